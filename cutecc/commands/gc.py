"""`cutecc gc`: evict least recently used entries to fit a size, or those unused for an age.

Last use is the later of an entry's `used` mtime (touched by `cutecc build` on a hit and
by the runtime at registration) and its `built_at`. Removal goes through
`Store.remove` (under the key's lock, by rename out of entries/ first); a key whose
lock another process holds (a build) is skipped, never deleted under it. A runtime
library goes once no entry links against it and it has not been used (linked against by
a build, loaded by a program) for RUNTIME_GRACE_S: a build may be about to publish
entries that need it. `--max-size` bounds the entries' bytes; the runtime libraries (one
per toolchain, shared by its entries) are reported beside them.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.entry import label_of, runtime_record
from cutecc.locks import Busy
from cutecc.report import Report
from cutecc.store.writer import Store
from cutecc.units import human_size, iso, parse_age, parse_size

RUNTIME_GRACE_S = 3600.0


@dataclass
class GcReport(Report):
    cache_dir: str
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)  # key, label, bytes, last_used
    busy: list[str] = field(default_factory=list)
    kept: int = 0
    kept_bytes: int = 0
    swept_tmp: int = 0
    quarantine_removed: int = 0
    removed_runtimes: list[dict[str, Any]] = field(default_factory=list)  # key, library, bytes
    runtime_bytes: int = 0  # of the runtime libraries kept

    def to_json(self) -> dict[str, Any]:
        removed = [dict(r, last_used=iso(r["last_used"])) for r in self.removed]
        freed = sum(r["bytes"] for r in [*self.removed, *self.removed_runtimes])
        return dict(self.__dict__, removed=removed, freed_bytes=freed)

    def warnings(self) -> list[str]:
        return [f"skipped {k[:12]}: locked by another process" for k in self.busy]

    def lines(self, verbose: int = 0) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        out = [f"{verb} {r['label']} {r['key'][:12]} ({human_size(r['bytes'])})" for r in self.removed]
        out += [f"{verb} runtime library {r['library']} ({human_size(r['bytes'])}): no entry links "
                "against it" for r in self.removed_runtimes]
        out.append(f"{verb} {len(self.removed)} entries "
                   f"({human_size(sum(r['bytes'] for r in self.removed))}), kept {self.kept} "
                   f"({human_size(self.kept_bytes)}, and {human_size(self.runtime_bytes)} of runtime "
                   f"libraries), swept {self.swept_tmp} tmp leftover(s) "
                   f"in {self.cache_dir}")
        return out


def gc(cache_dir: str | Path | None = None, *, max_size: str | int | None = None,
       older_than: str | float | None = None, dry_run: bool = False, now: float | None = None,
       lock_timeout: float = 0) -> GcReport:
    """Remove entries unused for `older_than`, then the least recently used until the cache
    holds at most `max_size` bytes; also sweep tmp/ leftovers and (with `older_than`) old
    quarantined entries. `dry_run` only reports what would go."""
    limit = None if max_size is None else parse_size(max_size)
    age = None if older_than is None else parse_age(older_than)
    store = Store(cache_dir).require()
    now = time.time() if now is None else now
    report = GcReport(str(store.root), dry_run)
    entries = sorted(((e.last_used(), e.key, e) for e in store.entries()), key=lambda t: t[:2])
    sizes = {e.key: e.disk_bytes() for _, _, e in entries}
    total = sum(sizes.values())
    for used, key, e in entries:  # oldest first
        stale = age is not None and now - used > age
        if not stale and (limit is None or total <= limit):
            report.kept += 1
            continue
        try:
            gone = dry_run or store.remove(key, timeout=lock_timeout)
        except Busy:
            report.busy.append(key)
            report.kept += 1
            continue
        if gone:
            total -= sizes[key]
            report.removed.append({"key": key, "label": label_of(e.meta), "bytes": sizes[key],
                                   "last_used": used})
    gone = {r["key"] for r in report.removed}
    linked = {rec["key"] for _, key, e in entries if key not in gone
              for rec in [runtime_record(e.meta)] if rec is not None}
    for rt in store.runtimes():
        size = rt.disk_bytes()
        if rt.key in linked or now - rt.last_used() < RUNTIME_GRACE_S:
            report.runtime_bytes += size
            continue
        try:
            removed = dry_run or store.remove(rt.key, timeout=lock_timeout, runtime=True)
        except Busy:
            report.busy.append(rt.key)
            report.runtime_bytes += size
            continue
        if removed:
            report.removed_runtimes.append({"key": rt.key, "library": rt.meta.get("library"),
                                            "bytes": size})
    report.kept_bytes = total
    if not dry_run:
        report.swept_tmp = store.sweep_tmp()
        if age is not None:
            report.quarantine_removed = _prune_quarantine(store, now - age)
    return report


def _prune_quarantine(store: Store, before: float) -> int:
    n = 0
    for d in sorted(store.quarantine_dir.glob("*")) if store.quarantine_dir.is_dir() else []:
        try:
            if os.stat(d).st_mtime < before:
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        except OSError:
            continue
    return n
