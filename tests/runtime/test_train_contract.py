"""Derived extents and scalars, scratch, and `jax.export` with symbolic shapes, seen from
JAX on a CPU: output shapes, the scalars the runtime passes,
the scratch operands and results of the custom call, and symbolic export.

The kernels are tests/gpu/train_kernels (built once per session, or CUTECC_TRAIN_CACHE);
tests/gpu/test_train_gpu.py runs them on a GPU.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.errors import CuteccError
from cutecc.runtime.library import target_name

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if "stablehlo.custom_call" in line]


@pytest.fixture(scope="module")
def ks(train_cache: Path):
    return cutecc.load(train_cache, arch="sm_90a")


@pytest.mark.parametrize(("m", "n", "width"), [(5, 33, 64), (1, 1, 32), (3, 64, 64), (2, 65, 96)])
def test_a_derived_output_extent_and_scalar_follow_the_call(ks, m: int, n: int, width: int) -> None:
    out = jax.eval_shape(ks.pad_cols, S((m, n), F32))
    assert (out.shape, out.dtype) == ((m, width), F32)
    (call,) = custom_calls(lower(ks.pad_cols, S((m, n), F32)))
    assert f"cols = {width} : i32" in call and f"-> tensor<{m}x{width}xf32>" in call


def test_hardware_facts_are_numbers_recorded_at_build(ks) -> None:
    out = jax.eval_shape(ks.col_partials, S((1000, 70), F32))
    assert out.shape == (132, 70)  # the h100 profile's sm_count
    (call,) = custom_calls(lower(ks.col_partials, S((1000, 70), F32)))
    assert "blocks = 132 : i32" in call and "rows_per = 8 : i32" in call  # ceil(1000 / 132)


def test_a_derived_scalar_is_no_keyword_of_the_call(ks) -> None:
    assert list(inspect.signature(ks.pad_cols).parameters) == ["x"]
    assert "cols" not in ks.pad_cols.builds[0].signature()
    with pytest.raises(CuteccError, match=r"scalar 'cols' is derived \(value = 'round_up\(n, 32\)'\)"):
        jax.eval_shape(lambda x: ks.pad_cols(x, cols=64), S((2, 33), F32))


def test_scratch_is_allocated_passed_and_dropped(ks) -> None:
    out = jax.eval_shape(ks.triple, S((100,), F32))
    assert isinstance(out, jax.ShapeDtypeStruct) and out.shape == (100,)  # only `out` comes back
    text = lower(ks.triple, S((100,), F32))
    (call,) = custom_calls(text)
    # x, then acc as zeros (rounded up to 64), aliased to the last result; tmp a plain result
    assert "(tensor<100xf32>, tensor<128xf32>) -> (tensor<100xf32>, tensor<100xf32>, tensor<128xf32>)" in call
    assert "output_tuple_indices = [2], operand_index = 1" in call
    assert re.search(r"constant dense<0\.0+e\+00> : tensor<f32>", text)
    assert f"@{target_name(ks.triple.builds[0].key)}" in call


def test_scratch_composes_under_jit_with_other_ops(ks) -> None:
    f = jax.jit(lambda x: ks.triple(x) * 2 + ks.pad_cols(x[None, :])[0, :x.shape[0]])
    assert jax.eval_shape(f, S((40,), F32)).shape == (40,)


# Residuals, named grad pairing and declared reductions ----------------------------------

def test_a_saved_output_is_not_returned(ks) -> None:
    out = jax.eval_shape(ks.expw, S((6, 10), F32), S((10,), F32))
    assert isinstance(out, jax.ShapeDtypeStruct) and out.shape == (6, 10)  # e stays hidden
    (call,) = custom_calls(lower(ks.expw, S((6, 10), F32), S((10,), F32)))
    assert "-> (tensor<6x10xf32>, tensor<6x10xf32>)" in call  # out and e


def test_a_declared_reduction_sums_the_partials(ks) -> None:
    dx, dw = jax.eval_shape(ks.expw_bwd, S((10,), F32), S((6, 10), F32), S((6, 10), F32))
    assert dx.shape == (6, 10) and dw.shape == (10,)
    text = lower(ks.expw_bwd, S((10,), F32), S((6, 10), F32), S((6, 10), F32))
    (call,) = custom_calls(text)
    assert "tensor<132x10xf32>" in call and "rows_per = 1 : i32" in call
    assert "stablehlo.reduce" in text


def test_grad_through_a_named_pairing_with_a_residual(ks) -> None:
    loss = lambda x, w: (ks.expw(x, w) ** 2).sum()  # noqa: E731
    gx, gw = jax.eval_shape(jax.grad(loss, argnums=(0, 1)), S((300, 70), F32), S((70,), F32))
    assert (gx.shape, gw.shape) == ((300, 70), (70,))
    text = lower(jax.value_and_grad(loss, argnums=(0, 1)), S((300, 70), F32), S((70,), F32))
    calls = custom_calls(text)
    fwd, bwd = ks.expw.builds[0], ks.expw_bwd.builds[0]
    assert [target_name(fwd.key) in c for c in calls] == [True, False]
    assert target_name(bwd.key) in calls[1]
    # the backward takes (w, e, cotangent): three operands, the second the forward's hidden e
    assert "(tensor<70xf32>, tensor<300x70xf32>, tensor<300x70xf32>) -> (tensor<300x70xf32>, " \
           "tensor<132x70xf32>)" in calls[1]
    assert re.search(r"%(\w+):2 = stablehlo.custom_call @" + target_name(fwd.key), text)


def test_grad_of_one_input_only(ks) -> None:
    """Only x's gradient requested: w's backward result is computed but not used."""
    g = jax.eval_shape(jax.grad(lambda x, w: ks.expw(x, w).sum()), S((4, 8), F32), S((8,), F32))
    assert g.shape == (4, 8)


def test_a_returned_residual_without_its_cotangent_is_declared_in_the_entry(ks) -> None:
    """expw_r returns e beside out and declares it nondiff; expw_rs declares it stop-gradient
    (recorded with its entry, which the runtime reads). A gradient into e is an error for the
    first; for the second it is dropped, and with only e in the loss no backward runs."""
    assert ks.expw_r.grad["stop_gradient"] == () and ks.expw_rs.grad["stop_gradient"] == ("e",)
    x, w = S((300, 70), F32), S((70,), F32)
    with pytest.raises(CuteccError, match='output "e"'):
        jax.eval_shape(jax.grad(lambda x, w: ks.expw_r(x, w)[1].sum()), x, w)
    on_out = lambda x, w: (ks.expw_r(x, w)[0] ** 2).sum()  # noqa: E731
    calls = custom_calls(lower(jax.value_and_grad(on_out, argnums=(0, 1)), x, w))
    fwd, bwd = (target_name(ks[n].builds[0].key) for n in ("expw_r", "expw_bwd"))
    assert len(calls) == 2 and fwd in calls[0] and bwd in calls[1]
    only_e = lambda x, w: ks.expw_rs(x, w)[1].sum()  # noqa: E731
    calls = custom_calls(lower(jax.value_and_grad(only_e, argnums=(0, 1)), x, w))
    assert len(calls) == 1 and target_name(ks.expw_rs.builds[0].key) in calls[0]


# Broadcast (stride 0) inputs and 64-bit extents ------------------------------------------

def test_a_broadcast_input_is_passed_with_extent_one(ks) -> None:
    out = jax.eval_shape(ks.add_bias, S((300, 70), F32), S((1, 70), F32))
    assert out.shape == (300, 70)
    (call,) = custom_calls(lower(ks.add_bias, S((300, 70), F32), S((1, 70), F32)))
    assert "(tensor<300x70xf32>, tensor<1x70xf32>) -> tensor<300x70xf32>" in call
    with pytest.raises(CuteccError, match=r"b: dimension 0 is 300, expected 1 \(the buffer's extent\)"):
        jax.eval_shape(ks.add_bias, S((300, 70), F32), S((300, 70), F32))


def test_a_64_bit_extent_passes_where_a_32_bit_one_is_refused(ks) -> None:
    big = S((2**31 + 5,), jnp.uint8)
    assert jax.eval_shape(ks.plus_one_wide, big).shape == (2**31 + 5,)
    assert "tensor<2147483653xui8>" in custom_calls(lower(ks.plus_one_wide, big))[0]
    with pytest.raises(CuteccError, match="compiled as int32"):
        jax.eval_shape(ks.triple, S((2**31 + 5,), F32))


# Composite kernels: ordered launches sharing tensors by name ------------------------------

def test_a_composite_is_one_callable_over_its_launches(ks) -> None:
    assert "expw2_bwd" in ks and "expw2_bwd" in list(ks)
    fn = ks.expw2_bwd
    assert "bwd_g -> bwd_dxdw" in repr(fn)
    dx, dw = jax.eval_shape(fn, S((70,), F32), S((300, 70), F32), S((300, 70), F32))
    assert (dx.shape, dw.shape) == ((300, 70), (70,))
    text = lower(fn, S((70,), F32), S((300, 70), F32), S((300, 70), F32))
    calls = custom_calls(text)
    assert len(calls) == 2
    assert target_name(ks.bwd_g.builds[0].key) in calls[0]
    assert target_name(ks.bwd_dxdw.builds[0].key) in calls[1]
    assert "rows_per = 3 : i32" in calls[1]
    with pytest.raises(CuteccError, match=r"takes 3 array\(s\) \(w, e, dout\), got 2"):
        jax.eval_shape(fn, S((70,), F32), S((300, 70), F32))


def test_a_composite_pairs_as_a_backward(ks) -> None:
    loss = lambda x, w: (ks.expw2(x, w) ** 2).sum()  # noqa: E731
    gx, gw = jax.eval_shape(jax.grad(loss, argnums=(0, 1)), S((300, 70), F32), S((70,), F32))
    assert (gx.shape, gw.shape) == ((300, 70), (70,))
    calls = custom_calls(lower(jax.value_and_grad(loss, argnums=(0, 1)), S((300, 70), F32),
                               S((70,), F32)))
    keys = [ks.expw2.builds[0].key, ks.bwd_g.builds[0].key, ks.bwd_dxdw.builds[0].key]
    assert [[target_name(k) in c for k in keys].index(True) for c in calls] == [0, 1, 2]


def test_a_wider_gradient_is_cast_to_its_inputs_dtype() -> None:
    """quack RMSNorm's dw is summed from fp32 partials for a bf16 weight; jax.grad promises
    the input's dtype, so the runtime casts (an integer input's gradient is left alone)."""
    from cutecc.runtime.dispatch import _like

    assert _like(jnp.ones(3, F32), jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16
    assert _like(jnp.ones(3, F32), jnp.ones(3, F32)).dtype == F32
    assert _like(jnp.ones(3, F32), jnp.ones(3, jnp.int32)).dtype == F32
