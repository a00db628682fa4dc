"""Helpers shared by the tests (import them: `from helpers import ...`): the repository's
paths, a tiny real kernel project, and the CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cutecc` in a real subprocess."""
    return subprocess.run([PY, "-m", "cutecc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def script_json(script: str, *args: str, timeout: float = 600) -> Any:
    """Run a Python `script` in a fresh interpreter; the JSON its last line prints."""
    import json

    r = subprocess.run([PY, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_toy_project(root: Path, threads: tuple[int, ...] = (64, 128),
                      name: str = "kernels.toml") -> Path:
    """The toy kernel package under `root`, and a manifest `name` for `threads`."""
    pkg = root / "toy"
    if not pkg.is_dir():
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "ops.py").write_text(TOY_KERNEL)
    (root / name).write_text(toy_manifest(threads=threads))
    return root / name
