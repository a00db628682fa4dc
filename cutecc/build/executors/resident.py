"""The resident compile service: the compile service kept between builds.

A per-build compile service (`cutecc.build.executors.service`) pays the DSL's, torch's and
the installed libraries' imports once per build: seconds, more than all the compiles of a
small rebuild. A resident service is the same process kept alive after its build, for
`$CUTECC_SERVICE_IDLE` seconds (default `IDLE_SECONDS`; 0 or off: one service per build, as
before) with no build connected, so the next build forks its workers from it at once.

- **One per state.** Its name is a SHA-256 (`state_key`) over everything that decides
  what it imported and how its workers compile: the interpreter, its version and
  `sys.path`, the working directory, the whole environment and umask, the manifest's
  [env], the target arch, the memory limit and the `Preload`. A build whose state differs
  starts its own.
- **Never stale.** After its imports it stamps (size, mtime, ctime, inode, device) every
  file it loaded (each module's and every mapped library); each build that connects has
  them stat'ed again first, and one that changed (an edited or reinstalled package, a
  new cutecc) retires it: the build starts a fresh one. The project's own modules are
  never imported there (`Preload`): each forked worker imports them from disk.
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
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import reduction
from pathlib import Path
from typing import Any

from cutecc import environ
from cutecc.build.executors import service, worker_tree

IDLE_SECONDS = 300.0  # how long a resident service waits for the next build by default
STATE_VERSION = 1  # what `state_key` covers: bumped with it
HELLO_SECONDS = 30.0  # the most a connected service may take to check its stamps
# Variables no worker reads: the build's own (where it remembers planning, how long the service
# stays) and a shell's bookkeeping. Every other one names the state, whatever it is.
NOT_STATE = frozenset({environ.PLAN_MEMORY, environ.SERVICE_IDLE, "_", "OLDPWD", "SHLVL"})
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (Linux's sun_path, less its NUL)


def idle_seconds() -> float:
    """`$CUTECC_SERVICE_IDLE`: seconds a resident service waits for another build (0: none
    is kept). Unset: `IDLE_SECONDS`, but none under CI (`$CI` set, as CI services set it): a
    CI job is one build on a fresh machine, and what it leaves running only holds memory."""
    raw = os.environ.get(environ.SERVICE_IDLE, "").strip().lower()
    if not raw:
        return 0.0 if environ.flag("CI") else IDLE_SECONDS
    if raw in ("0", "off", "no", "false"):
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 7 * 86400:
        from cutecc.errors import CuteccError

        raise CuteccError(f'"{raw}" is not a number of seconds from 0 to 604800 (0 or off: no service '
                          "is kept between builds)", where=f"${environ.SERVICE_IDLE}")
    return seconds


def socket_dir() -> Path | None:
    """This user's directory of resident services' sockets (created 0700), or None where
    none can be trusted (owned by another user, or others may enter it)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    d = Path(base) / f"cutecc-services-{os.getuid()}"
    with contextlib.suppress(FileExistsError, OSError):
        d.mkdir(mode=0o700)
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d if len(os.fsencode(d)) <= SOCKET_PATH_MAX - 50 else None  # a socket's path is short


def _socket_dir() -> Path:
    d = socket_dir()
    if d is None:
        raise service.ServiceGone("no private directory for its socket, or its path is too long")
    return d


def state_key(arch: str, env: dict[str, str], memory: int | None, modules: service.Preload) -> str:
    """The SHA-256 naming the resident service of this process's state (module docstring)."""
    umask = os.umask(0o022)
    os.umask(umask)
    environment = sorted((k, v) for k, v in os.environ.items() if k not in NOT_STATE)
    doc = [STATE_VERSION, sys.executable, sys.version, sys.path, os.getcwd(), environment,
           umask, arch, sorted(env.items()), memory, dataclasses.asdict(modules)]
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
        self.started: subprocess.Popen[bytes] | None = None
        self.conn: Any = None
        self.how = "kept"
        if self._connect() is None:
            return
        self.how = "started"
        spec = {"key": self.key, "path": str(self.path), "arch": arch, "env": env, "memory": memory,
                "modules": dataclasses.asdict(modules), "idle": idle, "sys_path": list(sys.path)}
        # (forked once more at once, so the service is not the build's child: it outlives it)
        code = ("import os; os.fork() and os._exit(0); import pickle, sys; "
                "spec = pickle.load(sys.stdin.buffer); sys.path[:] = spec['sys_path']; "
                "from cutecc.build.executors.resident import main; main(spec)")
        self.started = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        start_new_session=True, close_fds=True)
        import pickle

        assert self.started.stdin is not None
        with contextlib.suppress(OSError):
            self.started.stdin.write(pickle.dumps(spec))
            self.started.stdin.close()
        self.started.wait()

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
        if self.is_ready:
            return None if final in (service.NOTHING, self.modules) else "it imported other modules"
        if self.started is None:
            return "no service"
        out = self.started.stdout
        assert out is not None
        if not select.select([out], [], [], timeout)[0]:
            return f"the resident compile service's imports took over {timeout:g} s"
        said = out.readline().decode(errors="replace").strip()
        out.close()
        if said != "ready":
            return said or "the resident compile service died starting"
        problem = self._connect()
        if problem is None and final not in (service.NOTHING, self.modules):
            return "it imported other modules"
        return problem

    def close(self) -> None:
        """End this build's session (the service kills what is left of its workers); the
        service stays for the next build."""
        if self.conn is not None and not self.conn.closed:  # (closed: a late exit status is "gone")
            with contextlib.suppress(Exception):
                self.conn.send(None)
            with contextlib.suppress(Exception):
                self.conn.close()
        if self.started is not None and self.started.stdout is not None:
            self.started.stdout.close()  # one still importing goes on, for the next build


def stamps() -> dict[str, tuple[int, ...] | None]:
    """The stamp of every file this process loaded: its modules' and its mapped libraries'."""
    files = {sys.executable}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str):
            files.add(f)
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                files.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
    out: dict[str, tuple[int, ...] | None] = {}
    for f in files:
        try:
            st = os.stat(f)
            out[f] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        except OSError:
            out[f] = None
    return out


def changed(before: dict[str, tuple[int, ...] | None]) -> str | None:
    """The first file whose stamp differs from `before`'s, if any."""
    for f, was in before.items():
        try:
            st = os.stat(f)
            now: tuple[int, ...] | None = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        except OSError:
            now = None
        if now != was:
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
            worker_tree.kill_tree(pid, token)
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self.conn.close()


def main(spec: dict[str, Any]) -> None:
    """The resident service: set up and import as a per-build service does, then serve
    builds on its socket until idle for `spec["idle"]` seconds, or stale."""
    from cutecc.build.executors.worker_process import init_worker
    from cutecc.build.workers import limit_memory

    try:
        init_worker(spec["arch"], None, spec["env"], False)
        limit_memory(spec["memory"])
        m = spec["modules"]
        service.preload(service.Preload(tuple(m["modules"]), tuple(m["entries"]), tuple(m["python_path"]),
                                        m["device"]))
        threads = threading.active_count()
        if threads != 1:
            _say(f"fork is not safe: the resident compile service runs {threads} threads after its imports")
            return
        watched = stamps()
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
        _say(f"the resident compile service could not start: {type(e).__name__}: {e}")
        return
    _say("ready")
    _Server(listener, path, mine, spec["key"], watched, float(spec["idle"])).loop()


def _say(what: str) -> None:
    """Tell the build that started this service `what` (its first line), then let go of
    its pipes: a service outlives its build and must not hold them."""
    with contextlib.suppress(OSError):
        os.write(1, (what + "\n").encode())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


class _Server:
    """The resident service's loop: accept builds, fork their workers, report exits."""

    def __init__(self, listener: socket.socket | None, path: Path, ino: int, key: str,
                 watched: dict[str, tuple[int, ...] | None], idle: float) -> None:
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
                conn.send(f"the resident compile service retired: {stale} changed since it imported it")
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
        except (EOFError, OSError):
            wtoken = None
        if not isinstance(wtoken, str):
            self._end(s)
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

        pid = service.fork_worker(s.conn, serve_forked, wtoken, let_go)
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
