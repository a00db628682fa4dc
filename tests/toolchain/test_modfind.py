"""Finding modules as Python's import system does: namespace
packages and packages split over several directories are found, keyed, and nothing of
theirs is run while planning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from cutecc.toolchain import modfind

MANIFEST = """\
archs = ["sm_90a"]
python_path = ["a", "b"]

[kernel.k]
entry = "{entry}"
args = [
  {{ name = "x", dtype = "float32", shape = ["n"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
]
"""

RAN = "import builtins\nbuiltins.CUTECC_TEST_PACKAGE_RAN = True\n"

FILES = {
    # A PEP 420 namespace top level (as flash-attn-4's flash_attn/), a regular
    # subpackage whose __init__ must not run, then the launcher's module
    "a/nsk/cute/__init__.py": RAN,
    "a/nsk/cute/fwd.py": "from . import helper\n\n\ndef launch(x, out):\n    return helper.H\n",
    "a/nsk/cute/helper.py": "H = 1\n",
    # A pkgutil-style package split over a/ and b/ (its subpackage lives in b/)
    "a/splitk/__init__.py": "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n",
    "a/splitk/one.py": "X = 1\n",
    "b/splitk/__init__.py": "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n",
    "b/splitk/two.py": "def launch(x, out):\n    return 2\n",
    # PEP 420 portions in a/ and b/
    "a/nsp/x.py": "X = 1\n",
    "b/nsp/sub/y.py": "def launch(x, out):\n    return 3\n",
}

ENTRIES = {"nsk.cute.fwd": "nsk/cute/fwd.py", "splitk.two": "splitk/two.py", "nsp.sub.y": "nsp/sub/y.py"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def _real_file(root: Path, module: str) -> str:
    code = "import importlib, sys; print(importlib.import_module(sys.argv[1]).__file__)"
    env = {"PYTHONPATH": f"{root / 'a'}:{root / 'b'}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, env=env,
                       cwd=root, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("module", sorted(ENTRIES))
def test_modules_are_found_where_import_finds_them(tree: Path, module: str) -> None:
    found = modfind.find_module(module, [str(tree / "a"), str(tree / "b")])
    assert found.origin is not None
    assert Path(found.origin).resolve() == Path(_real_file(tree, module)).resolve()
    import builtins

    assert not any(m.startswith(("nsk", "splitk", "nsp")) for m in sys.modules)
    assert not hasattr(builtins, "CUTECC_TEST_PACKAGE_RAN")  # nothing of theirs ran here


@pytest.mark.parametrize("module", sorted(ENTRIES))
def test_namespace_and_split_packages_plan_and_key_their_source(tree: Path, module: str) -> None:
    manifest = tree / "kernels.toml"
    manifest.write_text(MANIFEST.format(entry=f"{module}:launch"))
    [p] = plan(load_manifest(manifest))
    assert any(s.endswith(ENTRIES[module].split("/", 1)[1]) for s in p.sources), p.sources
    src = tree / ("a" if module == "nsk.cute.fwd" else "b") / ENTRIES[module]
    src.write_text(src.read_text() + "# edited\n")
    [q] = plan(load_manifest(manifest))
    assert q.key != p.key  # the found module's source is in the key


def test_a_missing_module_is_still_a_manifest_error(tree: Path) -> None:
    from cutecc.errors import CuteccError

    manifest = tree / "kernels.toml"
    manifest.write_text(MANIFEST.format(entry="nsk.cute.nothere:launch"))
    with pytest.raises(CuteccError, match='cannot find module "nsk.cute.nothere"'):
        plan(load_manifest(manifest))


# A package whose __init__ appends another distribution's directory to its
# own __path__ at import time (the DSL's `cutlass` adds nvidia-cutlass-operators' `cutlass/`
# this way: importlib.metadata finds the distribution, `locate_file` gives the directory).
EXTENDING_INIT = """\
import importlib.metadata as _md
from pathlib import Path

try:
    _dist = _md.distribution("fake-hostpkg-ext")
except _md.PackageNotFoundError:
    _dist = None
if _dist is not None:
    _portion = str(_dist.locate_file("hostpkg"))
    if Path(_portion).is_dir() and _portion not in __path__:
        __path__.append(_portion)
"""

EXTENDED = {
    "base/hostpkg/__init__.py": EXTENDING_INIT,
    "base/hostpkg/own.py": "X = 1\n",
    "ext/fake_hostpkg_ext-1.0.dist-info/METADATA":
        "Metadata-Version: 2.1\nName: fake-hostpkg-ext\nVersion: 1.0\n",
    "ext/fake_hostpkg_ext-1.0.dist-info/top_level.txt": "hostpkg\n",
    "ext/fake_hostpkg_ext-1.0.dist-info/RECORD": "",
    "ext/hostpkg/ext/__init__.py": "",
    "ext/hostpkg/ext/ops.py": "from . import helper\n\n\ndef launch(x, out):\n    return helper.H\n",
    "ext/hostpkg/ext/helper.py": "H = 1\n",
}


@pytest.fixture
def extended(tmp_path: Path) -> Path:
    for rel, text in EXTENDED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_module_a_package_adds_to_its_own_path_at_import_is_found_and_keyed(extended: Path) -> None:
    manifest = extended / "kernels.toml"
    manifest.write_text(MANIFEST.replace('["a", "b"]', '["base", "ext"]')
                        .format(entry="hostpkg.ext.ops:launch"))
    [p] = plan(load_manifest(manifest))
    assert {"hostpkg/__init__.py", "hostpkg/ext/ops.py", "hostpkg/ext/helper.py"} <= set(p.sources), p.sources
    helper = extended / "ext/hostpkg/ext/helper.py"
    helper.write_text("H = 2\n")
    [q] = plan(load_manifest(manifest))
    assert q.key != p.key  # the extension's source is in the key
    import builtins

    assert "hostpkg" not in sys.modules and not hasattr(builtins, "CUTECC_TEST_PACKAGE_RAN")


def test_a_module_not_found_says_which_parent_path_was_searched(extended: Path) -> None:
    from cutecc.errors import CuteccError

    manifest = extended / "kernels.toml"
    manifest.write_text(MANIFEST.replace('["a", "b"]', '["base", "ext"]')
                        .format(entry="hostpkg.ext.nothere:launch"))
    with pytest.raises(CuteccError) as e:
        plan(load_manifest(manifest))
    text = e.value.render()
    assert e.value.exit_code == 2 and 'cannot find module "hostpkg.ext.nothere"' in text, text
    assert "hostpkg.ext.__path__" in text and str(extended / "ext/hostpkg/ext") in text, text
    # a parent whose import fails: the import error is the reason given
    (extended / "base/hostpkg/__init__.py").write_text(EXTENDING_INIT + "raise RuntimeError('no GPU here')\n")
    manifest.write_text(MANIFEST.replace('["a", "b"]', '["base", "ext"]')
                        .format(entry="hostpkg.ext.ops:launch"))
    with pytest.raises(CuteccError) as e:
        plan(load_manifest(manifest))
    assert "RuntimeError: no GPU here" in e.value.render(), e.value.render()


def test_a_package_extending_its_path_is_not_imported_again_by_a_no_op_plan(
        extended: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the child import told of `hostpkg.__path__` is remembered under the stamps of the
    `__init__` files and directories that decided it: a second planning walks no closure
    and imports nothing (seen: 8.9 s no-op builds, `cutlass` imported again each time); an
    extension that goes away is noticed."""
    import cutecc.plan.key
    import cutecc.toolchain.hashcache

    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)  # remember stamps made just now
    manifest = extended / "kernels.toml"
    manifest.write_text(MANIFEST.replace('["a", "b"]', '["base", "ext"]')
                        .format(entry="hostpkg.ext.ops:launch"))
    cache = extended / "cache" / "filehashes.json"
    cache.parent.mkdir()
    [cold] = plan(load_manifest(manifest), hash_cache=cache)
    imported: list[str] = []
    walked: list[str] = []
    real_exec, real_walk = modfind._exec_path, cutecc.plan.key.SourceIndex._walk
    monkeypatch.setattr(modfind, "_exec_path", lambda name, *a: imported.append(name) or real_exec(name, *a))
    monkeypatch.setattr(cutecc.plan.key.SourceIndex, "_walk",
                        lambda self, m: walked.append(m) or real_walk(self, m))
    [warm] = plan(load_manifest(manifest), hash_cache=cache)
    assert warm.key == cold.key and (imported, walked) == ([], [])
    # the extension's distribution is removed: its directory is gone from __path__
    import shutil

    shutil.rmtree(extended / "ext/fake_hostpkg_ext-1.0.dist-info")
    from cutecc.errors import CuteccError

    with pytest.raises(CuteccError, match='cannot find module "hostpkg.ext'):
        plan(load_manifest(manifest), hash_cache=cache)
    assert imported == ["hostpkg"]


def _answer(name: str, path: list[str], levels: modfind.Levels | None,
            exec_cache: dict[str, modfind.Executed]) -> tuple[object, ...]:
    """What `find_module` says of `name` (its Found's fields, or its error) and what it consulted."""
    consulted: set[tuple[str, str]] = set()
    try:
        f = modfind.find_module(name, path, allow_exec=True, exec_cache=exec_cache, consulted=consulted,
                                imported=False, levels=levels)
        said: tuple[object, ...] = (f.origin, f.is_package, f.levels, f.executed, f.locations)
    except modfind.NotFound as e:
        said = (type(e).__name__, str(e))
    return said, sorted(consulted)


LOOKED_UP = [  # namespace packages, pkgutil portions, a package whose __init__ appends to its
    # __path__ (a submodule in its own directory, and one only its import tells), modules,
    # names that are no module (`from a import b`'s b), a module's attribute, a missing top
    "nsk.cute.fwd", "nsk.cute.helper", "nsk.cute.H", "nsk.cute", "nsk", "splitk.two", "splitk.one",
    "splitk.three", "nsp.sub.y", "nsp.x", "nsp.sub.nothere", "nsk.cute.helper.H", "hostpkg.own",
    "hostpkg.ext.ops", "hostpkg.ext.helper", "hostpkg.ext.nothere", "hostpkg.gone", "nothere.at.all",
    "nsk.cute.fwd", "hostpkg.ext.ops", "splitk.three", "nsk.cute.helper.H",
    # a package reached through a symbolic link, and a module that is a link
    "linked.fwd", "linked.helper", "linked.nothere", "linkmod",
]


def test_levels_answer_each_lookup_as_a_lookup_alone_would(tree: Path) -> None:
    """One planning pass's `Levels` (each level of a dotted name found once) changes no answer
    and nothing consulted: every name, in the order a walk asks them (each one twice, the
    second from what the first left), against a lookup that remembers nothing."""
    for rel, text in EXTENDED.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / "b/linked").symlink_to(tree / "a/nsk/cute", target_is_directory=True)
    (tree / "b/linkmod.py").symlink_to(tree / "a/nsp/x.py")
    path = [str(tree / d) for d in ("a", "b", "base", "ext")]
    levels, execs = modfind.Levels(path), {}
    remembered = [_answer(n, path, levels, execs) for n in LOOKED_UP]
    alone = [_answer(n, path, None, {}) for n in LOOKED_UP]
    assert remembered == alone
    kinds = {lvl for said, _ in alone if len(said) == 5 for lvl in said[2]}  # type: ignore[arg-type]
    assert {("nsk", "namespace"), ("splitk", "package (pkgutil/pkg_resources portion)"),
            ("hostpkg", "package (__init__ appends to __path__; not needed here)"),
            ("hostpkg", "package (__path__ set by running __init__)")} <= kinds, kinds
    assert sum(said[0] == "NotFound" for said, _ in alone) >= 6  # the misses were asked too
    assert alone[LOOKED_UP.index("linked.fwd")][0][0] == str(tree / "b/linked/fwd.py")  # through the link
    assert alone[LOOKED_UP.index("linkmod")][0][0] == str(tree / "b/linkmod.py")
    # levels of another path answer nothing of this one's
    other = modfind.Levels([str(tree / "b")])
    with pytest.raises(modfind.NotFound):
        modfind.find_module("nsk.cute.fwd", [str(tree / "b")], imported=False, levels=other)
    assert modfind.find_module("nsk.cute.fwd", path, imported=False, levels=other).origin == alone[0][0][0]


def test_a_module_made_after_a_pass_looked_it_up_is_found_by_the_next(tree: Path) -> None:
    """A `Levels` is one planning pass's, as the import system's directory caches are: what
    it found missing stays missing for the pass; the next pass (a new one) finds the module."""
    path = [str(tree / "a"), str(tree / "b")]
    levels = modfind.Levels(path)
    with pytest.raises(modfind.NotFound):
        modfind.find_module("nsk.cute.later", path, imported=False, levels=levels)
    (tree / "a/nsk/cute/later.py").write_text("X = 1\n")
    with pytest.raises(modfind.NotFound):
        modfind.find_module("nsk.cute.later", path, imported=False, levels=levels, invalidate=False)
    found = modfind.find_module("nsk.cute.later", path, imported=False, levels=modfind.Levels(path))
    assert found.origin == str(tree / "a/nsk/cute/later.py")


def test_a_failed_import_of_a_parent_is_tried_again_by_the_next_lookup(extended: Path) -> None:
    """A parent whose import in a child failed is not kept in the pass's `Levels`: the next
    lookup under it imports it again (and succeeds once the failure is gone)."""
    path = [str(extended / "base"), str(extended / "ext")]
    init = extended / "base/hostpkg/__init__.py"
    init.write_text(EXTENDING_INIT + "raise RuntimeError('no GPU here')\n")
    levels = modfind.Levels(path)
    with pytest.raises(modfind.ExecFailed, match="no GPU here"):
        modfind.find_module("hostpkg.ext.ops", path, allow_exec=True, imported=False, levels=levels)
    init.write_text(EXTENDING_INIT)
    found = modfind.find_module("hostpkg.ext.ops", path, allow_exec=True, imported=False, levels=levels,
                                invalidate=False)
    assert found.origin == str(extended / "ext/hostpkg/ext/ops.py") and found.executed == ["hostpkg"]
