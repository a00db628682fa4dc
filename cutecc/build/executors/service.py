"""The compile service: build workers forked from one process that has imported the DSL.

A spawned worker pays the interpreter's start and the DSL's imports (and torch's, for
kernels that reach it: seconds) before its first compile. The service is one spawned
process per pool (`Service`), set up as a worker is (the manifest's [env], the DSL's target
arch, Ctrl-C left to the build, tied to the build's life, the memory limit), which imports
what a worker needs (`Preload`: the DSL, torch when the pool's kernels reach it, and the
kernels' entry modules that installed libraries provide), then forks a worker per request
(`Service.fork`): a compile then pays only the compile. A cold build starts it before it
plans, from a guess of what the pool will import (`guess`, `cutecc.build.executors.local.prestart`),
and sends it the planned list once planning is done (`Service.ready`), so its imports overlap
planning. The project's own modules are left
to the workers: a module that hangs, crashes or starts processes at import is one entry's
failure, bounded like its compile, never the pool's.

The service stays GPU-blind: it asks no device anything (the entry modules it imports get
the profile's answers without torch being asked whether it has a GPU), and a worker
answers device queries from the hardware profile (`cutecc.toolchain.devicequery`) per compile.
Forking is safe only from a process running one thread, on Linux (a parent-death signal
ties each process to its parent); where the service finds otherwise it says why and the
pool spawns its workers instead (`$CUTECC_WORKERS=spawn` asks for that). A forked worker is
the service's child, not the build's: the service hands the build the worker's end of a
pipe and a descriptor that closes when the worker dies (passed over a Unix socket), and
reports each worker's exit status, so the build stops, times out and names a forked worker
as it does a spawned one (`ForkedWorker` has the part of `multiprocessing.Process` it uses).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import reduction
from pathlib import Path
from typing import Any

from cutecc import settings
from cutecc.build.executors import worker_tree

MODES = ("fork", "spawn")
READY_SECONDS = 600.0  # the most the service's imports may take before the pool spawns instead
FORK_SECONDS = 60.0  # the most a fork may take (a resident service serving another build meanwhile)


def mode() -> tuple[str, str]:
    """("fork" or "spawn", why): `$CUTECC_WORKERS` if set, else fork on Linux."""
    asked = settings.WORKERS.text().lower()
    if asked and asked not in MODES:
        from cutecc.errors import CuteccError

        raise CuteccError(f'"{asked}" is not a worker mode ({", ".join(MODES)})',
                          where=settings.WORKERS.where)
    if asked:
        return asked, settings.WORKERS.where
    if not sys.platform.startswith("linux"):
        return "spawn", f"fork is not safe on {sys.platform}"
    return "fork", "default"


@dataclass(frozen=True)
class Preload:
    """What a worker imports before it says ready, forked or spawned alike (so both kinds
    of worker compile from the same state): the DSL, cutecc's compile side, torch when the
    pool's kernels reach it, then the kernels' entry modules that come from installed
    libraries (quack, FA4: seconds of imports), with the manifest's python_path ahead on
    sys.path and the pool's device answers given, as a compile imports them. The project's
    own modules are left to the compiles: one that hangs, crashes or starts processes at
    import fails its entry alone, within its compile's bounds."""

    modules: tuple[str, ...] = ()
    entries: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()
    device: dict[str, Any] | None = None


NOTHING = Preload()


def _installed_module(entry: str, python_path: tuple[str, ...]) -> str | None:
    """The module of `entry` when an installed library provides it (not the project's)."""
    from cutecc.manifest import split_entry

    module = split_entry(entry)[0].partition(":")[0]
    top = module.split(".")[0]
    local = any((Path(r) / top).exists() or (Path(r) / f"{top}.py").exists() for r in python_path)
    return None if local else module


def _modules(torch: bool) -> tuple[str, ...]:
    return ("cutlass", "cutlass.cute", *(("torch",) if torch else ()), "cutecc.build.compiler",
            "cutecc.build.linker")


def preloads(jobs: list[Any]) -> Preload:
    """The `Preload` of a pool's `jobs` (`cutecc.build.workers.BuildJob`s of one worker kind)."""
    torch = any(j.device is not None or "torch" in (j.key_inputs.get("distributions") or {}) for j in jobs)
    entries: list[str] = []
    for j in jobs:
        module = _installed_module(j.entry, j.python_path)
        if module is not None and module not in entries:
            entries.append(module)
    return Preload(_modules(torch), tuple(entries), jobs[0].python_path if jobs else (),
                   jobs[0].device if jobs else None)


def guess(manifest: Any) -> tuple[str, dict[str, str], Preload] | None:
    """Before planning: the arch, [env] and `Preload` of the first pool planning will most
    likely give `manifest` (`preloads` of its jobs): a kernel from an installed library
    reaches torch when torch is installed, a project's own kernel does not. Its service can
    then import while the build plans (`cutecc.build.executors.local.prestart`); `covers` tells
    whether the guess held. None for a manifest without kernels."""
    from cutecc.toolchain import devicequery

    if not manifest.kernels:
        return None
    first = manifest.kernels[0]
    if not first.archs:
        return None
    arch = first.archs[0]
    path = tuple(str(p) for p in manifest.python_path)
    torch = importlib.util.find_spec("torch") is not None

    def device(k: Any) -> dict[str, Any] | None:
        if not torch or _installed_module(k.entry, path) is None:
            return None
        return devicequery.answers(dict(k.hardware), arch, k.profile)

    dev = device(first)
    entries: list[str] = []
    for k in manifest.kernels:
        module = _installed_module(k.entry, path)
        if arch in k.archs and device(k) == dev and module is not None and module not in entries:
            entries.append(module)
    return arch, manifest.env_for(arch), Preload(_modules(dev is not None), tuple(entries), path, dev)


def covers(final: Preload, guessed: Preload) -> bool:
    """Whether a service that imported `guessed` can serve a pool of `final`: the same path
    and device answers, nothing imported that `final` does not name (the rest it imports
    before it says ready)."""
    return (guessed.python_path == final.python_path and guessed.device == final.device
            and set(guessed.modules) <= set(final.modules) and set(guessed.entries) <= set(final.entries))


def preload(what: Preload) -> None:
    """Import what `what` names; a module that fails is left for the compile that needs it
    to report. What the imports made then leaves the cyclic collector's care (`gc.freeze`):
    it lives as long as the worker, and each full collection during a compile would walk
    it all (~440,000 objects with torch and quack; ~5% of a compile's CPU)."""
    for m in what.modules:
        with contextlib.suppress(Exception):
            importlib.import_module(m)
    if what.entries:
        from cutecc.plan.keyed_sources import front
        from cutecc.toolchain import devicequery

        front(what.python_path)  # as `cutecc.build.compiler.compile_to_object` puts them
        with devicequery.answering(what.device, probe=False):
            for m in what.entries:
                with contextlib.suppress(Exception):
                    importlib.import_module(m)
    from cutecc.build import read_set

    read_set.prepare()  # which installed file is whose, what is exempt: forked workers inherit it
    gc.collect()
    gc.freeze()


class ServiceGone(Exception):
    """The service died or refused to fork; the pool spawns its workers instead."""


class Service:
    """The build's end of one compile service (see the module docstring)."""

    def __init__(self, ctx: Any, setup: Callable[..., None], setup_args: tuple[Any, ...],
                 serve: Callable[..., None], memory: int | None, modules: Preload) -> None:
        self.conn, theirs = ctx.Pipe()
        self.token = secrets.token_hex(8)
        self.proc = ctx.Process(target=_main, args=(theirs, setup, setup_args, serve, memory, modules,
                                                    self.token))
        self.proc.start()
        theirs.close()
        self.exits: dict[int, int] = {}
        self.asked = self.is_ready = False

    def ready(self, timeout: float = READY_SECONDS, final: Preload = NOTHING) -> str | None:
        """Have the service import `final` too (after what it was started with), and wait
        for its imports: None once it can fork, else why it cannot."""
        deadline = time.monotonic() + timeout
        if not self.asked:
            self.asked = True
            with contextlib.suppress(OSError):  # a dead service is told below
                self.conn.send(final)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                return f"the compile service's imports took over {timeout:g} s"
            multiprocessing.connection.wait([self.conn, self.proc.sentinel], left)
            try:
                if self.conn.poll():
                    msg = self.conn.recv()
                    if msg == "ready":
                        self.is_ready = True
                        return None
                    self.close()
                    return str(msg)
            except (EOFError, OSError):
                pass
            if not self.proc.is_alive():
                self.close()
                return f"the compile service died starting (exit status {self.proc.exitcode})"

    def fork(self, token: str) -> ForkedWorker:
        """A new worker, marked `token`; ServiceGone if the service cannot."""
        try:
            self.conn.send(token)
            while True:
                if not self.conn.poll(FORK_SECONDS):
                    raise ServiceGone(f"the compile service did not fork a worker in {FORK_SECONDS:g} s")
                msg = self.conn.recv()
                if msg[0] == "exit":
                    self.exits[msg[1]] = msg[2]
                    continue
                break
            if msg[0] != "forked":
                raise ServiceGone(str(msg))
            with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                job_fd, dead_fd = reduction.recvfds(s, 2)
        except (EOFError, OSError, RuntimeError) as e:
            raise ServiceGone(f"the compile service is gone ({e})") from None
        return ForkedWorker(self, msg[1], multiprocessing.connection.Connection(job_fd), dead_fd)

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """Worker `pid`'s exit status (negative: the signal), once the service reported it."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            left = deadline - time.monotonic()
            try:
                if not self.conn.poll(max(0.0, left)):
                    return None
                msg = self.conn.recv()
            except (EOFError, OSError):
                return None
            if msg[0] == "exit":
                self.exits[msg[1]] = msg[2]
        return self.exits[pid]

    def close(self) -> None:
        """Stop the service (its workers die with it: their parent-death signal); one still
        importing is killed at once."""
        with contextlib.suppress(Exception):
            self.conn.send(None)
        if self.is_ready:
            self.proc.join(2)
        worker_tree.stop(self.proc, self.token, self.conn)


class ForkedWorker:
    """A worker the service forked, seen from the build: what `multiprocessing.Process`
    offers that the pool uses (pid, sentinel, is_alive, kill, join, exitcode, close)."""

    def __init__(self, service: Service, pid: int, conn: Any, dead_fd: int) -> None:
        self.service, self.pid, self.conn, self.sentinel = service, pid, conn, dead_fd
        self._code: int | None = None

    def is_alive(self) -> bool:
        return self.sentinel >= 0 and not multiprocessing.connection.wait([self.sentinel], 0)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        t0 = time.monotonic()
        if self.sentinel >= 0:
            multiprocessing.connection.wait([self.sentinel], timeout)
        if not self.is_alive() and self._code is None:
            left = 5.0 if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
            self._code = self.service.exit_code(self.pid, max(left, 1.0))

    @property
    def exitcode(self) -> int | None:
        if self._code is None and not self.is_alive():
            self._code = self.service.exit_code(self.pid, 1.0)
        return self._code

    def close(self) -> None:
        if self.sentinel >= 0:
            with contextlib.suppress(OSError):
                os.close(self.sentinel)
            self.sentinel = -1


def _main(conn: Any, setup: Callable[..., None], setup_args: tuple[Any, ...],
          serve: Callable[..., None], memory: int | None, modules: Preload,
          token: str) -> None:
    """The service: set up as a worker, import `modules` and then the `Preload` the build
    sends (`Service.ready`), then fork a worker per token received (each runs
    `serve(conn, parent, token)`) and report their exits."""
    from cutecc.build import read_set
    from cutecc.build.workers import limit_memory

    read_set.install()  # what it reads from here on, its forked workers inherit
    worker_tree.detach(token)
    setup(*setup_args)
    limit_memory(memory)
    preload(modules)
    try:
        final = conn.recv()
    except (EOFError, OSError):
        final = None
    if final is None:
        quit_now()
    preload(final)
    threads = threading.active_count()
    if threads != 1:
        conn.send(f"fork is not safe: the compile service runs {threads} threads after its imports")
        return
    conn.send("ready")
    while True:
        got = multiprocessing.connection.wait([conn], 0.2)
        _reap(conn)
        if not got:
            continue
        try:
            wtoken = conn.recv()
        except (EOFError, OSError):
            wtoken = None
        if wtoken is None:
            quit_now()
        if fork_worker(conn, serve, wtoken, conn.close) is None:
            return


def fork_worker(conn: Any, serve: Callable[..., None], token: str, let_go: Callable[[], None]) -> int | None:
    """Fork a worker that runs `serve(its end of a pipe, this process's pid, token)` in a
    session of its own, marked `token` (`worker_tree.detach`), after `let_go()` has closed
    what the worker must not hold; hand the build, over `conn`, ("forked", pid), the other
    end of the pipe and a descriptor that closes when the worker dies. The worker's pid, or
    None when `conn` failed (the worker then finds its pipe closed and exits)."""
    mine, theirs = multiprocessing.Pipe()
    dead_r, dead_w = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(dead_r)
            mine.close()
            let_go()
            worker_tree.detach(token)  # a session of its own, its mark for what it starts
            serve(theirs, me, token)
            code = 0
        finally:
            os._exit(code)
    os.close(dead_w)
    theirs.close()
    try:
        conn.send(("forked", pid))
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
            reduction.sendfds(s, [mine.fileno(), dead_r])
        return pid
    except OSError:
        return None
    finally:
        mine.close()
        os.close(dead_r)


def quit_now() -> None:
    """Exit at once, output flushed: a process that imported the DSL and torch spends a
    second or more tearing them down at a normal exit, which the build would wait for; its
    files are all written and closed by then."""
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(0)


def _reap(conn: Any) -> None:
    """Report each worker that exited: ("exit", pid, status; negative: the signal)."""
    for pid, code in exited():
        with contextlib.suppress(OSError):
            conn.send(("exit", pid, code))


def exited() -> Iterator[tuple[int, int]]:
    """(pid, exit status; negative: the signal) of each child that has exited, reaped."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)
