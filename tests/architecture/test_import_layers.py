"""The package's import graph: no cycles, and no import that climbs back up the layers.

The layers are the folders of `cutecc/`: each subpackage is one layer, and the modules at
the top (with `contract/`, the calling convention's records, and `entry/`, what a cache
entry is) are the shared base. `LAYERS`
lists them bottom up, each with the layers it may import; a new folder joins it here, or
the test says where it is missing. The graph is read from the source (never by importing
it) and counts every import of a cutecc module: at module level, inside functions (lazy
imports), and under `if TYPE_CHECKING:`. `from cutecc.x import y` depends on `cutecc.x.y`
when that is a module, else on `cutecc.x`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"

# The public faces sit at the top of the package: `cutecc.torch` (the PyTorch face of
# runtime/torch) belongs to the runtime, `cutecc.__main__` (`python -m cutecc`) to the command
# line, and `cutecc` itself (load, the exceptions) fronts the runtime and the build side alike:
# its `load` registers the build side's just-in-time builder with the runtime's miss hook.
FACES = {"cutecc": "face", "cutecc.torch": "runtime", "cutecc.__main__": "cli"}

# layer (a folder of cutecc/, or "base"): (the layers it may import), bottom up
LAYERS: dict[str, tuple[str, ...]] = {
    # Records and rules every side shares (top-level modules, contract/, entry/); no I/O beyond
    # reading a file it is handed.
    "base": (),
    # The cache directory: every path in it, every write to it.
    "store": ("base",),
    # kernels.lock, its lines (`Pin`, `LockEntry`, `Tuned`) and its signature.
    "lock": ("base", "store"),
    # What a deploy host runs: load a cache or a lock, call kernels (JAX, torch).
    "runtime": ("base", "store", "lock"),
    # kernels.toml: its grammar, records and tuning spaces; knows nothing of cache or runtime.
    "manifest": ("base",),
    # What the build reads of its tools and of the build host (the installed code's facts
    # are remembered in the cache's planning area, named by the store's layout).
    "toolchain": ("base", "store"),
    # What arrives and leaves: the remote cache, packs, the one verifier of foreign entries.
    "ship": ("base", "store", "lock", "runtime", "toolchain"),
    # What to build: keys, the build plan, the tuning plan, what covers a missed call (matched
    # by the runtime's own rule).
    "plan": ("base", "store", "lock", "runtime", "manifest", "toolchain"),
    # Building: compile and link one artifact; the pipeline, workers and executors for many;
    # the just-in-time builder a `load(jit=True)` registers with the runtime's miss hook.
    "build": ("base", "store", "lock", "runtime", "manifest", "toolchain", "ship", "plan"),
    # Measuring tuning candidates on a GPU (the child runs the runtime).
    "tuning": ("base", "store", "lock", "runtime", "manifest", "toolchain", "ship", "plan", "build"),
    # One library function per command, each returning a report.
    "commands": ("base", "store", "lock", "runtime", "manifest", "toolchain", "ship", "plan", "build",
                 "tuning"),
    # The command line: parsing, rendering, progress.
    "cli": ("base", "store", "lock", "runtime", "manifest", "toolchain", "ship", "plan", "build",
            "tuning", "commands"),
    # The top-level package (`cutecc.load`, the exceptions): fronts the runtime and, behind
    # `load(jit=True)`, the build side's just-in-time builder.
    "face": ("base", "store", "lock", "runtime", "manifest", "toolchain", "ship", "plan", "build",
             "tuning", "commands", "cli"),
}
# The runtime's side: what a deploy host runs. It imports none of the others, in any way.
DEPLOY_SIDE = ("base", "store", "lock", "runtime")
BASE_FOLDERS = ("contract", "entry")  # folders that belong to the base layer


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        out[name] = f
    return out


@functools.cache
def _graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {cutecc module it imports: the line of the first such import}."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = {}
    for mod, f in modules.items():
        deps: dict[str, int] = {}
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                while t and t not in modules:  # `import cutecc.x.y` names a module; an attribute is not one
                    t = t.rpartition(".")[0]
                if t.startswith("cutecc") and t != mod:
                    deps.setdefault(t, node.lineno)
        graph[mod] = deps
    return graph


def _module_level_lines(module: str) -> set[int]:
    """The lines of `module`'s imports that run when it is imported (outside any function)."""
    tree = ast.parse(_modules()[module].read_text())
    out: set[int] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.add(child.lineno)
            visit(child)

    visit(tree)
    return out


def _layer_of(module: str) -> str | None:
    """The layer of `module`: its folder under cutecc/, base for the top-level modules."""
    if module in FACES:
        return FACES[module]
    parts = module.split(".")
    if len(parts) == 2 and (ROOT / f"{parts[1]}.py").is_file():
        return "base"
    folder = parts[1] if len(parts) > 1 else None
    if folder in BASE_FOLDERS:
        return "base"
    return folder if folder in LAYERS else None


def test_every_module_is_in_one_layer_and_layers_import_only_layers_before_them() -> None:
    order = list(LAYERS)
    for layer, allowed in LAYERS.items():
        assert all(a in order[: order.index(layer)] for a in allowed), (layer, allowed)
    missing = sorted(m for m in _modules() if _layer_of(m) is None)
    assert not missing, f"modules in no layer (a new folder joins LAYERS in {__file__}): {missing}"


def test_the_top_of_the_package_holds_about_a_dozen_modules() -> None:
    """The tree shows the layers: what is left at the top is the shared base and the faces."""
    top = sorted(f.stem for f in ROOT.glob("*.py") if f.stem not in ("__init__", "__main__"))
    assert len(top) <= 12, top  # the base records and the two faces


def test_no_import_climbs_back_up_the_layers() -> None:
    """0 imports (lazy ones included) of a layer a module's layer may not import."""
    upward = []
    for mod, deps in sorted(_graph().items()):
        here = _layer_of(mod)
        assert here is not None
        for dep, line in sorted(deps.items()):
            there = _layer_of(dep)
            if there != here and there not in LAYERS[here]:
                upward.append(f"{mod}:{line} ({here}) imports {dep} ({there})")
    assert upward == [], "\n".join(upward)


def test_the_package_has_no_import_cycle_lazy_imports_included() -> None:
    """No module reaches itself through imports, whether at module level or inside functions
    (a lazy import hides a cycle from Python, not from the reader)."""
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, " -> ".join([*path[path.index(m):], m])
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_the_checker_sees_lazy_relative_and_type_only_imports(tmp_path: Path) -> None:
    """The graph's reader, on a package written for it: an import in a function, a relative
    one, one under TYPE_CHECKING, and `from pkg import module` vs `from pkg import name`."""
    pkg = tmp_path / "cutecc"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def load():\n    from cutecc.sub import b\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from cutecc.sub.b import X\nfrom cutecc import errors\n")
    (pkg / "errors.py").write_text("VALUE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom cutecc.errors import VALUE\n")
    g = _graph(pkg)
    assert set(g["cutecc"]) == {"cutecc.sub.b"}
    assert set(g["cutecc.a"]) == {"cutecc.sub.b", "cutecc.errors"}
    assert set(g["cutecc.sub.b"]) == {"cutecc.a", "cutecc.errors"}


def _imports_anywhere(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every cutecc module `path` names in an import of any kind: `import`, `from ... import`
    (relative ones resolved) at module level, in a function, under TYPE_CHECKING, and
    `importlib.import_module("cutecc...")` or `__import__("cutecc...")` with a literal name."""
    graph = _graph(root)
    mod = next(m for m, f in _modules(root).items() if f == path)
    out = [(line, dep) for dep, line in graph[mod].items()]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.startswith("cutecc") \
                and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__"):
            out.append((node.lineno, node.args[0].value))
    return sorted(out)


def test_the_runtime_imports_nothing_of_the_build_side_in_any_way() -> None:
    """0 imports from `cutecc/runtime/` (and the PyTorch face) of any layer but the deploy
    side's, lazy ones and dynamic ones included: the runtime offers a miss hook
    (`cutecc.runtime.jit_hook`) that the build side's just-in-time builder registers with."""
    found = []
    for mod, f in sorted(_modules().items()):
        if _layer_of(mod) != "runtime":
            continue
        for line, dep in _imports_anywhere(f):
            there = _layer_of(dep) if dep in _modules() else None
            if there not in DEPLOY_SIDE:
                found.append(f"{mod}:{line} imports {dep} ({there})")
    assert found == [], "\n".join(found)


def test_the_runtime_check_sees_lazy_and_dynamic_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "cutecc"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "build").mkdir()
    for f in ("__init__.py", "runtime/__init__.py", "build/__init__.py", "build/jit.py"):
        (pkg / f).write_text("")
    (pkg / "runtime" / "hook.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cutecc.build import jit\n"
        "def hook():\n    from ..build import jit\n"
        "def other():\n    import importlib\n    importlib.import_module('cutecc.build.jit')\n"
        "    __import__('cutecc.build')\n")
    assert _imports_anywhere(pkg / "runtime" / "hook.py", pkg) == [
        (3, "cutecc.build.jit"), (8, "cutecc.build.jit"), (9, "cutecc.build")]
