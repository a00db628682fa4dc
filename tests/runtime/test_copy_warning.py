"""An in-place operand (an `inout` tensor, such as flashinfer's residual `r`) that is an
argument of the `jax.jit` being lowered without donation is copied by XLA before every
call: the lowering says so once per kernel and operand (`CopyWarning`), as `cutecc show`
does of the entry; a donated argument, a value computed in the program and an eager call
(whose arrays stay the caller's) say nothing. Lowered for CUDA on the CPU (nothing runs)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from helpers import REPO, unbuilt_kernels

from cutecc.errors import CopyWarning
from cutecc.runtime import primitive


@pytest.fixture
def axpy():
    primitive._COPIES_WARNED.clear()
    yield unbuilt_kernels(REPO / "kernels.toml")["axpy"]
    primitive._COPIES_WARNED.clear()


def _lower(f, **jit) -> str:
    spec = jax.ShapeDtypeStruct((1024,), jnp.float32)
    return jax.jit(f, **jit).trace(spec, spec).lower(lowering_platforms=("cuda",)).as_text()


def test_an_inout_argument_not_donated_is_warned_once(axpy) -> None:
    def f(x, y):
        return axpy(x, y, alpha=2.0)

    with pytest.warns(CopyWarning, match=r'"axpy": y is written in place but is an argument of the '
                                         r"jax.jit being lowered that is not donated") as w:
        _lower(f)
    assert len(w) == 1 and w[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", CopyWarning)
        _lower(f)  # once per kernel and operand
        primitive._COPIES_WARNED.clear()
        _lower(f, donate_argnums=1)  # donated: XLA writes in its buffer
        _lower(lambda x, y: axpy(x, y * 2.0, alpha=2.0))  # a value of the program: dead after
        _lower(lambda x, y: axpy(y, x, alpha=2.0), donate_argnums=0)  # the donated one is written
