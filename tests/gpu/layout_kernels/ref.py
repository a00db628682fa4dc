"""The fallback of `apply_op` (tests/gpu/layout_kernels): a value no build computes (NaN), so
a call it served shows in the results as well as in the warning."""

import jax.numpy as jnp


def apply_op(x, y, *, op):  # type: ignore[no-untyped-def]
    return jnp.full_like(x, jnp.nan)
