"""Child of test_strict.py: four CPU devices (XLA_FLAGS set by the parent before JAX starts),
loaded kernels of the train cache under an Explicit mesh (`jax.set_mesh`). One JSON line per
check. `expw_rows` declares `shard = ["m"]`, `expw` no rule; both custom calls are lowered
for the CPU by a stand-in computing what the kernel computes (out = exp(x) * w, e = exp(x)),
behind the production placement check.

    python strict_child.py TRAIN_CACHE
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import cutecc
from cutecc.errors import CallError
from cutecc.runtime.primitive import cutecc_call_p, placed

COLLECTIVES = ("all-gather", "all-to-all", "all-reduce", "collective-permute")


def emit(check: str, ok: bool, **kw: Any) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), **kw}), flush=True)


def stand_in(x, w, *, target, kernel, results, aliases, attrs):
    e = jnp.exp(x)
    return [e * w, e]


def collectives(f: Any, *args: Any) -> list[str]:
    text = f.lower(*args).compile().as_text()
    return [c for c in COLLECTIVES if f" {c}(" in text or f"{c}-start" in text]


def refusal(f: Any) -> str:
    try:
        f()
    except CallError as e:
        return f"{e.where}: {e.message}"
    return "ran"


def main(cache: str) -> None:
    mlir.register_lowering(cutecc_call_p, placed(mlir.lower_fun(stand_in, multiple_results=True)),
                           platform="cpu")
    ks = cutecc.load(cache, arch="sm_90a")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 16), dtype=np.float32)
    w = rng.standard_normal(16, dtype=np.float32)
    want = np.exp(x) * w
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))  # noqa: E731
        ws = put(w)
        rows = put(x, "x")
        cols = put(x, None, "x")
        whole = put(x)

        f = jax.jit(lambda a, b: ks.expw_rows(a, b))
        got = f(rows, ws)
        emit("rule, declared split, jit", np.allclose(got, want, rtol=1e-6) and collectives(f, rows, ws) == []
             and tuple(got.sharding.spec)[:1] == ("x",), spec=str(got.sharding.spec))
        got = ks.expw_rows(rows, ws)
        emit("rule, declared split, eager", np.allclose(got, want, rtol=1e-6))

        says = ('kernel "expw_rows"', "explicit mesh", "P(None, 'x')", "all-gather over mesh axes 'x'",
                "shard = ['m']")
        msg = refusal(lambda: jax.jit(lambda a, b: ks.expw_rows(a, b))(cols, ws))
        emit("rule, other split, jit", all(s in msg for s in says), message=msg)
        msg = refusal(lambda: ks.expw_rows(cols, ws))
        emit("rule, other split, eager", all(s in msg for s in says), message=msg)

        msg = refusal(lambda: jax.jit(lambda a, b: ks.expw(a, b))(rows, ws))
        emit("no rule, split", all(s in msg for s in ('kernel "expw"', "P('x', None)", "all-gather",
                                                       "no shard rule", "whole arrays")), message=msg)
        msg = refusal(lambda: jax.jit(lambda a, b: ks.expw(a, b))(whole, ws))  # no collective: placement
        emit("no rule, replicated", "computation over 4 devices" in msg, message=msg)

        ks.expw_rows.builds = [dataclasses.replace(b, reshard="warn") for b in ks.expw_rows.builds]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = jax.jit(lambda a, b: ks.expw_rows(a, b) * 2)
            outs = [g(cols, ws), ks.expw_rows(cols, ws), g(cols, ws)]
            coll = collectives(g, cols, ws)
        texts = [str(c.message) for c in caught if "expw_rows" in str(c.message)]
        emit("warn", len(texts) == 1 and "all-gather" in texts[0] and "P(None, 'x')" in texts[0]
             and coll == ["all-gather"] and np.allclose(outs[0], 2 * want, rtol=1e-6)
             and np.allclose(outs[1], want, rtol=1e-6), warnings=texts, collectives=coll)

        ks.expw.builds = [dataclasses.replace(b, reshard="allow") for b in ks.expw.builds]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h = jax.jit(lambda a, b: ks.expw(a, b))
            got = h(rows, ws)
            coll = collectives(h, rows, ws)
        emit("allow, no rule", not [c for c in caught if "expw" in str(c.message)] and coll == ["all-gather"]
             and np.allclose(got, want, rtol=1e-6), collectives=coll)
        got = h(whole, ws)
        emit("allow, no rule, replicated", np.allclose(got, want, rtol=1e-6))

        ks.expw.builds = [dataclasses.replace(b, reshard="error") for b in ks.expw.builds]
        sm = jax.jit(jax.shard_map(lambda a, b: ks.expw(a, b), in_specs=(P("x"), P()), out_specs=P("x")))
        got = sm(rows, ws)
        emit("inside shard_map", np.allclose(got, want, rtol=1e-6) and collectives(sm, rows, ws) == [])

    auto = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))  # XLA's own choices: gathered
    ks.expw_rows.builds = [dataclasses.replace(b, reshard="error") for b in ks.expw_rows.builds]
    acols = jax.device_put(x, NamedSharding(auto, P(None, "x")))
    f = jax.jit(lambda a, b: ks.expw_rows(a, b))
    got = f(acols, w)
    emit("auto mesh unchanged",
         np.allclose(got, want, rtol=1e-6) and collectives(f, acols, w) == ["all-gather"])
    arows = jax.device_put(x, NamedSharding(auto, P("x")))
    msg = refusal(lambda: jax.jit(lambda a, b: ks.expw(a, b))(arows, w))
    ks.expw.builds = [dataclasses.replace(b, reshard="allow") for b in ks.expw.builds]
    h = jax.jit(lambda a, b: ks.expw(a, b))
    got = h(arows, w)
    emit("auto mesh, no rule: refused unless allowed", "computation over 4 devices" in msg
         and np.allclose(got, want, rtol=1e-6) and collectives(h, arows, w) == ["all-gather"], message=msg)


if __name__ == "__main__":
    assert jax.device_count() == 4, jax.devices()
    main(sys.argv[1])
