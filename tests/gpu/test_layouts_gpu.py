"""Declared layouts, divisibility, padded leading strides and call keywords on a real GPU,
against NumPy on fresh random inputs.

The kernels are tests/gpu/layout_kernels (their own manifest). Set CUTECC_LAYOUT_CACHE to
a cache built from it (the device machine has no DSL); with the DSL installed and no
CUTECC_LAYOUT_CACHE, it is built here.
"""

from __future__ import annotations

import operator
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.errors import CuteccError, FallbackWarning

from .conftest import prepared_cache

pytestmark = pytest.mark.gpu

MANIFEST = Path(__file__).parent / "layout_kernels" / "kernels.toml"
ENV_CACHE = "CUTECC_LAYOUT_CACHE"


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory):
    return cutecc.load(prepared_cache(tmp_path_factory, MANIFEST, ENV_CACHE))


def bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype=jnp.bfloat16)


@pytest.mark.parametrize("m, n", [(1, 8), (7, 64), (300, 1024)])
def test_vectorised_rows_with_declared_divisibility(ks, rng, m: int, n: int) -> None:
    x = bf16(rng, (m, n))
    y = jax.jit(ks.rows)(x)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x, np.float32))


@pytest.mark.parametrize("m, k", [(8, 1), (64, 7), (1024, 300)])
def test_column_major_operands_take_and_give_logical_arrays(ks, rng, m: int, k: int) -> None:
    x = bf16(rng, (m, k))
    y = jax.jit(ks.cols)(x)  # the kernel copies column by column in its own buffers
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x, np.float32))
    w = x.T  # a caller holding the (k, m) buffer passes w.T
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda w: ks.cols(w.T))(w), np.float32),
                                  np.asarray(x, np.float32))


def test_divisibility_is_checked_at_the_call(ks, rng) -> None:
    with pytest.raises(CuteccError, match=r"x: dimension 0 is 12, expected a multiple of 8"):
        ks.cols(bf16(rng, (12, 3)))


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (17, 64, 9)])
@pytest.mark.parametrize("causal", [False, True])
def test_stride_orders_and_call_keywords_under_jit_and_grad(ks, rng, shape, causal: bool) -> None:
    x = jnp.asarray(rng.standard_normal(shape), dtype=jnp.float32)
    f = 2.0 if causal else 1.0
    out = jax.jit(lambda x: ks.scale(x, causal=causal))(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) * f, rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: (ks.scale(x, causal=causal) ** 2).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * f * f * np.asarray(x), rtol=1e-5)


def test_a_needed_keyword_left_out_is_an_error(ks, rng) -> None:
    with pytest.raises(CuteccError, match="missing call keyword 'causal'"):
        ks.scale(jnp.ones((2, 2, 2), jnp.float32))


@pytest.mark.parametrize("m, k, ldx, ldy", [(1, 64, 64, 64), (7, 64, 72, 128), (300, 1024, 1024, 1040),
                                            (33, 1024, 2048, 1024)])
def test_padded_rows_copy_the_logical_block_and_keep_the_padding(ks, rng, m: int, k: int, ldx: int,
                                                                 ldy: int) -> None:
    """128-bit copies of the (m, k) block of an (m, ldx) buffer into that of an inout
    (m, ldy) buffer: ldx == k and ldx > k; the columns of y past k come back untouched."""
    x, y = bf16(rng, (m, ldx)), bf16(rng, (m, ldy))
    want = np.asarray(y, np.float32).copy()
    want[:, :k] = np.asarray(x, np.float32)[:, :k]
    out = jax.jit(lambda x, y: ks.pad_rows(x, y, k=k))(x, y)
    assert out.shape == (m, ldy)
    np.testing.assert_array_equal(np.asarray(out, np.float32), want)
    np.testing.assert_array_equal(np.asarray(ks.pad_rows(x, y, k=k), np.float32), want)  # eager


@pytest.mark.parametrize("m, k, lda", [(1, 1, 8), (5, 33, 40), (129, 64, 64), (300, 1000, 1024)])
def test_a_padded_operand_is_read_only_in_its_logical_block(ks, rng, m: int, k: int, lda: int) -> None:
    """out = a[:, :k] @ v with a passed whole: its padding is NaN, so a kernel that read
    past k (or used lda as the extent) would give NaN."""
    a = rng.standard_normal((m, lda)).astype(np.float32)
    a[:, k:] = np.nan
    v = rng.standard_normal(k).astype(np.float32)
    out = jax.jit(ks.row_dot)(jnp.asarray(a), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(out), a[:, :k].astype(np.float64) @ v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ldm, k", [(64, 1), (72, 5), (128, 300)])
def test_a_padded_column_major_operand(ks, rng, ldm: int, k: int) -> None:
    """The (ldm, k) array is the (k, ldm) buffer; the kernel copies its (64, k) block down
    the columns into a dense column-major result."""
    x = bf16(rng, (ldm, k))
    y = jax.jit(ks.pad_cols)(x)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x, np.float32)[:64])


def test_padded_calls_are_checked(ks, rng) -> None:
    with pytest.raises(CuteccError, match=r"x: dimension 1 of the buffer is 32, smaller than the "
                                          r"logical extent 64"):
        ks.pad_rows(bf16(rng, (2, 32)), bf16(rng, (2, 64)), k=64)
    with pytest.raises(CuteccError, match=r"missing call keyword 'k'"):
        ks.pad_rows(bf16(rng, (2, 64)), bf16(rng, (2, 64)))
    with pytest.raises(CuteccError, match=r"a: dimension 1 is 36, expected a multiple of 8 \(symbols.lda"):
        ks.row_dot(jnp.ones((2, 36), jnp.float32), jnp.ones((33,), jnp.float32))


@pytest.mark.parametrize("batches, m, n, k", [(1, 1, 1, 1), (3, 32, 24, 16), (2, 65, 130, 33),
                                              (8, 128, 256, 64)])
def test_modes_take_and_give_the_callers_arrays(ks, rng, batches: int, m: int, n: int, k: int) -> None:
    """cutlass_call's GEMM modes: batch-first a (l, m, k) and b (l, n, k) in, c (l, m, n)
    out, against einsum on fresh random inputs; jitted and eager, no transposes around it."""
    a = jnp.asarray(rng.standard_normal((batches, m, k)), dtype=jnp.float32)
    b = jnp.asarray(rng.standard_normal((batches, n, k)), dtype=jnp.float32)
    want = np.einsum("lmk,lnk->lmn", np.asarray(a, np.float64), np.asarray(b, np.float64))
    for c in (jax.jit(ks.gemm_mkl)(a, b), ks.gemm_mkl(a, b)):
        assert c.shape == (batches, m, n)
        np.testing.assert_allclose(np.asarray(c), want, rtol=1e-4, atol=1e-4)
    text = jax.jit(ks.gemm_mkl).lower(a, b).as_text()
    assert "stablehlo.transpose" not in text


@pytest.mark.parametrize("m", [1, 7, 300, 4097])
def test_a_symbolic_row_stride_reads_the_dense_array(ks, rng, m: int) -> None:
    """row_dot_ld is row_dot over (m, 64) rows compiled with a runtime row stride (lda, a
    multiple of 4): the dense array's 64 reaches the kernel as a value, not a constant."""
    a = jnp.asarray(rng.standard_normal((m, 64)), dtype=jnp.float32)
    v = jnp.asarray(rng.standard_normal(64), dtype=jnp.float32)
    want = np.asarray(a, np.float64) @ np.asarray(v, np.float64)
    for out in (jax.jit(ks.row_dot_ld)(a, v), ks.row_dot_ld(a, v)):
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", [operator.add, operator.mul])
def test_an_op_passed_as_the_object_runs_the_kernel_built_for_its_reference(ks, rng, op) -> None:
    here = str(MANIFEST.parent.parent)  # where a deployment installs the fallback's module
    if here not in sys.path:
        sys.path.insert(0, here)
    x, y = (jnp.asarray(rng.standard_normal(1000), jnp.float32) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # the kernel, never the fallback
        out = ks.apply_op(x, y, op=op)
        jitted = jax.jit(lambda x, y: ks.apply_op(x, y, op=op))(x, y)
    want = op(np.asarray(x), np.asarray(y))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(out))
    # not built: its fallback serves (it warns once per process and signature: the first run)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert np.isnan(np.asarray(ks.apply_op(x, y, op=operator.sub))).all()
    if op is operator.add:
        assert any(issubclass(w.category, FallbackWarning)
                   and "op={'import': 'operator:sub'}" in str(w.message) for w in seen), seen


def test_a_stride_on_an_extent_1_dimension_takes_the_dense_array(ks, rng) -> None:
    x = jnp.asarray(rng.standard_normal((1, 1000)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(ks.double_unit(x)), np.asarray(x) * 2)
