"""The forms of issue 48, item 9, run on a real GPU against NumPy on fresh random inputs: an
optional operand chosen per variant (`present`: one callable, a None in the slot or an array),
a vector width chosen from the call's extents (`from_shapes`: n = 4096 runs vec = 4, 4098
vec = 2, 4097 vec = 1), and a persistent grid sized by the DSL's `HardwareInfo` while traced
on the CPU build host (answered from the h100 profile: 132 blocks).

The kernels are tests/gpu/form_kernels (their own manifest). Set CUTECC_FORMS_CACHE to a
cache built from it (the device machine has no DSL); with the DSL installed and no
CUTECC_FORMS_CACHE, it is built here.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc

from .conftest import hlo_copies, prepared_cache

pytestmark = pytest.mark.gpu

MANIFEST = Path(__file__).parent / "form_kernels" / "kernels.toml"
ENV_CACHE = "CUTECC_FORMS_CACHE"


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory):
    return cutecc.load(prepared_cache(tmp_path_factory, MANIFEST, ENV_CACHE), manifest=MANIFEST)


def f32(rng: np.random.Generator, n: int) -> jax.Array:
    return jnp.asarray(rng.standard_normal(n), dtype=jnp.float32)


@pytest.mark.parametrize("n", [1, 1000, 70_001])
def test_an_optional_operand_none_or_an_array_in_one_callable(ks, rng, n: int) -> None:
    x, b = f32(rng, n), f32(rng, n)
    want = np.asarray(x) * 2.0
    np.testing.assert_allclose(np.asarray(ks.axpb(x, None, factor=2.0)), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ks.axpb(x, factor=2.0)), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda a, c: ks.axpb(a, c, factor=2.0))(x, b)),
                               want + np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda a: ks.axpb(a, None, factor=2.0))(x)), want,
                               rtol=1e-6)


@pytest.mark.parametrize(("n", "vec"), [(4096, 4), (4098, 2), (4097, 1), (12, 4)])
def test_the_vector_width_the_extent_chooses_runs(ks, rng, n: int, vec: int) -> None:
    x = f32(rng, n)
    assert ks.vscale.select(x)[0].variant == f"vec={vec}"
    np.testing.assert_allclose(np.asarray(jax.jit(lambda a: ks.vscale(a, factor=3.0))(x)),
                               np.asarray(x) * 3.0, rtol=1e-6)


@pytest.mark.parametrize("n", [5, 128 * 132, 1_000_003])
def test_a_grid_sized_by_hardware_info_at_build_time_runs(ks, rng, n: int) -> None:
    x = f32(rng, n)
    np.testing.assert_allclose(np.asarray(ks.persistent(x, factor=0.5)), np.asarray(x) * 0.5, rtol=1e-6)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (300, 70), (1000, 257)])
def test_a_composite_allocates_its_output_and_leaves_a_live_input_alone(ks, rng, m: int, n: int) -> None:
    """Issue 48, item 8: pad_crop's last launch writes y = 2 x + 1, sized by x passed for its
    extents only; x, an argument of the jit (live), is not written, and the compiled program
    copies nothing. The old in-place form gives the same y, at the price of a copy of x."""
    x = jnp.asarray(rng.standard_normal((m, n)), dtype=jnp.float32)
    before = np.asarray(x)
    want = before * 2.0 + 1.0
    f = jax.jit(ks.pad_crop)
    assert not hlo_copies(f.lower(x).compile().as_text())
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), before)
    old = jax.jit(ks.pad_crop_inout)
    assert hlo_copies(old.lower(x).compile().as_text())
    np.testing.assert_allclose(np.asarray(old(x)), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), before)
