"""Every directory cutecc keeps on a machine comes from one module, `cutecc/store/homes.py`
(issue 46): no other module asks platformdirs for a directory, asks `tempfile` where the
temporary directory is, reads the variables that place a home (`$XDG_CACHE_HOME`,
`$XDG_RUNTIME_DIR`, `$ZIG_GLOBAL_CACHE_DIR`, `$CUTECC_PLATFORM_LIBS`, `$CUTECC_PLAN_MEMORY`,
`$CUTECC_CACHE_DIR`), names `~/.cache`, or builds a per-user directory's name from
`os.getuid()`.

Read from the source (never by importing it). A throwaway directory a function makes and
removes itself (`tempfile.mkdtemp`, `TemporaryDirectory`) is no home and stays allowed.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
HOMES = "cutecc/store/homes.py"
PLACING = {"XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "ZIG_GLOBAL_CACHE_DIR", "CUTECC_PLATFORM_LIBS",
           "CUTECC_PLAN_MEMORY", "CUTECC_CACHE_DIR"}
# names of cutecc.environ that hold a placing variable (read through environ.NAME)
ENVIRON_NAMES = {"CACHE_DIR", "PLAN_MEMORY"}


def _placing(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and node.value in PLACING) or (
        isinstance(node, ast.Attribute) and node.attr in ENVIRON_NAMES)


def _reads_a_placing_variable(node: ast.AST) -> bool:
    """`os.environ.get(X)`, `os.getenv(X)`, `os.environ[X]` of a home's variable (naming one,
    in a list of what `cutecc env` shows, is no read)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        return node.func.attr in ("get", "getenv") and _placing(node.args[0])
    return isinstance(node, ast.Subscript) and _placing(node.slice) and "environ" in ast.unparse(node.value)


def _homes_built(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each way `tree` builds a home, sorted."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.split(".")[0] == "platformdirs" for n in names):
                out.append((node.lineno, "imports platformdirs"))
            if isinstance(node, ast.ImportFrom) and node.module == "tempfile" and any(
                    a.name == "gettempdir" for a in node.names):
                out.append((node.lineno, "imports tempfile.gettempdir"))
        elif isinstance(node, ast.Attribute) and node.attr in ("gettempdir", "user_cache_dir",
                                                                "user_runtime_dir", "tempdir"):
            out.append((node.lineno, f"asks for .{node.attr}"))
        elif _reads_a_placing_variable(node):
            out.append((node.lineno, f"reads ${ast.unparse(node)}, a home's variable"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "~/.cache" in node.value or "/.cache/" in node.value:
                out.append((node.lineno, "names ~/.cache"))
        elif isinstance(node, ast.JoinedStr) and any(
                isinstance(v, ast.FormattedValue) and "getuid" in ast.unparse(v.value) for v in node.values):
            out.append((node.lineno, "names a per-user directory by its uid"))
    return sorted(out)


def test_every_home_comes_from_the_one_module() -> None:
    found = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = str(f.relative_to(ROOT.parent))
        if rel == HOMES:
            continue
        tree = ast.parse(f.read_text(), rel)
        found += [f"{rel}:{line}: {what}" for line, what in _homes_built(tree)]
    assert found == [], "homes built outside cutecc/store/homes.py:\n" + "\n".join(found)


def test_the_check_sees_each_way_of_building_a_home() -> None:
    src = ("import platformdirs\n"
           "from tempfile import gettempdir\n"
           "d = tempfile.gettempdir()\n"
           "e = os.environ.get('XDG_RUNTIME_DIR')\n"
           "f = Path('~/.cache/x')\n"
           "g = f'cutecc-wrap-{os.getuid()}'\n"
           "h = os.environ.get(environ.CACHE_DIR)\n"
           "named = (environ.CACHE_DIR, 'XDG_RUNTIME_DIR')\n"
           "ok = tempfile.mkdtemp(prefix='cutecc-x-')\n"
           "fine = os.getuid() == st.st_uid\n")
    assert [line for line, _ in _homes_built(ast.parse(src))] == [1, 2, 3, 4, 5, 6, 7]


def test_the_one_module_names_every_home_and_each_is_versioned() -> None:
    """One versioned name per home, and the one owner-and-link check lives there."""
    from cutecc.store import homes

    assert set(homes.NAMES) == set(homes.VARIABLES) == set(homes.WHAT)
    for name in homes.NAMES:
        path = homes.path_of(name)
        if path is not None and name != homes.CACHE and not os.environ.get(homes.VARIABLES[name]):
            assert "-v1" in path.name, (name, path)
    owner_checks = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = str(f.relative_to(ROOT.parent))
        src = f.read_text()
        if rel != HOMES and "st_uid != os.getuid()" in src:
            owner_checks.append(rel)
    assert owner_checks == [], f"restate the owner-and-link check (use homes.why_not_mine): {owner_checks}"
