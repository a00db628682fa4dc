"""The source files a key was computed from, checked again where the worker compiled them.

Planning hashes an entry's source closure (`cutecc.plan.key.SourceIndex`) long before a build
worker imports it: an edit in between (or during the compile) would otherwise publish a
library built from other bytes under the key of the old ones, and every later no-op build
would serve it. So each job carries the files its key read (`KeyedFile`: path, module,
name in the key, SHA-256), and the worker, after its compile and before anything is
published, re-hashes them (streamed) and checks that each module it imported came from
the file the key read (`problem`). Any difference refuses the entry with a `WorkError`
naming the file; the next build plans anew from what is there then. An edit that is
reverted before the check (the same bytes again) is not seen: what the worker compiled
cannot be told apart from the keyed bytes by looking at the files afterwards.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Iterable
from typing import NamedTuple

CHUNK = 1 << 20  # bytes read at a time when hashing


class KeyedFile(NamedTuple):
    """One source file a key read: where it was, which module it is, its name in the key
    (relative to the python_path root or `sys.path` entry holding it) and its SHA-256."""

    path: str
    module: str
    rel: str
    sha256: str


def file_sha256(path: str) -> str:
    """SHA-256 of a file, read in chunks (never whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def problem(files: Iterable[KeyedFile]) -> str | None:
    """Why what this process compiled may not be what the key read (None: it is): a file
    whose bytes changed or went away since planning, or a module this process imported
    from another file than the one keyed."""
    for f in files:
        try:
            now = file_sha256(f.path)
        except OSError as e:
            return f"{f.rel} ({f.path}) changed since the build was planned: {e.strerror or e}"
        if now != f.sha256:
            return (f"{f.rel} ({f.path}) changed since the build was planned (its bytes differ "
                    "from those the key was computed from); run the build again")
        mod = sys.modules.get(f.module)
        got = getattr(mod, "__file__", None) if mod is not None else None
        if isinstance(got, str) and not _same(got, f.path):
            return (f"module {f.module} was imported from {got}, but its key read {f.path}; "
                    "run the build from a process that imports it from there (or again)")
    return None


def evict_stale(files: Iterable[KeyedFile]) -> list[str]:
    """Forget the packages this process (a long-lived Ray worker, say) imported from other
    files than the keyed ones, every module under them too, so the compile imports the
    files the key read; the top-level names forgotten."""
    stale = set()
    for f in files:
        mod = sys.modules.get(f.module)
        got = getattr(mod, "__file__", None) if mod is not None else None
        if isinstance(got, str) and not _same(got, f.path):
            stale.add(f.module.split(".")[0])
    for name in list(sys.modules):
        if name.split(".")[0] in stale:
            del sys.modules[name]
    if stale:
        importlib.invalidate_caches()
    return sorted(stale)


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def front(python_path: tuple[str, ...]) -> None:
    """Put the python_path roots first on `sys.path`, in their order, even those already on it
    further back (a script's directory or the working directory ahead of them would otherwise
    give its same-named module, which no key read)."""
    roots = [os.path.abspath(p) for p in python_path]
    sys.path[:] = roots + [e for e in sys.path if os.path.abspath(e or ".") not in roots]
