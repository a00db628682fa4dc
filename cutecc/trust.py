"""Who could have written what cutecc is about to trust, checked on the path as it is opened.

A SHA-256 recorded beside a file proves nothing against someone who can write both, so
before a cache's metadata or libraries are believed, every directory from `/` down to the
file must be owned by this user or root and not writable by others, nor by a group
anyone else is in (a sticky directory such as /tmp excepted), and so must the file. A group
this user alone can be in (a user-private group, as under umask 002) writes nothing someone
else could. The check is made on what is actually
opened: the path is resolved once, then opened one component at a time relative to the
directory already checked, never following a symbolic link, so swapping a component for
a link after the check opens nothing else. `$CUTECC_ALLOW_SHARED_CACHE=1` turns the
ownership rules off (not the no-follow opens).
"""

from __future__ import annotations

import contextlib
import functools
import grp
import os
import pwd
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cutecc import settings
from cutecc.errors import WorkError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Untrusted(WorkError):
    """A path someone other than this user (or root) could have changed (exit 1)."""

    def __init__(self, why: str, where: str) -> None:
        super().__init__(f"{why}; refusing to trust it. Fix the ownership or permissions "
                         f"(chown, chmod go-w), or set {settings.ALLOW_SHARED_CACHE.env}=1 to trust it",
                         where=where)
        self.why = why


def enforced() -> bool:
    """Whether the ownership rules apply (not switched off by the environment)."""
    return not settings.ALLOW_SHARED_CACHE.on()


def stat_problem(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this stat could have been written by someone else."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {me}) or root"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not sticky:
        return f"{what} is writable by any user (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWGRP and not sticky and not _private_group(st.st_gid):
        return (f"{what} is writable by group {_group_name(st.st_gid)} (gid {st.st_gid}), which "
                f"users other than this one can be in (mode {stat.S_IMODE(st.st_mode):o})")
    return None


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """Whether this user alone can be in group `gid`: it lists no other member and is no
    other user's primary group (a user-private group). Unknown groups are not."""
    me = os.geteuid()
    try:
        members = grp.getgrgid(gid).gr_mem
        name = pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    if any(m != name for m in members):
        return False
    return all(p.pw_uid == me for p in pwd.getpwall() if p.pw_gid == gid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _check(fd: int, what: str, always: bool = False) -> None:
    if always or enforced():
        why = stat_problem(os.fstat(fd), what)
        if why:
            raise Untrusted(why, what)


def _open(name: str, flags: int, dir_fd: int | None, what: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (40, 20) and os.path.islink(what):  # ELOOP, ENOTDIR on a link
            raise Untrusted(f"{what} is a symbolic link", what) from None
        raise


@contextlib.contextmanager
def open_dir(path: str | Path, always: bool = False) -> Iterator[int]:
    """A descriptor of directory `path`, every directory from `/` to it checked.

    Symbolic links in `path` as given are followed once, to find the real directory, and
    must themselves belong to this user or root; the real path is then opened component
    by component without following links.
    """
    given = Path(os.path.abspath(path))
    if always or enforced():  # a link on the way decides where we go: so must its owner and directory
        for p in (given, *given.parents):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid not in (os.geteuid(), 0):
                raise Untrusted(f"{p} is a symbolic link owned by uid {st.st_uid}", str(p))
            why = stat_problem(os.stat(p.parent), f"{p.parent} (holding the symbolic link {p.name})")
            if why:
                raise Untrusted(why, str(p))
    real = Path(os.path.realpath(given))
    fd = os.open("/", _DIR)
    try:
        _check(fd, "/", always)
        at = Path("/")
        for part in real.parts[1:]:
            at = at / part
            nfd = _open(part, _DIR, fd, str(at))
            os.close(fd)
            fd = nfd
            _check(fd, str(at), always)
        yield fd
    finally:
        os.close(fd)


def read_file(root: str | Path, parts: Sequence[str], max_bytes: int,
              file_check: Callable[[os.stat_result], str | None] | None = None,
              always: bool = False) -> bytes:
    """The bytes of `root/parts...`, opened through checked directories without following
    links; refused (Untrusted) when anything on the way could be someone else's, or when
    `file_check(stat of the opened file)` names a problem, and (OSError EFBIG) when it
    holds more than `max_bytes`. Reads only what is there, never a recorded size. `always`:
    the ownership rules apply even where `$CUTECC_ALLOW_SHARED_CACHE` turns them off (trust
    anchors: a shared cache is an opt-in for caches, never for keys)."""
    with open_dir(root, always) as fd:
        at = Path(root)
        dfd = fd
        opened: list[int] = []
        try:
            for part in parts[:-1]:
                at = at / part
                dfd = _open(part, _DIR, dfd, str(at))
                opened.append(dfd)
                _check(dfd, str(at), always)
            at = at / parts[-1]
            ffd = _open(parts[-1], _FILE, dfd, str(at))
            opened.append(ffd)
            st = os.fstat(ffd)
            if not stat.S_ISREG(st.st_mode):
                raise Untrusted(f"{at} is not a regular file", str(at))
            _check(ffd, str(at), always)
            why = file_check(st) if file_check is not None else None
            if why:
                raise Untrusted(f"{at}: {why}", str(at))
            if st.st_size > max_bytes:
                raise OSError(27, f"{st.st_size} bytes, over the {max_bytes}-byte limit", str(at))
            chunks, total = [], 0
            while True:
                chunk = os.read(ffd, min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise OSError(27, f"over the {max_bytes}-byte limit", str(at))
            return b"".join(chunks)
        finally:
            for f in opened:
                os.close(f)


def check_dir(path: str | Path) -> None:
    """Raise Untrusted unless every directory from `/` to `path` passes (see `open_dir`)."""
    with open_dir(path):
        pass


def read_path(path: str | os.PathLike[str], max_bytes: int,
              file_check: Callable[[os.stat_result], str | None] | None = None,
              always: bool = False) -> bytes:
    """`read_file` of one path (a key file, say): its directory and every one above it
    checked, the file opened without following a link."""
    p = Path(os.path.abspath(path))
    return read_file(p.parent, (p.name,), max_bytes, file_check, always)
