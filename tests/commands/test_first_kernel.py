"""docs/first-kernel.md stays true: every file it shows is examples/first_kernel's file byte
for byte (and it shows them all); the project builds with the DSL into a fresh cache, and the
page's CPU check (check_lowering.py) prints what the page says it prints, lowering a
training step through both kernels for CUDA with no GPU. The kernel against XLA on a GPU:
tests/gpu/test_first_kernel_gpu.py and benchmarks/first_kernel.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PY, REPO, run_cli

PAGE = REPO / "docs" / "first-kernel.md"
PROJECT = REPO / "examples" / "first_kernel"
# `<!-- file: PATH -->` or `<!-- output: PATH -->`, then a fenced block
BLOCK = re.compile(r"<!-- (file|output): (\S+) -->\n```[a-z]*\n(.*?)```\n", re.S)


def _blocks(kind: str) -> dict[str, str]:
    found = [(p, body) for k, p, body in BLOCK.findall(PAGE.read_text()) if k == kind]
    assert len({p for p, _ in found}) == len(found), "a file shown twice"
    return dict(found)


def test_the_page_shows_every_file_of_the_project_as_it_is() -> None:
    shown = _blocks("file")
    files = sorted(str(p.relative_to(REPO)) for p in PROJECT.iterdir()
                   if p.is_file() and p.suffix in (".py", ".toml"))
    assert sorted(shown) == files
    for path, body in shown.items():
        assert body == (REPO / path).read_text(), f"docs/first-kernel.md's {path} differs from the file"


def test_the_block_reader_sees_a_changed_line(tmp_path: Path) -> None:
    """The check above can fail: a page whose block lost a line no longer equals the file."""
    text = PAGE.read_text()
    one = next(iter(_blocks("file").values())).splitlines(keepends=True)
    changed = text.replace("".join(one), "".join(one[:-1]), 1)
    assert changed != text
    got = dict((p, b) for k, p, b in BLOCK.findall(changed) if k == "file")
    assert any(b != (REPO / p).read_text() for p, b in got.items())


def test_the_pages_kernel_builds_and_lowers_for_cuda_without_a_gpu(dsl: None, tmp_path: Path) -> None:
    """The page's commands in a copy of the project: `cutecc build` compiles the four
    libraries (forward and backward, float32 and bfloat16) and writes kernels.lock; the
    page's check_lowering.py prints what the page shows; a 70,000-row call (more rows than a
    grid's y dimension takes) lowers to the kernel, and float16 to the declared fallback."""
    proj = shutil.copytree(PROJECT, tmp_path / "first_kernel",
                           ignore=shutil.ignore_patterns("__pycache__", "kernels.lock", "dist"))
    cache = tmp_path / "cache"
    env = {"CUTECC_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    r = run_cli("build", env=env, cwd=proj)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^4 built, 0 cached, 0 failed in ", r.stdout, re.M), r.stdout
    assert (proj / "kernels.lock").is_file()
    out = subprocess.run([PY, "check_lowering.py"], cwd=proj, capture_output=True, text=True,
                         timeout=600, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    shown = _blocks("output")["examples/first_kernel/check_lowering.py"]
    assert shown.startswith("$ python check_lowering.py\n")
    assert out.stdout == shown.split("\n", 1)[1]
    script = r'''
import warnings, jax, cutecc
ks = cutecc.load(arch="sm_90a")
def lower(f, shape, dtype):
    s = jax.ShapeDtypeStruct(shape, dtype)
    return jax.jit(f).trace(s, s).lower(lowering_platforms=("cuda",)).as_text()
tall = lower(lambda a, b: ks.silu_mul(a, b), (70_000, 1024), "bfloat16")
assert tall.count("custom_call @cutecc_") == 1, tall
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    half = lower(lambda a, b: ks.silu_mul(a, b), (8, 64), "float16")
assert "custom_call" not in half and "stablehlo.multiply" in half, half
assert [w.category.__name__ for w in seen] == ["FallbackWarning"], [str(w.message) for w in seen]
print("ok")
'''
    out = subprocess.run([PY, "-c", script], cwd=proj, capture_output=True, text=True, timeout=600,
                         env={**os.environ, **env})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("name", ["silu_mul.py", "reference.py", "demo.py", "check_lowering.py"])
def test_the_projects_python_imports_no_build_side_at_run_time(name: str) -> None:
    """What runs on a GPU host (demo.py, check_lowering.py, the fallback) imports cutecc's
    runtime and JAX only; the DSL only in the kernel's own module, which only builds import."""
    src = (PROJECT / name).read_text()
    dsl = re.findall(r"^\s*(?:import|from)\s+(cutlass)\b", src, re.M)
    assert bool(dsl) == (name == "silu_mul.py"), (name, dsl)
