"""Inter-process locks on files (flock through filelock), with cutecc's errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import filelock

from cutecc.errors import CuteccError, WorkError

Timeout = filelock.Timeout


class Busy(Exception):
    """Another process holds the key's lock (e.g. builds it) beyond the timeout."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key}: locked by another process")
        self.key = key


@contextlib.contextmanager
def held(path: Path, timeout: float = -1) -> Iterator[None]:
    """Hold the lock file `path`. Raises `Timeout` after `timeout` s (-1: wait forever), or
    CuteccError (exit 1) when the lock file cannot be created or opened (a read-only or
    full cache)."""
    lock = filelock.FileLock(path, timeout=timeout, mode=0o644)  # whatever the umask
    try:
        lock.acquire()
    except filelock.Timeout:
        raise
    except OSError as e:
        raise WorkError(f"cannot take the lock: {e.strerror}", where=str(path)) from None
    try:
        yield
    finally:
        lock.release()


def is_held(path: Path) -> bool:
    """Whether another process holds the lock file `path` right now (a look, not a promise)."""
    if not path.exists():
        return False
    try:
        with held(path, timeout=0):
            return False
    except (Timeout, CuteccError):
        return True
