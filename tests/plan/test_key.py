"""The cache key: stable across processes and calls, sensitive to exactly what decides an
artifact's bytes (and to nothing else), computed without importing the DSL.

Pure Python: no GPU, no DSL, no compilation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import opts

import cutecc.build.executors.local
import cutecc.build.workers
import cutecc.commands.build
import cutecc.plan.key
from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.entry.rules import compute_key
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import Planned, plan
from cutecc.plan.key import SourceIndex, key_inputs

PY = sys.executable
HEX64 = re.compile(r"^[0-9a-f]{64}$")

MANIFEST = """\
format = 1
archs = ["sm_90a"]

[kernel.a]
entry = "kk.elem:scale"
args = [
  { name = "x", dtype = "$dtype", shape = ["n", 64] },
  { name = "out", role = "output", dtype = "$dtype", shape = ["n", 64], align = 16 },
  { kind = "stream" },
]
constants = { threads = 128 }
variants = { dtype = ["float32", "float16"] }

[kernel.b]
entry = "kk.other:make_add"
factory_args = { block = 256 }
compile_options = ""
args = [
  { name = "x", dtype = "float32", shape = ["m"] },
  { name = "y", dtype = "float32", shape = ["m"] },
  { name = "out", role = "output", dtype = "float32", shape = ["m"] },
]
"""

# The same manifest, reformatted: comments, key order within tables, kernel order,
# an inline table spelled as a sub-table, a dtype alias, defaults written out or left out.
REFORMATTED = """\
# Reformatted: nothing here changes what is built.
archs = [ "sm_90a" ]   # Hopper
format = 1

[kernel.b]
compile_options = ""
args = [
  { shape = ["m"], dtype = "float32", name = "x", role = "input" },
  { dtype = "f32", name = "y", shape = ["m"], layout = "row-major" },   # alias of float32
  { role = "output", name = "out", shape = ["m"], dtype = "float32", align = 16 },
]
entry = "kk.other:make_add"

[kernel.b.factory_args]
block = 0x100

[kernel.a]
variants = { dtype = ["float32", "float16"] }
constants = { threads = 128 }
entry = "kk.elem:scale"
args = [
  { dtype = "$dtype", name = "x", shape = ["n", 64] },
  { shape = ["n", 64], role = "output", name = "out", dtype = "$dtype" },
  { kind = "stream" },
]
"""

FILES = {
    "kk/__init__.py": '"""Fake kernels: read by cutecc, never imported."""\n',
    "kk/elem.py": (
        "import math\n\n"
        "import kk.absmod\n"
        "import numpy\n"
        "from . import common\n"
        "from .helpers import block_of\n\n\n"
        "def scale(x, out, stream, threads=128):\n"
        "    return block_of(threads) + kk.absmod.K + common.C + math.pi\n"
    ),
    "kk/helpers.py": "def block_of(t):\n    return t\n",
    "kk/absmod.py": "K = 1\n",
    "kk/common.py": "C = 2\n",
    "kk/other.py": ("from kk import common\n\n\ndef make_add(block):\n    return block + common.C\n"
                    "\n\nmake_add_v2 = make_add\n"),
    "kk/unused.py": "UNUSED = 1\n",
}

A = {"a[dtype=float32]", "a[dtype=float16]"}
B = {"b[default]"}
ALL = A | B


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """A project with two kernels in a fake package; returns its manifest path."""
    root = tmp_path / "proj"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    manifest = root / "kernels.toml"
    manifest.write_text(MANIFEST)
    return manifest


def _by_label(manifest: Path) -> dict[str, Planned]:
    """Planned entries by kernel[variant] (each kernel has one arch here)."""
    planned = plan(load_manifest(manifest))
    out = {f"{p.kernel.name}[{p.variant.id}]": p for p in planned}
    assert len(out) == len(planned)
    return out


def _keys(manifest: Path) -> dict[str, str]:
    return {label: p.key for label, p in _by_label(manifest).items()}


# Stability -------------------------------------------------------------------------


def test_keys_are_sha256_hex_and_distinct(proj: Path) -> None:
    keys = _keys(proj)
    assert set(keys) == ALL
    assert all(HEX64.match(k) for k in keys.values())
    assert len(set(keys.values())) == 3


def test_keys_are_stable_across_calls(proj: Path) -> None:
    first = [p.key for p in plan(load_manifest(proj))]
    for _ in range(3):
        assert [p.key for p in plan(load_manifest(proj))] == first
    m = load_manifest(proj)
    assert [p.key for p in plan(m)] == [p.key for p in plan(m)] == first


def test_keys_are_stable_across_processes(proj: Path, tmp_path: Path) -> None:
    code = ("import json, sys; from cutecc.plan.build_plan import plan; "
            "from cutecc.manifest import load_manifest; "
            "print(json.dumps([p.key for p in plan(load_manifest(sys.argv[1]))]))")
    here = [p.key for p in plan(load_manifest(proj))]
    runs = []
    for seed in ("0", "12345"):  # different hash seeds: set and dict orders differ
        r = subprocess.run([PY, "-c", code, str(proj)], capture_output=True, text=True, check=True,
                           cwd=tmp_path, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        runs.append(json.loads(r.stdout))
    assert runs[0] == runs[1] == here
    assert len(here) == 3 and all(HEX64.match(k) for k in here)


def test_planning_imports_neither_the_dsl_nor_jax(proj: Path, tmp_path: Path) -> None:
    code = ("import json, sys; from cutecc.commands.build import build; "
            "from cutecc.plan.build_plan import plan; "
            "from cutecc.manifest import load_manifest; "
            "keys = [p.key for p in plan(load_manifest(sys.argv[1]))]; "
            "from cutecc.settings import BuildOptions; "
            "r = build(sys.argv[1], BuildOptions(cache_dir=sys.argv[2]), dry_run=True); "
            "print(json.dumps([len(keys), r.count('planned'), "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'jax', 'kk'))]))")
    r = subprocess.run([PY, "-c", code, str(proj), str(tmp_path / "cache")], capture_output=True,
                       text=True, check=True, timeout=120)
    n, planned, heavy = json.loads(r.stdout)
    assert (n, planned) == (3, 3)
    assert heavy == []  # no cutlass, no jax, and the kernel package itself was only read
    assert not (tmp_path / "cache").exists()


def test_keys_do_not_depend_on_where_the_project_lives(proj: Path, tmp_path: Path) -> None:
    moved = shutil.copytree(proj.parent, tmp_path / "elsewhere" / "deeper")
    assert _keys(moved / "kernels.toml") == _keys(proj)


def test_keys_do_not_depend_on_a_symlinked_package(proj: Path, tmp_path: Path) -> None:
    linked = shutil.copytree(proj.parent, tmp_path / "linked")
    shutil.move(linked / "kk", tmp_path / "kk-real")
    (linked / "kk").symlink_to(tmp_path / "kk-real", target_is_directory=True)
    assert _keys(linked / "kernels.toml") == _keys(proj)


def test_compute_key_is_canonical_json_sha256() -> None:
    a = {"b": 1, "a": [1, 2], "c": {"y": None, "x": "é"}}
    b = {"c": {"x": "é", "y": None}, "a": [1, 2], "b": 1}
    assert compute_key(a) == compute_key(b)
    assert HEX64.match(compute_key(a))
    assert compute_key(a) != compute_key({**a, "a": [2, 1]})  # list order is meaningful


def test_key_inputs_name_everything_that_decides_the_bytes(proj: Path) -> None:
    p = _by_label(proj)["b[default]"]
    assert set(p.inputs) == {"kernel", "entry", "source", "factory_args", "args", "constants",
                             "arch", "compile_options", "toolchain", "distributions", "env"}
    assert p.inputs["kernel"] == "b"
    assert p.inputs["entry"] == "kk.other:make_add"
    assert p.inputs["factory_args"] == {"block": 256}
    assert p.inputs["arch"] == "sm_90a"
    assert p.key == compute_key(p.inputs)
    assert p.key == compute_key(key_inputs(p.kernel, p.variant, p.arch, p.inputs["source"],
                                           p.inputs["distributions"], p.inputs["env"]))
    assert p.inputs["toolchain"] == cutecc.plan.key.toolchain()
    # b's sources: its module, the package __init__ and what it imports; not elem's helpers.
    assert p.sources == ("kk/__init__.py", "kk/common.py", "kk/other.py")
    a = _by_label(proj)["a[dtype=float32]"]
    assert a.sources == ("kk/__init__.py", "kk/absmod.py", "kk/common.py", "kk/elem.py", "kk/helpers.py")
    assert a.inputs["factory_args"] is None and a.inputs["constants"] == {"threads": 128}


def test_source_index_follows_local_imports_only(proj: Path) -> None:
    idx = SourceIndex((proj.parent,))
    digest, files = idx.digest("kk.elem")
    assert HEX64.match(digest)
    assert "kk/unused.py" not in files and not any("numpy" in f for f in files)
    assert idx.digest("kk.elem") == (digest, files)
    with pytest.raises(CuteccError, match='cannot find module "kk.nope"'):
        idx.digest("kk.nope")


def test_syntax_error_in_a_dependency_is_a_cutecc_error(proj: Path) -> None:
    bad = proj.parent / "kk" / "helpers.py"
    bad.write_text("def block_of(:\n")
    with pytest.raises(CuteccError) as info:
        plan(load_manifest(proj))
    assert info.value.where == str(bad.resolve()) and "syntax error" in info.value.message


# Sensitivity -----------------------------------------------------------------------


def _edit(rel: str, old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        f = root / rel
        text = f.read_text()
        assert text.count(old) == count, (rel, old)
        f.write_text(text.replace(old, new))
    return apply


def _append(rel: str, extra: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        f = root / rel
        f.write_text(f.read_text() + extra)
    return apply


def _write(rel: str, text: str | None = None) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        f = root / rel
        f.write_text(FILES.get(rel, "") if text is None else text)
    return apply


CHANGES = [
    pytest.param(_append("kk/elem.py", "# edited\n"), A, "source", id="kernel-module-source"),
    pytest.param(_edit("kk/helpers.py", "return t", "return t * 2"), A, "source",
                 id="relative-import-module"),
    pytest.param(_edit("kk/absmod.py", "K = 1", "K = 3"), A, "source", id="absolute-import-module"),
    pytest.param(_edit("kk/common.py", "C = 2", "C = 5"), ALL, "source", id="module-imported-by-both"),
    pytest.param(_append("kk/other.py", "\n"), B, "source", id="other-kernel-module"),
    pytest.param(_append("kk/__init__.py", "VERSION = 2\n"), ALL, "source", id="package-init"),
    pytest.param(_edit("kernels.toml", "threads = 128", "threads = 256"), A, "constants", id="constant"),
    pytest.param(_edit("kernels.toml", "constants = { threads = 128 }",
                       'constants = { threads = 128, mode = "fast" }'), A, "constants", id="added-constant"),
    pytest.param(_edit("kernels.toml", "block = 256", "block = 512"), B, "factory_args", id="factory-arg"),
    pytest.param(_edit("kernels.toml", '{ name = "y", dtype = "float32"', '{ name = "y", dtype = "float16"'),
                 B, "args", id="dtype"),
    pytest.param(_edit("kernels.toml", "64]", "128]", count=2), A, "args", id="static-extent"),
    pytest.param(_edit("kernels.toml", '["m"]', '["rows"]', count=3), B, "args", id="symbol-name"),
    pytest.param(_edit("kernels.toml", "align = 16", "align = 64"), A, "args", id="alignment"),
    pytest.param(_edit("kernels.toml", '{ name = "y", dtype = "float32", shape = ["m"] }',
                       '{ name = "y", role = "inout", dtype = "float32", shape = ["m"] }'),
                 B, "args", id="role"),
    pytest.param(_edit("kernels.toml", 'compile_options = ""', 'compile_options = ""\narchs = ["sm_100a"]'),
                 B, "arch", id="kernel-arch"),
    pytest.param(_edit("kernels.toml", 'archs = ["sm_90a"]', 'archs = ["sm_80"]'), ALL, "arch",
                 id="manifest-arch"),
    pytest.param(_edit("kernels.toml", 'compile_options = ""', 'compile_options = "--opt-level 2"'),
                 B, "compile_options", id="compile-options"),
    pytest.param(_edit("kernels.toml", "kk.other:make_add", "kk.other:make_add_v2"), B, "entry",
                 id="entry-attribute"),
]

NO_CHANGES = [
    pytest.param(_append("kk/unused.py", "UNUSED = 2\n"), id="unrelated-file"),
    pytest.param(_write("kk/brand_new.py", "import kk.elem\n"), id="new-file-importing-the-kernel"),
    pytest.param(_write("kk/elem.py"), id="rewrite-same-bytes"),
    pytest.param(_write("kernels.toml", REFORMATTED), id="reformatted-manifest"),
    pytest.param(_edit("kernels.toml", '{ name = "y", dtype = "float32"', '{ name = "y", dtype = "f32"'),
                 id="dtype-alias"),
    pytest.param(_edit("kernels.toml", "format = 1\n", "# kernels\n\n"), id="format-line-and-comment"),
]


@pytest.mark.parametrize(("change", "affected", "field"), CHANGES)
def test_a_change_rekeys_exactly_the_affected_entries(
    proj: Path, change: Callable[[Path], None], affected: set[str], field: str
) -> None:
    before = _by_label(proj)
    change(proj.parent)
    after = _by_label(proj)
    assert set(after) == set(before) == ALL
    changed = {label for label in ALL if after[label].key != before[label].key}
    assert changed == affected
    for label in changed:
        diff = {k for k in before[label].inputs if before[label].inputs[k] != after[label].inputs[k]}
        assert diff == {field}, label
    for label in ALL - affected:
        assert after[label].inputs == before[label].inputs


@pytest.mark.parametrize("change", NO_CHANGES)
def test_a_change_that_decides_nothing_keeps_every_key(proj: Path, change: Callable[[Path], None]) -> None:
    before = _keys(proj)
    change(proj.parent)
    assert _keys(proj) == before


def test_arch_override_rekeys_and_labels(proj: Path) -> None:
    m = load_manifest(proj)
    base = {p.label: p.key for p in plan(m)}
    two = plan(m, archs=("sm_90a", "sm_100a"))
    assert len(two) == 6
    assert {p.label: p.key for p in two if p.arch == "sm_90a"} == base
    sm100 = {p.label.replace("@sm_100a", "@sm_90a"): p.key for p in two if p.arch == "sm_100a"}
    assert set(sm100) == set(base) and not set(sm100.values()) & set(base.values())


TOOLCHAIN = ("nvidia-cutlass-dsl", "apache-tvm-ffi", "nvidia-cuda-runtime", "zig",
             "cutecc_artifact_format", "link_recipe", "host_target", "runtime")


@pytest.mark.parametrize("component", TOOLCHAIN)
def test_toolchain_versions_rekey_everything(
    proj: Path, monkeypatch: pytest.MonkeyPatch, component: str
) -> None:
    real = cutecc.plan.key.toolchain()
    assert component in real
    before = _keys(proj)
    monkeypatch.setattr(cutecc.plan.key, "toolchain",
                        lambda platform="x86_64": {**real, component: real[component] + "+changed"})
    after = _keys(proj)
    assert set(after) == ALL
    assert all(after[label] != before[label] for label in ALL)
    monkeypatch.undo()
    assert _keys(proj) == before


def test_toolchain_is_cached_and_has_the_tool_versions() -> None:
    tc = cutecc.plan.key.toolchain()
    assert tc is cutecc.plan.key.toolchain()
    assert set(TOOLCHAIN) == set(tc)
    assert all(isinstance(v, str) and v for v in tc.values())


def test_the_runtime_key_names_every_input_of_the_runtime_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.toolchain import versions as toolchain

    inputs = toolchain.runtime_inputs()
    assert cutecc.plan.key.toolchain()["runtime"] == cutecc.plan.key.runtime_key() == compute_key(inputs)
    assert {"runtime_format", "recipe", "source", "exports", "zig", "target", "apache-tvm-ffi",
            "dialect_rt", "cudart"} == set(inputs)
    for name in inputs:  # each one changes the key
        monkeypatch.setattr(toolchain, "runtime_inputs",
                            lambda platform="x86_64", n=name: {**inputs, n: inputs[n] + "+x"})
        assert cutecc.plan.key.runtime_key() != compute_key(inputs), name


def test_no_host_detail_is_a_key_input() -> None:
    """What differs between build hosts (their C compiler, paths, user, time) is no input:
    the bytes do not depend on it (tests/toolchain/test_reproducible.py)."""
    tc = cutecc.plan.key.toolchain()
    assert not any("/" in v for v in tc.values()), tc  # no paths
    assert "cc" not in tc and "gcc" not in json.dumps(tc).lower()  # zig links, not the host's cc


# Dry run ---------------------------------------------------------------------------


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("a dry run must not compile")

    monkeypatch.setattr(cutecc.build.executors.local, "compile_all", boom)
    monkeypatch.setattr(cutecc.build.workers, "build_one", boom)


def test_cli_dry_run_lists_and_compiles_nothing(
    proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_compiling(monkeypatch)
    cache = tmp_path / "cache"
    planned = plan(load_manifest(proj))
    r = CliRunner().invoke(main, ["build", str(proj), "--dry-run", "--cache-dir", str(cache)])
    assert r.exit_code == 0, (r.output, r.exception)
    lines = r.stdout.splitlines()
    assert lines[:-1] == [f"would build {p.label} {p.key[:12]}" for p in planned]
    assert lines[-1].startswith("0 built, 0 cached, 0 failed, 3 to build in ")
    assert lines[-1].endswith(f"({cache})")
    assert r.stderr == ""
    assert not cache.exists()


def test_cli_dry_run_json_and_kernel_and_arch_selection(
    proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_compiling(monkeypatch)
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(proj), "--dry-run", "--json", "--kernel", "b",
                                  "--arch", "sm_90a,sm_100a", "--cache-dir", str(cache)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert (rep["built"], rep["cached"], rep["failed"], rep["planned"]) == (0, 0, 0, 2)
    assert [(e["kernel"], e["variant"], e["arch"], e["status"]) for e in rep["entries"]] == [
        ("b", "default", "sm_90a", "planned"), ("b", "default", "sm_100a", "planned")]
    assert rep["entries"][0]["key"] == _keys(proj)["b[default]"]
    assert not cache.exists()


def test_dry_run_reports_what_is_already_cached_and_writes_nothing(
    proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_compiling(monkeypatch)
    cache = tmp_path / "cache"
    key_b = _keys(proj)["b[default]"]
    entry = cache / "entries" / key_b[:2] / key_b
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text("{}")
    snapshot = sorted((p.relative_to(cache).as_posix(), p.stat().st_mtime_ns) for p in cache.rglob("*"))
    report = build(proj, opts(cache_dir=cache), dry_run=True)
    assert {o.planned.label: o.status for o in report.outcomes} == {
        "a[dtype=float32]@sm_90a": "planned", "a[dtype=float16]@sm_90a": "planned",
        "b[default]@sm_90a": "cached"}
    assert report.ok and report.count("built") == 0
    r = CliRunner().invoke(main, ["build", str(proj), "--dry-run", "--cache-dir", str(cache)])
    assert r.exit_code == 0
    assert "b[default]" not in r.stdout and r.stdout.count("would build ") == 2
    assert "0 built, 1 cached, 0 failed, 2 to build" in r.stdout
    assert sorted((p.relative_to(cache).as_posix(), p.stat().st_mtime_ns)
                  for p in cache.rglob("*")) == snapshot


# Entry attributes, read from the source -----------------------------------------------


@pytest.mark.parametrize("source, attr, lacks", [
    ("def f(): pass\n", "f", False),
    ("def f(): pass\n", "g", True),
    ("class K:\n    def g(self): pass\n", "g", True),  # a method is not a module attribute
    ("import os\nif os.name:\n    g = 1\nelse:\n    pass\n", "g", False),
    ("try:\n    from x import g\nexcept ImportError:\n    g = None\n", "g", False),
    ("from x import y as g\n", "g", False),
    ("g: int = 1\n", "g", False),
    ("a, (b, g) = 1, (2, 3)\n", "g", False),
    ("from x import *\n", "g", False),  # may define anything: never surely lacking
    ("def __getattr__(name): ...\n", "g", False),
    ("globals()['g'] = 1\n", "g", False),
])
def test_lacks_is_sure_or_silent(tmp_path: Path, source: str, attr: str, lacks: bool) -> None:
    (tmp_path / "mod_under_test.py").write_text(source)
    assert SourceIndex((tmp_path,)).lacks("mod_under_test", attr) is lacks


def test_two_kernels_defined_alike_get_their_own_entries(proj: Path) -> None:
    """The runtime exposes an entry under its kernel's name, so the name is keyed."""
    text = proj.read_text()
    b = text[text.index("[kernel.b]"):]
    proj.write_text(text + "\n" + b.replace("[kernel.b]", "[kernel.b2]"))
    by = _by_label(proj)
    assert by["b[default]"].key != by["b2[default]"].key
    diff = {k for k in by["b[default]"].inputs if by["b[default]"].inputs[k] != by["b2[default]"].inputs[k]}
    assert diff == {"kernel"}


# Installed code and the environment ----------------------------

FAKE_LIB = {
    "fakequack/__init__.py": "",
    "fakequack/softmax.py": "class Softmax:\n    pass\n",
    "fakequack-0.6.5.dist-info/METADATA": "Metadata-Version: 2.1\nName: fakequack\nVersion: 0.6.5\n",
    "fakequack-0.6.5.dist-info/top_level.txt": "fakequack\n",
}


@pytest.fixture
def installed(proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed kernel library (site dir on sys.path) that the project's kernel imports."""
    import cutecc.toolchain.dists

    site = tmp_path / "site"
    for rel, text in FAKE_LIB.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    record = "".join(f"{rel},,\n" for rel in FAKE_LIB) + "fakequack-0.6.5.dist-info/RECORD,,\n"
    (site / "fakequack-0.6.5.dist-info/RECORD").write_text(record)
    monkeypatch.syspath_prepend(str(site))
    for f in (cutecc.toolchain.dists._installed, cutecc.toolchain.dists._owners,
              cutecc.toolchain.dists.is_editable):
        f.cache_clear()
    monkeypatch.setattr(cutecc.toolchain.dists, "_installed", cutecc.toolchain.dists._installed)
    elem = proj.parent / "kk/elem.py"
    elem.write_text("import fakequack.softmax\n" + elem.read_text())
    yield site
    for f in (cutecc.toolchain.dists._installed, cutecc.toolchain.dists._owners,
              cutecc.toolchain.dists.is_editable):
        f.cache_clear()


def test_an_edited_installed_kernel_library_rekeys_and_explain_names_it(proj: Path, installed: Path) -> None:
    from cutecc.commands.explain import differences

    before = _by_label(proj)
    a = before["a[dtype=float32]"]
    assert a.inputs["distributions"]["fakequack"].startswith("0.6.5 ")  # the version is recorded
    assert "fakequack" not in before["b[default]"].inputs["distributions"]  # b does not import it
    assert any(n.startswith("nvidia-cutlass-dsl") for n in a.inputs["distributions"])
    soft = installed / "fakequack/softmax.py"
    soft.write_text(soft.read_text() + "# one more line\n")  # RECORD unchanged, as pip leaves it
    after = _by_label(proj)
    assert all(after[label].key != before[label].key for label in A)
    assert after["b[default]"].key == before["b[default]"].key
    assert [d.input for d in differences(a.inputs, after["a[dtype=float32]"].inputs)] == [
        "distributions.fakequack"]


def test_compile_affecting_environment_is_keyed_and_named(proj: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.commands.explain import differences

    before = _keys(proj)
    monkeypatch.setenv("CUTE_DSL_CACHE_DIR", "/tmp/elsewhere")  # excluded: decides no bytes
    monkeypatch.setenv("CUTE_DSL_KEEP_PTX", "1")
    assert _keys(proj) == before
    monkeypatch.setenv("QUACK_ARCH", "sm_90a")  # quack picks its config by it on a CPU host
    p = _by_label(proj)["a[dtype=float32]"]
    assert p.inputs["env"] == {"QUACK_ARCH": "sm_90a"}
    assert all(_keys(proj)[label] != before[label] for label in ALL)
    monkeypatch.delenv("QUACK_ARCH")
    assert [d.input for d in differences(p.inputs, _by_label(proj)["a[dtype=float32]"].inputs)] == [
        "env.QUACK_ARCH"]


def test_manifest_env_is_keyed_with_the_arch_substituted(proj: Path) -> None:
    before = _keys(proj)
    proj.write_text(proj.read_text() + '\n[env]\nQUACK_ARCH = "$arch"\n')
    m = load_manifest(proj)
    assert m.env_for("sm_100a") == {"QUACK_ARCH": "sm_100a"}
    p = _by_label(proj)["a[dtype=float32]"]
    assert p.inputs["env"]["QUACK_ARCH"] == "sm_90a"
    assert all(_keys(proj)[label] != before[label] for label in ALL)


def test_a_virtual_environment_inside_the_project_is_not_project_source() -> None:
    """The root manifest's python_path is the repository, which holds .venv (CI's and the
    README's layout): the DSL installed there is keyed by its distribution, never parsed
    as project source (that made every no-op build parse ~4,000 files: 46 s)."""
    from helpers import REPO

    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan

    sources = {s for p in plan(load_manifest(REPO / "kernels.toml")) for s in p.sources}
    assert sources and all(s.startswith("kernels/") for s in sources), sorted(sources)[:5]


def _two_libraries(site: Path, dist_info: bool) -> None:
    """Two installed kernel libraries in `site`: `fa` imports `fq` (as flash-attn-4 imports
    quack), with or without their dist-info."""
    files = {"fq/__init__.py": "", "fq/norm.py": "class Norm:\n    pass\n",
             "fa/__init__.py": "", "fa/fwd.py": "import fq.norm\n\nclass Fwd:\n    pass\n"}
    if dist_info:
        for name, version in (("fq", "1.0"), ("fa", "2.0")):
            d = f"{name}-{version}.dist-info"
            files[f"{d}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            files[f"{d}/top_level.txt"] = f"{name}\n"
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    for d in site.glob("*.dist-info"):
        top = d.name.split("-")[0]
        own = [r for r in files if r.startswith((top + "/", d.name))]
        (d / "RECORD").write_text("".join(f"{r},,\n" for r in own) + f"{d.name}/RECORD,,\n")


_KERNEL = '''
[kernel.{name}]
entry = "{entry}"
args = [{{ name = "x", dtype = "float32", shape = ["n"] }},
        {{ name = "y", role = "output", dtype = "float32", shape = ["n"] }}, {{ kind = "stream" }}]
'''


def _fwd_key(tmp_path: Path, text: str) -> str:
    import cutecc.toolchain.dists

    for f in (cutecc.toolchain.dists._installed, cutecc.toolchain.dists._owners,
              cutecc.toolchain.dists.is_editable):
        f.cache_clear()
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    (d / "kernels.toml").write_text('archs = ["sm_90a"]\n' + text)
    return {p.kernel.name: p.key for p in plan(load_manifest(d / "kernels.toml"))}["fwd"]


@pytest.mark.parametrize("dist_info", [True, False], ids=["installed", "on-PYTHONPATH"])
def test_a_kernels_key_is_its_own_and_covers_what_it_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist_info: bool) -> None:
    """An installed kernel library importing another (flash-attn-4 imports quack): the
    importer's key is the same whether or not a kernel of the other library is in the
    manifest (an entry's package used to count as project source for every kernel planned
    after it, so `build --kernel` and `tune` keyed other artifacts than a whole build), the
    same wherever the environment lives, and it changes when the imported library's code
    does, with or without a distribution owning it."""
    import cutecc.toolchain.dists

    norm = _KERNEL.format(name="norm", entry="fq.norm:Norm")
    fwd = _KERNEL.format(name="fwd", entry="fa.fwd:Fwd")
    keys = []
    places = ("a/site-packages", "b/other/site-packages") if dist_info else ("a/lib", "b/src")
    for where in places:
        site = tmp_path / where
        _two_libraries(site, dist_info)
        with monkeypatch.context() as m:
            m.syspath_prepend(str(site))
            keys += [_fwd_key(tmp_path, norm + fwd), _fwd_key(tmp_path, fwd), _fwd_key(tmp_path, fwd + norm)]
            (site / "fq/norm.py").write_text("class Norm:\n    scale = 2\n")
            edited = _fwd_key(tmp_path, fwd)
    for f in (cutecc.toolchain.dists._installed, cutecc.toolchain.dists._owners,
              cutecc.toolchain.dists.is_editable):
        f.cache_clear()
    assert len(set(keys)) == 1, keys
    assert edited != keys[0]


def test_a_closure_walked_after_another_remembers_all_its_answers_read(tmp_path: Path) -> None:
    """A walk takes the lookups an earlier walk of the same index made (`SourceIndex._find`,
    `modfind.Levels`): what it remembers its closure under (the paths its answers read) is
    what a walk alone reads, so a closure is never kept past a change that would move it."""
    from cutecc.toolchain.hashcache import HashCache

    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import common\nimport lib.util\nfrom lib import thing\n",
        "pkg/b.py": "from . import common\nfrom lib.util import helper\nimport lib.missing\n",
        "pkg/common.py": "import lib\nfrom lib.util import x as y\n",
        "lib/__init__.py": "",
        "lib/util.py": "import os\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    def walked(*modules: str) -> dict[str, tuple[list[object], list[tuple[str, str]]]]:
        kept: dict[str, tuple[list[object], list[tuple[str, str]]]] = {}
        cache = HashCache(None)
        cache.remember_closure = lambda key, context, members, paths, born: kept.__setitem__(  # type: ignore[method-assign]
            key.split("\0")[0], (sorted(members), sorted(paths)))
        index = SourceIndex((tmp_path,), cache)
        for m in modules:
            index.digest(m)
        return kept

    together = walked("pkg.a", "pkg.b")
    assert together["pkg.b"] == walked("pkg.b")["pkg.b"]
    assert together["pkg.a"] == walked("pkg.a")["pkg.a"]
    members, paths = together["pkg.b"]
    assert {str(tmp_path / "lib/util.py"), str(tmp_path / "pkg/common.py")} <= {m[0] for m in members}  # type: ignore[index]
    assert (str(tmp_path / "lib"), "missing") in paths  # a miss an earlier walk found first
