"""Modules found ahead of installed code's own: what its imports then run, in the key.

An installed distribution is keyed by name, version and a digest of its files
(`cutecc.toolchain.dists`), which says nothing of what its imports find: installed `dep/ew.py`
doing `import util` (a top-level module of the same distribution) runs whichever `util`
comes first on the path, and a directory ahead on `$PYTHONPATH` (or a root of the
manifest's python_path) holding a `util.py`, or a development checkout of a dependency over
its installed release, would be compiled under the installed release's key.

So each top-level module name a distribution the kernel reaches installs is looked up as
the build worker will import it (`SourceIndex.lookup`: the python_path first, then
`sys.path`); where the file found is not one that distribution's RECORD lists (nor the
standard library's, nor an editable install's, whose sources are keyed as the project's), it
shadows the installed module: the file and its project-local closure are keyed by content
(the key's `shadows`: `{top-level name: source digest}`, present only when some module
shadows, so every other key is what it was) and carried as keyed files, which the worker
hashes again and checks it imported (`cutecc.plan.keyed_sources`). A namespace package found
instead (no file) is not looked into. Which names were found where is remembered in the
planning cache under the stamps of the directories searched and of the files found
(`dists.HashCache.closure`), so a no-op build stats, and reads nothing.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from cutecc.plan.key import SourceIndex
from cutecc.plan.keyed_sources import KeyedFile
from cutecc.toolchain import dists


class Shadows(NamedTuple):
    """What shadowing modules add to a key: `{top-level name: digest}` and their files."""

    digests: dict[str, str]
    files: tuple[KeyedFile, ...]


NONE = Shadows({}, ())


def shadows(index: SourceIndex, installed: dists.DistIndex, reached: Iterable[str],
            modules: Iterable[str] = (), memo: dict[str, list[tuple[str, str]]] | None = None
            ) -> Shadows:
    """The modules that shadow what distributions `reached` (names, as `DistIndex.reached`
    gives them) install, keyed by content (`Shadows`); `NONE` when nothing shadows. Of a
    shadowing package, its own closure and that of each of `modules` (the dotted names the
    kernel's code imports) under it are keyed: a checkout's sub-modules the kernel imports.
    `memo` keeps what was found per set of names for the planning pass (kernels share them)."""
    owners: dict[str, list[str]] = {}
    for name in sorted(set(reached)):
        if dists.is_editable(name):
            continue  # its sources are the project's: keyed where imported
        for top in dists.tops(name):
            if top.isidentifier():
                owners.setdefault(top, []).append(name)
    if not owners:
        return NONE
    key = "\0".join(["<shadows>", *sorted(owners), "", *index.roots_resolved])
    memo = {} if memo is None else memo
    if key not in memo:
        memo[key] = _shadowing(index, installed, owners, key)
    found = memo[key]
    if not found:
        return NONE
    digests: dict[str, str] = {}
    files: dict[str, KeyedFile] = {}
    for origin, top in found:
        if origin.endswith(".py"):
            walked = [top, *sorted(m for m in set(modules) if m.startswith(top + ".")
                                   and index.missing(m) is None)]
            mine = {f.path: f for m in walked for f in index.files(m)}
            members = tuple(mine[p] for p in sorted(mine, key=lambda p: mine[p].rel))
        else:  # an extension module or byte code: its bytes
            members = (index.keyed_file(Path(origin), top),)
        h = hashlib.sha256()
        for f in members:
            h.update(f"{f.rel}\0{f.sha256}\0".encode())
        digests[top] = h.hexdigest()
        files.update((f.path, f) for f in members)
    return Shadows(dict(sorted(digests.items())), tuple(files[p] for p in sorted(files)))


def _shadowing(index: SourceIndex, installed: dists.DistIndex,
               owners: dict[str, list[str]], key: str) -> list[tuple[str, str]]:
    """`(file, top-level name)` of each of `owners`' names found in a file no owner installed:
    looked up, or as an earlier planning found them while nothing it searched has changed."""
    known = index.recall(key)
    if known is not None:
        return [(f, top) for f, top, _ in known]
    out: list[tuple[str, str, bool]] = []
    consulted: set[tuple[str, str]] | None = set()
    for top, names in sorted(owners.items()):
        found, told = index.lookup(top)
        if told is None or consulted is None:
            consulted = None  # an answer no stamp tells unchanged: not remembered
        else:
            consulted |= told
        origin = found.origin if found is not None else None
        if not origin or not os.path.isfile(origin):
            continue  # not found (import fails as it would), or a namespace package
        if _stdlib(top, origin) or any(installed.installs(n, origin) for n in names) \
                or any(dists.is_editable(n) for n in dists.owners(top)):
            continue  # the interpreter's, the distribution's own, or an editable's source
        out.append((str(Path(origin).absolute()), top, found is not None and found.is_package))
    if consulted is not None:
        index.remember(key, out, consulted)
    return [(f, top) for f, top, _ in out]


def _stdlib(top: str, origin: str) -> bool:
    """Whether `origin` is the standard library's module `top` (the interpreter's, not a
    shadow: a backport's distribution may name it too)."""
    if top not in sys.stdlib_module_names:
        return False
    where = os.path.realpath(origin)
    for key in ("stdlib", "platstdlib"):
        base = os.path.realpath(sysconfig.get_paths()[key]) + os.sep
        if where.startswith(base) and "site-packages" not in where[len(base):].split(os.sep):
            return True
    return False
