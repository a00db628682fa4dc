"""Dispatch by contract: the right variant, or an error that says what exists and what to do."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.errors import CuteccError


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    return cutecc.load(example_cache, arch="sm_90a")


def S(shape, dtype=jnp.float32):  # noqa: N802 - reads like a type
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_picks_the_variant_of_the_dtype(ks, dtype: str) -> None:
    b, env = ks.mul.select(S((10,), dtype), S((10,), dtype))
    assert b.variant == f"dtype={dtype}" and env == {"n": 10}


@pytest.mark.parametrize("d", [1024, 4096])
def test_picks_the_variant_of_the_static_extent(ks, d: int) -> None:
    b, env = ks.rmsnorm.select(S((3, d), "bfloat16"), S((d,), "bfloat16"))
    assert b.variant == f"dtype=bfloat16,d={d}" and env == {"m": 3}


@pytest.mark.parametrize(("args", "fragment"), [
    ((S((8,), "int32"), S((8,), "int32")), "x: dtype int32, expected"),
    ((S((8, 2)), S((8, 2))), "x: rank 2, expected 1"),
    ((S((8,)), S((9,))), 'y: dimension 0 is 9, but "n" is 8'),
    ((S((8,)),), "takes 2 array(s), got 1"),
    ((S((0,)), S((0,))), "dimension 0 is empty"),
])
def test_rejects_what_no_variant_accepts(ks, args, fragment: str) -> None:
    with pytest.raises(CuteccError) as e:
        ks.mul.select(*args)
    msg = str(e.value)
    assert fragment in msg
    assert 'kernel "mul"' in msg and "dtype=float16" in msg and "cutecc build" in msg


def test_rejects_a_static_extent_that_was_not_built(ks) -> None:
    with pytest.raises(CuteccError, match="dimension 1 is 512, expected 1024"):
        ks.rmsnorm(jnp.ones((2, 512)), jnp.ones((512,)))


def test_scalar_keywords_are_checked(ks) -> None:
    x, w = jnp.ones((2, 1024)), jnp.ones((1024,))
    with pytest.raises(CuteccError, match="unknown keyword argument 'epsilon'; runtime scalars: eps"):
        ks.rmsnorm(x, w, epsilon=1e-5)
    with pytest.raises(CuteccError, match="known when the call is traced"):
        jax.jit(lambda x, w, e: ks.rmsnorm(x, w, eps=e)).trace(x, w, 1e-5)
    with pytest.raises(CuteccError, match="argument 1 is a float, not an array"):
        ks.mul(jnp.ones(3), 2.0)


def test_grad_without_backward_and_vmap_say_what_to_do(ks) -> None:
    x = jnp.ones((4,), jnp.float32)
    with pytest.raises(NotImplementedError, match="cutecc kernel 'axpy' has no derivative rule"):
        jax.grad(lambda x: ks.axpy(x, x).sum())(x)
    with pytest.raises(NotImplementedError, match="cutecc kernel 'mul' cannot be batched"):
        jax.vmap(ks.mul)(jnp.ones((2, 4)), jnp.ones((2, 4)))


def test_numpy_inputs_are_accepted_for_tracing(ks) -> None:
    out = jax.eval_shape(ks.mul, np.ones(6, np.float16), np.ones(6, np.float16))
    assert out.shape == (6,) and out.dtype == jnp.float16


def test_unknown_kernel_name_lists_the_known_ones(ks) -> None:
    with pytest.raises(AttributeError, match="no kernel 'softmax'.*axpy, mul, mul_bwd, rmsnorm"):
        ks.softmax  # noqa: B018
