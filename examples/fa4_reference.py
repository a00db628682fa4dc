"""A plain JAX attention with fa4_fwd's calling convention, declared as its fallback
(`fallback = "fa4_reference:fa4_fwd"` in kernels.toml): cutecc serves it for a call no
built FA4 variant takes (another head_dim or dtype, a GPU other than Hopper), and jax.grad
differentiates it. FA4's causal mask is aligned to the bottom right when s_q != s_k (query
row i sees keys j <= i + s_k - s_q), as flash-attention's; so is this one's."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fa4_fwd(q: jax.Array, k: jax.Array, v: jax.Array, *, softmax_scale: float,
            causal: bool = False) -> jax.Array:
    """out[b, s_q, h, d] of q[b, s_q, h, d], k and v[b, s_k, h, d], in float32 arithmetic."""
    s_q, s_k = q.shape[1], k.shape[1]
    mask = None
    if causal:
        mask = (jnp.arange(s_k)[None, :] <= jnp.arange(s_q)[:, None] + (s_k - s_q))[None, None]
    out = jax.nn.dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                       v.astype(jnp.float32), scale=softmax_scale, mask=mask)
    return out.astype(q.dtype)
