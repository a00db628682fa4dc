"""Child of test_sharding.py: eight CPU devices (XLA_FLAGS set by the parent before JAX starts),
calls partitioned by `cutecc.runtime.sharding` compiled and run, one JSON line per check:
the numbers against the unsharded reference, the per-shard shapes the body saw, and which
collectives the compiled HLO holds.

    python sharding_child.py TRAIN_CACHE [gspmd]

Two kinds of calls. `sharding.call` with a jnp body (the production partitioning code, a
reference computation per shard), and a loaded kernel (`expw_rows`, `shard = ["m"]`) called
through the whole production dispatch, whose custom call alone is lowered for the CPU by a
stand-in computing what the kernel computes (out = exp(x) * w, e = exp(x)), behind the
production placement check.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

if len(sys.argv) > 2 and sys.argv[2] == "gspmd":
    jax.config.update("jax_use_shardy_partitioner", False)

import cutecc  # noqa: E402
from cutecc.errors import CallError  # noqa: E402
from cutecc.runtime import sharding  # noqa: E402
from cutecc.runtime.primitive import cutecc_call_p, placed  # noqa: E402

COLLECTIVES = ("all-gather", "all-to-all", "all-reduce", "collective-permute")
rng = np.random.default_rng(7)
seen: list[tuple[int, ...]] = []  # the shapes each traced body saw


def emit(check: str, **kw: object) -> None:
    print(json.dumps({"check": check, **kw}), flush=True)


def hlo_of(f, *args) -> str:
    return f.lower(*args).compile().as_text()


def collectives(text: str) -> list[str]:
    return [c for c in COLLECTIVES if f" {c}(" in text or f"{c}-start" in text]


def attention(q, k, v):
    """Per (batch, head): softmax(q k^T / sqrt(d)) v over the sequence; independent along b, h."""
    seen.append(tuple(q.shape))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return (jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v),)


def sharded_attention(q, k, v):
    qkv = ("b", None, "h", None)
    return sharding.call(attention, [q, k, v], [qkv, qkv, qkv], [qkv])[0]


def check_attention() -> None:
    # Auto axes: a jnp body traced at the global shapes would otherwise see explicitly
    # sharded types (a kernel's custom call carries none)
    mesh = jax.make_mesh((2, 4), ("a", "c"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q, k, v = (jnp.asarray(rng.standard_normal((8, 24, 8, 16), dtype=np.float32)) for _ in range(3))
    want = attention(q, k, v)[0]
    for spec, gather in [(P("a", None, "c", None), False), (P("c", None, "a", None), False),
                         (P(("a", "c"), None, None, None), False), (P(None, "a", None, None), True),
                         (P(None, None, None, "c"), True)]:
        args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v)]
        seen.clear()
        f = jax.jit(lambda q, k, v: sharded_attention(q, k, v))  # traced afresh
        got = f(*args)
        emit(f"attention {spec}", ok=bool(np.allclose(got, want, rtol=1e-5, atol=1e-5)),
             collectives=collectives(hlo_of(f, *args)), want_gather=gather, shapes=list(seen),
             out_spec=str(got.sharding.spec))


def stand_in(x, w, *, target, kernel, results, aliases, attrs):
    """What the expw kernel computes, lowered for the CPU in place of its custom call."""
    seen.append(tuple(x.shape))
    e = jnp.exp(x)
    return [e * w, e]


def check_kernel(cache: str) -> None:
    mlir.register_lowering(cutecc_call_p, placed(mlir.lower_fun(stand_in, multiple_results=True)),
                           platform="cpu")
    ks = cutecc.load(cache, arch="sm_90a")
    # Auto axes (XLA's own collectives, so the gather below runs), whatever this JAX's
    # default: under Explicit ones that gather is refused (tests/runtime/test_strict.py)
    from jax.sharding import AxisType

    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    x = jnp.asarray(rng.standard_normal((64, 16), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((16,), dtype=np.float32))
    want = np.exp(x) * w
    for spec, gather in [(P("x"), False), (P(None, "x"), True), (P(), False)]:
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        seen.clear()
        f = jax.jit(lambda x, w: ks.expw_rows(x, w) * 2)
        got = f(xs, w)
        emit(f"expw_rows {spec}", ok=bool(np.allclose(got, 2 * want, rtol=1e-6)),
             collectives=collectives(hlo_of(f, xs, w)), want_gather=gather, shapes=seen,
             out_spec=str(got.sharding.spec))
    seen.clear()
    got = ks.expw_rows(jax.device_put(x, NamedSharding(mesh, P("x"))), w)  # eagerly
    emit("expw_rows eager", ok=bool(np.allclose(got, want, rtol=1e-6)), shapes=seen,
         out_spec=str(got.sharding.spec))
    try:  # no shard rule: rows split over the mesh are refused, never gathered silently
        jax.jit(ks.expw)(jax.device_put(x, NamedSharding(mesh, P("x"))), w)
        emit("expw refused", ok=False)
    except CallError as e:
        emit("expw refused", ok="computation over 8 devices" in e.message, message=e.message)
    got = jax.jit(ks.expw)(x, w)  # on one device of the eight: runs there
    emit("expw on one device", ok=bool(np.allclose(got, want, rtol=1e-6)) and len(got.devices()) == 1)
    five = jax.devices()[5]  # with a rule too: all on device 5, the whole call runs there
    got = jax.jit(ks.expw_rows)(jax.device_put(x, five), jax.device_put(w, five))
    emit("expw_rows on device 5", ok=bool(np.allclose(got, want, rtol=1e-6)) and got.devices() == {five})


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    check_attention()
    check_kernel(sys.argv[1])
