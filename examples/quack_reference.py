"""Plain JAX RMSNorm and cross-entropy with the calling conventions of the quack kernels
declared in kernels.toml, declared as their fallbacks (`fallback = "quack_reference:..."`):
cutecc serves them for a call no built variant takes (another hidden size or vocabulary,
another dtype, a GPU other than Hopper), and jax.grad differentiates them. Both compute
in float32, as quack does; the residuals the kernels save for their backwards (rstd, lse)
are not returned, as the kernels' calls do not return them."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def quack_rmsnorm(x: jax.Array, w: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """out[m, d] = x / sqrt(mean(x^2 over d) + eps) * w, in x's dtype."""
    xf = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * rstd * w.astype(jnp.float32)).astype(x.dtype)


def quack_cross_entropy(logits: jax.Array, target: jax.Array, *, ignore_index: int = -100) -> jax.Array:
    """loss[m] = logsumexp(logits[m]) - logits[m, target[m]] in float32, 0 where target[m] is
    `ignore_index` (as quack, which also gives such rows no gradient)."""
    lf = logits.astype(jnp.float32)
    keep = target != ignore_index
    picked = jnp.take_along_axis(lf, jnp.where(keep, target, 0)[:, None], axis=-1)[:, 0]
    return jnp.where(keep, jax.nn.logsumexp(lf, axis=-1) - picked, 0.0)
