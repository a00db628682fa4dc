"""Find a module as Python's import system would, without running package code.

`find_module(name, python_path)` walks the dotted name one level at a time as
`importlib._bootstrap._find_and_load` does: each level is asked of every finder on
`sys.meta_path` (so editable installs' finders and `.pth` path entries count), each
submodule over its parent's `__path__`. A parent's `__path__` is its spec's search
locations unless its `__init__` (read, not run) changes it:

- PEP 420 namespace packages (no `__init__`, e.g. flash_attn): all portions on the path;
- pkgutil / pkg_resources portions (`extend_path`, `declare_namespace`): every
  same-named directory on the parent's search path, computed here;
- an `__init__` that only appends to `__path__` (cutlass): the static locations, when
  they hold the submodule;
- anything else: only running it tells; with `allow_exec=True` the parent is imported
  in a child process (never here) and `Found.executed` says so. The child also tells what
  decided the answer (`Executed.depends`): the package's `__init__` files it ran, the
  directories of the `__path__` it learned, and the path entries holding distributions'
  metadata (what `importlib.metadata` reads), so a caller may remember the answer while
  none of them changes.
Modules already imported in this process are taken from `sys.modules`, as import would
(unless asked to answer for a fresh process, `imported=False`, as planning does: the
build worker that compiles the module is one).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

_EXTEND_MARKERS = ("extend_path", "declare_namespace")


@dataclass
class Found:
    name: str
    origin: str | None          # the module's file (None for a namespace package)
    is_package: bool
    levels: list[tuple[str, str]] = field(default_factory=list)  # (name, kind) per level
    executed: list[str] = field(default_factory=list)  # parents whose code had to run
    locations: list[str] = field(default_factory=list)  # a package's search locations


class NotFound(ImportError):
    """No such module, as import would say."""


class ExecFailed(NotFound):
    """Importing a parent in a child to learn its `__path__` failed (or took too long): an
    answer no stamp tells unchanged."""


class Executed(NamedTuple):
    """What importing a package in a child told: its `__path__`, and `(path, "")` for each
    file or directory whose change may change it (`consulted`'s form)."""

    path: list[str]
    depends: list[tuple[str, str]]


def _path_spec(fullname: str, path: list[str] | None):
    """PathFinder.find_spec, minus one step: for a namespace package it returns the spec
    with its portions as a list instead of building a _NamespacePath, which reads the
    parent from sys.modules (KeyError when the parent was never imported)."""
    namespace: list[str] = []
    for entry in sys.path if path is None else path:
        if not isinstance(entry, str):
            continue
        finder = importlib.machinery.PathFinder._path_importer_cache(  # type: ignore[attr-defined]
            entry or os.getcwd())  # private, undeclared in typeshed: the finder import would use
        if finder is None:
            continue
        spec = finder.find_spec(fullname, None)
        if spec is None:
            continue
        if spec.loader is not None:
            return spec  # a module or regular package: the first one wins
        namespace.extend(spec.submodule_search_locations or [])  # a namespace portion
    if namespace:
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = namespace
        return spec
    return None


def _find_spec(fullname: str, path: list[str] | None):
    """importlib._bootstrap._find_spec without the sys.modules shortcut: ask each
    meta-path finder in order, as import does."""
    for finder in sys.meta_path:
        if getattr(finder, "cutecc_pinned_closure", False):
            continue  # a loaded fallback's checked code (`runtime.fallback_code`): not a worker's
        if finder is importlib.machinery.PathFinder:
            spec = _path_spec(fullname, path)
        else:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, None)
        if spec is not None:
            return spec
    return None


def _path_effect(init_file: str) -> str:
    """What running this __init__ would do to __path__ (`path_effect`), read from disk."""
    try:
        src = Path(init_file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    return path_effect(src)


def path_effect(src: str) -> str:
    """What running an __init__ of source `src` would do to __path__: "none", "extend"
    (pkgutil / pkg_resources idiom), "append" (only __path__.append/extend) or "unknown"."""
    if "__path__" not in src and "declare_namespace" not in src:
        return "none"
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return "unknown"
    # Accept exactly the two idioms: __path__ = [pkgutil.]extend_path(__path__, __name__)
    # and [pkg_resources.]declare_namespace(__name__); anything else touching __path__ is unknown.
    kinds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if fname in _EXTEND_MARKERS:
                kinds.add("extend")
        elif isinstance(node, ast.Name) and node.id == "__path__" and isinstance(node.ctx, ast.Store):
            kinds.add("assign")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "__path__":
            # __path__.append/extend keep the original entries first; anything else may not
            kinds.add("append" if node.attr in ("append", "extend") else "mutate")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == "__path__" and not isinstance(node.ctx, ast.Load):
            kinds.add("mutate")  # __path__[:] = ...
    if kinds & {"mutate", "assign"} and "extend" not in kinds:
        return "unknown"
    if "extend" in kinds:
        return "unknown" if "mutate" in kinds else "extend"
    return "append" if "append" in kinds else "none"


def _extend_path(locs: list[str], name: str, search: list[str]) -> list[str]:
    """pkgutil.extend_path for `name`, over `search` (sys.path for a top level, the
    parent's __path__ otherwise) instead of reading the parent from sys.modules."""
    out = list(locs)
    final = name.rpartition(".")[2]
    for entry in search:
        if not isinstance(entry, str) or not os.path.isdir(entry):
            continue
        finder = importlib.machinery.PathFinder._path_importer_cache(entry)  # type: ignore[attr-defined]
        if finder is None or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(final)
        for p in (spec.submodule_search_locations or []) if spec else []:
            if p not in out:
                out.append(p)
        pkgfile = os.path.join(entry, final + ".pkg")  # pkgutil's .pkg files
        if os.path.isfile(pkgfile):
            with open(pkgfile) as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line and not line.startswith("#") and line not in out:
                        out.append(line)
    return out


_EXEC_CHILD = """\
import importlib, json, os, sys
name = sys.argv[1]
m = importlib.import_module(name)
inits = sorted({f for k, v in list(sys.modules.items()) if k == name or k.startswith(name + ".")
                for f in [getattr(v, "__file__", None)] if f and os.path.basename(f) == "__init__.py"})
meta = []
for d in sys.path:
    try:
        if d and any(e.endswith((".dist-info", ".egg-info")) for e in os.listdir(d)):
            meta.append(d)
    except OSError:
        pass
print("cutecc-path:" + json.dumps({"path": list(m.__path__), "inits": inits, "meta": meta}))
"""


def _exec_path(name: str, python_path: Sequence[str]) -> Executed:
    """Import package `name` in a child process: its real __path__ and what decided it
    (`Executed`); an ExecFailed quoting the import's error when that fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*python_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        r = subprocess.run([sys.executable, "-c", _EXEC_CHILD, name], capture_output=True, text=True,
                           env=env, timeout=300)
    except subprocess.TimeoutExpired:
        raise ExecFailed(f"importing {name} to learn its __path__ took over 300 s") from None
    lines = [x for x in r.stdout.splitlines() if x.startswith("cutecc-path:")]
    if r.returncode != 0 or not lines:
        err = r.stderr.strip().splitlines()
        raise ExecFailed(f"importing {name} to learn its __path__ failed: "
                         f"{err[-1] if err else f'exit status {r.returncode}'}")
    told = json.loads(lines[-1].removeprefix("cutecc-path:"))
    # a directory is named with a trailing separator: any change of its listing counts, even
    # where lookups searched it too (those record only the names they looked up in it)
    depends = {(str(f), "") for f in told["inits"] if isinstance(f, str) and os.path.isabs(f)}
    depends |= {(str(d).rstrip(os.sep) + os.sep, "") for d in [*told["path"], *told["meta"]]
                if isinstance(d, str) and os.path.isabs(d)}
    return Executed([str(x) for x in told["path"]], sorted(depends))


def _consult(consulted: set[tuple[str, str]] | None, search: list[str], tail: str) -> None:
    """Record what a path-based lookup of `tail` over `search` reads of the file system:
    `(directory, tail)` for each directory searched (`candidates` says which paths in it
    decide the answer)."""
    if consulted is None:
        return
    for entry in search:
        if isinstance(entry, str):
            consulted.add((entry or os.getcwd(), tail))


def candidates(directory: str, tail: str) -> list[str]:
    """The paths whose presence decides what a path-based finder finds for `tail` in
    `directory` (`importlib.machinery.FileFinder`): `tail` as a directory (a package, whose
    listing says whether it has an `__init__`, or a namespace portion) and as a module
    file of each suffix import knows."""
    base = os.path.join(directory, tail)
    return [base, *(base + suffix for suffix in importlib.machinery.all_suffixes())]


class Levels:
    """What each level of a lookup answered, for later lookups over the same `python_path`
    in one planning pass (`find_module`'s `levels`): a published library's closure looks up
    thousands of names under a few packages, and `a.b.c.x` and `a.b.c.y` need `a`, `a.b`
    and `a.b.c` found once. A level's answer depends on its name and its parent's search
    locations, which the name decides (the same file system, as the import system's own
    directory caches assume between `importlib.invalidate_caches` calls); where a parent's
    `__init__` only appends to `__path__`, whether its static locations hold the submodule
    is asked per submodule. A parent imported in a child that failed is not remembered:
    the next lookup tries again, as without this."""

    def __init__(self, python_path: Sequence[str]) -> None:
        self.python_path = tuple(python_path)
        self.specs: dict[str, _Step] = {}  # by full name
        self.parents: dict[tuple[str, str], _Parent] = {}  # by (parent, submodule or "")


class _Step(NamedTuple):
    """One level of a lookup: its spec (None: not found, `why` says so), static search
    locations, kind, and the paths its answer depends on (`find_module`'s `consulted`)."""

    spec: Any
    locations: tuple[str, ...]
    kind: str
    consulted: tuple[tuple[str, str], ...]
    why: str = ""


class _Parent(NamedTuple):
    """A regular package as a parent: its search locations, kind, the paths they depend on,
    whether it was imported in a child; `why` it cannot be one (empty: it can)."""

    locations: tuple[str, ...]
    kind: str
    consulted: tuple[tuple[str, str], ...]
    executed: bool
    why: str = ""


def find_module(name: str, python_path: list[str] | tuple[str, ...] = (), *,
                allow_exec: bool = False, invalidate: bool = True,
                exec_cache: dict[str, Executed] | None = None,
                effect_of: Callable[[str], str] = _path_effect,
                consulted: set[tuple[str, str]] | None = None, resolved: bool = False,
                imported: bool = True, levels: Levels | None = None) -> Found:
    """Where import finds `name` with `python_path` ahead of sys.path; NotFound says which
    level failed and which search locations (which parent's `__path__`) were searched.
    `exec_cache` remembers what parents imported in a child (`allow_exec`) told, so one
    planning pass imports each at most once. `effect_of(__init__ file)` tells what
    running it does to `__path__` (`path_effect`; a caller may remember it by the file's stamp).
    `consulted` (when given) collects what the answer depends on: `(directory, name)` for
    each name looked up in each directory searched (`candidates`), and `(file, "")` for
    each `__init__` whose effect on `__path__` was read, and for a parent run in a child
    what decided its `__path__` (`Executed.depends`); a caller may remember the answer while
    none of them changes. `resolved`: `python_path` is already absolute and resolved. `imported=False`
    answers as a fresh process would (a build worker): modules this process already
    imported, from wherever, are looked up on the path like any other. `levels` remembers
    each level's answer for later calls with `imported=False`, the same `python_path` and
    the same `allow_exec` and `effect_of` (`Levels`: one planning pass's)."""
    if not resolved:
        python_path = [str(Path(p).resolve()) for p in python_path]
    memo = levels if levels is not None and not imported and levels.python_path == tuple(python_path) \
        else None
    saved = sys.path[:]
    # first even where already on sys.path further back, as the build worker puts them
    # (`cutecc.plan.keyed_sources.front`): a script's same-named module never shadows them
    sys.path[:] = [*python_path, *(p for p in saved if p not in python_path)]
    if invalidate:  # FileFinder caches directory listings; one call per planning pass is enough
        importlib.invalidate_caches()
    try:
        parts = name.split(".")
        found = Found(name, None, False)
        search: list[str] | None = None  # None: the top level, i.e. sys.path
        for i in range(len(parts)):
            full = ".".join(parts[: i + 1])
            step = memo.specs.get(full) if memo is not None else None
            if step is None:
                step = _level(full, parts, i, search, found, imported)
                if memo is not None:
                    memo.specs[full] = step
            if consulted is not None:
                consulted.update(step.consulted)
            if step.spec is None:
                raise NotFound(step.why)
            spec, kind = step.spec, step.kind
            locs = list(step.locations)
            last = i == len(parts) - 1
            if not last:
                if spec.submodule_search_locations is None:
                    raise NotFound(f"{full!r} is a module, not a package ({spec.origin})")
                if kind == "package":
                    parent = None
                    if memo is not None:
                        parent = memo.parents.get((full, "")) or memo.parents.get((full, parts[i + 1]))
                    if parent is None:
                        parent, sub = _parent(full, parts, i, search, spec, locs, python_path,
                                              allow_exec, exec_cache, effect_of)
                        if memo is not None:
                            memo.parents[(full, sub)] = parent
                    if consulted is not None:
                        consulted.update(parent.consulted)
                    if parent.why:
                        raise NotFound(parent.why)
                    locs, kind = list(parent.locations), parent.kind
                    if parent.executed:
                        found.executed.append(full)
                search = locs
            found.levels.append((full, kind))
            if last:
                found.origin = spec.origin if spec.has_location else None
                found.is_package = spec.submodule_search_locations is not None
                found.locations = locs
        return found
    finally:
        sys.path[:] = saved


def _level(full: str, parts: list[str], i: int, search: list[str] | None, found: Found,
           imported: bool) -> _Step:
    """Level `i` of a lookup (`full`) over its parent's `search` (None: sys.path)."""
    seen: set[tuple[str, str]] = set()
    _consult(seen, sys.path if search is None else search, parts[i])
    mod = sys.modules.get(full) if imported else None
    known = getattr(mod, "__spec__", None) if mod is not None else None
    if known is not None:
        # already imported here: import would use it
        return _Step(known, tuple(getattr(mod, "__path__", []) or []), "imported", tuple(seen))
    spec = _find_spec(full, search)
    if spec is None:
        where = ("sys.path and the manifest's python_path" if search is None else
                 f"{'.'.join(parts[:i])}.__path__ = {search}"
                 + (" (learned by importing it)" if ".".join(parts[:i]) in found.executed else ""))
        return _Step(None, (), "", tuple(seen), f"no module named {full!r} (searched {where})")
    if spec.submodule_search_locations is None:
        kind = "module"
    elif spec.origin in (None, "namespace") or not spec.has_location:
        kind = "namespace"
    else:
        kind = "package"
    return _Step(spec, tuple(spec.submodule_search_locations or []), kind, tuple(seen))


def _parent(full: str, parts: list[str], i: int, search: list[str] | None, spec: Any,
            locs: list[str], python_path: Sequence[str], allow_exec: bool,
            exec_cache: dict[str, Executed] | None, effect_of: Callable[[str], str]) -> tuple[_Parent, str]:
    """A regular package `full` as the parent of `parts[i + 1]`, and what a `Levels` may keep
    it under: "" (any submodule), or the submodule (its `__init__` only appends to
    `__path__`: whether the static locations hold this one decides). A child's import
    that fails raises ExecFailed (not kept)."""
    origin: str = spec.origin
    seen: set[tuple[str, str]] = set()
    effect = effect_of(origin)
    if origin:
        seen.add((origin, ""))
    kind = "package"
    sub = ""
    if effect == "extend":
        parent_search = sys.path if search is None else search
        _consult(seen, parent_search, parts[i])  # its portions and .pkg files
        _consult(seen, parent_search, parts[i] + ".pkg")
        locs = _extend_path(locs, full, parent_search)
        kind = "package (pkgutil/pkg_resources portion)"
    elif effect == "append":
        # __init__ only appends: a hit in the static locations is exact; a miss
        # there needs the appended entries, i.e. running __init__ (below).
        sub = parts[i + 1]
        nxt = ".".join(parts[: i + 2])
        _consult(seen, locs, sub)
        if _find_spec(nxt, locs) is None:
            effect = "unknown"
        else:
            kind = "package (__init__ appends to __path__; not needed here)"
    if effect == "unknown":
        if not allow_exec:
            return _Parent((), "", tuple(seen), False,
                           f"{full}/__init__.py changes __path__ in a way only running it tells "
                           f"({origin}); allow_exec=True imports it in a child process"), sub
        if exec_cache is not None and full in exec_cache:
            told = exec_cache[full]
        else:
            told = _exec_path(full, python_path)  # ExecFailed: not kept, the next lookup tries again
            if exec_cache is not None:
                exec_cache[full] = told
        seen.update(told.depends)
        return _Parent(tuple(told.path), "package (__path__ set by running __init__)", tuple(seen), True), sub
    return _Parent(tuple(locs), kind, tuple(seen), False), sub
