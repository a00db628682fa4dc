"""The local executor: this machine's process pools, one per arch.

The DSL fixes its target arch when it is imported (`CUTE_DSL_ARCH`), so misses are
compiled in one pool of processes per arch (and per set of device answers), the arch given
to the pool once, at start. The pool's workers are forked from a compile service that has
imported the DSL (torch and installed libraries' entry modules, when the kernels reach
them) once, so a compile pays only the compile; where forking is unsafe they are spawned,
and import the same before their first job (`cutecc.build.executors.service`; each result names
which). Each worker runs `workers.build_one` for one job at a time: it publishes its
entry into the store under the key's lock, and returns the entry's metadata. Each compile
is bounded (`workers.Limits`): a worker whose job runs past the time limit is killed and
replaced, and one under a memory limit has its data segment capped (RLIMIT_DATA), so a
runaway kernel fails alone. A worker runs in a session of its own and marks what it
starts, so stopping it stops every process its compile started, detached ones included
(`cutecc.build.executors.worker_tree`). `LocalExecutor` is this module behind
`cutecc.build.executors.Executor`, the protocol the build pipeline takes.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc.build.executors import service, worker_process, worker_tree
from cutecc.build.executors.preload import NOTHING, Preload, covers, guess, preloads
from cutecc.build.workers import (
    DEFAULT_LIMITS,
    BuildJob,
    Limits,
    Result,
    died_error,
    stopped_error,
    with_startup,
)
from cutecc.store.writer import Store

if TYPE_CHECKING:
    from cutecc.ship.remote import RemoteConfig


@dataclass(frozen=True)
class LocalExecutor:
    """This machine's process pools (`compile_all`), each compile within `limits`."""

    limits: Limits = DEFAULT_LIMITS
    kind: str = field(default="local", init=False)

    def compile_all(self, jobs: list[BuildJob], store_root: Path, workers: int,
                    on_result: Callable[[BuildJob, Result], None],
                    remote: RemoteConfig | None = None) -> None:
        """Build every job in pools of up to `workers` processes; `on_result` sees each as it
        finishes, in this process."""
        compile_all(jobs, store_root, workers, on_result, remote=remote, limits=self.limits)


def compile_all(jobs: list[BuildJob], store_root: Path, workers: int,
                on_result: Callable[[BuildJob, Result], None],
                remote: RemoteConfig | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
    """Build every job, one pool of workers per arch (and per set of device answers:
    libraries cache what they asked), forked from a compile service where that is safe,
    else spawned (`cutecc.build.executors.service`); `on_result` sees each as it finishes. With a
    writable `remote`, each worker uploads what it built. A compile past `limits.seconds` has
    its worker killed and replaced (what it staged is swept, never published) and is reported
    failed; so is one whose worker dies."""
    by_kind: dict[str, list[BuildJob]] = {}
    for j in jobs:
        by_kind.setdefault(j.worker_kind, []).append(j)
    for items in by_kind.values():
        _Pool(items[0].arch, max(1, min(workers, len(items))), dict(items[0].env), limits,
              preloads(items)).run(items, store_root, remote, on_result)


@dataclass
class _Slot:
    """One worker process, its end of the pipe, and the job it compiles (with its start)."""

    proc: Any
    conn: Any
    token: str  # the mark of what its compiles start (`worker_tree`)
    kind: str  # how it started: "fork", or "spawn (why)"
    asked: float = 0.0  # when its start was asked for
    startup: float | None = None  # seconds from then to ready, until its first result names it
    ready: bool = False
    job: BuildJob | None = None
    started: float = 0.0


class _Pool:
    """Worker processes for one arch, each fed one job at a time over a pipe, so a job past
    its time limit can be stopped by killing its worker alone and the slot refilled (a
    ProcessPoolExecutor breaks as a whole when one of its workers is killed). Workers are
    forked from a compile service (`service`) or, where that is unsafe, spawned; `worker`
    says which, and why not fork."""

    MAX_FAILED_STARTS = 3  # workers that died before taking any job: the rest fail

    def __init__(self, arch: str, n: int, env: dict[str, str], limits: Limits,
                 modules: Preload = NOTHING) -> None:
        self.arch, self.n, self.env, self.limits, self.modules = arch, n, env, limits, modules
        self.ctx = multiprocessing.get_context("spawn")
        self.slots: list[Any] = []
        self.failed_starts = 0
        self.store_root = Path()
        self.service: service.Service | None = None
        self.worker = "spawn"

    def _start_service(self) -> None:
        """Connect to (or start) the compile service, or adopt the one `prestart` started if
        it fits, if forking is asked for and safe; else say why not. A resident service that
        does not fit or retired is replaced by a fresh one, and one that cannot start by a
        service of this build's own (idle 0)."""
        how, why = service.mode()
        if how != "fork":
            self.worker = f"spawn ({why})"
            return
        svc = _adopt(self.arch, self.env, self.limits.memory, self.modules)
        problem: str | None = "not started"
        keep = True
        for _ in range(3):
            if svc is None:
                svc = _open_service(self.arch, self.env, self.limits.memory, self.modules, keep=keep)
            problem = svc.ready(final=self.modules)  # a Ctrl-C meanwhile stops the pool (and the service)
            if problem is None:
                break
            svc.close()
            if svc.idle <= 0:
                break
            # a retired service or one of the guess: a fresh resident one; else one of this build's own
            keep = problem.startswith((service.RETIRED, service.OTHER_MODULES))
            svc = None
        if problem is None and svc is not None:
            self.service = svc
            self.worker = "fork (resident)" if svc.idle > 0 else "fork"
        else:
            self.service, self.worker = None, f"spawn ({problem})"

    def _spawn(self) -> _Slot:
        token = secrets.token_hex(8)
        if self.service is not None:
            try:
                with _sigint_held_while_spawning():
                    forked = self.service.fork(token)
                return _Slot(forked, forked.conn, token, self.worker, time.monotonic())
            except service.ServiceGone as e:
                self.service.close()
                self.service, self.worker = None, f"spawn ({e})"
        mine, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker_process.serve_spawned,
                                args=(theirs, self.arch, os.getpid(), self.env, self.limits.memory, token,
                                      self.modules))
        asked = time.monotonic()
        with _sigint_held_while_spawning():  # workers start with Ctrl-C blocked
            proc.start()
        theirs.close()
        return _Slot(proc, mine, token, self.worker, asked)

    def run(self, jobs: list[BuildJob], store_root: Path, remote: RemoteConfig | None,
            on_result: Callable[[BuildJob, Result], None]) -> None:
        queue = collections.deque(jobs)
        self.store_root = store_root
        try:
            t0 = time.monotonic()
            self._start_service()
            self.slots = [self._spawn() for _ in range(self.n)]
            for s in self.slots:  # the first workers' start includes the service's
                s.asked = t0
            while queue or any(s.job for s in self.slots):
                for s in self.slots:
                    if s.ready and s.job is None and queue:
                        s.job, s.started = queue.popleft(), time.monotonic()
                        s.conn.send((s.job, str(store_root), remote))
                for s, result in self._wait(refill=bool(queue)):
                    job, s.job = s.job, None
                    if job is not None and result is not None:
                        startup, s.startup = s.startup, None
                        on_result(job, with_startup(result, s.kind, startup))
                if queue and not self.slots:
                    for job in queue:
                        on_result(job, Result("failed", 0.0, "build workers could not start "
                                              f"({self.failed_starts} died before taking a job)",
                                              worker=self.worker))
                    queue.clear()
        finally:  # done, Ctrl-C, or the caller's callback failed: no worker outlives the pool
            for s in self.slots:
                with contextlib.suppress(Exception):
                    s.conn.send(None)
            for s in self.slots:
                s.proc.join(5 if s.job is None else 0)
                _kill(s)
            if self.service is not None:
                self.service.close()

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
                s.ready, s.startup = True, time.monotonic() - s.asked
            elif isinstance(msg, Result):
                out.append((s, msg))
            elif msg == "dead" or (s.job is not None and limit and time.monotonic() - s.started >= limit):
                stopped = msg != "dead"
                _kill(s)
                if s.job is not None:
                    why = stopped_error(self.limits) if stopped else died_error(s.proc.exitcode, self.limits)
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


# services started before planning (`prestart`): (arch, env, memory limit, what it imports, it)
_PRESTARTED: list[tuple[str, dict[str, str], int | None, Preload, service.Service]] = []


def prestart(manifest: Any, limits: Limits = DEFAULT_LIMITS) -> bool:
    """Start the compile service of the first pool `manifest` will most likely need
    (`preload.guess`) now, so that its imports (the DSL, torch, installed libraries:
    seconds) run while the build plans (seconds too, when cold). The pool adopts it if
    planning agreed with the guess (`preload.covers`); `discard_prestarted` stops it
    otherwise. Only where workers fork; whether one was started."""
    if _PRESTARTED or service.mode()[0] != "fork":
        return False
    guessed = guess(manifest)
    if guessed is None:
        return False
    arch, env, modules = guessed
    _PRESTARTED.append((arch, env, limits.memory, modules, _open_service(arch, env, limits.memory, modules)))
    return True


def _open_service(arch: str, env: dict[str, str], memory: int | None, modules: Preload,
                  keep: bool = True) -> service.Service:
    """A session with the resident compile service of this state, when services are kept
    (`service.idle_seconds`) and `keep`; else with a service of this build's own (idle 0)."""
    idle = service.idle_seconds() if keep else 0.0
    if idle > 0:
        with contextlib.suppress(service.ServiceGone):
            return service.Service(arch, env, memory, modules, idle)
    return service.Service(arch, env, memory, modules, 0.0)


def discard_prestarted() -> None:
    """Stop the services `prestart` started that no pool adopted."""
    while _PRESTARTED:
        _PRESTARTED.pop()[-1].close()


def _adopt(arch: str, env: dict[str, str], memory: int | None,
           final: Preload) -> service.Service | None:
    for i, (a, e, m, guessed, svc) in enumerate(_PRESTARTED):
        if (a, e, m) == (arch, env, memory) and covers(final, guessed):
            del _PRESTARTED[i]
            return svc
    return None


def _kill(s: _Slot) -> None:
    """Stop a worker and every process its compiles started (`worker_tree`)."""
    worker_tree.stop(s.proc, s.token, s.conn)
    if isinstance(s.proc, service.ForkedWorker):
        s.proc.close()


@contextlib.contextmanager
def _sigint_held_while_spawning() -> Iterator[None]:
    """Ignore SIGINT while a worker is spawned, and block it too: an ignored signal stays
    ignored across exec, so a Ctrl-C during the worker's start-up (before `worker_process.init_worker`)
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
