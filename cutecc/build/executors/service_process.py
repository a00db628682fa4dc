"""What a compile service process runs (`cutecc.build.executors.service` is the build's end).

Set up as a worker (`worker_process.set_up`), it imports its `Preload`, says "ready" or
why not on the pipe its build gave it, then serves builds, a session each: a connection over
which a build sends its stdout and stderr, then a token per worker it wants forked
(`fork_worker`), and over which the service reports each worker's exit. A session's end (the
build said so, or its connection closed: it ended, crashed or was killed) kills what is left
of its workers and of what they started (`worker_tree`).

- **This build's own** (idle 0): tied to its build's life (a parent-death signal), it has one
  session, over the socket pair it was started with, whose hello names what planning chose
  (imported before it answers); it exits when that session ends.
- **Resident** (idle > 0): detached, it serves this user's builds (the peer's credentials) of
  its state (the hello names it) on its socket until idle for its idle seconds, or its socket
  is no longer its own. After its imports it stamps (size, mtime, ctime, inode, device) every
  module file it loaded, every library mapped into it and every other file it read (`stamps`);
  one that changed while it imported, or before a build connects or a fork, retires it
  (`RETIRED`): that build spawns, the next starts a fresh service. When it starts it retires
  the least recently used of this user's others beyond the number allowed (each socket's
  mtime marks its last build's connection; `service.most_services`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import reduction
from pathlib import Path
from typing import Any, NoReturn

from cutecc.build import read_set
from cutecc.build.executors import worker_tree
from cutecc.build.executors.preload import Preload, preload
from cutecc.build.executors.service import HELLO_SECONDS, READY_SECONDS, RETIRED, listener_pid
from cutecc.build.executors.worker_process import quit_now, serve_forked, set_up
from cutecc.toolchain.hashcache import path_stamp

NEVER = [-1]  # a stamp no file has


def stamps() -> dict[str, list[int] | None]:
    """The stamp of every file this process loaded: its modules', its mapped libraries', and
    every other file it read since its first import (`read_set.files_read`: data files an
    import read too); stale at once if a library was replaced after it was mapped."""
    files = {sys.executable, *read_set.files_read()}
    files.update(p for m in list(sys.modules.values()) if isinstance(p := getattr(m, "__file__", None), str))
    out = {f: path_stamp(f) for f in files}
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        if any(ln.endswith(" (deleted)\n") and (".so" in ln or sys.executable in ln) for ln in f):
            out["(a library replaced after it was loaded)"] = NEVER
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
    """The service (module docstring): set up and import as a worker does, say ready, then
    serve builds until its own build's session ends (idle 0), or idle or stale (resident)."""
    read_set.install()  # what it reads from here on: stamped, and its workers inherit the record
    tell, resident = spec["tell"], spec["idle"] > 0
    signal.alarm(int(READY_SECONDS))  # a start-up that hangs (an import) ends here
    began = time.time_ns()
    listener, path, mine, watched = None, None, 0, {}
    try:
        m = spec["modules"]  # (its own one tied to its build's life, marking what it starts)
        set_up(spec["arch"], None if resident else spec["parent"], spec["env"], spec["memory"],
               "" if resident else spec["token"],
               Preload(tuple(m["modules"]), tuple(m["entries"]), tuple(m["python_path"]), m["device"]), False)
        unsafe = _unsafe_to_fork()
        if unsafe:
            _fail(tell, unsafe, resident)
        if resident:
            watched = stamps()
            moved = changed(watched, began)
            if moved is not None:
                _fail(tell, f"{moved} changed while the resident compile service imported it", resident)
            path = Path(spec["path"])
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            tmp = path.with_name(f".{os.getpid()}.{path.name}")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            listener.bind(str(tmp))
            listener.listen(16)
            os.replace(tmp, path)  # a service of the same state started meanwhile is replaced
            mine = os.stat(path).st_ino
    except Exception as e:  # told to the build, which spawns its workers or starts another
        _fail(tell, f"the compile service could not start: {type(e).__name__}: {e}", resident)
    signal.alarm(0)
    _say(tell, "ready", resident)
    server = _Server(listener, path, mine, spec["key"], watched, float(spec["idle"]))
    if resident:
        with read_set.paused():  # the service's bookkeeping: no compile reads it
            server.retire_least_used(int(spec["most"]))
    else:
        server.admit(socket.socket(fileno=spec["conn"]), own=True)
    server.loop()


def _unsafe_to_fork() -> str | None:
    """Why forking is not safe here (more than one thread runs), or None."""
    n = threading.active_count()
    return None if n == 1 else f"fork is not safe: the compile service runs {n} threads after its imports"


def _say(tell: int, what: str, resident: bool) -> None:
    """Tell the build that started this service `what` (one line on `tell`); a resident one
    then lets go of every descriptor it was given: it outlives its build and must hold none
    of its pipes (what its imports printed goes nowhere)."""
    with contextlib.suppress(OSError):
        os.write(tell, (what + "\n").encode())
    with contextlib.suppress(OSError):
        os.close(tell)
    if resident:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()


def _fail(tell: int, why: str, resident: bool) -> NoReturn:
    """Tell the build why this service cannot serve, and exit at once (no interpreter exit:
    it would wait for any thread an import started)."""
    _say(tell, why, resident)
    os._exit(1)


class _Server:
    """The service's loop: admit builds, fork their workers, report exits."""

    def __init__(self, listener: socket.socket | None, path: Path | None, ino: int, key: str,
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
                quit_now()

    def _still_mine(self) -> bool:
        try:
            return self.path is not None and os.stat(self.path).st_ino == self.ino
        except OSError:
            return False

    def _retire(self) -> None:
        """Take no more builds (the builds connected go on to their end)."""
        if self.listener is None or self.path is None:
            return
        if self._still_mine():
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.listener.close()
        self.listener = None

    def retire_least_used(self, most: int) -> None:
        """Retire this user's other resident services beyond `most` live ones, this one
        counted, the least recently used first (its socket removed, each ends once idle);
        a socket no service answers on is removed."""
        assert self.path is not None
        others = []
        for p in self.path.parent.glob("*.sock"):
            if p.name.startswith(".") or p == self.path:
                continue
            with contextlib.suppress(OSError):
                used = p.stat().st_mtime_ns
                if listener_pid(p) is None:
                    p.unlink()
                else:
                    others.append((used, p))
        for _, p in sorted(others, reverse=True)[max(0, most - 1):]:
            with contextlib.suppress(OSError):
                p.unlink()

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
        self.admit(sock)

    def admit(self, sock: socket.socket, own: bool = False) -> None:
        """Open a build's session on `sock` once its hello names this service's state (with
        `own`, this build's own service's one session: the hello also names what planning
        chose, imported now) and its stamps hold; else tell it why not."""
        conn = multiprocessing.connection.Connection(sock.detach())
        try:
            if not own and not conn.poll(HELLO_SECONDS):
                raise OSError("no hello")
            hello = conn.recv()
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                out, err = reduction.recvfds(raw, 2)
        except (OSError, EOFError, RuntimeError, ValueError):
            conn.close()
            return
        why = None
        if not (isinstance(hello, tuple) and hello[:2] == ("hello", self.key) and len(hello) == 2 + own):
            why = "another state's service"
        elif own:
            preload(hello[2])
            why = _unsafe_to_fork()
        else:
            stale = changed(self.watched)
            if stale is not None:  # retired: a fresh service serves this build and the next
                why = f"{RETIRED}: {stale} changed since it imported it"
                self._retire()
        if why is not None:
            with contextlib.suppress(Exception):
                conn.send(why)
            conn.close()
            for fd in (out, err):
                os.close(fd)
            return
        self.sessions.append(_Session(conn, out, err))
        if self._still_mine():  # its last use, for `retire_least_used`
            with contextlib.suppress(OSError):
                os.utime(self.path)  # type: ignore[arg-type]
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
            importlib.invalidate_caches()  # the project's files as they are now

        try:
            pid = fork_worker(s.conn, serve_forked, wtoken, let_go)
        except OSError as e:  # no fork (memory, processes): this build's alone
            with contextlib.suppress(OSError):
                s.conn.send(f"the compile service could not fork: {e}")
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
        for pid, code in exited():
            s = self.owner.pop(pid, None)
            if s is None:
                continue
            s.workers.pop(pid, None)
            if s in self.sessions:
                with contextlib.suppress(OSError):
                    s.conn.send(("exit", pid, code))


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
