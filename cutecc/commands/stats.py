"""`cutecc stats`: what the cache holds, and what builds recorded in its stats.json.

Builds add their hits (entries found cached), misses (compiled), failures and the compile
seconds the hits saved (each hit entry's recorded `build_seconds`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cutecc.store import Store


def stats(cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Entries, bytes on disk, quarantined entries, and the recorded build counters."""
    store = Store(cache_dir).require()
    entries = list(store.entries())
    quarantined = sum(1 for _ in store.quarantine_dir.iterdir()) if store.quarantine_dir.is_dir() else 0
    counters = store.read_stats()
    lookups = counters["hits"] + counters["misses"] + counters["failures"]
    return {
        "cache_dir": str(store.root),
        "entries": len(entries),
        "bytes": sum(e.disk_bytes() for e in entries),
        "quarantined": quarantined,
        **counters,
        "hit_rate": round(counters["hits"] / lookups, 4) if lookups else None,
    }
