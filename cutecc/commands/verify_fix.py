"""`cutecc verify --fix`: each problem's repair (quarantine, records written again, a
runtime library linked again, what does not belong removed), every change through the
store's writer."""

from __future__ import annotations

from pathlib import Path

import filelock

from cutecc.commands.verify_checks import BAD, Problem, VerifyReport, _record_or_none, check_entry
from cutecc.errors import CuteccError, WorkError
from cutecc.locks import Busy
from cutecc.store.layout import meta_file
from cutecc.store.writer import Store


def _fix_tuning(store: Store, p: Problem, bad: set[str]) -> str:
    """Remove a record file with any bad line (`load` then serves the defaults, and
    `cutecc tune` measures again): a record is one default's, whole or not at all. A bad
    build record or plan goes the same way (the next build or tune writes it again)."""
    path = Path(p.path)
    if str(path) in bad:
        return "removed"
    try:
        store.discard(path)  # a directory in a record's place too
    except OSError as e:
        raise WorkError(f"cannot remove: {e.strerror}", where=str(path)) from None
    bad.add(str(path))
    return "removed"


def _fix(store: Store, report: VerifyReport) -> None:
    bad: dict[str, list[Problem]] = {}
    for p in report.problems:
        if p.kind in BAD and p.key:
            bad.setdefault(p.key, []).append(p)
    done: dict[str, str] = {}
    tuning_removed: set[str] = set()
    for key, probs in bad.items():
        reason = "; ".join(f"{p.kind}: {Path(p.path).name}: {p.detail}" for p in probs)
        rt = store.runtimes_dir in Path(probs[0].path).parents
        def still_bad(d: Path, k: str = key, r: bool = rt) -> bool:
            return any(p.kind in BAD for p in check_entry(d, k, r))

        try:
            dest = store.quarantine(key, reason, runtime=rt, still_bad=still_bad)
            action = f"quarantined to {dest}" if dest else "gone: rebuilt or removed meanwhile"
        except Busy:
            action = "busy: left as is"
        done[key] = action
    for p in report.problems:
        if p.key in done and p.kind in BAD | {"orphan"}:
            p.action = done[p.key]  # its whole entry went to quarantine
        elif p.kind == "orphan":
            p.action = _remove_orphan(store, p)
        elif p.kind in ("unindexed", "stale-index") and p.key:
            p.action = _fix_record(store, p)
        elif p.kind == "no-runtime" and p.key:
            p.action = _relink_runtime(store, p.key)
        elif p.kind in ("bad-tuning", "bad-record"):
            p.action = _fix_tuning(store, p, tuning_removed)
    store.sweep_tmp()
    for p in report.problems:
        if p.kind == "stale-tmp":
            p.action = "busy: left as is" if Path(p.path).exists() else "removed"


def _fix_record(store: Store, p: Problem) -> str:
    """Create a missing index record, or delete a stale one, under the key's lock, after
    looking at the entry again."""
    path = Path(p.path)
    kernel, key = path.parent.name, path.name
    try:
        with store.lock(key, timeout=0):
            rec = _record_or_none(store, key)
            if rec is not None and rec.kernel == kernel:
                store.index(key, rec, store.layout.entry_meta(key))  # from the metadata, the truth
                return "indexed"
            store.unindex(kernel, key)
            return "removed"
    except filelock.Timeout:
        return "busy: left as is"
    except OSError as e:
        raise WorkError(f"cannot fix the index: {e.strerror}", where=str(path)) from None


def _relink_runtime(store: Store, key: str) -> str:
    """Link a missing runtime library again, where this machine has the build extra and
    the key is its toolchain's; else say how."""
    try:
        from cutecc.build.workers import ensure_runtime

        ensure_runtime(store, key)
    except (CuteccError, ImportError) as e:
        why = e.message if isinstance(e, CuteccError) else str(e)
        return f"left: {why}; run `cutecc build` (with the build extra) to link it"
    return "linked again"


def _remove_orphan(store: Store, p: Problem) -> str:
    path = Path(p.path)
    try:
        if p.key and path.parent == store.layout.entry(p.key):  # a stray file in an entry
            with store.lock(p.key, timeout=0):
                store.discard(path, ignore_errors=True)
        elif p.key and path == store.layout.entry(p.key):  # an entry dir without meta.json
            with store.lock(p.key, timeout=0):
                if not meta_file(path).exists():
                    store.discard(path, ignore_errors=True)
        else:  # a directory (never following a link inside), a file or a link itself
            store.discard(path, ignore_errors=True)
    except filelock.Timeout:
        return "busy: left as is"
    except OSError as e:
        raise WorkError(f"cannot remove: {e.strerror}", where=str(path)) from None
    return "removed"
