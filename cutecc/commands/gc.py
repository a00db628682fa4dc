"""`cutecc gc`: evict least recently used entries to fit a size, those unused for an age, or
those nothing recorded names (`--unreachable`).

Last use is the later of an entry's `used` mtime (touched by `cutecc build` on a hit and
by the runtime at registration) and its `built_at`. Removal goes through
`Store.remove` (under the key's lock, by rename out of entries/ first); a key whose
lock another process holds (a build) is skipped, never deleted under it. A runtime
library goes once no entry links against it and it has not been used (linked against by
a build, loaded by a program) for RUNTIME_GRACE_S: a build may be about to publish
entries that need it. `--max-size` bounds the entries' bytes; the runtime libraries (one
per toolchain, shared by its entries) are reported beside them.

`--unreachable` evicts, as pre-commit's and uv's gc do, what no record names: an entry is
reachable when the newest build of a kernel and arch (`generations/`) or of a manifest
(`manifests/`), a stored tuning plan, a tuning record, or a lock file given with
`--keep-lock` names it (`StoreView.recorded_keys`). An entry built or used within the
grace period stays (a build records its generation only when it ends). The other areas
follow the entries: a tuning record goes with its default entry, and (with `older_than`)
tuning plans, received sources (`src/`) and quarantined entries of that age go.

Beyond the cache, gc reaches every other home cutecc keeps (`cutecc.store.homes.prune`):
the homes an older cutecc kept under unversioned names, the platform link inputs this
cutecc pins no more, sockets no resident service listens on, and (with `older_than`, by the
clock) the generated wrappers, the planning memory and zig's cache unused that long.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.errors import CuteccError
from cutecc.locks import Busy
from cutecc.store import homes
from cutecc.store.view import StoreView
from cutecc.store.writer import Store
from cutecc.toolchain.targetlibs import pinned_files
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
    unreachable: bool = False  # evicting what no record names
    removed_tuning: list[str] = field(default_factory=list)  # default keys whose records went
    removed_plans: int = 0  # tuning plans older than `older_than`
    removed_sources: int = 0  # src/ trees older than `older_than`
    removed_homes: list[dict[str, Any]] = field(default_factory=list)  # home, path, bytes, why

    def to_json(self) -> dict[str, Any]:
        removed = [dict(r, last_used=iso(r["last_used"])) for r in self.removed]
        freed = sum(r["bytes"] for r in [*self.removed, *self.removed_runtimes, *self.removed_homes])
        return dict(self.__dict__, removed=removed, freed_bytes=freed)

    def warnings(self) -> list[str]:
        return [f"skipped {k[:12]}: locked by another process" for k in self.busy]

    def lines(self, verbose: int = 0) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        out = [f"{verb} {r['label']} {r['key'][:12]} ({human_size(r['bytes'])})"
               + (": no recorded build, tuning or lock names it" if r.get("unreachable") else "")
               for r in self.removed]
        out += [f"{verb} the tuning record of {k[:12]}: its default entry went" for k in self.removed_tuning]
        if self.removed_plans or self.removed_sources:
            out.append(f"{verb} {self.removed_plans} tuning plan(s) and {self.removed_sources} "
                       "received source tree(s) past the age")
        out += [f"{verb} {r['path']} ({human_size(r['bytes'])}, {r['home']}): {r['why']}"
                for r in self.removed_homes]
        out += [f"{verb} runtime library {r['library']} ({human_size(r['bytes'])}): no entry links "
                "against it" for r in self.removed_runtimes]
        out.append(f"{verb} {len(self.removed)} entries "
                   f"({human_size(sum(r['bytes'] for r in self.removed))}), kept {self.kept} "
                   f"({human_size(self.kept_bytes)}, and {human_size(self.runtime_bytes)} of runtime "
                   f"libraries), swept {self.swept_tmp} tmp leftover(s) "
                   f"in {self.cache_dir}")
        return out


def gc(cache_dir: str | Path | None = None, *, max_size: str | int | None = None,
       older_than: str | float | None = None, unreachable: bool = False,
       keep_locks: tuple[str | Path, ...] = (), dry_run: bool = False, now: float | None = None,
       lock_timeout: float = 0) -> GcReport:
    """Remove entries unused for `older_than`, with `unreachable` those no record (nor a lock
    of `keep_locks`) names, then the least recently used until the cache holds at most
    `max_size` bytes; also sweep tmp/ leftovers, the tuning records of removed defaults and
    (with `older_than`) old quarantined entries, tuning plans and received sources; and
    what `cutecc.store.homes.prune` removes of the other homes (`now` is the entries' clock
    only). `dry_run` only reports what would go."""
    limit = None if max_size is None else parse_size(max_size)
    age = None if older_than is None else parse_age(older_than)
    if keep_locks and not unreachable:
        raise CuteccError("--keep-lock keeps entries from --unreachable eviction; give both",
                          where="cutecc gc")
    store = Store(cache_dir).require()
    now = time.time() if now is None else now
    report = GcReport(str(store.root), dry_run, unreachable=unreachable)
    reachable = _reachable(store, keep_locks) if unreachable else None
    entries = sorted(((e.last_used(), e.key, e) for e in store.entries()), key=lambda t: t[:2])
    sizes = {e.key: e.disk_bytes() for _, _, e in entries}
    total = sum(sizes.values())
    for used, key, e in entries:  # oldest first
        stale = age is not None and now - used > age
        orphan = reachable is not None and key not in reachable and now - used >= RUNTIME_GRACE_S
        if not stale and not orphan and (limit is None or total <= limit):
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
            report.removed.append({"key": key, "label": e.recorded.label, "bytes": sizes[key],
                                   "last_used": used, "unreachable": orphan and not stale})
    removed_keys = {r["key"] for r in report.removed}
    linked = {e.recorded.runtime for _, key, e in entries if key not in removed_keys} - {None}
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
            report.removed_runtimes.append({"key": rt.key, "library": rt.recorded.library,
                                            "bytes": size})
    report.kept_bytes = total
    for key in sorted(removed_keys):  # a tuning record of a default that went serves nothing
        if store.layout.tuning_result(key).is_file() and (dry_run or store.remove_tuning_results(key)):
            report.removed_tuning.append(key)
    if age is not None:
        report.removed_plans = store.prune(store.layout.tuning_plans(), now - age, dry_run)
        report.removed_sources = store.prune(store.layout.sources(), now - age, dry_run)
    report.removed_homes = [dict(r.__dict__) for r in homes.prune(age, pinned_files(), dry_run)]
    if not dry_run:
        report.swept_tmp = store.sweep_tmp()
        if age is not None:
            report.quarantine_removed = store.prune(store.quarantine_dir, now - age, dry_run)
    return report


def _reachable(store: StoreView, locks: tuple[str | Path, ...]) -> frozenset[str]:
    """The keys the cache's records name, and every key (tuned winners too) of `locks`."""
    from cutecc.lock.lockfile import read_lock

    keys = set(store.recorded_keys())
    for path in locks:
        lock = read_lock(path)
        keys.update(lock.distinct_keys())
        keys.update(t.base for t in lock.tuning)
    return frozenset(keys)
