"""`cutecc build`: plan every (kernel, variant, arch), compile the misses, publish them.

Planning computes each key without importing the DSL; entries already in the store
are reported cached and cost nothing more. Misses compile in worker processes (one
pool per arch, since the DSL fixes its target arch at import), each publishing its
entry atomically under the key's lock, so concurrent builds never build twice.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime as dt
import errno
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.contract import args_to_json
from cutecc.errors import CuteccError
from cutecc.key import SourceIndex, compute_key, key_inputs, toolchain
from cutecc.lockfile import LOCK_NAME, record_build
from cutecc.manifest import Kernel, Manifest, Variant, load_manifest, parse_archs
from cutecc.store import Store, read_only_from_env, touch_used

LIBRARY = "kernel.so"
# errnos that mean "the cache cannot take the artifact" (not a compile error): no traceback
_STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES,
                             errno.EPERM, errno.EIO})


@dataclass(frozen=True)
class Planned:
    """One artifact the manifest asks for."""

    kernel: Kernel
    variant: Variant
    arch: str
    key: str
    inputs: dict[str, Any]
    sources: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.kernel.name}[{self.variant.id}]@{self.arch}"


@dataclass
class Outcome:
    planned: Planned
    status: str  # "built", "cached", "failed", "planned" (dry run)
    seconds: float = 0.0
    error: str | None = None


@dataclass
class BuildReport:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    cache_dir: Path | None = None
    lock_file: Path | None = None  # the lock this build wrote or confirmed (None: not written)
    lock_changed: bool = False

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "cache_dir": str(self.cache_dir),
            "seconds": round(self.seconds, 3),
            "built": self.count("built"), "cached": self.count("cached"),
            "failed": self.count("failed"), "planned": self.count("planned"),
            "lock_file": str(self.lock_file) if self.lock_file else None,
            "lock_changed": self.lock_changed,
            "entries": [
                {"kernel": o.planned.kernel.name, "variant": o.planned.variant.id,
                 "arch": o.planned.arch, "key": o.planned.key, "status": o.status,
                 "seconds": round(o.seconds, 3), "error": o.error}
                for o in self.outcomes
            ],
        }


def plan(manifest: Manifest, archs: tuple[str, ...] = ()) -> list[Planned]:
    """Every artifact of the manifest with its key; `archs` overrides the manifest's."""
    index = SourceIndex(manifest.python_path)
    out = []
    for k in manifest.kernels:
        try:
            digest, sources = index.digest(k.module)
        except CuteccError as e:
            if e.where:  # already names the file at fault (a syntax error in a dependency)
                raise
            raise CuteccError(e.message, where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry') from None
        attr = k.entry.split(":", 1)[1].split(".")[0]
        if index.lacks(k.module, attr):
            raise CuteccError(f'module "{k.module}" defines no "{attr}"', where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry')
        for v in k.variants:
            for arch in archs or k.archs:
                inputs = key_inputs(k, v, arch, digest)
                out.append(Planned(k, v, arch, compute_key(inputs), inputs, sources))
    return out


def build(
    manifest_path: str | Path,
    *,
    archs: tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
    kernels: tuple[str, ...] = (),
    dry_run: bool = False,
    on_done: Callable[[Outcome], None] | None = None,
    read_only: bool = False,
    lock: bool = True,
    lock_file: str | Path | None = None,
) -> BuildReport:
    """Build a manifest into a cache; see the module docstring.

    `read_only` (or `$CUTECC_READ_ONLY`): write nothing to the cache and make any miss
    an error (exit 1) instead of a compile, e.g. for a deploy that must only read.
    `lock`: after a fully successful build (not a dry run), write `kernels.lock` beside
    the manifest (or `lock_file`) if its content changed; see `cutecc.lockfile`.
    """
    t0 = time.perf_counter()
    read_only = read_only or read_only_from_env()
    archs = parse_archs(archs) if archs else ()
    manifest = load_manifest(manifest_path, kernels=kernels)
    store = Store(cache_dir)
    report = BuildReport(cache_dir=store.root)
    planned = plan(manifest, archs)
    misses = []
    for p in planned:
        if store.has(p.key):
            report.outcomes.append(Outcome(p, "cached"))
        elif dry_run:
            report.outcomes.append(Outcome(p, "planned"))
        else:
            misses.append(p)
    if read_only and (misses or report.count("planned")):
        missing = misses or [o.planned for o in report.outcomes if o.status == "planned"]
        raise CuteccError(f"read-only mode: {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} "
                          "not in the cache: " + ", ".join(f"{p.label} {p.key[:12]}" for p in missing),
                          where=str(store.root), exit_code=1)
    if misses:
        store.ensure()
        store.sweep_tmp()
        _compile_all(misses, manifest, store, jobs or os.cpu_count() or 1, report, on_done)
    order = {p.key + p.label: i for i, p in enumerate(planned)}
    report.outcomes.sort(key=lambda o: order[o.planned.key + o.planned.label])
    if not dry_run and not read_only:
        if not misses:  # leftovers of killed builds go even when everything is cached
            with contextlib.suppress(CuteccError, OSError):
                if store.locks_dir.is_dir():
                    store.sweep_tmp()
        _record_use(store, report)
    if lock and not dry_run and report.ok:
        _write_lock(Path(lock_file or Path(manifest_path).parent / LOCK_NAME), manifest_path,
                    planned, store, report, partial=bool(kernels or archs))
    report.seconds = time.perf_counter() - t0
    return report


def _write_lock(path: Path, manifest_path: str | Path, planned: list[Planned], store: Store,
                report: BuildReport, *, partial: bool) -> None:
    """Record the build in its lock file (a --kernel/--arch build updates only its part)."""
    defined = {k.name for k in load_manifest(manifest_path).kernels} if partial else set()
    report.lock_changed = record_build(
        path, [(p.kernel.name, p.variant.id, p.arch, p.key) for p in planned], store,
        partial=partial, covered={(p.kernel.name, p.arch) for p in planned}, defined=defined)
    report.lock_file = path


def _record_use(store: Store, report: BuildReport) -> None:
    """Mark each hit used (for `cutecc gc`) and add this build's counts to stats.json.

    Best-effort: a cache on a read-only mount still serves its hits.
    """
    if not store.locks_dir.is_dir():
        return
    saved = 0.0
    for o in report.outcomes:
        if o.status == "cached":
            touch_used(store.entry_dir(o.planned.key))
            try:
                entry = store.get(o.planned.key)
                saved += float(entry.meta.get("build_seconds", 0)) if entry else 0.0
            except (CuteccError, TypeError, ValueError):
                pass
    with contextlib.suppress(OSError):  # filelock.Timeout is an OSError too
        store.add_stats(hits=report.count("cached"), misses=report.count("built"),
                        failures=report.count("failed"), seconds_saved=saved)


def _compile_all(misses: list[Planned], manifest: Manifest, store: Store, jobs: int,
                 report: BuildReport, on_done: Callable[[Outcome], None] | None) -> None:
    by_arch: dict[str, list[Planned]] = {}
    for p in misses:
        by_arch.setdefault(p.arch, []).append(p)
    ctx = multiprocessing.get_context("spawn")
    for arch, items in by_arch.items():
        # Several variants can share a key (a variant parameter that changes nothing);
        # build each key once.
        unique = list({p.key: p for p in items}.values())
        workers = max(1, min(jobs, len(unique)))
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                    initargs=(arch,)) as pool:
            futures = {pool.submit(_build_one, _job_args(p, manifest), str(store.root)): p
                       for p in unique}
            results: dict[str, tuple[str, float, str | None]] = {}
            for fut in cf.as_completed(futures):
                p = futures[fut]
                try:
                    results[p.key] = fut.result()
                except Exception as e:  # a worker died (killed, out of memory)
                    results[p.key] = ("failed", 0.0, f"build worker died: {e!r}")
                status, secs, err = results[p.key]
                for q in items:
                    if q.key == p.key:
                        o = Outcome(q, status, secs, err)
                        report.outcomes.append(o)
                        if on_done:
                            on_done(o)


def _job_args(p: Planned, manifest: Manifest) -> dict[str, Any]:
    return {
        "entry": p.kernel.entry, "variant": p.variant, "arch": p.arch,
        "compile_options": p.kernel.compile_options,
        "python_path": tuple(str(x) for x in manifest.python_path),
        "key": p.key, "key_inputs": p.inputs, "sources": p.sources,
        "kernel": p.kernel.name, "backward": p.kernel.backward,
    }


def _init_worker(arch: str) -> None:
    os.environ["CUTE_DSL_ARCH"] = arch


def _build_one(job: dict[str, Any], store_root: str) -> tuple[str, float, str | None]:
    """Worker: compile, link and publish one entry. Returns (status, seconds, error)."""
    from cutecc.compiler import SYMBOL, CompileJob, compile_to_object
    from cutecc.linker import link

    t0 = time.perf_counter()
    store = Store(store_root)

    def produce(staging: Path) -> dict[str, Any]:
        planned, now = job["key_inputs"]["toolchain"], toolchain()
        if now != planned:  # the key would not describe what builds the artifact
            changed = sorted(k for k in {*planned, *now} if planned.get(k) != now.get(k))
            raise CuteccError(f"the toolchain changed after the build was planned ({', '.join(changed)});"
                              " run the build again", where="build", exit_code=1)
        cjob = CompileJob(job["entry"], job["variant"], job["arch"], job["compile_options"],
                          job["python_path"])
        obj = compile_to_object(cjob, staging)
        link(obj, staging / LIBRARY, SYMBOL, entry=job["entry"], arch=job["arch"], key=job["key"])
        obj.unlink()
        variant: Variant = job["variant"]
        return {
            "kernel": job["kernel"],
            "variant": variant.id,
            "params": dict(variant.params),
            "arch": job["arch"],
            "entry": job["entry"],
            "args": args_to_json(variant.args),
            "backward": job["backward"],
            "library": LIBRARY,
            "symbol": SYMBOL,
            "toolchain": toolchain(),
            "key_inputs": job["key_inputs"],
            "sources": list(job["sources"]),
            "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(time.perf_counter() - t0, 3),
        }

    try:
        _, built = store.publish(job["key"], produce)
    except CuteccError as e:
        return "failed", time.perf_counter() - t0, e.render()
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRORS:  # a full or read-only cache
            where = f" ({e.filename})" if e.filename else ""
            return "failed", time.perf_counter() - t0, (
                f"cannot write the artifact into {store.root}: {e.strerror}{where}")
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return "failed", time.perf_counter() - t0, f"{type(e).__name__}: {e}\n{''.join(tb[-6:])}"
    return ("built" if built else "cached"), time.perf_counter() - t0, None
