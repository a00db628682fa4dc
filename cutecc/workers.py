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
lock) before any worker needs it. Each compile is bounded (`Limits`): a worker whose job
runs past the time limit is killed and replaced, and one under a memory limit has its
data segment capped (RLIMIT_DATA), so a runaway kernel fails alone.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from cutecc import environ
from cutecc.contract import args_to_json
from cutecc.entry import LIBRARY, library_record, runtime_meta_problem, runtime_soname
from cutecc.errors import CuteccError
from cutecc.key import toolchain, toolchain_platform
from cutecc.manifest import Manifest, Variant
from cutecc.plan import Planned
from cutecc.store import Store
from cutecc.units import human_size, now_iso

if TYPE_CHECKING:
    from cutecc.remote import Pushed, RemoteConfig

# errnos that mean "the cache cannot take the artifact" (not a compile error): no traceback
_STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES,
                             errno.EPERM, errno.EIO})
DEFAULT_COMPILE_TIMEOUT = 3600.0  # seconds one compile may run (FA4-sized ones take ~1 min)
COMPILE_TIMEOUT_VAR, COMPILE_MEMORY_VAR = environ.COMPILE_TIMEOUT, environ.COMPILE_MEMORY
_OUT_OF_MEMORY = ("MemoryError", "Cannot allocate memory", "bad_alloc")
_memory_limit: int | None = None  # this worker's, once `limit_memory` set it


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
    def platform(self) -> str:
        """The host platform of the library's host code (its toolchain names it)."""
        return toolchain_platform(self.key_inputs["toolchain"])

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


class Limits(NamedTuple):
    """What one compile may take: `seconds` of wall time from when its worker takes it, and
    `memory` bytes of data (RLIMIT_DATA: heap and private mappings, what a runaway compile
    grows; not address space, of which the DSL maps ~2.3 times its resident size); None
    is no limit. Chosen by `cutecc.executors.compile_limits`."""

    seconds: float | None = DEFAULT_COMPILE_TIMEOUT
    memory: int | None = None


DEFAULT_LIMITS = Limits()


def stopped_error(limits: Limits) -> str:
    """The error of a compile stopped at the time limit (one line)."""
    return (f"stopped: its compile ran past the {limits.seconds:g} s limit "
            f"(${COMPILE_TIMEOUT_VAR}, [build] compile_timeout, --compile-timeout)")


def died_error(what: str, limits: Limits) -> str:
    """The error of a compile whose worker died (`what`: how), naming the memory limit."""
    hint = (f"; it may have run past the {human_size(limits.memory)} memory limit "
            f"(${COMPILE_MEMORY_VAR})" if limits.memory else "")
    return f"build worker died ({what}){hint}"


def compile_all(jobs: list[BuildJob], store_root: Path, workers: int,
                on_result: Callable[[BuildJob, Result], None],
                remote: RemoteConfig | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
    """Build every job, one pool of spawned processes per arch (and per set of device
    answers: libraries cache what they asked); `on_result` sees each as it finishes. With a
    writable `remote`, each worker uploads what it built. A compile past `limits.seconds` has
    its worker killed and replaced (what it staged is swept, never published) and is reported
    failed; so is one whose worker dies."""
    by_kind: dict[str, list[BuildJob]] = {}
    for j in jobs:
        by_kind.setdefault(j.worker_kind, []).append(j)
    for items in by_kind.values():
        _Pool(items[0].arch, max(1, min(workers, len(items))), dict(items[0].env), limits).run(
            items, store_root, remote, on_result)


@dataclass
class _Slot:
    """One worker process, its end of the pipe, and the job it compiles (with its start)."""

    proc: Any
    conn: Any
    ready: bool = False
    job: BuildJob | None = None
    started: float = 0.0


class _Pool:
    """Spawned worker processes for one arch, each fed one job at a time over a pipe, so a
    job past its time limit can be stopped by killing its worker alone and the slot refilled
    (a ProcessPoolExecutor breaks as a whole when one of its workers is killed)."""

    MAX_FAILED_STARTS = 3  # workers that died before taking any job: the rest fail

    def __init__(self, arch: str, n: int, env: dict[str, str], limits: Limits) -> None:
        self.arch, self.n, self.env, self.limits = arch, n, env, limits
        self.ctx = multiprocessing.get_context("spawn")
        self.slots: list[Any] = []
        self.failed_starts = 0
        self.store_root = Path()

    def _spawn(self) -> _Slot:
        mine, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(theirs, self.arch, os.getpid(), self.env,
                                                     self.limits.memory))
        with _sigint_held_while_spawning():  # workers start with Ctrl-C blocked
            proc.start()
        theirs.close()
        return _Slot(proc, mine)

    def run(self, jobs: list[BuildJob], store_root: Path, remote: RemoteConfig | None,
            on_result: Callable[[BuildJob, Result], None]) -> None:
        queue = collections.deque(jobs)
        self.store_root = store_root
        try:
            self.slots = [self._spawn() for _ in range(self.n)]
            while queue or any(s.job for s in self.slots):
                for s in self.slots:
                    if s.ready and s.job is None and queue:
                        s.job, s.started = queue.popleft(), time.monotonic()
                        s.conn.send((s.job, str(store_root), remote))
                for s, result in self._wait(refill=bool(queue)):
                    job, s.job = s.job, None
                    if job is not None and result is not None:
                        on_result(job, result)
                if queue and not self.slots:
                    for job in queue:
                        on_result(job, Result("failed", 0.0, "build workers could not start "
                                              f"({self.failed_starts} died before taking a job)"))
                    queue.clear()
        finally:  # done, Ctrl-C, or the caller's callback failed: no worker outlives the pool
            for s in self.slots:
                with contextlib.suppress(Exception):
                    s.conn.send(None)
            for s in self.slots:
                s.proc.join(5 if s.job is None else 0)
                _kill(s)

    def _wait(self, refill: bool) -> list[tuple[_Slot, Result | None]]:
        """Wait for a message, a worker's death or the next deadline; what finished. A slot
        whose worker was stopped or died is refilled when `refill` (jobs are waiting)."""
        limit = self.limits.seconds
        busy = [s.started + limit for s in self.slots if s.job is not None and limit]
        timeout = max(0.0, min(busy) - time.monotonic()) if busy else None
        waitables = [s.conn for s in self.slots] + [s.proc.sentinel for s in self.slots]
        multiprocessing.connection.wait(waitables, timeout)
        out: list[tuple[_Slot, Result | None]] = []
        for i, s in enumerate(self.slots):
            msg: Any = "dead"
            with contextlib.suppress(EOFError, OSError):
                if s.conn.poll():
                    msg = s.conn.recv()
                elif s.proc.is_alive():
                    msg = None
            if msg == "ready":
                s.ready = True
            elif isinstance(msg, Result):
                out.append((s, msg))
            elif msg == "dead" or (s.job is not None and limit and time.monotonic() - s.started >= limit):
                stopped = msg != "dead"
                _kill(s)
                if s.job is not None:
                    why = stopped_error(self.limits) if stopped else died_error(_exit_text(s.proc.exitcode),
                                                                                self.limits)
                    out.append((s, Result("failed", time.monotonic() - s.started, why)))
                    with contextlib.suppress(Exception):  # what it staged (its key's lock died with it)
                        Store(self.store_root).sweep_tmp()
                elif not s.ready:
                    self.failed_starts += 1
                # the slot is refilled, so later jobs still run (not after repeated failed starts)
                fresh = refill and (s.job is not None or self.failed_starts < self.MAX_FAILED_STARTS)
                self.slots[i] = self._spawn() if fresh else None
        self.slots = [s for s in self.slots if s is not None]
        return out


def _kill(s: _Slot) -> None:
    with contextlib.suppress(Exception):
        if s.proc.is_alive():
            s.proc.kill()
        s.proc.join(5)
    with contextlib.suppress(Exception):
        s.conn.close()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _serve(conn: Any, arch: str, parent: int, env: dict[str, str], memory: int | None) -> None:
    """A worker: set up once for `arch`, then build each job sent until told to stop."""
    _init_worker(arch, parent, env)
    limit_memory(memory)
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job, store_root, remote = msg
        try:
            result = build_one(job, store_root, remote)
        except BaseException as e:  # MemoryError outside the compile, ...
            result = Result("failed", 0.0, f"{type(e).__name__}: {e}")
        conn.send(result)


def _memory_hint(error: str) -> str:
    """`error`, naming the memory limit when it reads like running out of memory under one."""
    if _memory_limit and any(m in error for m in _OUT_OF_MEMORY):
        return (f"{error}\n  (over the compile memory limit of {human_size(_memory_limit)}: "
                f"${COMPILE_MEMORY_VAR}, [build] compile_memory, --compile-memory)")
    return error


def limit_memory(memory: int | None) -> None:
    """Lower this process's data limit (RLIMIT_DATA) to `memory` bytes; never raise it."""
    global _memory_limit
    if not memory:
        return
    import resource

    _memory_limit = memory
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = memory if hard == resource.RLIM_INFINITY else min(memory, hard)
    if soft == resource.RLIM_INFINITY or cap < soft:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


@contextlib.contextmanager
def _sigint_held_while_spawning() -> Iterator[None]:
    """Ignore SIGINT while a worker is spawned, and block it too: an ignored signal stays
    ignored across exec, so a Ctrl-C during the worker's start-up (before `_init_worker`)
    cannot print a traceback from it; and a blocked one is kept pending even while ignored
    (Linux discards only unblocked ignored signals), so a Ctrl-C at the build meanwhile is
    delivered (KeyboardInterrupt) once the handler is back, never lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _init_worker(arch: str, parent: int, env: dict[str, str] | None = None) -> None:
    """Set the manifest's [env] and the DSL's target (before any import), and tie the
    worker's life to the build's: it dies with its parent (a parent-death signal, and a
    watchdog for where that is not available), and leaves Ctrl-C to the parent, which
    stops the pool itself."""
    from cutecc.compiler import set_target

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # if the spawn left it blocked
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
    now = toolchain(toolchain_platform(planned))
    if now != planned:  # the key would not describe what builds the artifact
        changed = sorted(k for k in {*planned, *now} if planned.get(k) != now.get(k))
        raise CuteccError(f"the toolchain changed after the build was planned ({', '.join(changed)});"
                          " run the build again", where="build", exit_code=1)
    return now


def runtime_platform(key: str) -> str:
    """The platform whose runtime library this toolchain keys `key` (an error if none)."""
    from cutecc.key import runtime_key
    from cutecc.platforms import BUILD_PLATFORM, PLATFORMS

    ours = runtime_key(BUILD_PLATFORM)
    if key == ours:
        return BUILD_PLATFORM
    for name in PLATFORMS:
        try:
            if name != BUILD_PLATFORM and key == runtime_key(name):
                return name
        except CuteccError:  # no pins for this DSL: not that platform's
            continue
    raise CuteccError(f"runtime library {key[:12]} is not this toolchain's ({ours[:12]});"
                      " run the build again", where="build", exit_code=1)


def ensure_runtime(store: Store, key: str) -> tuple[Any, bool]:
    """The runtime library entry of `key` (this toolchain's), linked and published if the
    store lacks it: (entry, built). Its `used` file is touched, so `cutecc gc` keeps it while
    builds use it."""
    from cutecc.linker import link_runtime, runtime_inputs
    from cutecc.store import touch_used

    platform = runtime_platform(key)

    def produce(staging: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        link_runtime(staging, key, platform)
        return {"kind": "runtime", "key_inputs": runtime_inputs(platform), "library": runtime_soname(key),
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
                                           job.python_path, job.device, job.platform), staging)
        link(obj, staging / LIBRARY, SYMBOL, entry=job.entry, arch=job.arch, key=job.key,
             runtime=runtime.path / rec[0], platform=job.platform)
        obj.unlink()
        return {
            "kernel": job.kernel,
            "variant": job.variant.id,
            "params": dict(job.variant.params),
            "arch": job.arch,
            "platform": job.platform,
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
        return Result("failed", time.perf_counter() - t0, _memory_hint(e.render()))
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRORS:  # a full or read-only cache
            where = f" ({e.filename})" if e.filename else ""
            return Result("failed", time.perf_counter() - t0,
                          f"cannot write the artifact into {store.root}: {e.strerror}{where}")
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return Result("failed", time.perf_counter() - t0,
                      _memory_hint(f"{type(e).__name__}: {e}\n{''.join(tb[-6:])}"))
    seconds = time.perf_counter() - t0
    pushed = None
    if built and remote is not None and remote.write:
        from cutecc.remote import push_entry

        pushed = push_entry(remote, entry, store)
    return Result("built" if built else "cached", seconds, None, entry.meta, pushed)
