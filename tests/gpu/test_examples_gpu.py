"""The published-kernel examples (examples/kernels.toml: quack-kernels' RMSNorm and
cross-entropy forward, flash-attn-4's Hopper attention forward) on a real GPU, under
jax.jit, against jax.numpy references on fresh random inputs (their backward passes and a
training step through them: tests/gpu/test_training_gpu.py).

The device has no DSL: build the examples on a build host
(`cutecc build examples/kernels.toml --cache-dir DIR --no-lock`) and point
CUTECC_EXAMPLES_CACHE at DIR (tests/gpu/run.sh takes it as its second argument).
Without it these tests skip. Nothing here needs torch: the runtime loads the libraries
with tvm-ffi only.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from .conftest import poison, rand

pytestmark = pytest.mark.gpu

# Relative to the reference's largest magnitude. bf16 has an 8-bit mantissa: one rounding
# of the output is 2^-8 ~ 4e-3; attention and the norm add a few more.
TOL = {"float32": 1e-5, "bfloat16": 1.6e-2}


@pytest.fixture(scope="module")
def ks(examples_ks):
    return examples_ks


def close(got: jax.Array, want: jax.Array, tol: float) -> None:
    g = np.asarray(got.astype(jnp.float32))
    w = np.asarray(want.astype(jnp.float32))
    assert g.shape == w.shape, (g.shape, w.shape)
    assert np.isfinite(g).all(), f"{(~np.isfinite(g)).sum()} unwritten or non-finite elements"
    err = np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)
    assert err <= tol, f"relative error {err:.3g} > {tol}"


# --- quack RMSNorm forward: out (rstd is a residual kept for the backward) ---------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m", [1, 37, 1000, 4099])
def test_quack_rmsnorm(ks, rng, dtype: str, m: int) -> None:
    d = 4096
    x, w = rand(rng, (m, d), dtype), rand(rng, (d,), dtype)
    eps = float(rng.uniform(1e-6, 1e-2))
    xf = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1) + eps)
    want = (xf * rstd[:, None] * w.astype(jnp.float32)).astype(dtype)
    poison(m * d * 8)
    out = jax.jit(lambda x, w: ks.quack_rmsnorm(x, w, eps=eps))(x, w)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (m, d)
    close(out, want, TOL[dtype])


# --- quack cross-entropy forward: per-row loss with ignore_index ---------------------------

@pytest.mark.parametrize("m", [1, 37, 513])
@pytest.mark.parametrize("ignore_index", [-100, 7])
def test_quack_cross_entropy(ks, rng, m: int, ignore_index: int) -> None:
    vocab = 32768
    logits = (rand(rng, (m, vocab), "float32") * 3).astype(jnp.bfloat16)
    target = rng.integers(0, vocab, size=m)
    target[rng.random(m) < 0.25] = ignore_index  # about a quarter of the rows are ignored
    target = jnp.asarray(target, dtype=jnp.int32)
    lf = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(lf, jnp.clip(target, 0, vocab - 1)[:, None], axis=-1)[:, 0]
    want = jnp.where(target == ignore_index, 0.0, jax.nn.logsumexp(lf, axis=-1) - picked)
    poison(m * vocab * 2)
    loss = jax.jit(lambda x, t: ks.quack_cross_entropy(x, t, ignore_index=ignore_index))(logits, target)
    assert loss.dtype == jnp.float32 and loss.shape == (m,)
    close(loss, want, 1e-4)  # the inputs are bf16, the arithmetic is float32
    assert (np.asarray(loss)[np.asarray(target) == ignore_index] == 0).all()


# --- flash-attn-4 Hopper forward, causal chosen by a call keyword --------------------------

def attention_ref(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, causal: bool) -> jax.Array:
    """XLA's attention in float32; FA4's causal mask is aligned to the bottom right."""
    s_q, s_k = q.shape[1], k.shape[1]
    f32 = [a.astype(jnp.float32) for a in (q, k, v)]
    if causal and s_q == s_k:
        return jax.nn.dot_product_attention(*f32, scale=scale, is_causal=True, implementation="xla")
    mask = None
    if causal:
        mask = (jnp.arange(s_k)[None, :] <= jnp.arange(s_q)[:, None] + (s_k - s_q))[None, None]
    return jax.nn.dot_product_attention(*f32, scale=scale, mask=mask, implementation="xla")


# (batch, s_q, s_k, heads): tile multiples, ragged lengths (not multiples of 128), and
# s_q != s_k; causal cases keep s_q <= s_k so that no query row is fully masked.
SEQ = [(2, 128, 128, 4), (1, 1000, 1000, 8), (3, 77, 77, 2), (2, 200, 513, 4), (1, 1, 300, 2),
       (1, 4096, 4096, 16)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, s_q, s_k, h", SEQ)
def test_fa4_forward(ks, rng, causal: bool, b: int, s_q: int, s_k: int, h: int) -> None:
    d = 128
    q, k, v = rand(rng, (b, s_q, h, d), "bfloat16"), rand(rng, (b, s_k, h, d), "bfloat16"), \
        rand(rng, (b, s_k, h, d), "bfloat16")
    scale = 1.0 / math.sqrt(d)
    poison(b * s_q * h * d * 2)
    f = jax.jit(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal))
    out = f(q, k, v)
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    close(out, attention_ref(q, k, v, scale, causal), 2e-2)


def test_fa4_causal_keyword_selects_a_different_kernel(ks, rng) -> None:
    """Both variants share one tensor contract: only the keyword can tell them apart, and
    the two results must differ (a causal call served by the non-causal kernel would not)."""
    q, k, v = (rand(rng, (1, 256, 2, 128), "bfloat16") for _ in range(3))
    scale = 1.0 / math.sqrt(128)
    a = ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=False)
    c = ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=True)
    close(a, attention_ref(q, k, v, scale, False), 2e-2)
    close(c, attention_ref(q, k, v, scale, True), 2e-2)
    assert not np.allclose(np.asarray(a, np.float32), np.asarray(c, np.float32))


# --- flash-attn-4's tuning candidates: every one is right wherever its bucket serves it ---

def _fa4_candidates(ks) -> list[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """Each compiled tuning candidate of fa4_fwd in the examples cache (`cutecc tune
    --compile-only`, as tests/gpu/prepare.sh --examples runs it), callable on its own."""
    from cutecc.runtime.dispatch import Build, KernelFn
    from cutecc.store import Store

    declared = {b.key for b in ks.fa4_fwd.builds}
    # The declared builds' arch (sm_90a), not the device's (an H100 loads as sm_90).
    arches = {b.arch for b in ks.fa4_fwd.builds}
    out = []
    for e in Store(os.environ["CUTECC_EXAMPLES_CACHE"]).entries():
        if e.doc["kernel"] == "fa4_fwd" and e.key not in declared and e.doc["arch"] in arches:
            b = Build.of(e.meta, e.path)
            out.append((e.doc["variant"], KernelFn("fa4_fwd", [b], arch=e.doc["arch"])))
    return sorted(out, key=lambda c: c[0])


def test_fa4_tuning_candidates_agree_off_the_bucket_edges(ks, rng) -> None:
    """`cutecc tune` checks a candidate against the default at each bucket's edge (s_q = s_k),
    but a winner serves every call of its bucket: ragged lengths, s_q != s_k, causal or not.
    Every candidate is checked against XLA's attention there."""
    cands = _fa4_candidates(ks)
    if not cands:
        pytest.skip("no fa4_fwd tuning candidates in the examples cache (tune --compile-only)")
    scale = 1.0 / math.sqrt(128)
    wrong = []
    for b, s_q, s_k, h in [(3, 77, 77, 2), (2, 200, 513, 4), (1, 1, 300, 2), (1, 1000, 1000, 8)]:
        q, k, v = rand(rng, (b, s_q, h, 128), "bfloat16"), rand(rng, (b, s_k, h, 128), "bfloat16"), \
            rand(rng, (b, s_k, h, 128), "bfloat16")
        for causal in (False, True):
            want = attention_ref(q, k, v, scale, causal)
            for variant, fn in cands:
                if f"causal={causal}" not in variant:
                    continue
                poison(b * s_q * h * 128 * 2)
                call = jax.jit(lambda q, k, v, fn=fn, c=causal: fn(q, k, v, softmax_scale=scale, causal=c))
                got = call(q, k, v)
                try:
                    close(got, want, 2e-2)
                except AssertionError as err:
                    wrong.append(f"{variant} at b={b} s_q={s_q} s_k={s_k} h={h}: {err}")
    assert not wrong, "\n".join(wrong)
