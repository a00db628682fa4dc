"""Finding modules as Python's import system does (issue 10, findings 1 and 2): namespace
packages and packages split over several directories are found, keyed, and nothing of
theirs is run while planning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cutecc import modfind
from cutecc.manifest import load_manifest
from cutecc.plan import plan

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
    # finding 1: a PEP 420 namespace top level (as flash-attn-4's flash_attn/), a regular
    # subpackage whose __init__ must not run, then the launcher's module
    "a/nsk/cute/__init__.py": RAN,
    "a/nsk/cute/fwd.py": "from . import helper\n\n\ndef launch(x, out):\n    return helper.H\n",
    "a/nsk/cute/helper.py": "H = 1\n",
    # finding 2: a pkgutil-style package split over a/ and b/ (its subpackage lives in b/)
    "a/splitk/__init__.py": "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n",
    "a/splitk/one.py": "X = 1\n",
    "b/splitk/__init__.py": "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n",
    "b/splitk/two.py": "def launch(x, out):\n    return 2\n",
    # finding 2: PEP 420 portions in a/ and b/
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
