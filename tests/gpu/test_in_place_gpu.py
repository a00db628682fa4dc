"""`kernel.in_place` on a real GPU: outputs written in their input's memory give the same
numbers as the plain call, a live input is left as it was (XLA copies it first), a loop
carry is updated in place, and the optimized HLO holds no copy of the kernel's result."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc

from .conftest import rand

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    return cutecc.load(example_cache)


def rms_ref(x: jax.Array, w: jax.Array, eps: float) -> np.ndarray:
    xf = np.asarray(x, np.float32)
    return xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rmsnorm_in_place_donated_and_live(ks, rng, dtype: str) -> None:
    x, w = rand(rng, (300, 4096), dtype), rand(rng, (4096,), dtype)
    want = rms_ref(x, w, 1e-5)
    kept = np.asarray(x, np.float32)
    live = jax.jit(lambda a, b: (ks.rmsnorm.in_place(a, b, eps=1e-5), a * 1))(x, w)  # a stays live
    np.testing.assert_allclose(np.asarray(live[0], np.float32), want, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(np.asarray(live[1], np.float32), kept)  # not overwritten
    donated = jax.jit(lambda a, b: ks.rmsnorm.in_place(a, b, eps=1e-5), donate_argnums=0)(x.copy(), w)
    np.testing.assert_array_equal(np.asarray(donated, np.float32), np.asarray(live[0], np.float32))


def test_mul_in_place_as_a_loop_carry(ks, rng) -> None:
    n = (1 << 20) + 3
    x = rand(rng, (n,), "float32")
    y = jnp.asarray(1 + 1e-3 * rng.standard_normal(n).astype(np.float32))
    f = jax.jit(lambda a, b: jax.lax.fori_loop(0, 20, lambda i, c: ks.mul.in_place(c, b), a))
    want = np.asarray(x, np.float64) * np.asarray(y, np.float64) ** 20
    got = np.asarray(f(x, y))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    np.testing.assert_array_equal(got, np.asarray(jax.jit(
        lambda a, b: jax.lax.fori_loop(0, 20, lambda i, c: ks.mul(c, b), a))(x, y)))
    hlo = f.lower(x, y).compile().as_text()
    calls = set(re.findall(r"%?([\w.\-]+) = \S+ custom-call\(", hlo))
    copied = re.findall(r"copy\((?:\S+ )?%?([\w.\-]+)\)", hlo)
    assert calls and not calls & set(copied), hlo
