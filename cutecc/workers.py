"""The build's worker processes: compile, link and publish one entry each.

The DSL fixes its target arch when it is imported (`CUTE_DSL_ARCH`), so misses are
compiled in one pool of spawned processes per arch, the arch given to the pool once, at
start. Each worker publishes its entry into the store under the key's lock, so two
builds never build one key twice, and returns the entry's metadata so the lock file is
written without reading back what was just published. With a writable remote cache, the
worker that built an entry also uploads it (`cutecc.remote`); an upload that fails is
reported, never a failed build. `cutecc.executors` chooses who runs `build_one`: this
module's pools (the local executor) or Ray. Kernel libraries link against the
toolchain's runtime library, which `ensure_runtime` publishes (once, under its own key's
lock) before any worker needs it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc.contract import args_to_json
from cutecc.entry import LIBRARY, library_record, runtime_meta_problem, runtime_soname
from cutecc.errors import CuteccError
from cutecc.key import toolchain
from cutecc.manifest import Manifest, Variant
from cutecc.plan import Planned
from cutecc.store import Store
from cutecc.units import now_iso

if TYPE_CHECKING:
    from cutecc.remote import Pushed, RemoteConfig

# errnos that mean "the cache cannot take the artifact" (not a compile error): no traceback
_STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES,
                             errno.EPERM, errno.EIO})


@dataclass(frozen=True)
class BuildJob:
    """Everything a worker needs to build one entry (picklable; no manifest object)."""

    kernel: str
    entry: str
    variant: Variant
    compile_options: str
    python_path: tuple[str, ...]
    key: str
    key_inputs: dict[str, Any]
    sources: tuple[str, ...]
    backward: str | None
    env: tuple[tuple[str, str], ...] = ()  # the manifest's [env] for this arch

    @property
    def arch(self) -> str:
        return str(self.key_inputs["arch"])

    @property
    def device(self) -> dict[str, Any] | None:
        """The answers its device queries get (`cutecc.devicequery`), when keyed."""
        return self.key_inputs.get("device")

    @property
    def worker_kind(self) -> str:
        """What a worker process is set up for: the arch, and the device answers (libraries
        cache what they asked, so builds with other answers get other processes)."""
        return self.arch + ("" if self.device is None else " " + json.dumps(self.device, sort_keys=True))

    @classmethod
    def of(cls, p: Planned, manifest: Manifest) -> BuildJob:
        return cls(p.kernel.name, p.kernel.entry, p.variant, p.kernel.compile_options,
                   tuple(str(x) for x in manifest.python_path), p.key, p.inputs, p.sources,
                   p.kernel.backward, tuple(manifest.env_for(p.arch).items()))


@dataclass(frozen=True)
class Result:
    """A worker's answer: built, cached (another process had it) or failed."""

    status: str
    seconds: float
    error: str | None = None
    meta: dict[str, Any] | None = None  # the published entry's metadata (for the lock)
    pushed: Pushed | None = None  # what uploading it to the remote cache did, if asked to


def compile_all(jobs: list[BuildJob], store_root: Path, workers: int,
                on_result: Callable[[BuildJob, Result], None],
                remote: RemoteConfig | None = None) -> None:
    """Build every job, one spawned pool per arch (and per set of device answers);
    `on_result` sees each as it finishes. With a writable `remote`, each worker uploads what
    it built."""
    by_kind: dict[str, list[BuildJob]] = {}
    for j in jobs:
        by_kind.setdefault(j.worker_kind, []).append(j)
    ctx = multiprocessing.get_context("spawn")
    for items in by_kind.values():
        n = max(1, min(workers, len(items)))
        pool = cf.ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker,
                                      initargs=(items[0].arch, os.getpid(), dict(items[0].env)))
        try:
            with _sigint_ignored_while_spawning():  # workers start with Ctrl-C ignored
                futures = {pool.submit(build_one, j, str(store_root), remote): j for j in items}
            for fut in cf.as_completed(futures):
                try:
                    result = fut.result()
                except Exception as e:  # a worker died (killed, out of memory)
                    result = Result("failed", 0.0, f"build worker died: {e!r}")
                on_result(futures[fut], result)
        except BaseException:  # Ctrl-C, or the caller's callback failed: stop the workers now
            _kill_workers(pool)
            raise
        pool.shutdown(wait=True)


@contextlib.contextmanager
def _sigint_ignored_while_spawning() -> Iterator[None]:
    """Ignore SIGINT while the pool spawns its workers: an ignored signal stays ignored
    across exec, so a Ctrl-C during a worker's start-up (before its initializer runs)
    cannot print a traceback from it. The build itself is interrupted after, as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _kill_workers(pool: cf.ProcessPoolExecutor) -> None:
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(5)


def _init_worker(arch: str, parent: int, env: dict[str, str] | None = None) -> None:
    """Set the manifest's [env] and the DSL's target (before any import), and tie the
    worker's life to the build's: it dies with its parent (a parent-death signal, and a
    watchdog for where that is not available), and leaves Ctrl-C to the parent, which
    stops the pool itself."""
    from cutecc.compiler import set_target

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    os.environ.update(env or {})
    set_target(arch)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _check_toolchain(planned: dict[str, Any]) -> dict[str, str]:
    now = toolchain()
    if now != planned:  # the key would not describe what builds the artifact
        changed = sorted(k for k in {*planned, *now} if planned.get(k) != now.get(k))
        raise CuteccError(f"the toolchain changed after the build was planned ({', '.join(changed)});"
                          " run the build again", where="build", exit_code=1)
    return now


def ensure_runtime(store: Store, key: str) -> tuple[Any, bool]:
    """The runtime library entry of `key` (this toolchain's), linked and published if the
    store lacks it: (entry, built). Its `used` file is touched, so `cutecc gc` keeps it while
    builds use it."""
    from cutecc.key import runtime_key
    from cutecc.linker import link_runtime, runtime_inputs
    from cutecc.store import touch_used

    if key != runtime_key():
        raise CuteccError(f"runtime library {key[:12]} is not this toolchain's ({runtime_key()[:12]});"
                          " run the build again", where="build", exit_code=1)

    def produce(staging: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        link_runtime(staging, key)
        return {"kind": "runtime", "key_inputs": runtime_inputs(), "library": runtime_soname(key),
                "built_at": now_iso(), "build_seconds": round(time.perf_counter() - t0, 3)}

    entry, built = store.publish(key, produce, runtime=True)
    why = runtime_meta_problem(entry.meta, key)
    if why:
        raise CuteccError(f"runtime library {key[:12]}: {why}; run `cutecc verify --fix`",
                          where=str(entry.path), exit_code=1)
    touch_used(entry.path)
    return entry, built


def build_one(job: BuildJob, store_root: str, remote: RemoteConfig | None = None) -> Result:
    """Compile, link and publish one entry (in a worker whose DSL targets `job.arch`);
    then, with a writable `remote`, upload it if this call built it."""
    from cutecc.compiler import SYMBOL, CompileJob, compile_to_object
    from cutecc.linker import link

    t0 = time.perf_counter()
    store = Store(store_root)

    def produce(staging: Path) -> dict[str, Any]:
        now = _check_toolchain(job.key_inputs["toolchain"])
        runtime, _ = ensure_runtime(store, now["runtime"])  # normally the build published it
        rec = library_record(runtime.meta)
        assert rec is not None  # ensure_runtime checked the metadata
        obj = compile_to_object(CompileJob(job.entry, job.variant, job.compile_options,
                                           job.python_path, job.device), staging)
        link(obj, staging / LIBRARY, SYMBOL, entry=job.entry, arch=job.arch, key=job.key,
             runtime=runtime.path / rec[0])
        obj.unlink()
        return {
            "kernel": job.kernel,
            "variant": job.variant.id,
            "params": dict(job.variant.params),
            "arch": job.arch,
            "entry": job.entry,
            "args": args_to_json(job.variant.args),
            "backward": job.backward,
            "library": LIBRARY,
            "symbol": SYMBOL,
            "runtime": {"key": runtime.key, "library": rec[0], "sha256": rec[1], "size": rec[2]},
            "toolchain": now,
            "key_inputs": job.key_inputs,
            "sources": list(job.sources),
            "built_at": now_iso(),
            "build_seconds": round(time.perf_counter() - t0, 3),
        }

    try:
        entry, built = store.publish(job.key, produce)
    except CuteccError as e:
        return Result("failed", time.perf_counter() - t0, e.render())
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRORS:  # a full or read-only cache
            where = f" ({e.filename})" if e.filename else ""
            return Result("failed", time.perf_counter() - t0,
                          f"cannot write the artifact into {store.root}: {e.strerror}{where}")
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return Result("failed", time.perf_counter() - t0,
                      f"{type(e).__name__}: {e}\n{''.join(tb[-6:])}")
    seconds = time.perf_counter() - t0
    pushed = None
    if built and remote is not None and remote.write:
        from cutecc.remote import push_entry

        pushed = push_entry(remote, entry, store)
    return Result("built" if built else "cached", seconds, None, entry.meta, pushed)
