"""What a local build worker process runs: its set-up (the manifest's [env], the DSL's
target arch, Ctrl-C left to the build, its life tied to its parent's) and its job loop,
spawned (`serve_spawned`) or forked from a compile service (`serve_forked`; the service is
set up as a spawned worker is, `set_up`). Shared by `cutecc.build.executors.local`, which runs the pools,
and `cutecc.build.executors.service_process`, which forks workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from cutecc.build import read_set
from cutecc.build.executors import worker_tree
from cutecc.build.executors.preload import NOTHING, Preload, preload
from cutecc.build.workers import Result, build_one, limit_memory


def serve_spawned(conn: Any, arch: str, parent: int, env: dict[str, str], memory: int | None,
                  token: str = "", modules: Preload = NOTHING) -> None:
    """A spawned worker: `set_up` as a compile service is, then build each job sent until
    told to stop."""
    set_up(arch, parent, env, memory, token, modules)
    jobs(conn)
    quit_now()


def set_up(arch: str, parent: int | None, env: dict[str, str], memory: int | None, token: str,
           modules: Preload, watchdog: bool = True) -> None:
    """Record what this process reads from here on (`cutecc.build.read_set`), give it a
    session of its own marking what it starts with `token` (if any, `worker_tree.detach`),
    `init_worker`, limit its memory, import `modules` (what a forked worker has)."""
    read_set.install()
    if token:
        worker_tree.detach(token)
    init_worker(arch, parent, env, watchdog)
    limit_memory(memory)
    preload(modules)


def serve_forked(conn: Any, parent: int, token: str) -> None:
    """A worker forked by the compile service (set up and imported there; the service gave
    it a session of its own and its mark, `token`): tied to the service's life, then as
    `serve_spawned`."""
    tie_to(parent)
    jobs(conn)


def jobs(conn: Any) -> None:
    """Say ready, then build each job sent until told to stop."""
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


def init_worker(arch: str, parent: int | None, env: dict[str, str] | None = None,
                 watchdog: bool = True) -> None:
    """Set the manifest's [env] and the DSL's target (before any import), and tie the
    worker's life to the build's (`tie_to`; without `watchdog`, the compile service's
    case, by the parent-death signal alone: it must stay one thread to fork), and leave
    Ctrl-C to the parent, which stops the pool itself."""
    from cutecc.build.compiler import set_target

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # if the spawn left it blocked
    if parent is not None:  # None: a resident service, which outlives its build
        tie_to(parent, watchdog)
    os.environ.update(env or {})
    set_target(arch)


def tie_to(parent: int, watchdog: bool = True) -> None:
    """Die with `parent`: a parent-death signal (cleared by fork, so armed again in each
    process), and a watchdog thread for where that is not available."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if watchdog:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)




def quit_now() -> None:
    """Exit at once, output flushed: a process that imported the DSL and torch spends a
    second or more tearing them down at a normal exit, which the build would wait for; its
    files are all written and closed by then."""
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(0)
