"""The runtime's settings are read once, at the edge: under `cutecc/runtime/`, the one function
that reads the environment (`os.environ`, `os.getenv`, a settings row's value) is
`RuntimeSettings.from_environment`; everything else takes what it read, typed. Every setting
it reads is a row of the table (`cutecc/settings.py`), and every row of the runtime's group
is read there."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from helpers import REPO

from cutecc import settings
from cutecc.runtime import runtime_settings

RUNTIME = REPO / "cutecc" / "runtime"
EDGE = ("cutecc/runtime/runtime_settings.py", "RuntimeSettings.from_environment")
ROWS = {n for n, v in vars(settings).items() if isinstance(v, settings.Setting)}
_VALUE = {"read", "on", "text"}  # what a row's value is read by
_READERS = {"read_only", "switch"}  # the table's functions that read a variable
_WHOLE = {"TABLE", "BY_ENV"}  # the table itself (each row's value read in a loop)


def _reads(tree: ast.AST) -> list[tuple[str, int, str]]:
    """(enclosing function, line, what) of each read of the environment in `tree`."""
    from_settings: set[str] = set()  # names imported from cutecc.settings
    from_os: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "cutecc.settings":
            from_settings |= {a.asname or a.name for a in node.names}
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            from_os |= {a.asname or a.name for a in node.names}
    out: list[tuple[str, int, str]] = []

    def is_row(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.value.id == "settings" and node.attr in ROWS
        return isinstance(node, ast.Name) and node.id in from_settings and node.id in ROWS

    def what(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "getenv", "environb", "getenvb"):
            return f"os.{node.attr}"
        if isinstance(node, ast.Name) and node.id in from_os and node.id.startswith(("environ", "getenv")):
            return node.id
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _VALUE \
                and is_row(node.func.value):
            return f"{ast.unparse(node.func)}()"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "settings" and node.attr in _READERS | _WHOLE:
            return f"settings.{node.attr}"
        if isinstance(node, ast.Name) and node.id in from_settings and node.id in _READERS | _WHOLE:
            return node.id
        return None

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            got = what(child)
            if got:
                out.append((inner, getattr(child, "lineno", 0), got))
            visit(child, inner)

    visit(tree, "")
    return out


def _runtime_reads(root: Path = RUNTIME) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(REPO)) if p.is_relative_to(REPO) else p.name
        for scope, line, got in _reads(ast.parse(p.read_text(encoding="utf-8"))):
            if (rel, scope) != EDGE:
                out.setdefault(rel, []).append(f"{scope or '<module>'}:{line} {got}")
    return out


def test_no_runtime_module_reads_the_environment_but_the_edge() -> None:
    assert _runtime_reads() == {}, ("read the environment outside "
                                    f"{EDGE[1]} (take a RuntimeSettings instead): {_runtime_reads()}")
    # and the edge does read it: the settings of the runtime come from there
    edge = _reads(ast.parse((REPO / EDGE[0]).read_text(encoding="utf-8")))
    assert {scope for scope, _, _ in edge} == {EDGE[1]}, edge


def test_the_check_finds_each_way_of_reading_the_environment(tmp_path: Path) -> None:
    """The check above can fail: each way a module could read a variable is found."""
    (tmp_path / "bad.py").write_text(
        "import os\nfrom os import getenv\nfrom cutecc import settings\nfrom cutecc.settings import JIT\n"
        "def a():\n    return os.environ.get('X')\n"
        "def b():\n    return getenv('X')\n"
        "class C:\n    def c(self):\n        return settings.STRICT.on()\n"
        "def d():\n    return JIT.text()\n"
        "def e():\n    return settings.read_only()\n"
        "def f():\n    return [s.read() for s in settings.TABLE]\n"
        "def g():\n    return settings.STRICT.where, JIT.env\n")  # names, not values: fine
    got = _runtime_reads(tmp_path)["bad.py"]
    assert [g.split(":")[0] for g in got] == ["a", "b", "C.c", "d", "e", "f"], got


def test_every_runtime_setting_is_a_row_read_at_the_edge() -> None:
    rows = runtime_settings.READ_AT_LOAD
    fields = {f.name for f in dataclasses.fields(runtime_settings.RuntimeSettings)} - {"origin"}
    assert set(rows) == fields  # each field has its row, each row its field
    assert all(r in settings.TABLE for r in rows.values())
    # every row of the table's runtime group is read by the load (none read elsewhere, later)
    assert {s.env for s in settings.TABLE if s.group == "runtime"} <= {r.env for r in rows.values()}
