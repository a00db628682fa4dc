"""Every example kernel on a real GPU against a jax.numpy reference, on fresh random inputs.

Outputs land in memory that was filled with NaN just before, so an element the kernel
fails to write shows up as a mismatch.
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

import cutecc

from .conftest import poison, rand

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
SIZES = [1, 1000, (1 << 20) + 3]


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    k = cutecc.load(example_cache)  # the device's own arch
    assert k.arch.startswith("sm_9"), k.arch
    return k


def close(got: jax.Array, want: jax.Array, dtype: str) -> None:
    g = np.asarray(got.astype(jnp.float32))
    w = np.asarray(want.astype(jnp.float32))
    assert g.shape == w.shape
    assert np.isfinite(g).all(), f"{(~np.isfinite(g)).sum()} unwritten or non-finite elements"
    err = np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_mul(ks, rng, dtype: str, n: int, mode: str) -> None:
    x, y = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    f = ks.mul if mode == "eager" else jax.jit(ks.mul)
    poison(n * 4)
    close(f(x, y), x * y, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", SIZES)
def test_mul_bwd_two_outputs(ks, rng, dtype: str, n: int) -> None:
    x, y, g = (rand(rng, (n,), dtype) for _ in range(3))
    poison(n * 8)
    dx, dy = jax.jit(ks.mul_bwd)(x, y, g)
    close(dx, g * y, dtype)
    close(dy, g * x, dtype)


def rmsnorm_ref(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * r * w.astype(jnp.float32)).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", [1024, 4096])
@pytest.mark.parametrize("m", [1, 37, 2048])
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_rmsnorm(ks, rng, dtype: str, d: int, m: int, mode: str) -> None:
    x, w = rand(rng, (m, d), dtype), rand(rng, (d,), dtype)
    eps = float(rng.uniform(1e-6, 1e-2))
    def norm(x: jax.Array, w: jax.Array) -> jax.Array:
        return ks.rmsnorm(x, w, eps=eps)

    f = norm if mode == "eager" else jax.jit(norm)
    poison(m * d * 4)
    close(f(x, w), rmsnorm_ref(x, w, eps), dtype)


@pytest.mark.parametrize("n", SIZES)
def test_axpy_in_place(ks, rng, n: int) -> None:
    x, y = rand(rng, (n,), "float32"), rand(rng, (n,), "float32")
    alpha = float(rng.uniform(-3, 3))
    want = alpha * x + y
    got = jax.jit(lambda x, y: ks.axpy(x, y, alpha=alpha), donate_argnums=1)(x, y)
    close(got, want, "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_custom_vjp_gradient_matches_jax(ks, rng, dtype: str) -> None:
    n = 4099
    x, y, c = (rand(rng, (n,), dtype) for _ in range(3))

    def loss(f):
        return lambda x, y: (f(x, y).astype(jnp.float32) * c.astype(jnp.float32)).sum()

    got = jax.jit(jax.grad(loss(ks.mul), argnums=(0, 1)))(x, y)
    want = jax.grad(loss(lambda a, b: a * b), argnums=(0, 1))(x, y)
    for g, w in zip(got, want):
        close(g, w, dtype)


def test_shard_map_on_one_device(ks, rng) -> None:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("d",))
    x = jax.device_put(rand(rng, (4096,), "float32"), NamedSharding(mesh, P("d")))
    y = jax.device_put(rand(rng, (4096,), "float32"), NamedSharding(mesh, P("d")))
    f = jax.jit(jax.shard_map(ks.mul, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d")))
    close(f(x, y), x * y, "float32")


def test_export_round_trip_runs(ks, rng) -> None:
    x, w = rand(rng, (64, 1024), "bfloat16"), rand(rng, (1024,), "bfloat16")
    f = jax.jit(lambda x, w: ks.rmsnorm(x, w, eps=1e-5) * 2)
    exp = jax.export.export(f, disabled_checks=ks.disabled_safety_checks())(x, w)
    back = jax.export.deserialize(exp.serialize())
    ks.register_all()  # what a process that only deserializes must do first
    close(back.call(x, w), rmsnorm_ref(x, w, 1e-5) * 2, "bfloat16")


PCACHE = r'''
import sys, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name) if "cache_hits" in name else None)
import cutecc
ks = cutecc.load(sys.argv[1])
x = jnp.arange(1000, dtype=jnp.float32)
out = jax.jit(lambda a, b: ks.mul(ks.mul(a, b), b))(x, x)
assert np.allclose(np.asarray(out), np.arange(1000.0) ** 3, rtol=1e-6)
print("HITS", len(hits))
'''


def test_persistent_compilation_cache_hits_in_a_new_process(example_cache: Path, tmp_path: Path) -> None:
    def run() -> int:
        r = subprocess.run([sys.executable, "-c", PCACHE, str(example_cache), str(tmp_path / "jc")],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split("HITS")[1])

    assert run() == 0
    assert run() >= 1
