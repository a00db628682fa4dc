"""silu_mul in plain JAX: the kernel's reference and its fallback (a call no build fits)."""

import jax
import jax.numpy as jnp


def silu_mul(a, b):
    """out = silu(a) * b, computed in float32, returned in a's dtype."""
    x, y = a.astype(jnp.float32), b.astype(jnp.float32)
    return (jax.nn.silu(x) * y).astype(a.dtype)


def silu_mul_bwd(a, b, dout):
    """(da, db) of silu_mul, given dout: the backward kernel's calling convention."""
    _, vjp = jax.vjp(silu_mul, a, b)
    return vjp(dout)
