"""The compile service, from the build's end: workers forked from one process that imported the DSL.

A spawned worker pays the interpreter's start and the DSL's imports (torch's too: seconds)
before its first compile. A compile service is set up as a worker is (the [env], the arch,
the memory limit), imports its `Preload` once, and forks a worker per request
(`Service.fork`): a compile then pays only the compile. One service, one lifecycle
(`service_process` runs it); only how long it waits for the next build differs
(`idle_seconds`):

- **idle 0** (`$CUTECC_SERVICE_IDLE=0`, or under CI): this build's own, its child, tied to
  its life over a socket pair; it imports what planning named on top of the guess it was
  started with (`Service.ready`) and exits when the build's session ends.
- **resident** (idle > 0): detached, listening on a socket named by a SHA-256 of everything
  that decides what it imported and how its workers compile (`state_key`), in a directory
  only this user can enter (`socket_dir`), so the next build of that state forks from it at
  once; it retires when a file it read changed. At most `most_services()` live per user: a
  new one retires the least recently used.

A forked worker runs one build's jobs with that build's stdout and stderr and dies with its
session; the build gets the worker's end of a pipe, a descriptor that closes when it dies
and its exit status, so it stops, times out and names a forked worker as a spawned one
(`ForkedWorker`). Forking is safe only from a process running one thread, on Linux; where
the service finds otherwise the pool spawns its workers (`$CUTECC_WORKERS=spawn` asks so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing.connection
import os
import pickle
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from multiprocessing import reduction
from pathlib import Path
from typing import Any

from cutecc import settings
from cutecc.build.executors import worker_tree
from cutecc.build.executors.preload import NOTHING, Preload
from cutecc.store import homes

MODES = ("fork", "spawn")
READY_SECONDS = 600.0  # the most the service's imports may take before the pool spawns instead
FORK_SECONDS = 60.0  # the most a fork may take (a resident service serving another build meanwhile)
HELLO_SECONDS = 30.0  # the most a connected resident service may take to check its stamps
IDLE_SECONDS = 300.0  # how long a resident service waits for the next build by default
MOST_SERVICES = 2  # resident services per user by default (each holds its imports' memory)
STATE_VERSION = 1  # what `state_key` covers: bumped with it
# Variables no worker reads: the build's own (where it remembers planning, how long the service
# stays, how many stay) and a shell's bookkeeping. Every other one names the state, whatever it is.
NOT_STATE = frozenset({settings.PLAN_MEMORY.env, settings.SERVICE_IDLE.env, settings.SERVICE_MAX.env, "_",
                       "OLDPWD", "SHLVL", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SSH_CONNECTION", "SSH_CLIENT",
                       "SSH_TTY", "TMUX_PANE", "WINDOWID"})
OTHER_MODULES = "it imported other modules"  # a resident service of the guess, not of the plan
RETIRED = "the resident compile service retired"  # what a stale one answers
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (Linux's sun_path, less its NUL)


def idle_seconds() -> float:
    """`$CUTECC_SERVICE_IDLE`: seconds a resident service waits for another build (0: the
    service is the build's own). Unset: `IDLE_SECONDS`, but 0 under CI (`$CI` set, as CI
    services set it): a CI job is one build on a fresh machine, and what it leaves running
    only holds memory."""
    raw = settings.SERVICE_IDLE.text().lower()
    if not raw:
        return 0.0 if settings.switch("CI") else IDLE_SECONDS
    if raw in ("0", "off", "no", "false"):
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 7 * 86400:
        from cutecc.errors import CuteccError

        raise CuteccError(f'"{raw}" is not a number of seconds from 0 to 604800 (0 or off: no service '
                          "is kept between builds)", where=settings.SERVICE_IDLE.where)
    return seconds


def most_services() -> int:
    """`$CUTECC_SERVICE_MAX`: how many resident services this user keeps at once (default
    `MOST_SERVICES`); a new one retires the least recently used beyond it."""
    raw = settings.SERVICE_MAX.text()
    if not raw:
        return MOST_SERVICES
    if not (raw.isdigit() and 1 <= int(raw) <= 64):
        from cutecc.errors import CuteccError

        raise CuteccError(f'"{raw}" is not a number of resident compile services from 1 to 64 '
                          f"({settings.SERVICE_IDLE.env}=0: none is kept)", where=settings.SERVICE_MAX.where)
    return int(raw)


def socket_dir(create: bool = True) -> Path | None:
    """This user's directory of resident services' sockets (the `services` home,
    `cutecc.store.homes.services`; created 0700 with `create`), or None where none can be
    trusted (owned by another user, or others may enter it)."""
    if create:
        d, why = homes.make(homes.SERVICES)
    else:
        d = homes.path_of(homes.SERVICES)
        why = None if d is None else homes.why_not_mine(d, private=True)
    if d is None or why is not None:
        return None
    return d if len(os.fsencode(d)) <= SOCKET_PATH_MAX - 50 else None  # a socket's path is short


def _umask() -> str:
    """This process's umask, read without setting it (other threads may create files)."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return line.split()[1]
    return "unknown"


def _interpreter_flags() -> list[str]:
    """The command-line options this interpreter runs with (-O, -W, -X, -I, -S, ...), as the
    service must be started with them."""
    args = getattr(subprocess, "_args_from_interpreter_flags", None)
    return list(args()) if args else []


def state_key(arch: str, env: dict[str, str], memory: int | None, modules: Preload) -> str:
    """The SHA-256 naming the resident service of this process's state (module docstring)."""
    environment = sorted((k, v) for k, v in os.environ.items() if k not in NOT_STATE)
    doc = [STATE_VERSION, sys.executable, sys.version, _interpreter_flags(), repr(sys.flags),
           sys.warnoptions, sorted(sys._xoptions.items()), sys.path, os.getcwd(), environment,
           _umask(), arch, sorted(env.items()), memory, dataclasses.asdict(modules)]
    return hashlib.sha256(json.dumps(doc, default=str, sort_keys=True).encode()).hexdigest()


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


class ServiceGone(Exception):
    """The service died or refused to fork; the pool spawns its workers instead."""


class Service:
    """The build's end of a compile service (module docstring): with `idle` > 0 connected to
    the live resident one of its state, else one started now, detached; with `idle` 0 this
    build's own, started now as its child. Ready once its imports are done (`ready`)."""

    def __init__(self, arch: str, env: dict[str, str], memory: int | None, modules: Preload,
                 idle: float) -> None:
        self.modules, self.idle = modules, idle
        self.key = state_key(arch, env, memory, modules)
        self.exits: dict[int, int] = {}
        self.is_ready = False
        self.proc: subprocess.Popen[bytes] | None = None  # this build's own service (idle 0)
        self.started: Any = None  # the pipe a service started here says "ready" on
        self.conn: Any = None
        self.pair: socket.socket | None = None  # idle 0: this build's end, until connected
        self.path: Path | None = None
        self.how = "kept"
        if idle > 0:
            d = socket_dir()
            if d is None:
                raise ServiceGone("no private directory for its socket, or its path is too long")
            self.path = d / f"{self.key[:32]}.sock"
            if self._connect() is None:
                return
        self.how = "started"
        self._start(arch, env, memory)

    def _start(self, arch: str, env: dict[str, str], memory: int | None) -> None:
        """Start the service: resident, forked once more at once so that it is not the
        build's child (it outlives it); else the build's child, tied to its life. It says
        "ready" or why not on a pipe of its own (`started`)."""
        self.token = secrets.token_hex(8)
        spec = {"key": self.key, "path": str(self.path or ""), "arch": arch, "env": env, "memory": memory,
                "modules": dataclasses.asdict(self.modules), "idle": self.idle, "sys_path": list(sys.path),
                "most": most_services() if self.idle > 0 else 0, "parent": os.getpid(), "token": self.token}
        told, tell = os.pipe()
        spec["tell"], fds = tell, [tell]
        if self.idle <= 0:
            self.pair, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            spec["conn"] = theirs.fileno()
            fds.append(theirs.fileno())
        kind = "resident" if self.idle > 0 else "build"
        code = ("import os, pickle, sys; spec = pickle.load(sys.stdin.buffer); "
                "sys.argv[1] == 'resident' and os.fork() and os._exit(0); sys.path[:] = spec['sys_path']; "
                "from cutecc.build import read_set; read_set.install(); "  # (its first import recorded)
                "from cutecc.build.executors.service_process import main; main(spec)")
        quiet = subprocess.DEVNULL if self.idle > 0 else None  # a resident one holds no pipe of the build
        try:
            proc = subprocess.Popen([sys.executable, *_interpreter_flags(), "-c", code, kind],
                                    stdin=subprocess.PIPE, stdout=quiet, stderr=quiet,
                                    start_new_session=True, pass_fds=fds)
        finally:
            os.close(tell)
            if self.idle <= 0:
                theirs.close()
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.close()
        if self.idle > 0:
            proc.wait()  # (the service itself is its child, detached)
        else:
            self.proc = proc
        self.started = os.fdopen(told, "rb")

    def _connect(self, final: Preload | None = None, timeout: float = HELLO_SECONDS) -> str | None:
        """Open this build's session with the service (its own over the socket pair, with the
        `final` imports; a resident one at `path`): None once it is ready, else why not."""
        if self.pair is not None:
            conn = multiprocessing.connection.Connection(self.pair.detach())
            self.pair = None
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(HELLO_SECONDS)
                s.connect(str(self.path))
                s.settimeout(None)
                conn = multiprocessing.connection.Connection(s.detach())
            except OSError as e:
                s.close()
                return f"none is running ({e.strerror or e})"
        try:
            conn.send(("hello", self.key) if final is None else ("hello", self.key, final))
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                reduction.sendfds(raw, [1, 2])  # its workers write where the build writes
            if not conn.poll(timeout):
                raise OSError("no answer")
            answer = conn.recv()
        except (EOFError, OSError) as e:
            conn.close()
            return f"it did not answer ({e})"
        if answer != "ready":
            conn.close()
            return str(answer)
        self.conn, self.is_ready = conn, True
        return None

    def ready(self, timeout: float = READY_SECONDS, final: Preload | None = None) -> str | None:
        """Wait until this build has a session, the service having imported `final` too
        (a resident one must have imported just that): None, else why not."""
        if self.idle > 0 and final not in (None, self.modules):
            return OTHER_MODULES
        if self.is_ready:
            return None
        if self.started is None:
            return "no service"
        deadline = time.monotonic() + timeout
        out, self.started = self.started, None
        if not select.select([out], [], [], timeout)[0]:
            out.close()
            self.close()
            return f"the compile service's imports took over {timeout:g} s"
        said = out.readline().decode(errors="replace").strip()
        out.close()
        if said != "ready":
            self.close()
            return said or "the compile service died starting"
        if self.idle > 0:
            return self._connect()
        return self._connect(final or NOTHING, max(1.0, deadline - time.monotonic()))

    def _recv(self, timeout: float, exit_of: int | None = None) -> Any:
        """The service's next message but an exit status (each recorded in `exits`), or None
        when none came within `timeout`, or as soon as worker `exit_of`'s exit status came."""
        deadline = time.monotonic() + timeout
        while self.conn.poll(max(0.0, deadline - time.monotonic())):
            msg = self.conn.recv()
            if msg[0] != "exit":
                return msg
            self.exits[msg[1]] = msg[2]
            if msg[1] == exit_of:
                return None
        return None

    def fork(self, token: str) -> ForkedWorker:
        """A new worker, marked `token`; ServiceGone if the service cannot."""
        try:
            self.conn.send(token)
            msg = self._recv(FORK_SECONDS)
            if msg is None:
                raise ServiceGone(f"the compile service did not fork a worker in {FORK_SECONDS:g} s")
            if msg[0] != "forked":
                raise ServiceGone(str(msg))
            with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                job_fd, dead_fd = reduction.recvfds(s, 2)
        except (EOFError, OSError, RuntimeError, AttributeError) as e:
            raise ServiceGone(f"the compile service is gone ({e})") from None
        return ForkedWorker(self, msg[1], multiprocessing.connection.Connection(job_fd), dead_fd)

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """Worker `pid`'s exit status (negative: the signal), once the service reported it."""
        with contextlib.suppress(EOFError, OSError, AttributeError):
            deadline = time.monotonic() + timeout
            while pid not in self.exits and time.monotonic() < deadline:
                self._recv(deadline - time.monotonic(), exit_of=pid)
        return self.exits.get(pid)

    def close(self) -> None:
        """End this build's session (the service kills what is left of its workers). A
        resident service stays for the next build (one still importing goes on); this
        build's own exits, and is killed with what it started if it has not in 2 s."""
        if self.conn is not None and not self.conn.closed:  # (closed: a late exit status is "gone")
            with contextlib.suppress(Exception):
                self.conn.send(None)
            with contextlib.suppress(Exception):
                self.conn.close()
        for f in (self.started, self.pair):
            if f is not None:
                f.close()
        self.started = self.pair = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2 if self.is_ready else 0)
            worker_tree.kill_tree(self.proc.pid, self.token)
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait()


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



def listener_pid(path: Path) -> int | None:
    """The pid of the process listening on the socket at `path`, or None (none does)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(str(path))
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", cred)
    except (OSError, struct.error):
        return None
    finally:
        s.close()
    return pid if uid == os.getuid() and pid > 0 else None
