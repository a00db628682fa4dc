"""Every create and delete in the cache goes through `cutecc/store/writer.py`.

Read from the source (never by importing it): a module outside `cutecc/store/` that knows
the store (imports any of `cutecc.store` but its homes, lazily or for types only: it holds
cache paths)
calls no file-system primitive that creates, writes, renames or deletes (`unlink`,
`rmtree`, `mkdir`, `write_bytes`, `os.replace`, `atomic_write`, `open(.., "w")`, ...),
except on a path it made with `tempfile` in the same function, or where ALLOWED says why
the path is not the cache's. `cutecc/atomic.py` is the atomic-write primitive the store
calls; `cutecc/store/misses.py` is the store's one writer the runtime may import (the
runtime never imports the writer: tests/store/test_runtime_reads_only.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
EXEMPT = ("cutecc/store/", "cutecc/atomic.py")

# (module, function): why what it writes or deletes is not in the cache, or is the store's
ALLOWED = {
    ("cutecc/ship/ingest.py", "publish.stage"):
        "fills the staging directory Store.publish hands its build callback (the writer hashes, "
        "records and renames it into place, or deletes it)",
    ("cutecc/build/workers.py", "build_one.produce"):
        "compiles into the staging directory Store.publish hands it and deletes the object file "
        "there before the writer publishes it",
    ("cutecc/commands/pack.py", "pack"): "the pack's output directory, which the user names",
    ("cutecc/commands/tune.py", "tune"): "--results: a file the user names",
    ("cutecc/lock/lockfile.py", "write_lock"): "the project's kernels.lock, beside its manifest",
    ("cutecc/build/executors/ray.py", "_in_driver_process"): "the Ray driver's private temporary directory",
    ("cutecc/build/executors/ray.py", "_private_temp_dir"):
        "a fresh directory in the system's temporary directory (`cutecc.store.homes.short_temp_dir`)",
}

_METHODS = {"unlink", "rmdir", "mkdir", "write_bytes", "write_text", "rename", "touch",
            "symlink_to", "hardlink_to", "chmod"}
_FUNCTIONS = {("shutil", n) for n in ("rmtree", "move", "copy", "copy2", "copyfile", "copytree")} | {
    ("os", n) for n in ("remove", "unlink", "rename", "replace", "makedirs", "mkdir", "rmdir", "symlink",
                        "link", "chmod", "utime")}
_NAMES = {"atomic_write", "make_dir", "rmtree", "copytree", "copyfile"}


def _knows_the_store(tree: ast.AST) -> bool:
    """Whether the module imports any of `cutecc.store` but its homes (`cutecc.store.homes`:
    the other directories cutecc keeps, which are not the cache)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[:2] == ["cutecc", "store"] \
                and n.module != "cutecc.store.homes" and any(a.name != "homes" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and n.module == "cutecc" and any(a.name == "store" for a in n.names):
            return True
        if isinstance(n, ast.Import) and any(a.name.split(".")[:2] == ["cutecc", "store"]
                                             and a.name != "cutecc.store.homes" for a in n.names):
            return True
    return False


# what a two-path primitive changes: the destination, or (a move) both
_DEST = {"symlink", "link", "copy", "copy2", "copyfile", "copytree"}


def _writes(call: ast.Call) -> tuple[str, list[ast.expr]] | None:
    """The primitive `call` writes or deletes with, and the expressions of the paths it
    changes (none where it cannot tell); None for any other call."""
    fn, args = call.func, list(call.args)
    if isinstance(fn, ast.Attribute):
        if isinstance(fn.value, ast.Name) and (fn.value.id, fn.attr) in _FUNCTIONS:
            return f"{fn.value.id}.{fn.attr}", args[1:2] if fn.attr in _DEST else args[:2]
        if fn.attr in _METHODS:
            return f".{fn.attr}", [fn.value, *args[:1]] if fn.attr == "rename" else [fn.value]
        if isinstance(fn.value, ast.Name) and fn.value.id == "tempfile" and \
                any(k.arg == "dir" for k in call.keywords):  # creates in a directory it is given
            return f"tempfile.{fn.attr}(dir=)", [k.value for k in call.keywords if k.arg == "dir"]
    elif isinstance(fn, ast.Name):
        if fn.id in _NAMES:
            return fn.id, args[1:2] if fn.id in _DEST else args[:1]
        mode = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "mode"), None)
        if fn.id == "open" and isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
            return 'open(.., "w")', args[:1]
    return None


def _uses(e: ast.AST | None, names: set[str]) -> bool:
    return e is not None and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(e))


def _made_by_tempfile(e: ast.AST | None) -> bool:
    return e is not None and any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                                 and n.value.id == "tempfile" for n in ast.walk(e))


def writes_in(source: str) -> list[tuple[str, int, str]]:
    """(function, line, primitive) of each write or delete in a module's source, but those
    on a path made with `tempfile` in the same function (or one it is nested in)."""
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: list[str], temp: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*where, child.name], set(temp))
                continue
            # names bound to a temporary path: `d = tempfile.mkdtemp()`, `with
            # tempfile.TemporaryDirectory() as d`, and what is joined from them
            if isinstance(child, (ast.Assign, ast.AnnAssign)) and child.value is not None and \
                    (_made_by_tempfile(child.value) or _uses(child.value, temp)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                temp |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if isinstance(child, ast.withitem) and child.optional_vars is not None and \
                    (_made_by_tempfile(child.context_expr) or _uses(child.context_expr, temp)):
                temp |= {n.id for n in ast.walk(child.optional_vars) if isinstance(n, ast.Name)}
            if isinstance(child, ast.Call):
                hit = _writes(child)
                if hit is not None and not (hit[1] and all(_uses(e, temp) or _made_by_tempfile(e)
                                                           for e in hit[1])):
                    out.append((".".join(where) or "<module>", child.lineno, hit[0]))
            visit(child, where, temp)

    visit(ast.parse(source), [], set())
    return out


def _modules() -> dict[str, str]:
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT.parent).as_posix()
        if not rel.startswith(EXEMPT):
            out[rel] = f.read_text()
    return out


def test_no_module_but_the_stores_writes_or_deletes_in_the_cache() -> None:
    found = []
    for rel, source in _modules().items():
        if not _knows_the_store(ast.parse(source)):
            continue
        for where, line, what in writes_in(source):
            if (rel, where) not in ALLOWED:
                found.append(f"{rel}:{line} ({where}) {what}")
    assert found == [], ("writes or deletes outside cutecc/store/ (add a writer method in "
                         "cutecc/store/writer.py, or say in ALLOWED why the path is not the cache's):\n"
                         + "\n".join(found))


def test_every_allowed_write_is_still_there() -> None:
    """An allowance outlives nothing: each names a function that still writes."""
    modules = _modules()
    stale = [k for k in ALLOWED
             if k[0] not in modules or k[1] not in {w for w, _, _ in writes_in(modules[k[0]])}]
    assert stale == []


def test_the_checker_sees_writes_and_spares_temporary_paths() -> None:
    source = '''
import os, shutil, tempfile
from pathlib import Path
from cutecc.atomic import atomic_write

def a(store):
    shutil.rmtree(store.layout.sources())
    (store.root / "x").write_bytes(b"")
    with open(store.root / "y", "wb") as f:
        pass
    atomic_write(store.root / "z", b"")
    os.replace(store.root / "p", store.root / "q")

def b():
    d = Path(tempfile.mkdtemp())
    (d / "x").write_text("")
    with tempfile.TemporaryDirectory() as t:
        p = Path(t) / "y"
        p.unlink()
        os.symlink(store.root, p)
        os.rename(p, store.root / "moved")
    shutil.rmtree(d, ignore_errors=True)

class C:
    def m(self, path):
        path.unlink(missing_ok=True)
        "a".replace("a", "b")
        open(path).read()
'''
    got = [(w, what) for w, _, what in writes_in(source)]
    assert got == [("a", "shutil.rmtree"), ("a", ".write_bytes"), ("a", 'open(.., "w")'),
                   ("a", "atomic_write"), ("a", "os.replace"), ("b", "os.rename"), ("C.m", ".unlink")]
    assert _knows_the_store(ast.parse("def f():\n    from cutecc.store.view import StoreView\n"))
    assert not _knows_the_store(ast.parse("from cutecc.atomic import atomic_write\n"))
    assert not _knows_the_store(ast.parse("from cutecc.store import homes\n"))
    assert _knows_the_store(ast.parse("from cutecc.store import homes, Store\n"))
