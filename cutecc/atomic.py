"""Atomic file writes: a temporary file in the same directory, fsynced, then renamed.

A reader sees the old file or the new one, never a part; a crash leaves at most a
temporary `.<name>.<hex>.tmp` that the store sweeps.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

TMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp")  # what atomic_write names its temporary


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` through a fsynced temporary file in the same directory."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # whatever the umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or creation in `path` durable (best-effort: some file systems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
