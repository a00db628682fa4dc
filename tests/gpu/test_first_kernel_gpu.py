"""docs/first-kernel.md's kernel (examples/first_kernel: out = silu(a) * b, and its backward)
on a real GPU against its jnp reference on fresh random inputs: float32 and bfloat16, eagerly
and under `jax.jit`, Llama-7B's MLP width (4096 x 11008), more rows than a grid's y dimension
takes (70,000 > 65,535), a ragged size whose last chunk is partial; `jax.grad` through the
declared backward; a float16 call served by the declared fallback; and the page's demo.py as
a user runs it. Its time against XLA's own formulation: benchmarks/first_kernel.py.

The device needs no DSL: `bash tests/gpu/prepare.sh CACHES` builds CACHES/first_kernel
(`cutecc build examples/first_kernel/kernels.toml --cache-dir DIR --no-lock`) and
tests/gpu/run.sh sets CUTECC_FIRST_KERNEL_CACHE from it. Without it these tests skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from .conftest import poison, rand

pytestmark = pytest.mark.gpu

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "first_kernel"
# |got - want| / (1 + |want|): float32 differs by the fast exp's last bits; bfloat16 by one
# rounding of a value the two sides computed alike in float32 (2^-8), plus the gradients'.
TOL = {"float32": 1e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


@pytest.fixture(scope="module")
def ks():
    import cutecc

    pre = os.environ.get("CUTECC_FIRST_KERNEL_CACHE")
    if not pre or not Path(pre).is_dir():
        pytest.skip("CUTECC_FIRST_KERNEL_CACHE is not set to a built cache of "
                    "examples/first_kernel (tests/gpu/prepare.sh CACHES)")
    return cutecc.load(pre)


@pytest.fixture(scope="module")
def ref():
    """The project's reference.py, importable for the module's tests as it is for the
    runtime's fallback (`reference:silu_mul`, imported from sys.path at the first miss)."""
    sys.path.insert(0, str(PROJECT))
    from reference import silu_mul, silu_mul_bwd

    yield silu_mul, silu_mul_bwd
    sys.path.remove(str(PROJECT))


def close(got: jax.Array, want: jax.Array, dtype: str) -> None:
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.dtype == jnp.dtype(dtype) and g.shape == w.shape, (got.dtype, g.shape, w.shape)
    assert np.isfinite(g).all(), f"{(~np.isfinite(g)).sum()} unwritten or non-finite elements"
    err = float(np.max(np.abs(g - w) / (1.0 + np.abs(w))))
    assert err <= TOL[dtype], f"error {err:.3g} > {TOL[dtype]}"


SHAPES = [("bfloat16", 4096, 11008), ("float32", 4096, 11008), ("bfloat16", 70_000, 1024),
          ("float32", 70_001, 3), ("bfloat16", 333, 1001), ("float32", 1, 1)]


def test_a_dtype_no_build_serves_runs_the_fallback(ks, rng) -> None:
    """First in this file: the fallback's module (reference.py) must not be imported before
    it serves (a pinned fallback runs only its checked bytes; the `ref` fixture imports the
    checked module afterwards). The expected values are computed here, in float32."""
    import cutecc

    a, b = rand(rng, (64, 256), "float16"), rand(rng, (64, 256), "float16")
    with pytest.warns(cutecc.FallbackWarning, match="silu_mul"):
        got = ks.silu_mul(a, b)
    x, y = a.astype(jnp.float32), b.astype(jnp.float32)
    close(got, (x * jax.nn.sigmoid(x) * y).astype(jnp.float16), "float16")


@pytest.mark.parametrize("dtype,rows,cols", SHAPES)
def test_forward_matches_the_reference(ks, ref, rng, dtype: str, rows: int, cols: int) -> None:
    a, b = rand(rng, (rows, cols), dtype), rand(rng, (rows, cols), dtype)
    want = ref[0](a, b)
    poison(rows * cols * 8)
    close(ks.silu_mul(a, b), want, dtype)
    poison(rows * cols * 8)
    close(jax.jit(lambda a, b: ks.silu_mul(a, b))(a, b), want, dtype)


@pytest.mark.parametrize("dtype,rows,cols", [("bfloat16", 4096, 11008), ("float32", 70_000, 256),
                                             ("bfloat16", 37, 999)])
def test_grad_runs_the_declared_backward(ks, ref, rng, dtype: str, rows: int, cols: int) -> None:
    a, b, g = (rand(rng, (rows, cols), dtype) for _ in range(3))
    want_out, want_vjp = jax.vjp(ref[0], a, b)
    f = jax.jit(lambda a, b, g: (lambda o, vjp: (o, *vjp(g)))(*jax.vjp(ks.silu_mul, a, b)))
    poison(rows * cols * 16)
    out, da, db = f(a, b, g)
    close(out, want_out, dtype)
    for got, want in zip((da, db), want_vjp(g)):
        close(got, want, dtype)
    # and the backward kernel called on its own, as the pairing calls it
    for got, want in zip(ks.silu_mul_bwd(a, b, g), ref[1](a, b, g)):
        close(got, want, dtype)


def test_the_pages_demo_runs_as_written() -> None:
    """examples/first_kernel/demo.py (shown whole on the page), in a fresh process from its
    folder, against the prepared cache: every error it prints within the tolerance."""
    pre = os.environ.get("CUTECC_FIRST_KERNEL_CACHE")
    if not pre or not Path(pre).is_dir():
        pytest.skip("CUTECC_FIRST_KERNEL_CACHE is not set")
    env = {**os.environ, "CUTECC_CACHE_DIR": pre,
           "PYTHONPATH": os.pathsep.join([str(PROJECT.parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "demo.py"], cwd=PROJECT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    errors = {line.split()[0]: float(line.split()[-1]) for line in r.stdout.splitlines()
              if not line.startswith("warning:") and " error " in f" {line} "}
    assert set(errors) == {"forward", "jit", "grad", "float16"}, r.stdout
    assert max(errors["forward"], errors["jit"], errors["grad"]) <= TOL["bfloat16"], r.stdout
    assert errors["float16"] <= TOL["float16"], r.stdout
    assert 'warning: cutecc kernel "silu_mul"' in r.stdout and "served by its fallback" in r.stdout, r.stdout
