"""A trace that only computes shapes is no call: `jax.eval_shape`, `jax.jit(f).trace` and
`custom_partitioning`'s trace at the global shapes (each device then traces its shard) are
served by the fallback, as any trace is, but neither warn (`FallbackWarning`) nor count a
miss; a call lowered into a program (a `jax.jit` call, `lower`, `jax.export`) or run eagerly
still does (`cutecc.runtime.fallback_mark`). On the CPU: builds are stand-ins
(`helpers.fake_compile`); the fallback is plain JAX and runs here."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import opts, script_json

import cutecc
from cutecc.commands.build import build
from cutecc.errors import FallbackWarning
from cutecc.store.misses import read_misses

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


@pytest.fixture
def cache(fallback_project: Path) -> Path:
    cache = fallback_project.parent.parent / "cache"
    r = build(fallback_project, opts(cache_dir=cache))
    assert r.ok, r.warnings()
    return cache


def test_a_shape_only_trace_neither_warns_nor_counts(cache: Path) -> None:
    ks = cutecc.load(cache, arch="sm_90a")
    spec = jax.ShapeDtypeStruct((3, 32), jnp.float32)  # d=64 is built: a miss

    def f(x: jax.Array) -> jax.Array:
        return ks.scale(x, factor=2.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        assert jax.eval_shape(f, spec).shape == (3, 32)
        assert jax.eval_shape(jax.grad(lambda x: f(x).sum()), spec).shape == (3, 32)
        assert jax.eval_shape(jax.vmap(f), jax.ShapeDtypeStruct((2, 3, 32), jnp.float32)).shape == (2, 3, 32)
        jax.jit(f).trace(spec)
    assert read_misses(cache) == []
    # lowered into a program: a call that may run, warned and counted
    with pytest.warns(FallbackWarning, match=r'"scale" \(float32\[3, 32\]\): no built variant fits') as w:
        jax.jit(f).trace(spec).lower()
    assert w[0].filename == __file__  # the caller's line, not JAX's lowering's
    (miss,) = read_misses(cache)
    assert (miss.arrays, miss.count) == ((("float32", (3, 32)),), 1)
    # run: the eager call (its own jit) and an eager jax.grad (op by op) count as before
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 32), dtype=np.float32))
    np.testing.assert_allclose(ks.scale(x, factor=2.0), 2.0 * np.sin(np.asarray(x)), rtol=1e-6)
    g = jax.grad(lambda x: f(x).sum())(x)
    np.testing.assert_allclose(g, 2.0 * np.cos(np.asarray(x)), rtol=1e-5)
    assert read_misses(cache)[0].count == 3
    # a vmapped call is counted at each element's signature, as its warning names it
    with pytest.warns(FallbackWarning, match=r"float32\[5, 24\]"):
        jax.vmap(f)(jnp.ones((2, 5, 24), jnp.float32))
    assert {m.arrays for m in read_misses(cache)} == {(("float32", (3, 32)),), (("float32", (5, 24)),)}


CUSTOM_PARTITIONING = r'''
import json, os, sys, warnings
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, sys.argv[2])
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P
import cutecc
from cutecc.store.misses import read_misses
ks = cutecc.load(sys.argv[1], arch="sm_90a")
mesh = jax.make_mesh((2,), ("d",))
rows = NamedSharding(mesh, P("d", None))

def call(x):
    return ks.scale(x, factor=2.0)

f = custom_partitioning(call)

def partition(mesh, arg_shapes, result_shape):
    return mesh, call, rows, (rows,)

f.def_partition(partition=partition, infer_sharding_from_operands=lambda mesh, a, r: rows,
                sharding_rule="i j -> i j")
x = jax.device_put(jnp.asarray(np.arange(8 * 32, dtype=np.float32).reshape(8, 32) / 100), rows)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    out = jax.jit(f, out_shardings=rows)(x)
ok = bool(np.allclose(np.asarray(out), 2.0 * np.sin(np.asarray(x)), rtol=1e-6))
print(json.dumps({"ok": ok, "warned": [str(w.message) for w in seen if "fallback" in str(w.message)],
                  "misses": [[list(a) for a in m.arrays] + [m.count] for m in read_misses(sys.argv[1])]}))
'''


def test_custom_partitionings_global_trace_is_not_counted_its_shards_are(cache: Path,
                                                                         fallback_project: Path) -> None:
    got = script_json(CUSTOM_PARTITIONING, str(cache), str(fallback_project.parent))
    assert got["ok"]
    # the global trace (float32[8, 32]) ran nowhere: each device ran its shard's
    assert got["misses"] == [[["float32", [4, 32]], 1]], got
    assert len(got["warned"]) == 1 and "float32[4, 32]" in got["warned"][0], got
