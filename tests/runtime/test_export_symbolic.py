"""`jax.export` with symbolic shapes: the checks of a call that need
concrete sizes (the 2^31 limit of a symbolic extent, divisibility) are left, for a symbolic
dimension, to where the size is concrete: the kernel's own argument check at run time (the
DSL's TVM-FFI function checks each symbolic extent's int32 range and declared divisibility).

The kernels are the root kernels.toml's and tests/gpu/train_kernels'; built once per session.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.contract.args import CallingConvention, TensorArg
from cutecc.errors import CuteccError
from cutecc.runtime.dispatch import _mismatch
from cutecc.runtime.library import target_name

S = jax.ShapeDtypeStruct
F32 = jnp.float32


@pytest.fixture(scope="module")
def ks(train_cache: Path):
    return cutecc.load(train_cache, arch="sm_90a")


def _export(fn, *specs, ks):
    return jax.export.export(jax.jit(fn), platforms=["cuda"],
                             disabled_checks=ks.disabled_safety_checks())(*specs)


def test_export_with_symbolic_shapes(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    (n,) = jax.export.symbolic_shape("n")
    exp = _export(lambda x, y: ks.mul(x, y) * 2, S((n,), F32), S((n,), F32), ks=ks)
    assert str(exp.out_avals[0].shape) == "(n,)"
    back = jax.export.deserialize(exp.serialize())
    f32 = [b for b in ks.mul.builds if b.variant == "dtype=float32"][0]
    assert target_name(f32.key) in back.mlir_module()


def test_export_with_symbolic_shapes_and_scratch(ks) -> None:
    (n,) = jax.export.symbolic_shape("n")
    exp = _export(ks.triple, S((n,), F32), ks=ks)
    assert str(exp.out_avals[0].shape) == "(n,)"
    assert target_name(ks.triple.builds[0].key) in exp.mlir_module()


def test_export_symbolic_rows_with_a_scalar_of_concrete_columns(ks) -> None:
    (m,) = jax.export.symbolic_shape("m")
    exp = _export(ks.pad_cols, S((m, 33), F32), ks=ks)
    assert str(exp.out_avals[0].shape) == "(m, 64)"
    assert "cols = 64 : i32" in exp.mlir_module()


def test_export_refuses_a_scalar_that_would_depend_on_a_symbolic_dimension(ks) -> None:
    m, n = jax.export.symbolic_shape("m, n")
    with pytest.raises(CuteccError, match="'rows_per' = 'ceil_div\\(m, 132\\)' depends on a symbolic"):
        _export(ks.col_partials, S((m, n), F32), ks=ks)
    # where the scalar's symbols are concrete, the rest may stay symbolic
    exp = _export(ks.col_partials, S((1000, n), F32), ks=ks)
    assert str(exp.out_avals[0].shape) == "(132, n)"


# What a call decides about a symbolic dimension ----------------------------------------

class _Contract:
    """Just what `_mismatch` reads of a build: its calling convention."""

    def __init__(self, *inputs: TensorArg) -> None:
        out = TensorArg("out", "output", "float32", (1,))
        self.conv = CallingConvention.of((*inputs, out))


def _fits(contract: _Contract, *shapes) -> tuple[dict | None, str]:
    return _mismatch(contract, [S(s, F32) for s in shapes])


def test_divisibility_must_be_provable_for_a_symbolic_dimension() -> None:
    c = _Contract(TensorArg("x", "input", "float32", ("m", "n"), divisibility=(1, 8)))
    m, n, k = jax.export.symbolic_shape("m, n, k")
    env, why = _fits(c, (m, n))
    assert env is None and 'expected a multiple of 8' in why and 'e.g. "8*n"' in why
    env, why = _fits(c, (m, 8 * k))
    assert env == {"m": m, "n": 8 * k} and why == ""
    assert _fits(c, (3, 12))[0] is None  # concrete: as before


def test_the_int32_limit_is_decided_by_constraints_else_left_to_the_kernel() -> None:
    c = _Contract(TensorArg("x", "input", "float32", ("n",)))
    (n,) = jax.export.symbolic_shape("n")
    assert _fits(c, (n,))[0] == {"n": n}  # the kernel's argument check refuses >= 2^31 at run time
    (big,) = jax.export.symbolic_shape("big", constraints=("big >= 2147483648",))
    env, why = _fits(c, (big,))
    assert env is None and "compiled as int32" in why
    assert _fits(c, (2**31,))[0] is None  # concrete: refused at trace time, as before


def test_symbolic_dimensions_bind_symbols_and_static_extents_exactly() -> None:
    c = _Contract(TensorArg("x", "input", "float32", ("n", 4)), TensorArg("y", "input", "float32", ("n",)))
    n, m = jax.export.symbolic_shape("n, m")
    assert _fits(c, (n, 4), (n,))[0] == {"n": n}
    assert "from an earlier argument" in _fits(c, (n, 4), (m,))[1]
    assert "expected 4" in _fits(c, (n, m), (n,))[1]


def test_a_padded_view_must_provably_fit_its_symbolic_buffer() -> None:
    c = _Contract(TensorArg("a", "input", "float32", ("m", "k"), buffer=("m", "lda")),
                  TensorArg("v", "input", "float32", ("k",)))
    m, k, lda = jax.export.symbolic_shape("m, k, lda")
    assert "smaller than the logical extent" in _fits(c, (m, lda), (k,))[1]
    assert _fits(c, (m, k + 64), (k,))[0] == {"m": m, "lda": k + 64, "k": k}


def test_derived_extents_evaluate_over_symbolic_dimensions() -> None:
    from cutecc.runtime.dispatch import _buffer_shape

    n, k = jax.export.symbolic_shape("n, k")
    t = TensorArg("s", "scratch", "float32", ("round_up(n, 128)", "min(k, 4) * 2", "max(n, 3)", 5))
    shape = _buffer_shape("toy", t, {"n": n, "k": k})
    assert [str(d) for d in shape[:2]] == [str(-(-n // 128) * 128), str(jax.core.min_dim(k, 4) * 2)]
    assert shape[3] == 5
    assert _buffer_shape("toy", t, {"n": 130, "k": 9}) == (256, 8, 130, 5)
    with pytest.raises(CuteccError, match='derived extent .* is 0 for'):
        _buffer_shape("toy", TensorArg("s", "scratch", "float32", ("n - 4",)), {"n": 4})
