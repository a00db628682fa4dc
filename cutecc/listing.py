"""`cutecc list`: what a cache holds, read from each entry's metadata only."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.store import Store


@dataclass(frozen=True)
class Row:
    key: str
    kernel: str
    variant: str
    arch: str
    size: int
    built_at: str

    def age_seconds(self, now: dt.datetime) -> float:
        try:
            return (now - dt.datetime.fromisoformat(self.built_at)).total_seconds()
        except ValueError:
            return float("nan")


def list_entries(cache_dir: str | Path | None = None, *, kernel: str | None = None,
                 arch: str | None = None) -> list[Row]:
    """One row per published entry, sorted by kernel, variant and arch."""
    rows = []
    for e in Store(cache_dir).entries():
        m = e.meta
        if (kernel and m.get("kernel") != kernel) or (arch and m.get("arch") != arch):
            continue
        rows.append(Row(e.key, str(m.get("kernel")), str(m.get("variant")), str(m.get("arch")),
                        e.size, str(m.get("built_at", ""))))
    rows.sort(key=lambda r: (r.kernel, r.variant, r.arch, r.key))
    return rows


def to_json(rows: list[Row], cache_dir: Path) -> dict[str, Any]:
    return {
        "cache_dir": str(cache_dir),
        "entries": [r.__dict__ for r in rows],
        "total": {"entries": len(rows), "bytes": sum(r.size for r in rows)},
    }


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def human_age(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
