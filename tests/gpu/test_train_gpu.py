"""Derived extents and scalars, scratch and symbolic `jax.export` on a real GPU,
against NumPy on fresh random inputs.

The kernels are tests/gpu/train_kernels (their own manifest). Set CUTECC_TRAIN_CACHE to a
cache built from it (tests/gpu/prepare.sh builds it into CACHES/train; the device machine
has no DSL); with the DSL installed and no CUTECC_TRAIN_CACHE, it is built here.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.errors import CallError

from .conftest import poison, rand

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ks(train_cache: Path):
    return cutecc.load(train_cache)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (7, 33), (300, 1000), (3, 64)])
def test_derived_output_extent_and_scalar(ks, rng, m: int, n: int) -> None:
    x = rand(rng, (m, n), "float32")
    poison(4 * m * (n + 64))
    y = jax.jit(ks.pad_cols)(x)
    width = -(-n // 32) * 32
    assert y.shape == (m, width)
    np.testing.assert_array_equal(np.asarray(y), np.pad(np.asarray(x), ((0, 0), (0, width - n))))


@pytest.mark.parametrize(("m", "d"), [(1000, 70), (5, 3), (132 * 3 + 1, 257), (1, 1)])
def test_per_sm_partials_with_hardware_scalars(ks, rng, m: int, d: int) -> None:
    x = rand(rng, (m, d), "float32")
    poison(4 * 132 * d)
    p = np.asarray(jax.jit(ks.col_partials)(x))
    rows = -(-m // 132)
    xs = np.asarray(x, np.float64)
    want = np.stack([xs[b * rows:(b + 1) * rows].sum(0) if b * rows < m else np.zeros(d)
                     for b in range(132)])
    assert p.shape == (132, d)
    np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p.sum(0), xs.sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 100, 64 * 1000 + 3, 1 << 20])
def test_scratch_zeroed_and_not(ks, rng, n: int) -> None:
    x = rand(rng, (n,), "float32")
    for _ in range(2):  # NaN in the memory the allocator hands out next: acc must be zeroed
        poison(4 * (n + 64) * 3)
        out = jax.jit(ks.triple)(x)
        np.testing.assert_allclose(np.asarray(out), 3 * np.asarray(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ks.triple(x)), 3 * np.asarray(x), rtol=1e-6, atol=1e-6)


def test_scratch_kernel_in_a_loop(ks, rng) -> None:
    x = rand(rng, (4096,), "float32")
    y = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: ks.triple(v), x))(x)
    np.testing.assert_allclose(np.asarray(y), 27 * np.asarray(x), rtol=1e-5, atol=1e-5)


def test_symbolic_export_runs_at_several_sizes(ks, rng) -> None:
    (n,) = jax.export.symbolic_shape("n")
    exp = jax.export.export(jax.jit(lambda x: ks.triple(x) + 1), platforms=["cuda"],
                            disabled_checks=ks.disabled_safety_checks())(
        jax.ShapeDtypeStruct((n,), jnp.float32))
    back = jax.export.deserialize(exp.serialize())
    ks.register_all()
    for size in (1, 1000, 70001):
        x = rand(rng, (size,), "float32")
        np.testing.assert_allclose(np.asarray(back.call(x)), 3 * np.asarray(x) + 1, rtol=1e-6, atol=1e-6)


def test_symbolic_export_of_rows_with_a_derived_width(ks, rng) -> None:
    (m,) = jax.export.symbolic_shape("m")
    exp = jax.export.export(jax.jit(ks.pad_cols), platforms=["cuda"],
                            disabled_checks=ks.disabled_safety_checks())(
        jax.ShapeDtypeStruct((m, 33), jnp.float32))
    back = jax.export.deserialize(exp.serialize())
    ks.register_all()
    for rows in (1, 513):
        x = rand(rng, (rows, 33), "float32")
        np.testing.assert_array_equal(np.asarray(back.call(x)), np.pad(np.asarray(x), ((0, 0), (0, 31))))


def _expw_ref(x, w):
    return jnp.exp(x) * w


@pytest.mark.parametrize(("m", "d"), [(1, 1), (300, 70), (1000, 257), (131, 5)])
def test_grad_through_a_saved_residual_and_reduced_partials(ks, rng, m: int, d: int) -> None:
    x = rand(rng, (m, d), "float32") * 0.5
    w = rand(rng, (d,), "float32")
    t = rand(rng, (m, d), "float32")  # a loss that gives every element its own cotangent

    def loss(f):
        return lambda x, w: jnp.sum((f(x, w) - t) ** 2)

    poison(4 * m * d * 4)
    val, (gx, gw) = jax.jit(jax.value_and_grad(loss(ks.expw), argnums=(0, 1)))(x, w)
    rval, (rx, rw) = jax.jit(jax.value_and_grad(loss(_expw_ref), argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(float(val), float(rval), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-4, atol=1e-3)
    out = ks.expw(x, w)  # eagerly: the saved e is not returned
    assert out.shape == (m, d)
    np.testing.assert_allclose(np.asarray(out), np.asarray(_expw_ref(x, w)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("m", "d"), [(1, 1), (300, 70), (1000, 257)])
def test_an_output_the_backward_takes_no_cotangent_of_is_never_a_silent_zero(ks, rng, m: int,
                                                                            d: int) -> None:
    """expw_r / expw_rs return e = exp(x) beside out; their backward takes no cotangent of e.
    A loss on out differentiates as plain JAX's; a gradient into e is an error (nondiff), or
    dropped as lax.stop_gradient would (stop_gradient), never a silent zero."""
    x = rand(rng, (m, d), "float32") * 0.5
    w = rand(rng, (d,), "float32")
    t = rand(rng, (m, d), "float32")
    c = rand(rng, (m, d), "float32")

    def on_out(f):
        return lambda x, w: jnp.sum((f(x, w)[0] - t) ** 2)

    def ref(x, w):
        return _expw_ref(x, w), jnp.exp(x)

    poison(4 * m * d * 4)
    want = jax.jit(jax.value_and_grad(on_out(ref), argnums=(0, 1)))(x, w)
    for name in ("expw_r", "expw_rs"):
        got = jax.jit(jax.value_and_grad(on_out(ks[name]), argnums=(0, 1)))(x, w)
        np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-4)
        for g, r in zip(got[1], want[1]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-3)
    with pytest.raises(CallError, match='output "e"'):
        jax.grad(lambda x: jnp.sum(ks.expw_r(x, w)[1] * c))(x)
    # stop-gradient by declaration: a loss on both is the reference with e held constant
    both = lambda f: lambda x, w: jnp.sum((f(x, w)[0] - t) ** 2) + jnp.sum(f(x, w)[1] * c)  # noqa: E731
    stopped = lambda x, w: (_expw_ref(x, w), jax.lax.stop_gradient(jnp.exp(x)))  # noqa: E731
    got = jax.jit(jax.grad(both(ks.expw_rs), argnums=(0, 1)))(x, w)
    want = jax.jit(jax.grad(both(stopped), argnums=(0, 1)))(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-3)
    gx = jax.jit(jax.grad(lambda x: jnp.sum(ks.expw_rs(x, w)[1] * c)))(x)
    assert not np.asarray(gx).any()  # only e in the loss: declared stop-gradient, so zero


def test_grad_of_x_only_and_under_a_loop(ks, rng) -> None:
    x = rand(rng, (64, 32), "float32") * 0.5
    w = rand(rng, (32,), "float32")
    gx = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(ks.expw(x, w)))))(x)
    rx = jax.grad(lambda x: jnp.sum(jnp.sin(_expw_ref(x, w))))(x)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("m", "d"), [(1, 1), (300, 70), (4097, 33)])
def test_broadcast_input_reads_one_row_through_stride_0(ks, rng, m: int, d: int) -> None:
    x = rand(rng, (m, d), "float32")
    b = rand(rng, (1, d), "float32")
    out = jax.jit(ks.add_bias)(x, b)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + np.asarray(b))


def test_a_64_bit_extent_runs_past_2_to_the_31(ks, rng) -> None:
    n = 2**31 + 77
    x = jnp.asarray(rng.integers(0, 255, size=(1 << 20,), dtype=np.uint8))
    x = jnp.tile(x, n // (1 << 20) + 1)[:n]  # about 2 GiB, built on the device
    out = jax.jit(ks.plus_one_wide)(x)
    assert out.shape == (n,)
    assert bool(jax.jit(lambda a, b: jnp.array_equal(a + jnp.uint8(1), b))(x, out))
    np.testing.assert_array_equal(np.asarray(out[-100:]), np.asarray(x[-100:]) + 1)


@pytest.mark.parametrize(("m", "d"), [(1, 1), (300, 70), (1000, 257)])
def test_composite_backward_of_two_launches(ks, rng, m: int, d: int) -> None:
    x = rand(rng, (m, d), "float32") * 0.5
    w = rand(rng, (d,), "float32")
    dout = rand(rng, (m, d), "float32")
    e = jnp.exp(x)
    dx, dw = jax.jit(ks.expw2_bwd)(w, e, dout)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(dout * e * w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), np.asarray((dout * e).sum(0)), rtol=1e-4, atol=1e-3)
    t = rand(rng, (m, d), "float32")
    loss = lambda f: (lambda x, w: jnp.sum((f(x, w) - t) ** 2))  # noqa: E731
    gx, gw = jax.jit(jax.grad(loss(ks.expw2), argnums=(0, 1)))(x, w)
    rx, rw = jax.grad(loss(_expw_ref), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-4, atol=1e-3)
