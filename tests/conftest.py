"""Shared fixtures: a tiny kernel project, and the repository's example manifest built once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

TOY_KERNEL = '''\
import cutlass
import cutlass.cute as cute


@cute.kernel
def _scale_kernel(x: cute.Tensor, out: cute.Tensor, scale: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * scale


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
          threads: cutlass.Constexpr = 128):
    n = x.shape[0]
    _scale_kernel(x, out, factor, n).launch(
        grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1], stream=stream)


@cute.jit
def broken(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
           threads: cutlass.Constexpr = 128):
    cute.no_such_dsl_function(x)  # exists for the planner, fails when the DSL traces it
'''


def toy_manifest(threads: tuple[int, ...] = (64, 128), kernels: tuple[str, ...] = ("scale",)) -> str:
    out = 'archs = ["sm_90a"]\n'
    for name in kernels:
        out += textwrap.dedent(f'''
        [kernel.{name}]
        entry = "toy.ops:scale"
        args = [
          {{ name = "x", dtype = "float32", shape = ["n"] }},
          {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
          {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},
          {{ kind = "stream" }},
        ]
        constants = {{ threads = "$threads" }}
        variants = {{ threads = {list(threads)} }}
        ''')
    return out


@pytest.fixture
def toy_project(tmp_path: Path) -> Path:
    """A project with one small kernel (two variants); returns its manifest path."""
    pkg = tmp_path / "proj" / "toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(TOY_KERNEL)
    manifest = tmp_path / "proj" / "kernels.toml"
    manifest.write_text(toy_manifest())
    return manifest


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cutecc` in a real subprocess."""
    return subprocess.run([PY, "-m", "cutecc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="session")
def example_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's kernels.toml built once for sm_90a into a fresh cache.

    Set CUTECC_TEST_CACHE to reuse a cache built beforehand (the GPU suite does: the
    device machine has no DSL).
    """
    pre = os.environ.get("CUTECC_TEST_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp("example-cache")
    r = run_cli("build", str(REPO / "kernels.toml"), "--cache-dir", str(cache), "--arch", "sm_90a",
                "--no-lock")  # leave the repository's kernels.lock to `cutecc build` runs
    assert r.returncode == 0, r.stderr + r.stdout
    return cache


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
