"""A fallback's code, run only from bytes checked against its pin.

A fallback's closure (`cutecc.contract.fallbacks`: its module and the project modules it
imports, each with its SHA-256) is checked whole before any of it runs: each file is read
from the first of the candidate roots (a pack's `_cutecc/fallbacks/`, the build's
python_path, the lock's or manifest's directory, then `sys.path`) that holds it with the
pinned bytes; one that no root holds with them refuses the fallback, naming the file found
and its digest. Then the module is executed from those bytes (`compile` of the checked
source into a fresh module, registered in `sys.modules` under its name), and its imports
of the closure's other modules are served the same way by a meta-path finder that knows
only checked bytes: no `__pycache__` file is read, and no file is read twice. A closure
module already imported in this process other than from these bytes is refused, naming
it (what runs would not be what the lock pins). Packages get an empty `__path__`: a
submodule the closure does not pin cannot be imported through them; and an import the
closure's own code asks for (by a computed name, `importlib.import_module`, which the
closure's walk cannot see) that would find an unpinned module under a project root the
closure was read from is refused, naming it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cutecc.contract.fallbacks import ClosureFile, FallbackRef, module_path
from cutecc.errors import NoBuildFits

MAX_SOURCE_BYTES = 16 << 20  # one source file of a closure


@dataclass(frozen=True)
class Checked:
    """One closure file read and checked: where it was read, its bytes and SHA-256."""

    module: str
    path: str
    data: bytes
    sha256: str
    package: bool


class _Loader(importlib.abc.Loader):
    """Executes one checked file's bytes (never a byte-code cache)."""

    def __init__(self, checked: Checked | None) -> None:
        self.checked = checked  # None: a parent package the closure holds no file of

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        if self.checked is None:
            return
        code = compile(self.checked.data, self.checked.path, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the checked bytes of a pinned closure


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the checked closures' modules by name (first on `sys.meta_path`); `parents`,
    last there, the packages above them that hold no file (namespace packages), where no
    other finder finds one (a pack's closure is on no path)."""

    cutecc_pinned_closure = True  # what a build's module search skips (`toolchain.modfind`)

    def __init__(self, parents: bool = False) -> None:
        self.files: dict[str, Checked] = {}
        self.parents: set[str] | None = set() if parents else None
        self.roots: set[str] = set()  # the project roots the closures were read from
        self.paths: set[str] = set()  # the checked files (their code's co_filename)

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        c = self.files.get(name) if self.parents is None else None
        if c is None and self.parents is None and self.roots:
            _unpinned(name, path, self.roots, self.paths)  # (raises for a project module's code)
        if c is None and (self.parents is None or name not in self.parents):
            return None
        spec = importlib.machinery.ModuleSpec(name, _Loader(c), origin=c.path if c else None,
                                              is_package=c.package if c else True)
        if c is not None:
            spec.has_location = True
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations = []  # nothing but the pinned closure below it
        return spec


def _importer() -> str | None:
    """The file whose code asked for the import under way: the innermost frame outside the
    import machinery (`importlib`, the frozen bootstrap)."""
    f: Any = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith("<frozen ") or fn.startswith(_IMPORTLIB) or fn == __file__):
            return str(fn)
        f = f.f_back
    return None


def _unpinned(name: str, path: Sequence[str] | None, roots: set[str], paths: set[str]) -> None:
    """Refuse the import of `name` by a checked closure's code when it would find a module
    under a root the closure was read from that the closure does not pin (an import of a
    computed name, `importlib.import_module(...)`, which the closure's walk cannot see)."""
    if _importer() not in paths:
        return
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    origin = getattr(spec, "origin", None)
    if isinstance(origin, str) and any(origin.startswith(r) for r in roots):
        raise NoBuildFits(f"module {name} ({origin}) is imported by a pinned fallback's code but is not "
                          "in the closure its lock line pins (an import of a computed name): import it by "
                          "an import statement, and build again to pin it", where=str(_importer()))


_IMPORTLIB = os.path.dirname(importlib.__file__) + os.sep
_FINDER = _Finder()
_PARENTS = _Finder(parents=True)
_LOCK = threading.RLock()


def _ours(module: Any, sha256: str) -> bool:
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    return isinstance(loader, _Loader) and loader.checked is not None and loader.checked.sha256 == sha256


def _ours_any(module: Any) -> bool:
    return isinstance(getattr(getattr(module, "__spec__", None), "loader", None), _Loader)


def _read(f: ClosureFile, roots: Sequence[Path], pinned_by: str) -> Checked | str:
    """`f` read from the first root holding it with its pinned bytes, or why none does."""
    first: str | None = None
    for root in roots:
        path = os.path.join(root, *f.path.split("/"))
        try:  # a regular file only (a FIFO or device named like a module is never waited on)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read(MAX_SOURCE_BYTES + 1)
        except OSError:
            continue
        finally:
            os.close(fd)
        digest = hashlib.sha256(data).hexdigest()
        if digest == f.sha256 and len(data) <= MAX_SOURCE_BYTES:
            return Checked(f.module, path, data, digest, f.is_package)
        if first is None:
            first = f"{path} (SHA-256 {digest[:16]}...)"
    if first is not None:
        return (f"{first} is not the file {pinned_by} pins for module {f.module} (SHA-256 "
                f"{f.sha256[:16]}...)")
    shown = ", ".join(map(str, roots[:4])) + (", ..." if len(roots) > 4 else "")
    return f"module {f.module} ({f.path}) is in none of {shown}"


def check_closure(ref: FallbackRef, roots: Sequence[Path], where: str,
                  pinned_by: str = "the lock") -> list[Checked]:
    """Every file of `ref`'s closure read from `roots` and checked against its pin, before
    any of it runs; NoBuildFits (at `where`) names what does not match: a legacy pin, a
    file missing or changed."""
    if ref.legacy:
        raise NoBuildFits(f"{pinned_by} pins the fallback's module file only (written before cutecc "
                          "pinned a fallback's closure, the modules it imports included): run `cutecc "
                          "build` to pin it (and sign the lock again)", where=where)
    checked: list[Checked] = []
    for f in ref.files:
        got = _read(f, roots, pinned_by)
        if isinstance(got, str):
            raise NoBuildFits(f"the fallback's code is not what {pinned_by} pins: {got}; build again "
                              "to pin the code there, or restore it", where=where)
        checked.append(got)
    return checked


def load_function(ref: FallbackRef, roots: Sequence[Path], where: str,
                  pinned_by: str = "the lock") -> Callable[..., Any]:
    """The fallback `ref`'s function, its closure checked whole (`check_closure`) before
    any of it runs, then executed from the checked bytes. NoBuildFits (at `where`) says
    what does not match, or that a closure module was imported here otherwise."""
    checked = check_closure(ref, roots, where, pinned_by)
    with _LOCK:
        for c in checked:
            live = sys.modules.get(c.module)
            if live is not None and not _ours(live, c.sha256):
                origin = getattr(live, "__file__", None) or "no file"
                how = ("from other checked bytes (another lock's or build's)" if _ours_any(live)
                       else f"not from the bytes {pinned_by} pins")
                raise NoBuildFits(f"module {c.module} is already imported in this process ({origin}), "
                                  f"{how}; a pinned fallback runs only its checked closure: import it "
                                  "after the fallback first serves, or not at all", where=where)
        for c in checked:
            _FINDER.files[c.module] = c
            _FINDER.paths.add(c.path)
            rel = os.path.join(*module_path(c.module, c.package).split("/"))
            if c.path.endswith(os.sep + rel) and "-packages" not in c.path:  # a project's root
                _FINDER.roots.add(c.path[:-len(rel)])  # (an installed package's imports are its own)
            parts = c.module.split(".")
            assert _PARENTS.parents is not None
            _PARENTS.parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        if _PARENTS not in sys.meta_path:
            sys.meta_path.append(_PARENTS)
        try:
            mod = importlib.import_module(ref.module)
        except Exception as e:  # its top-level code failed, or imported what is not there
            raise NoBuildFits(f"importing the fallback's module failed: {type(e).__name__}: {e}",
                              where=where) from e
    fn: Any = mod
    try:
        for part in ref.attr.split("."):
            fn = getattr(fn, part)
    except AttributeError:
        raise NoBuildFits(f"module {ref.module} has no {ref.attr!r}", where=where) from None
    if not callable(fn):
        raise NoBuildFits(f"{ref.attr!r} is a {type(fn).__name__}, not a function", where=where)
    return fn  # type: ignore[no-any-return]
