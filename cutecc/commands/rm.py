"""`cutecc rm`: remove chosen entries (by key or prefix, kernel, or arch), safely.

Removal goes through `Store.remove`: under the key's lock and by rename out of entries/
first, so a concurrent build never interleaves and a reader sees an entry whole or absent.
A removed entry's tuning record (`tuning/results/<key>.json`, when it was a tuned default)
goes with it: it would pick builds for a default that is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.commands.show import resolve
from cutecc.errors import CuteccError, WorkError
from cutecc.locks import Busy
from cutecc.store.view import Entry, StoreView
from cutecc.store.writer import Store
from cutecc.units import human_size


@dataclass
class RmReport(Report):
    cache_dir: str
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)  # key, label, bytes
    busy: list[str] = field(default_factory=list)
    removed_tuning: list[str] = field(default_factory=list)  # defaults whose tuning record went

    @property
    def ok(self) -> bool:
        return not self.busy

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "dry_run": self.dry_run, "removed": self.removed,
                "busy": self.busy, "removed_tuning": self.removed_tuning, "ok": self.ok}

    def warnings(self) -> list[str]:
        return [f"error: {k[:12]}: locked by another process (a build?); not removed"
                for k in self.busy]

    def lines(self, verbose: int = 0) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        return [f"{verb} {r['label']} {r['key'][:12]} ({human_size(r['bytes'])})" for r in self.removed] + [
            f"{verb} the tuning record of {k[:12]}" for k in self.removed_tuning]


def select(store: StoreView, keys: tuple[str, ...] = (), kernel: str | None = None,
           arch: str | None = None) -> list[Entry]:
    """The entries named by keys/prefixes (each must match exactly one), or by kernel and/or arch."""
    if keys and (kernel or arch):
        raise CuteccError("give keys, or --kernel/--arch, not both", where="cutecc rm")
    if keys:
        out = {}
        for k in keys:
            e = store.get(resolve(store, k))
            if e is not None:
                out[e.key] = e
        return list(out.values())
    if not (kernel or arch):
        raise CuteccError("nothing to remove: give keys or key prefixes, --kernel or --arch",
                          where="cutecc rm")
    found = [e for e in store.entries()
             if (not kernel or e.recorded.kernel == kernel) and (not arch or e.recorded.arch == arch)]
    if not found:
        what = " and ".join(f"{n} {v!r}" for n, v in (("kernel", kernel), ("arch", arch)) if v)
        raise WorkError(f"no entry matches {what} (see `cutecc list`)", where=str(store.root))
    return found


def rm(cache_dir: str | Path | None = None, *, keys: tuple[str, ...] = (), kernel: str | None = None,
       arch: str | None = None, dry_run: bool = False, lock_timeout: float = 30) -> RmReport:
    """Remove the selected entries; a key locked for longer than `lock_timeout` s is skipped."""
    store = Store(cache_dir).require()
    report = RmReport(str(store.root), dry_run)
    for e in select(store, keys, kernel, arch):
        size = e.disk_bytes()
        try:
            gone = dry_run or store.remove(e.key, timeout=lock_timeout)
        except Busy:
            report.busy.append(e.key)
            continue
        if gone:
            report.removed.append({"key": e.key, "label": e.recorded.label, "bytes": size})
            tuned = store.layout.tuning_result(e.key).is_file()
            if tuned and (dry_run or store.remove_tuning_results(e.key)):
                report.removed_tuning.append(e.key)
    return report
