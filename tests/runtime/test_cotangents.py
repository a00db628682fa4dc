"""Every cotangent or an error, seen from JAX on a CPU: a forward returning a residual beside
its result (rstd), paired with a backward that takes only the result's cotangent.

A gradient flowing into an output whose cotangent the backward does not take is an error at
trace time (non-differentiable), or dropped by an explicit stop-gradient declaration; an
output nobody differentiates costs nothing (JAX's symbolic zeros tell them apart). Nothing
compiles: the builds are the manifest's contracts under made-up keys, traced and lowered
but never run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import unbuilt_kernels, unbuilt_target

from cutecc.errors import CallError

S = jax.ShapeDtypeStruct
F32 = jnp.float32

FWD = """
[kernel.rownorm]
entry = "kk.elem:rownorm"
args = [
  { name = "x", dtype = "float32", shape = ["m", "n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["m", "n"] },
  { name = "rstd", role = "output", dtype = "float32", shape = ["m"] },
  { kind = "stream" },
]
"""
BWD = """
[kernel.rownorm_bwd]
entry = "kk.elem:rownorm_bwd"
args = [
  { name = "x", dtype = "float32", shape = ["m", "n"] },
  { name = "rstd", dtype = "float32", shape = ["m"] },
  { name = "dout", dtype = "float32", shape = ["m", "n"] },
  { name = "dx", role = "output", dtype = "float32", shape = ["m", "n"] },
  { kind = "stream" },
]
"""
TAKES_OUT = 'args = ["x", "rstd", "cotangent.out"]'


def _kernels(tmp_path: Path, grad: str | None) -> dict[str, Any]:
    """rownorm and its backward as the runtime sees them; `grad` is the pairing's table.
    None: the pairing as an entry built before declarations existed records it (its args
    leave out rstd's cotangent, and nothing says so)."""
    table = grad or f'{{ backward = "rownorm_bwd", {TAKES_OUT}, nondiff = ["rstd"] }}'
    p = tmp_path / "kernels.toml"
    p.write_text(FWD + f"grad = {table}\n" + BWD)
    old = {"backward": "rownorm_bwd", "args": ["x", "rstd", "cotangent.out"], "returns": None}
    return unbuilt_kernels(p, {"rownorm": old} if grad is None else None)


def _targets(fn: Any, *specs: Any) -> list[str]:
    text = jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
    return re.findall(r"stablehlo.custom_call @(cutecc_\w+)", text)


X = S((6, 40), F32)


def test_a_gradient_into_an_output_the_backward_does_not_take_is_an_error(tmp_path: Path) -> None:
    ks = _kernels(tmp_path, None)
    with pytest.raises(CallError) as info:
        jax.eval_shape(jax.grad(lambda x: ks["rownorm"](x)[1].sum()), X)
    msg = str(info.value)
    assert 'kernel "rownorm"' in msg and 'output "rstd"' in msg and '"rownorm_bwd"' in msg
    assert "stop_gradient" in msg and '"cotangent.rstd"' in msg
    with pytest.raises(CallError, match='output "rstd"'):  # both outputs in the loss: still refused
        jax.eval_shape(jax.grad(lambda x: sum(o.sum() for o in ks["rownorm"](x))), X)


def test_the_declared_nondiff_output_refuses_a_gradient_too(tmp_path: Path) -> None:
    ks = _kernels(tmp_path, f'{{ backward = "rownorm_bwd", {TAKES_OUT}, nondiff = ["rstd"] }}')
    with pytest.raises(CallError, match='output "rstd".*declared non-differentiable'):
        jax.eval_shape(jax.grad(lambda x: (ks["rownorm"](x)[1] ** 2).sum()), X)


def test_an_unused_output_costs_nothing_and_the_result_differentiates(tmp_path: Path) -> None:
    ks = _kernels(tmp_path, f'{{ backward = "rownorm_bwd", {TAKES_OUT}, nondiff = ["rstd"] }}')

    def loss(x: Any) -> Any:
        out, rstd = ks["rownorm"](x)
        return (out ** 2).sum() + jax.lax.stop_gradient(rstd).sum()

    assert jax.eval_shape(jax.grad(loss), X).shape == (6, 40)
    fwd, bwd = (unbuilt_target(n, ks[n].builds[0].key) for n in ("rownorm", "rownorm_bwd"))
    assert _targets(jax.value_and_grad(loss), X) == [fwd, bwd]
    # the backward takes (x, rstd, cotangent of out): the forward's rstd, not a zero
    text = jax.jit(jax.grad(loss)).trace(X).lower(lowering_platforms=("cuda",)).as_text()
    assert re.search(r"custom_call @" + bwd + r"\(%\w+, %\w+#1, %\w+\)", text), text


def test_declared_stop_gradient_drops_the_cotangent(tmp_path: Path) -> None:
    ks = _kernels(tmp_path, f'{{ backward = "rownorm_bwd", {TAKES_OUT}, stop_gradient = ["rstd"] }}')
    assert ks["rownorm"].grad["stop_gradient"] == ("rstd",)
    fwd, bwd = (unbuilt_target(n, ks[n].builds[0].key) for n in ("rownorm", "rownorm_bwd"))
    both = lambda x: sum(o.sum() for o in ks["rownorm"](x))  # noqa: E731
    assert jax.eval_shape(jax.grad(both), X).shape == (6, 40)
    assert _targets(jax.value_and_grad(both), X) == [fwd, bwd]
    # only the stop-gradient output in the loss: no gradient reaches the backward, none runs
    only = lambda x: ks["rownorm"](x)[1].sum()  # noqa: E731
    assert _targets(jax.value_and_grad(only), X) == [fwd]
    jaxpr = jax.make_jaxpr(jax.grad(only))(jnp.ones((6, 40)))
    assert str(jaxpr).count("cutecc_call") == 1 and "broadcast_in_dim" in str(jaxpr)


def test_a_pairing_that_takes_every_cotangent_keeps_plain_custom_vjp(tmp_path: Path) -> None:
    """Taking both cotangents (a backward of four inputs): no symbolic zeros needed."""
    bwd4 = BWD.replace('{ name = "dout"', '{ name = "drstd", dtype = "float32", shape = ["m"] },\n'
                       '  { name = "dout"')
    p = tmp_path / "kernels.toml"
    p.write_text(FWD + 'grad = { backward = "rownorm_bwd", args = ["x", "rstd", "cotangent.rstd", '
                 '"cotangent.out"] }\n' + bwd4)
    fn = unbuilt_kernels(p)["rownorm"]
    assert fn.grad == {"args": ("x", "rstd", "cotangent.rstd", "cotangent.out"), "returns": None,
                       "stop_gradient": ()}
    pairing = fn._cotangents(fn.builds[0])
    assert pairing.complete and pairing.taken == ("out", "rstd")
    assert jax.eval_shape(jax.grad(lambda x: fn(x)[1].sum()), X).shape == (6, 40)
