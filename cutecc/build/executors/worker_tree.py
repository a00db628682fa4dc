"""A local build worker and every process its compiles start, stopped together.

A compile may start processes (a DSL helper, a compiler driver, a daemon that detaches).
Stopping a worker at the time limit must take them too, or they outlive the build. The
worker runs in a session and process group of its own (`detach`), so one signal to the
group reaches the children that stayed in it; a child that left the group (`setsid`, a
daemon) still carries the worker's mark in its environment (`WORKER_MARK`, a random token
per worker, inherited unless a process clears its environment), by which `kill_tree`
finds it in /proc. No cgroup, no privilege: only this user's processes are read or signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from cutecc import settings

WORKER_MARK = settings.WORKER_MARK.env  # the mark in what a worker starts

ROUNDS = 3  # scans for marked processes (one may fork while the last is killed)


def detach(token: str) -> None:
    """In a fresh worker: a session of its own, and its mark for what it starts."""
    with contextlib.suppress(OSError):  # already a group leader: keep its group
        os.setsid()
    os.environ[WORKER_MARK] = token


def kill_tree(pid: int, token: str, group: bool = True) -> None:
    """SIGKILL worker `pid`'s process group (with `group`, when `detach` made it its own)
    and every process carrying its mark."""
    with contextlib.suppress(OSError):
        if group and os.getpgid(pid) == pid:  # its own group: never the build's
            os.killpg(pid, signal.SIGKILL)
    for _ in range(ROUNDS):
        marked = _marked(token)
        if not marked:
            return
        for p in marked:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)


def _marked(token: str) -> list[int]:
    """The processes (this user's: others' environments are not readable) whose initial
    environment holds `WORKER_MARK=token`."""
    needle = f"{WORKER_MARK}={token}".encode()
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(d.name))
    return out


def stop(proc: Any, token: str, conn: Any) -> None:
    """Stop a worker process and every process its compiles started (`kill_tree`), then
    close its pipe; each step ignores a worker that is already gone."""
    with contextlib.suppress(Exception):
        kill_tree(proc.pid, token)
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    with contextlib.suppress(Exception):
        conn.close()

