"""The runtime reads the cache through `cutecc.store.layout` and `cutecc.store.view` only:
the writer (publish, removal, quarantine, sweeping) is never in its import closure, lazy
imports included, so a deployment that only loads kernels carries no code that rewrites
the cache."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from helpers import PY

PACKAGE = Path(__file__).resolve().parents[2] / "cutecc"
RUNTIME = ("cutecc.runtime", "cutecc.torch", "cutecc.entry")
WRITER = "cutecc.store.writer"
# The build side the top-level package (which `import cutecc.runtime` runs) reaches only behind
# an opt-in, at a miss, on a development host with the DSL: `cutecc.load`'s just-in-time
# builder factory (`cutecc.load(jit=True)`), never what a deployment runs, so the closure stops
# there. The runtime itself imports none of it (tests/architecture/test_import_layers.py).
OPT_IN = frozenset({"cutecc.build.jit"})


def _file(module: str) -> Path | None:
    p = PACKAGE.parent.joinpath(*module.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _imports(module: str) -> set[str]:
    path = _file(module)
    assert path is not None, module
    return imports_in(path.read_text())


def imports_in(source: str) -> set[str]:
    """The cutecc modules `source` imports anywhere (functions too), their packages included;
    imports only a type checker sees (`if TYPE_CHECKING:`) are not imports at run time."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    named: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names if a.name.split(".")[0] == "cutecc"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "cutecc":
            named.add(node.module)
            named |= {f"{node.module}.{a.name}" for a in node.names if _file(f"{node.module}.{a.name}")}
    out = set()
    for name in named:
        parts = name.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if _file(".".join(parts[:i]))}
    return out


def runtime_closure() -> set[str]:
    """Every cutecc module the runtime's modules can import, transitively."""
    start = [m for m in RUNTIME if _file(m)]
    start += [f"cutecc.runtime.{p.stem}" for p in (PACKAGE / "runtime").glob("*.py") if p.stem != "__init__"]
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m not in seen and m not in OPT_IN:
            seen.add(m)
            todo += sorted(_imports(m) - seen)
    return seen


def store_lines(modules: set[str]) -> int:
    """Lines of the store's modules among `modules`."""
    return sum(len(f.read_text().splitlines()) for m in sorted(modules)
               if m.startswith("cutecc.store") for f in [_file(m)] if f is not None)


def test_the_runtimes_import_closure_holds_the_view_and_not_the_writer() -> None:
    closure = runtime_closure()
    assert {"cutecc.runtime.loader", "cutecc.store.layout", "cutecc.store.view"} <= closure
    assert WRITER not in closure
    # What of the store a deployment imports is smaller than the whole store.
    whole = {f"cutecc.store.{p.stem}" for p in (PACKAGE / "store").glob("*.py")} | {"cutecc.store"}
    assert store_lines(closure) < store_lines(whole)


def test_the_closure_check_sees_lazy_imports_and_not_type_checking_ones() -> None:
    """The check can fail: an import inside a function counts; one a type checker alone sees
    does not."""
    lazy = "def f():\n    from cutecc.store.writer import Store\n    return Store\n"
    assert WRITER in imports_in(lazy) and "cutecc.store" in imports_in(lazy)
    typing_only = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from cutecc.store.writer import Store\n")
    assert imports_in(typing_only) == set()


LOAD = r'''
import sys
import cutecc
try:
    cutecc.load(sys.argv[1], arch="sm_90a")
except cutecc.CuteccError as e:
    assert "no entries" in str(e) or "no kernel" in str(e), e
print("\n".join(sorted(m for m in sys.modules if m.startswith("cutecc"))))
'''


def test_loading_a_cache_does_not_import_the_writer(tmp_path: Path) -> None:
    from cutecc.store.writer import Store

    Store(tmp_path / "c").ensure()
    r = subprocess.run([PY, "-c", LOAD, str(tmp_path / "c")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert "cutecc.runtime.loader" in modules and "cutecc.store.view" in modules
    assert WRITER not in modules
