"""A small Llama-style block and its loss, written twice: through the published kernels of
examples/kernels.toml where they exist, and in plain JAX.

    x -> RMSNorm -> q, k, v projections -> causal attention -> output projection -> + x
      -> RMSNorm -> SwiGLU MLP -> + -> vocabulary projection -> cross-entropy (mean over rows)

`loss_cutecc` runs RMSNorm (quack), attention (flash-attn-4's Hopper forward) and the
per-row cross-entropy (quack) as cutecc kernels and leaves the matmuls, the SwiGLU and the
residual adds to XLA; `jax.grad` of it runs each kernel's declared backward (quack's
RMSNorm and cross-entropy backward, FA4's three-launch backward): no hand-written VJP.
`loss_jax` is the same model in plain JAX (`jax.nn.dot_product_attention`, jnp norms and
cross-entropy), in whatever dtype its arguments have. Both share `block_loss`, so the two
differ only in those three operations.

Imports JAX only (no DSL, no torch): the kernels come from a built cache,
`cutecc.load(CACHE)`. The sizes the published kernels were built for bind the model's:
d_model 4096 (RMSNorm), head_dim 128 (FA4), vocabulary 32768 (cross-entropy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

IGNORE_INDEX = -100  # target rows with this class count zero loss (quack's default)


@dataclass(frozen=True)
class Config:
    """The block's sizes; the defaults are the extents examples/kernels.toml builds."""

    d_model: int = 4096
    n_heads: int = 32
    d_ff: int = 11008
    vocab: int = 32768
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PARAMS = ("norm1", "wq", "wk", "wv", "wo", "norm2", "w_gate", "w_up", "w_down", "w_out")


def init_params(key: jax.Array, cfg: Config = Config(), dtype: Any = jnp.bfloat16) -> dict[str, jax.Array]:
    """Random weights: matrices N(0, 1/fan_in) (activations stay O(1) through the block),
    norm weights 1 + N(0, 0.1^2) (not all ones, so their gradients are exercised)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab
    shapes = {"norm1": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "norm2": (d,),
              "w_gate": (d, f), "w_up": (d, f), "w_down": (f, d), "w_out": (d, v)}
    out = {}
    for k, name in zip(jax.random.split(key, len(PARAMS)), PARAMS):
        shape = shapes[name]
        r = jax.random.normal(k, shape, jnp.float32)
        out[name] = (1 + 0.1 * r if len(shape) == 1 else r / math.sqrt(shape[0])).astype(dtype)
    return out


def init_batch(key: jax.Array, batch: int, seq: int, cfg: Config = Config(), dtype: Any = jnp.bfloat16,
               ignored: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """Random activations x (batch, seq, d_model) ~ N(0, 1) and int32 targets (batch, seq),
    about `ignored` of them IGNORE_INDEX."""
    kx, kt, ki = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, seq, cfg.d_model), jnp.float32).astype(dtype)
    t = jax.random.randint(kt, (batch, seq), 0, cfg.vocab, jnp.int32)
    return x, jnp.where(jax.random.uniform(ki, t.shape) < ignored, IGNORE_INDEX, t)


def block_loss(params: dict[str, jax.Array], x: jax.Array, target: jax.Array, cfg: Config,
               norm: Callable[[jax.Array, jax.Array], jax.Array],
               attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
               xent: Callable[[jax.Array, jax.Array], jax.Array]) -> jax.Array:
    """The block's mean cross-entropy, given its three kernel-shaped operations: `norm(h, w)`
    on (rows, d_model), `attend(q, k, v)` causal on (batch, seq, heads, head_dim) and
    `xent(logits, target)` per row (float32)."""
    b, s, d = x.shape
    h = x.reshape(b * s, d)
    a = norm(h, params["norm1"])
    q, k, v = (jnp.dot(a, params[n]).reshape(b, s, cfg.n_heads, cfg.head_dim) for n in ("wq", "wk", "wv"))
    h = h + jnp.dot(attend(q, k, v).reshape(b * s, d), params["wo"])
    m = norm(h, params["norm2"])
    g = jax.nn.silu(jnp.dot(m, params["w_gate"])) * jnp.dot(m, params["w_up"])
    h = h + jnp.dot(g, params["w_down"])
    logits = jnp.dot(h, params["w_out"])
    return jnp.mean(xent(logits, target.reshape(b * s)))


def loss_cutecc(params: dict[str, jax.Array], x: jax.Array, target: jax.Array, ks: Any,
                cfg: Config = Config()) -> jax.Array:
    """The block through cutecc kernels `ks` (a `cutecc.load` of examples/kernels.toml); bf16."""
    scale = 1 / math.sqrt(cfg.head_dim)
    return block_loss(
        params, x, target, cfg,
        norm=lambda h, w: ks.quack_rmsnorm(h, w, eps=cfg.eps),
        attend=lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=True),
        xent=lambda logits, t: ks.quack_cross_entropy(logits, t, ignore_index=IGNORE_INDEX))


def rmsnorm(h: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) * w per row, computed in float32 and returned in h's dtype (as quack does)."""
    hf = h.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + eps)
    return (hf * rstd * w.astype(jnp.float32)).astype(h.dtype)


def cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Per-row cross-entropy in float32; rows whose target is IGNORE_INDEX count zero."""
    lf = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(lf, jnp.clip(target, 0, lf.shape[-1] - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(target == IGNORE_INDEX, 0.0, jax.nn.logsumexp(lf, axis=-1) - picked)


def loss_jax(params: dict[str, jax.Array], x: jax.Array, target: jax.Array, cfg: Config = Config(),
             attention: str | None = "xla") -> jax.Array:
    """The same block in plain JAX, in the dtype of its arguments. `attention` is
    `jax.nn.dot_product_attention`'s implementation: "xla" (any dtype), "cudnn" (XLA's own
    fused attention on NVIDIA GPUs; bf16/fp16 only) or None (JAX's pick)."""
    scale = 1 / math.sqrt(cfg.head_dim)
    return block_loss(
        params, x, target, cfg,
        norm=lambda h, w: rmsnorm(h, w, cfg.eps),
        attend=lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                                            implementation=attention),
        xent=cross_entropy)
