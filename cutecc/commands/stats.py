"""`cutecc stats`: what the cache holds, and what builds recorded in its stats.json.

Builds add their hits (entries found cached), misses (compiled), failures and the compile
seconds the hits saved (each hit entry's recorded `build_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.report import Report
from cutecc.store import Store
from cutecc.units import human_size


@dataclass(frozen=True)
class StatsReport(Report):
    values: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def to_json(self) -> dict[str, Any]:
        return dict(self.values)

    def lines(self, verbose: int = 0) -> list[str]:
        s = self.values
        rate = "-" if s["hit_rate"] is None else f"{100 * s['hit_rate']:.1f}%"
        out = [f"cache          {s['cache_dir']}",
               f"entries        {s['entries']} ({human_size(s['bytes'])}), {s['quarantined']} quarantined",
               f"hits           {s['hits']} ({rate})", f"misses         {s['misses']}",
               f"failures       {s['failures']}", f"compile saved  {s['seconds_saved']:.1f} s"]
        if s.get("since"):
            out.append(f"since          {s['since']}")
        return out


def stats(cache_dir: str | Path | None = None) -> StatsReport:
    """Entries, bytes on disk, quarantined entries, and the recorded build counters."""
    store = Store(cache_dir).require()
    entries = list(store.entries())
    quarantined = sum(1 for _ in store.quarantine_dir.iterdir()) if store.quarantine_dir.is_dir() else 0
    counters = store.read_stats()
    lookups = counters["hits"] + counters["misses"] + counters["failures"]
    return StatsReport({
        "cache_dir": str(store.root),
        "entries": len(entries),
        "bytes": sum(e.disk_bytes() for e in entries),
        "quarantined": quarantined,
        **counters,
        "hit_rate": round(counters["hits"] / lookups, 4) if lookups else None,
    })
