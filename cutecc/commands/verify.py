"""`cutecc verify`: re-hash every entry against its metadata and find what does not belong.

Reports, for kernel entries and runtime libraries alike, missing, truncated (size
differs) and altered (hash differs) files, malformed metadata, and orphans: files an
entry's metadata does not list, entry directories without meta.json, and tmp/ leftovers
whose key nobody has locked. It checks the index too: an entry without its record
(`unindexed`: `cutecc.load` would not see it), a record without its entry
(`stale-index`, also one that differs from its metadata), and an entry whose runtime
library is not in the cache (`no-runtime`). Tuning records are checked by the rule the
runtime applies to them (`bad-tuning`: a winner that is not a healthy sibling of its
default, with the same contract and call keywords, bytes and toolchain as recorded, or a
record it cannot read); with a lock (`--lock`), so are the lock's tuning lines
(`stale-tuning`: a line load would ignore; lines of another device kind are noted). Every
other area of the cache (`cutecc.store.layout`) is checked for what does not belong: a
top-level name the layout does not know, a file in `generations/`, `manifests/`,
`composites/`, `tuning/` or `src/` not named as the layout names them (`orphan`), and a
build record or tuning plan that is not a JSON object of a format (`bad-record`).
`fix=True` moves bad entries to quarantine/ (so the next build rebuilds them), deletes
orphans and stale records, restores missing records and links a missing runtime library
again where the build extra can, and removes bad tuning records (the defaults then serve)
and bad build records (the next build writes them again);
it never touches a healthy entry's files.
An installed pack (`_cutecc/`, `cutecc.runtime.package.is_pack_tree`) is checked in place and
written never: it has no index by design (it loads through its kernels.lock, which with its
`fallbacks/` is its own), and `fix` is refused. A check takes no key lock in a cache without
`locks/`, so it creates none.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import filelock

from cutecc.commands.verify_checks import (  # BAD, Problem, check_entry: named here too
    BAD,
    Problem,
    VerifyReport,
    _check_area,
    _check_areas,
    _check_index,
    _check_lock_tuning,
    _check_tuning,
    _listdir,
    check_entry,
)
from cutecc.commands.verify_fix import _fix
from cutecc.errors import CuteccError, WorkError
from cutecc.runtime.package import PACK_FILES, is_pack_tree
from cutecc.settings import NOTHING_GIVEN, BuildOptions
from cutecc.store.writer import Store

if TYPE_CHECKING:
    from cutecc.build.outcome import Progress

__all__ = ["BAD", "Problem", "VerifyReport", "check_entry", "lock_drift", "verify"]


def lock_drift(lock: str | Path) -> str | None:
    """The line naming the distributions whose installed version differs from the one the
    lock's environment records (None: none, or the lock records no environment). Versions
    only: a build, which plans, also compares their files."""
    import importlib.metadata as md

    from cutecc.lock.environment import Drift, drift_line
    from cutecc.lock.lockfile import read_lock

    env = read_lock(lock).environment
    if env is None:
        return None
    drift = []
    for name, locked in env.distributions:
        try:
            here: str | None = md.version(name)
        except md.PackageNotFoundError:
            here = None
        if here != locked.split(" ")[0]:
            drift.append(Drift(name, locked, here))
    return drift_line(lock, drift) if drift else None


def verify(cache_dir: str | Path | None = None, *, fix: bool = False,
           lock_timeout: float = 0, lock: str | Path | None = None,
           deep: str | Path | None = None, jobs: int | None = None,
           progress: Progress | None = None, options: BuildOptions = NOTHING_GIVEN) -> VerifyReport:
    """Check the whole cache; with `fix`, quarantine bad entries and delete orphans.
    `lock`: also say which key-deciding distributions that lock was made with differ, by
    version, from those installed here (`lock_drift`). `deep` (a manifest): then compile
    again every entry it plans that the cache holds, on `jobs` local workers, and report
    those whose artifact differs from what their key promised (`cutecc.commands.retrace`;
    the manifest is planned first, so a bad one fails before anything is read), each
    bounded as `options` (`cutecc.settings.BuildOptions`: the compile limits asked for), else
    the manifest's `[build]`, bound a build's; `progress` sees each of those compiles finish.

    Fixing takes each key's lock (waiting up to `lock_timeout` s); a key held longer,
    e.g. by a build, is left as is and reported busy.
    """
    drift = lock_drift(lock) if lock is not None else None
    again = None
    if deep is not None:
        from cutecc.commands.retrace import plan_again

        again = plan_again(deep)
    store = Store(cache_dir).require()
    store.check_trust()  # another user's cache is refused whole, never "fixed"
    pack = is_pack_tree(store.root)
    if fix and pack:
        raise WorkError("an installed pack is not fixed in place (its files are its wheel's): "
                        "install it again (`pip install --force-reinstall`)", where=str(store.root))
    report = VerifyReport(str(store.root), fixed=fix, drift_note=drift)
    kernels = _check_area(store, report, runtime=False)
    runtimes = set(_check_area(store, report, runtime=True))
    _check_index(store, report, kernels, pack=pack)
    needs: dict[str, list[str]] = {}  # runtime key -> keys of the healthy entries linked to it
    for key, meta in sorted(kernels.items()):
        needs.setdefault(meta.runtime.key, []).append(key)
    for rkey, keys in sorted(needs.items()):
        if rkey not in runtimes and not store.layout.runtime_meta(rkey).exists():
            report.problems.append(Problem(
                "no-runtime", str(store.layout.runtime(rkey)),
                f"the runtime library {rkey[:12]} that {len(keys)} entr{'y' if len(keys) == 1 else 'ies'} "
                f"link against (e.g. {keys[0][:12]}) is not in the cache", rkey))
    _check_tuning(store, report, kernels)
    if lock is not None:
        _check_lock_tuning(report, kernels, Path(lock))
    _check_areas(store, report, PACK_FILES if pack else ())
    for d in _listdir(store.tmp_dir):
        key = d.name.split(".", 1)[0]
        if not store.created():  # no locks/: nobody builds here, and a check creates none
            report.problems.append(Problem("stale-tmp", str(d), "leftover of a killed build", key))
            continue
        try:
            with store.lock(key, timeout=0):
                if d.exists():  # not published or removed since we listed tmp/
                    report.problems.append(Problem("stale-tmp", str(d),
                                                   "leftover of a killed build", key))
        except filelock.Timeout:
            continue  # a build (or removal) of that key is under way
        except CuteccError as e:  # a read-only cache: nobody can be building into it here
            report.problems.append(Problem("stale-tmp", str(d), f"leftover of a killed build? "
                                           f"({e.message})", key))
    if fix:
        _fix(store, report)
    if again is not None:
        from cutecc.commands.retrace import retrace

        report.deep = retrace(store, again, jobs=jobs, progress=progress,
                              limits=(options.compile_timeout, options.compile_memory))
    return report
