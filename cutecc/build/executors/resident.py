"""The resident compile service: the compile service kept between builds.

A per-build compile service (`cutecc.build.executors.service`) pays the DSL's, torch's and
the installed libraries' imports once per build: seconds, more than all the compiles of a
small rebuild. A resident service is the same process kept alive after its build, for
`$CUTECC_SERVICE_IDLE` seconds (default `IDLE_SECONDS`; 0 or off: one service per build, as
before) with no build connected, so the next build forks its workers from it at once.

- **One per state.** Its name is a SHA-256 (`state_key`) over everything that decides
  what it imported and how its workers compile: the interpreter, its version, its flags
  (-O, -W, -X, -I, -S: it is started with them) and `sys.path`, the working directory, the
  environment (less `NOT_STATE`: the build's own planning and idle settings, a shell's and
  make's bookkeeping) and umask, the manifest's [env], the target arch, the memory limit
  and the `Preload`. A build whose state differs starts its own.
- **Not stale.** After its imports it stamps (size, mtime, ctime, inode, device) every
  module file it loaded and every shared library mapped into it, and refuses to serve if
  one changed while it imported or was replaced after it was mapped. Before each build
  connects and before each worker it forks, the stamps are checked again: one that changed
  (an edited or reinstalled package, a new cutecc) retires it (the build connected spawns
  its remaining workers, the next build starts a fresh service). Data files its imports
  read are not stamped. The project's own modules are never imported there (`Preload`):
  each forked worker imports them from disk.
- **Private.** Its socket lies in a directory only this user can enter
  (`socket_dir`; `$XDG_RUNTIME_DIR` when set), and it serves only this user's processes
  (the peer's credentials).
- **Bounded as before.** A forked worker runs each job for one build (a session, one
  connection) with that build's stdout and stderr, and dies with the build: when the
  connection closes (the build ended, crashed or was killed) the service kills every
  worker of that session and what they started (`worker_tree`). Time and memory limits,
  Ctrl-C and exit statuses work as with a per-build service (`service.ForkedWorker`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing.connection
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from multiprocessing import reduction
from pathlib import Path
from typing import Any, NoReturn

from cutecc import settings
from cutecc.build.executors import service, worker_tree
from cutecc.store import homes
from cutecc.toolchain.hashcache import path_stamp

IDLE_SECONDS = 300.0  # how long a resident service waits for the next build by default
STATE_VERSION = 1  # what `state_key` covers: bumped with it
HELLO_SECONDS = 30.0  # the most a connected service may take to check its stamps
# Variables no worker reads: the build's own (where it remembers planning, how long the service
# stays) and a shell's bookkeeping. Every other one names the state, whatever it is.
NOT_STATE = frozenset({settings.PLAN_MEMORY.env, settings.SERVICE_IDLE.env, "_", "OLDPWD", "SHLVL",
                       "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY",
                       "TMUX_PANE", "WINDOWID"})
START_SECONDS = service.READY_SECONDS  # the most a resident service's start-up (its imports) may take
OTHER_MODULES = "it imported other modules"  # a service of the guess, not of the plan
RETIRED = "the resident compile service retired"  # what a stale one answers
NEVER = [-1]  # a stamp no file has
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (Linux's sun_path, less its NUL)


def idle_seconds() -> float:
    """`$CUTECC_SERVICE_IDLE`: seconds a resident service waits for another build (0: none
    is kept). Unset: `IDLE_SECONDS`, but none under CI (`$CI` set, as CI services set it): a
    CI job is one build on a fresh machine, and what it leaves running only holds memory."""
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


def socket_dir() -> Path | None:
    """This user's directory of resident services' sockets (created 0700; the `services`
    home, `cutecc.store.homes.services`), or None where none can be trusted (owned by
    another user, or others may enter it)."""
    d, why = homes.make(homes.SERVICES)
    if d is None or why is not None:
        return None
    return d if len(os.fsencode(d)) <= SOCKET_PATH_MAX - 50 else None  # a socket's path is short


def _socket_dir() -> Path:
    d = socket_dir()
    if d is None:
        raise service.ServiceGone("no private directory for its socket, or its path is too long")
    return d


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


def state_key(arch: str, env: dict[str, str], memory: int | None, modules: service.Preload) -> str:
    """The SHA-256 naming the resident service of this process's state (module docstring)."""
    environment = sorted((k, v) for k, v in os.environ.items() if k not in NOT_STATE)
    doc = [STATE_VERSION, sys.executable, sys.version, _interpreter_flags(), repr(sys.flags),
           sys.warnoptions, sorted(sys._xoptions.items()), sys.path, os.getcwd(), environment,
           _umask(), arch, sorted(env.items()), memory, dataclasses.asdict(modules)]
    return hashlib.sha256(json.dumps(doc, default=str, sort_keys=True).encode()).hexdigest()


class ResidentService(service.Service):
    """The build's end of a resident service: connected to a live one of its state, else
    one started now (detached from the build) and connected once its imports are done
    (`ready`). Forks, exit statuses and the stop of a session are `service.Service`'s."""

    def __init__(self, arch: str, env: dict[str, str], memory: int | None, modules: service.Preload,
                 idle: float) -> None:
        self.modules = modules
        self.key = state_key(arch, env, memory, modules)
        self.path = _socket_dir() / f"{self.key[:32]}.sock"
        self.exits: dict[int, int] = {}
        self.asked = self.is_ready = False
        self.proc: Any = None
        self.started: Any = None  # the pipe a service started here says "ready" on
        self.conn: Any = None
        self.how = "kept"
        if self._connect() is None:
            return
        self.how = "started"
        spec = {"key": self.key, "path": str(self.path), "arch": arch, "env": env, "memory": memory,
                "modules": dataclasses.asdict(modules), "idle": idle, "sys_path": list(sys.path)}
        # (forked once more at once, so the service is not the build's child: it outlives it;
        # it says "ready" or why not on a pipe of its own, `tell`)
        code = ("import os; os.fork() and os._exit(0); import pickle, sys; "
                "spec = pickle.load(sys.stdin.buffer); sys.path[:] = spec['sys_path']; "
                "from cutecc.build.executors.resident import main; main(spec)")
        told, tell = os.pipe()
        spec["tell"] = tell
        try:
            starter = subprocess.Popen([sys.executable, *_interpreter_flags(), "-c", code],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(tell,))
        finally:
            os.close(tell)
        import pickle

        assert starter.stdin is not None
        with contextlib.suppress(OSError):
            starter.stdin.write(pickle.dumps(spec))
            starter.stdin.close()
        starter.wait()
        self.started = os.fdopen(told, "rb")

    def _connect(self) -> str | None:
        """Connect to the service at `path` and open a session: None once it is ready for
        this build, else why not (none there, or it retired itself as stale)."""
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
            conn.send(("hello", self.key))
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                reduction.sendfds(raw, [1, 2])  # its workers write where the build writes
            if not conn.poll(HELLO_SECONDS):
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

    def ready(self, timeout: float = service.READY_SECONDS,
              final: service.Preload = service.NOTHING) -> str | None:
        """Wait until this build has a session: None, else why not."""
        if final not in (service.NOTHING, self.modules):
            return OTHER_MODULES
        if self.is_ready:
            return None
        if self.started is None:
            return "no service"
        out = self.started
        if not select.select([out], [], [], timeout)[0]:
            return f"the resident compile service's imports took over {timeout:g} s"
        said = out.readline().decode(errors="replace").strip()
        out.close()
        self.started = None
        if said != "ready":
            return said or "the resident compile service died starting"
        return self._connect()

    def close(self) -> None:
        """End this build's session (the service kills what is left of its workers); the
        service stays for the next build."""
        if self.conn is not None and not self.conn.closed:  # (closed: a late exit status is "gone")
            with contextlib.suppress(Exception):
                self.conn.send(None)
            with contextlib.suppress(Exception):
                self.conn.close()
        if self.started is not None:
            self.started.close()  # one still importing goes on, for the next build
            self.started = None


def stamps() -> dict[str, list[int] | None]:
    """The stamp of every file this process loaded: its modules', its mapped libraries', and
    every other file it read since its first import (`cutecc.build.read_set`: data files an
    import read too)."""
    from cutecc.build import read_set

    files = {sys.executable, *read_set.files_read()}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str):
            files.add(f)
    deleted = False
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(None, 5)
            name = parts[5].rstrip("\n") if len(parts) == 6 else ""
            if name.startswith("/") and (".so" in name or name.removesuffix(" (deleted)") == sys.executable):
                deleted = deleted or name.endswith(" (deleted)")  # replaced after it was loaded
                files.add(name.removesuffix(" (deleted)"))
    out = {f: path_stamp(f) for f in files}
    if deleted:
        out["(a library replaced after it was loaded)"] = NEVER  # stale at once
    return out


def changed(before: dict[str, list[int] | None], since: int = 0) -> str | None:
    """The first file whose stamp (`hashcache.stamp`: size, mtime, ctime, inode, device)
    differs from `before`'s, or changed at or after `since` (ns; while it was being
    imported), if any."""
    for f, was in before.items():
        now = path_stamp(f) if was != NEVER else None
        if now != was or (now is not None and now[2] >= since > 0):
            return f
    return None


@dataclasses.dataclass
class _Session:
    """One connected build: its connection, its stdout and stderr, its live workers."""

    conn: Any
    out: int
    err: int
    workers: dict[int, str] = dataclasses.field(default_factory=dict)  # pid -> token

    def end(self) -> None:
        for pid, token in self.workers.items():
            with contextlib.suppress(OSError):  # (one not yet in a group of its own)
                os.kill(pid, signal.SIGKILL)
            worker_tree.kill_tree(pid, token)
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self.conn.close()


def main(spec: dict[str, Any]) -> None:
    """The resident service: set up and import as a per-build service does, then serve
    builds on its socket until idle for `spec["idle"]` seconds, or stale."""
    from cutecc.build import read_set
    from cutecc.build.executors.worker_process import init_worker
    from cutecc.build.workers import limit_memory

    read_set.install()  # what it reads from here on: stamped, and its workers inherit the record
    tell = spec["tell"]
    signal.alarm(int(START_SECONDS))  # a start-up that hangs (an import) ends here
    began = time.time_ns()
    try:
        init_worker(spec["arch"], None, spec["env"], False)
        limit_memory(spec["memory"])
        m = spec["modules"]
        service.preload(service.Preload(tuple(m["modules"]), tuple(m["entries"]), tuple(m["python_path"]),
                                        m["device"]))
        threads = threading.active_count()
        if threads != 1:
            _fail(tell, f"fork is not safe: the resident compile service runs {threads} threads after "
                  "its imports")
        watched = stamps()
        moved = changed(watched, began)
        if moved is not None:
            _fail(tell, f"{moved} changed while the resident compile service imported it")
        path = Path(spec["path"])
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = path.with_name(f".{os.getpid()}.{path.name}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        listener.bind(str(tmp))
        listener.listen(16)
        os.replace(tmp, path)  # a service of the same state started meanwhile is replaced
        mine = os.stat(path).st_ino
    except Exception as e:  # told to the build, which starts a service of its own instead
        _fail(tell, f"the resident compile service could not start: {type(e).__name__}: {e}")
    signal.alarm(0)
    _say(tell, "ready")
    _Server(listener, path, mine, spec["key"], watched, float(spec["idle"])).loop()


def _say(tell: int, what: str) -> None:
    """Tell the build that started this service `what` (one line on `tell`), then let go of
    every descriptor it was given: a service outlives its build and must hold none of its
    pipes (what its imports printed goes nowhere)."""
    with contextlib.suppress(OSError):
        os.write(tell, (what + "\n").encode())
    with contextlib.suppress(OSError):
        os.close(tell)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()


def _fail(tell: int, why: str) -> NoReturn:
    """Tell the build why this service cannot serve, and exit at once (no interpreter exit:
    it would wait for any thread an import started)."""
    _say(tell, why)
    os._exit(1)


class _Server:
    """The resident service's loop: accept builds, fork their workers, report exits."""

    def __init__(self, listener: socket.socket | None, path: Path, ino: int, key: str,
                 watched: dict[str, list[int] | None], idle: float) -> None:
        self.listener, self.path, self.ino, self.key = listener, path, ino, key
        self.watched, self.idle = watched, idle
        self.sessions: list[_Session] = []
        self.owner: dict[int, _Session] = {}
        self.quiet_since = time.monotonic()

    def loop(self) -> None:
        while True:
            listening = [self.listener] if self.listener is not None else []
            ready = multiprocessing.connection.wait([*listening, *(s.conn for s in self.sessions)], 0.2)
            self._reap()
            for obj in ready:
                if obj is self.listener:
                    self._accept()
                else:
                    self._serve(next(s for s in self.sessions if s.conn is obj))
            if self.sessions or self.owner:
                self.quiet_since = time.monotonic()
            elif self.listener is None or time.monotonic() - self.quiet_since >= self.idle \
                    or not self._still_mine():
                self._retire()
                service.quit_now()

    def _still_mine(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.ino
        except OSError:
            return False

    def _retire(self) -> None:
        """Take no more builds (the builds connected go on to their end)."""
        if self.listener is None:
            return
        if self._still_mine():
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.listener.close()
        self.listener = None

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        try:
            cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", cred)[1] != os.getuid():  # (pid, uid, gid)
                sock.close()
                return
        except (OSError, struct.error):
            sock.close()
            return
        for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):  # a build that stalls mid-message
            sock.setsockopt(socket.SOL_SOCKET, opt, struct.pack("ll", int(HELLO_SECONDS), 0))
        conn = multiprocessing.connection.Connection(sock.detach())
        try:
            if not conn.poll(HELLO_SECONDS):
                raise OSError("no hello")
            hello = conn.recv()
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                out, err = reduction.recvfds(raw, 2)
        except (OSError, EOFError, RuntimeError, ValueError):
            conn.close()
            return
        if not (isinstance(hello, tuple) and hello == ("hello", self.key)):
            with contextlib.suppress(Exception):
                conn.send("another state's service")
            for fd in (out, err):
                os.close(fd)
            conn.close()
            return
        stale = changed(self.watched)
        if stale is not None:  # retired: a fresh service serves this build and the next
            with contextlib.suppress(Exception):
                conn.send(f"{RETIRED}: {stale} changed since it imported it")
            conn.close()
            for fd in (out, err):
                os.close(fd)
            self._retire()
            return
        self.sessions.append(_Session(conn, out, err))
        with contextlib.suppress(OSError):
            conn.send("ready")

    def _serve(self, s: _Session) -> None:
        try:
            wtoken = s.conn.recv()
        except Exception:  # gone, stalled, or not a message of ours
            wtoken = None
        if not isinstance(wtoken, str):
            self._end(s)
            return
        stale = changed(self.watched)
        if stale is not None:  # this build's workers spawn instead; the next build starts afresh
            self._retire()
            with contextlib.suppress(OSError):
                s.conn.send(f"{RETIRED}: {stale} changed since it imported it")
            return
        from cutecc.build.executors.worker_process import serve_forked

        def let_go() -> None:  # in the worker: nothing of the service or of other builds
            if self.listener is not None:
                self.listener.close()
            for other in self.sessions:
                other.conn.close()
            os.dup2(s.out, 1)  # its build's stdout and stderr
            os.dup2(s.err, 2)
            for other in self.sessions:
                for fd in (other.out, other.err):
                    os.close(fd)
            import importlib

            importlib.invalidate_caches()  # the project's files as they are now

        try:
            pid = service.fork_worker(s.conn, serve_forked, wtoken, let_go)
        except OSError as e:  # no fork (memory, processes): this build's alone
            with contextlib.suppress(OSError):
                s.conn.send(f"the resident compile service could not fork: {e}")
            return
        if pid is None:
            self._end(s)
            return
        s.workers[pid] = wtoken
        self.owner[pid] = s

    def _end(self, s: _Session) -> None:
        """A build's session is over (it said so, or it is gone): its workers too."""
        if s in self.sessions:
            self.sessions.remove(s)
        s.end()

    def _reap(self) -> None:
        for pid, code in service.exited():
            s = self.owner.pop(pid, None)
            if s is None:
                continue
            s.workers.pop(pid, None)
            if s in self.sessions:
                with contextlib.suppress(OSError):
                    s.conn.send(("exit", pid, code))
