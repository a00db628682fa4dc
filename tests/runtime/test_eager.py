"""Eager calls (no `jit`, no transformation) run as one cached `jax.jit` of the whole call
(seen: an eager grad-paired call cost 9-13x XLA's eager op, a plain one 4-6x): the
variant is chosen, the scalars checked and the `custom_vjp` built once per signature, and
the checks still say what was wrong. Run on the CPU in a subprocess with a stand-in
lowering of the primitive (a CUDA kernel cannot run here), so only cutecc's side is timed
out of the picture and counted."""

from __future__ import annotations

from pathlib import Path

from helpers import script_json

SCRIPT = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.interpreters import mlir
import cutecc
from cutecc.errors import CuteccError
from cutecc.runtime import dispatch
from cutecc.runtime.primitive import cutecc_call_p

def stand_in(*args, results, attrs, **_):  # the results' shapes, filled from the inputs
    extra = sum(v for _, _, v in attrs) if attrs else 0.0
    return [jnp.zeros(s, jnp.dtype(d)) + args[0].reshape(-1)[0].astype(jnp.dtype(d)) + extra
            for s, d in results]
mlir.register_lowering(cutecc_call_p, mlir.lower_fun(stand_in, multiple_results=True), platform="cpu")

traces = []
real = dispatch.KernelFn._traced
def counting(self, arrays, scalars):
    traces.append((self.name, tuple(sorted(scalars))))
    return real(self, arrays, scalars)
dispatch.KernelFn._traced = counting
vjps = []
real_vjp = jax.custom_vjp
def counting_vjp(f):
    vjps.append(1)
    return real_vjp(f)
dispatch.jax.custom_vjp = counting_vjp

ks = cutecc.load(sys.argv[1], arch="sm_90a")
rng = np.random.default_rng()
x = jnp.asarray(rng.standard_normal(300, dtype=np.float32))
y = jnp.asarray(rng.standard_normal(300, dtype=np.float32))
out = {}
got = [ks.mul(x, y) for _ in range(5)]
out["mul_value"] = bool(all(np.allclose(g, np.full(300, x[0])) for g in got))
out["mul_traces"] = len(traces)
out["mul_vjps"] = len(vjps)
ks.mul(x[:100], y[:100])
out["mul_traces_new_shape"] = len(traces)
traces.clear()
a = [ks.axpy(x, y, alpha=2.0) for _ in range(3)]
out["axpy_value"] = bool(np.allclose(a[0], np.full(300, x[0] + 2.0)))
ks.axpy(x, y, alpha=3.0); ks.axpy(x, y)
out["axpy_traces"] = len(traces)
for name, call in {"dtype": lambda: ks.mul(x.astype(jnp.float16), y),
                   "bool_for_float": lambda: ks.axpy(x, y, alpha=True),
                   "unknown_kw": lambda: ks.axpy(x, y, beta=1.0),
                   "not_array": lambda: ks.mul(x, 3.0)}.items():
    try:
        call()
        out[name] = "no error"
    except CuteccError as e:
        out[name] = str(e)
ks.axpy(x, y, alpha=1)  # an int for a float32 scalar is accepted (and traced anew: its type)
out["int_alpha_traced"] = traces[-1] == ("axpy", ("alpha",))
out["grad"] = bool(np.isfinite(np.asarray(jax.grad(lambda u: ks.mul(u, y).sum())(x))).all())
print(json.dumps(out))
'''


def test_eager_calls_trace_once_per_signature_and_keep_their_checks(example_cache: Path) -> None:
    got = script_json(SCRIPT, str(example_cache))
    assert got["mul_value"] and got["axpy_value"]
    # five eager calls of a grad-paired kernel: one trace, one custom_vjp (was one per call)
    assert got["mul_traces"] == 1 and got["mul_vjps"] == 1
    assert got["mul_traces_new_shape"] == 2  # a new shape is a new signature, as for jit
    assert got["axpy_traces"] == 3  # alpha=2.0 (x3), alpha=3.0, no alpha
    assert "no built variant matches the call (float16[300], float32[300])" in got["dtype"]
    assert "runtime scalar 'alpha' (float32) must be a number: got bool True" in got["bool_for_float"]
    assert "unknown keyword argument 'beta'" in got["unknown_kw"]
    assert "argument 1 is a float, not an array" in got["not_array"]
    assert got["int_alpha_traced"]
    assert got["grad"] is True  # under a transformation the traced path still serves
