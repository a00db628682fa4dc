"""`cutecc stats`: what the cache holds, and what builds recorded in its stats.json.

Builds add their hits (entries found cached), misses (compiled), failures and the compile
seconds the hits saved (each hit entry's recorded `build_seconds`); with a remote cache,
its hits (entries fetched), misses (looked up, absent), refused entries, the times it was
unavailable, uploads, requests, bytes moved each way, seconds spent fetching and the
compile seconds the fetched entries saved. Beside the entries, the records the cache keeps
(`RECORD_AREAS`: build generations, manifests' newest builds, composite kernels, tuning
plans and results, received sources) are counted with their bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.store.layout import Layout
from cutecc.store.view import StoreView
from cutecc.units import human_size

# name in the report -> the area of the cache it counts (files, or trees for sources)
RECORD_AREAS = {"generations": Layout.generations, "manifests": Layout.manifests,
                "composites": Layout.composites, "tuning_plans": Layout.tuning_plans,
                "tuning_results": Layout.tuning_results, "sources": Layout.sources}


def _area(path: Path) -> tuple[int, int]:
    """(items directly in `path`, bytes of every file under it), links not followed."""
    try:
        items = os.listdir(path)
    except OSError:
        return 0, 0
    size = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                size += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return len(items), size


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
        remote = f" local, {s['remote_hits']} remote" if s["remote_hits"] else ""
        out = [f"cache          {s['cache_dir']}",
               f"entries        {s['entries']} ({human_size(s['bytes'])}), {s['quarantined']} quarantined",
               f"runtimes       {s['runtimes']} ({human_size(s['runtime_bytes'])})",
               "records        " + ", ".join(f"{r['count']} {name.replace('_', ' ')}"
                                             for name, r in s["records"].items())
               + f" ({human_size(sum(r['bytes'] for r in s['records'].values()))})",
               f"hits           {s['hits']}{remote} ({rate})", f"misses         {s['misses']}",
               f"failures       {s['failures']}", f"compile saved  {s['seconds_saved']:.1f} s"]
        if any(s[k] for k in ("remote_hits", "remote_misses", "remote_uploads", "remote_unavailable")):
            looked = s["remote_hits"] + s["remote_misses"] + s["remote_refused"]
            out += [f"remote hits    {s['remote_hits']} of {looked} looked up, {s['remote_refused']} "
                    f"refused, unavailable {s['remote_unavailable']} time(s)",
                    f"remote moved   {human_size(s['remote_bytes_down'])} down, "
                    f"{human_size(s['remote_bytes_up'])} up ({s['remote_uploads']} uploads), "
                    f"{s['remote_requests']} requests",
                    f"remote saved   {s['remote_seconds_saved']:.1f} s of compiles, for "
                    f"{s['remote_seconds']:.1f} s fetching"]
        if s.get("since"):
            out.append(f"since          {s['since']}")
        return out


def stats(cache_dir: str | Path | None = None) -> StatsReport:
    """Entries and runtime libraries with their bytes on disk, quarantined entries, the
    record areas (count and bytes each), and the recorded build counters."""
    store = StoreView(cache_dir).require()
    entries = list(store.entries())
    runtimes = list(store.runtimes())
    quarantined = sum(1 for _ in store.quarantine_dir.iterdir()) if store.quarantine_dir.is_dir() else 0
    counters = store.read_stats()
    records = {}
    for name, where in RECORD_AREAS.items():
        count, size = _area(where(store.layout))
        records[name] = {"count": count, "bytes": size}
    hits = counters.hits + counters.remote_hits
    lookups = hits + counters.misses + counters.failures
    return StatsReport({
        "cache_dir": str(store.root),
        "entries": len(entries),
        "bytes": sum(e.disk_bytes() for e in entries),
        "runtimes": len(runtimes),
        "runtime_bytes": sum(e.disk_bytes() for e in runtimes),
        "quarantined": quarantined,
        "records": records,
        **counters.counters(),
        "hit_rate": round(hits / lookups, 4) if lookups else None,  # local or remote
    })
