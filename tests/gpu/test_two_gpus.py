"""Two GPUs: placement rules (a call runs on its arrays' GPU; arrays over both are refused
without a shard rule), `shard_map` forward, `jax.grad` of a grad-paired
kernel, an `inout` kernel and `vmap`, each inside `shard_map` over both GPUs, against
references on fresh random inputs. Skipped with fewer than two GPUs; run on nvidia-h200-x2."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cutecc
from cutecc.errors import CuteccError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def two(example_cache: Path):
    gpus = jax.devices("gpu")
    if len(gpus) < 2:
        pytest.skip(f"needs two GPUs, JAX sees {len(gpus)}")
    return cutecc.load(example_cache), jax.make_mesh((2,), ("d",), devices=gpus[:2])


def _rand(seed: int, n: int, mesh, spec) -> jax.Array:
    x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    return jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))


def test_forward_under_shard_map_and_jit(two) -> None:
    ks, mesh = two
    x, y = _rand(1, 1 << 19, mesh, P("d")), _rand(2, 1 << 19, mesh, P("d"))
    f = jax.jit(jax.shard_map(ks.mul, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d")))
    np.testing.assert_allclose(np.asarray(f(x, y)), np.asarray(x) * np.asarray(y), rtol=1e-6)


@pytest.mark.parametrize("yspec", [P("d"), P()], ids=["y-sharded", "y-replicated"])
def test_grad_of_a_paired_kernel_inside_shard_map(two, yspec) -> None:
    ks, mesh = two
    n = 1 << 19
    x, y = _rand(3, n, mesh, P("d")), _rand(4, n if yspec == P("d") else n // 2, mesh, yspec)

    def loss(f):  # per shard: a weighted sum, so every gradient element differs
        return lambda x, y: (f(x, y) * jnp.arange(x.shape[0], dtype=x.dtype)).sum()

    got = jax.jit(jax.shard_map(jax.grad(loss(ks.mul), argnums=(0, 1)), mesh=mesh,
                                in_specs=(P("d"), yspec), out_specs=(P("d"), yspec)))(x, y)
    want = jax.jit(jax.shard_map(jax.grad(loss(jnp.multiply), argnums=(0, 1)), mesh=mesh,
                                 in_specs=(P("d"), yspec), out_specs=(P("d"), yspec)))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_inout_kernel_inside_shard_map(two) -> None:
    ks, mesh = two
    x, y = _rand(5, 1 << 18, mesh, P("d")), _rand(6, 1 << 18, mesh, P("d"))
    want = 0.5 * np.asarray(x) + np.asarray(y)
    f = jax.jit(jax.shard_map(lambda a, b: ks.axpy(a, b, alpha=0.5), mesh=mesh,
                              in_specs=(P("d"), P("d")), out_specs=P("d")))
    np.testing.assert_allclose(np.asarray(f(x, y)), want, rtol=1e-6)


def test_vmap_inside_shard_map_says_what_to_do(two) -> None:
    ks, mesh = two
    x = _rand(7, 1 << 12, mesh, P("d")).reshape(2, -1)
    f = jax.shard_map(jax.vmap(lambda a: ks.mul(a, a)), mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    with pytest.raises(NotImplementedError, match="cannot be batched with jax.vmap"):
        jax.jit(f)(x)


@pytest.mark.parametrize("k", [0, 1])
def test_a_call_outside_shard_map_runs_on_its_arrays_gpu(two, k: int) -> None:
    ks, mesh = two
    gpu = jax.devices("gpu")[k]
    rng = np.random.default_rng(20 + k)
    x, y = (jax.device_put(rng.standard_normal(1 << 16, dtype=np.float32), gpu) for _ in range(2))
    for out in (ks.mul(x, y), jax.jit(ks.mul)(x, y)):
        assert out.devices() == {gpu}
        np.testing.assert_allclose(np.asarray(out), np.asarray(x) * np.asarray(y), rtol=1e-6)


def test_arrays_on_two_devices_fail_clearly(two) -> None:
    ks, mesh = two
    x = _rand(8, 1 << 12, mesh, P("d"))
    # under the explicit mesh: named with its sharding and the collective XLA would insert
    # (cutecc.runtime.strict), never gathered silently
    with pytest.raises(CuteccError, match=r"input \"x\" is sharded P\('d'\).*all-gather.*jax.shard_map"):
        ks.mul(x, x)
    gpus = jax.devices("gpu")
    with pytest.raises(CuteccError, match="committed to different devices"):
        ks.mul(jax.device_put(jnp.ones(8), gpus[0]), jax.device_put(jnp.ones(8), gpus[1]))
