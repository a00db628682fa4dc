"""A call that does not fit raises what a JAX user catches from any function: TypeError for
an unknown or missing keyword or a non-array argument, ValueError for arrays or values no
built contract takes; both are CuteccErrors naming the argument (one error family)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.errors import CallError, CallTypeError, CuteccError


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    return cutecc.load(example_cache, arch="sm_90a")


def _trace(f, *specs):
    return jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))


def test_an_unknown_keyword_is_a_type_error(ks) -> None:
    x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    w = jax.ShapeDtypeStruct((1024,), jnp.float32)
    with pytest.raises(TypeError, match="unknown keyword argument 'epsilon'") as e:
        _trace(lambda x, w: ks.rmsnorm(x, w, epsilon=1e-5), x, w)
    assert isinstance(e.value, CallTypeError) and isinstance(e.value, CuteccError)


def test_a_wrong_count_of_arrays_and_a_non_array_are_type_errors(ks) -> None:
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(TypeError):
        _trace(lambda x: ks.mul(x), x)
    with pytest.raises(TypeError, match="argument 1"):
        ks.mul(jnp.ones(64, jnp.float32), "not an array")


def test_arrays_no_build_takes_are_a_value_error(ks) -> None:
    x = jax.ShapeDtypeStruct((64,), jnp.int8)
    with pytest.raises(ValueError) as e:
        _trace(lambda x: ks.mul(x, x), x)
    assert isinstance(e.value, CallError)
    assert "int8" in str(e.value)


def test_grad_without_the_declared_backward_names_it(example_cache: Path) -> None:
    """mul is paired with mul_bwd; a set loaded without mul_bwd still calls mul, and
    `jax.grad` says which backward is missing instead of "no derivative rule"."""
    only = cutecc.load(example_cache, arch="sm_90a", kernels=["mul"])
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    assert "custom_call" in _trace(lambda a: only.mul(a, a), x).as_text()
    with pytest.raises(ValueError, match="its backward kernel 'mul_bwd' is not in this kernel set"):
        _trace(jax.grad(lambda a: only.mul(a, a).sum()), x)
