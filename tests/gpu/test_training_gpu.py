"""Training through the published kernels of examples/kernels.toml on a real GPU: each
declared backward (quack RMSNorm and cross-entropy, FA4's three-launch Hopper backward)
under `jax.grad`, and the Llama-style block of examples/llama_block.py, whose loss and
every gradient through cutecc kernels are checked against the same block in plain JAX
computed in float32, on fresh random inputs.

Needs CUTECC_EXAMPLES_CACHE (tests/gpu/prepare.sh CACHES --examples builds it; run.sh sets
it); without it these tests skip.

Tolerances. The cutecc side runs in bf16 (8-bit mantissa: one rounding is a relative error
of up to 2^-9 ~ 2e-3) and the reference in float32, so the measure is the relative error of
the whole array, ||got - ref|| / ||ref||, which single elements near zero cannot blow up.
Each check also computes the same thing in plain JAX in bf16 (XLA's attention, jnp norms)
and asks that cutecc be no worse than RATIO times that, or within FLOOR: a correct bf16
kernel lands near XLA's own bf16 error, a wrong one (a missed tile, a wrong scale, an
unsummed partial) is off by O(1). FLOOR covers cases where XLA's bf16 path keeps more in
float32 than the kernel does: 1e-2 (about 5 roundings) for a single kernel, 3e-2 for the
block, whose gradients pass through a dozen bf16 roundings of activations and matmul results.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.commands.pack import pack
from cutecc.lock.signing import keygen
from examples import llama_block as lb

from .conftest import hlo_copies, poison, rand

pytestmark = pytest.mark.gpu

RATIO = 2.0
FLOOR_KERNEL = 1e-2
FLOOR_BLOCK = 3e-2
F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.fixture(scope="module")
def ks(examples_ks):
    return examples_ks


def rel(got: jax.Array, ref: jax.Array) -> float:
    """||got - ref|| / ||ref|| in float64, over the whole array."""
    g = np.asarray(got.astype(F32), dtype=np.float64)
    r = np.asarray(ref.astype(F32), dtype=np.float64)
    assert g.shape == r.shape, (g.shape, r.shape)
    assert np.isfinite(g).all(), f"{(~np.isfinite(g)).sum()} non-finite elements"
    norm = np.linalg.norm(r)
    assert norm > 0, "the reference is all zeros: the check would prove nothing"
    return float(np.linalg.norm(g - r) / norm)


def check(name: str, got: jax.Array, ref: jax.Array, xla_bf16: jax.Array, floor: float) -> None:
    """cutecc's error against the float32 reference, no worse than XLA's bf16 path's (RATIO)
    or within `floor`."""
    assert got.dtype == xla_bf16.dtype, (name, got.dtype, xla_bf16.dtype)
    err, base = rel(got, ref), rel(xla_bf16, ref)
    assert err <= max(RATIO * base, floor), f"{name}: relative error {err:.3g} (XLA bf16: {base:.3g})"


def up(*xs: jax.Array) -> list[jax.Array]:
    return [x.astype(F32) for x in xs]


# --- quack RMSNorm backward: dx and the summed per-SM dw partials --------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m", [1, 37, 1000, 4099])
def test_rmsnorm_grad(ks, rng, dtype: str, m: int) -> None:
    d, eps = 4096, 1e-6
    x, w, ct = rand(rng, (m, d), dtype), rand(rng, (d,), dtype), rand(rng, (m, d), dtype)
    poison(m * d * 16)

    def grads(norm, *args):
        return jax.jit(lambda x, w, ct: jax.grad(lambda x, w: jnp.vdot(
            norm(x, w).astype(F32), ct.astype(F32)), argnums=(0, 1))(x, w))(*args)

    dx, dw = grads(lambda x, w: ks.quack_rmsnorm(x, w, eps=eps), x, w, ct)
    assert (dx.dtype, dw.dtype) == (jnp.dtype(dtype), jnp.dtype(dtype))
    ref = grads(lambda x, w: lb.rmsnorm(x, w, eps), *up(x, w, ct))
    xla = grads(lambda x, w: lb.rmsnorm(x, w, eps), x, w, ct)
    floor = 1e-5 if dtype == "float32" else FLOOR_KERNEL
    for name, g, r, b in zip(("dx", "dw"), (dx, dw), ref, xla):
        check(name, g, r, b, floor)


# --- quack cross-entropy backward: dense and broadcast dloss, ignored rows -----------------

@pytest.mark.parametrize("m", [1, 37, 513])
def test_cross_entropy_grad(ks, rng, m: int) -> None:
    vocab, ignore = 32768, 7
    logits = (rand(rng, (m, vocab), "float32") * 3).astype(BF16)
    target = rng.integers(0, vocab, size=m)
    target[rng.random(m) < 0.25] = ignore
    target = jnp.asarray(target, dtype=jnp.int32)
    ct = jnp.asarray(rng.uniform(0.5, 2.0, size=m), dtype=F32)  # a weight per row, never 0
    poison(m * vocab * 4)

    def ref_loss(lg, t):
        return jnp.where(t == ignore, 0.0, lb.cross_entropy(lg, jnp.where(t == ignore, -100, t)))

    def grad(fn, lg):
        return jax.jit(jax.grad(lambda lg: jnp.vdot(fn(lg, target), ct)))(lg)

    got = grad(lambda lg, t: ks.quack_cross_entropy(lg, t, ignore_index=ignore), logits)
    assert got.dtype == BF16
    check("dlogits", got, grad(ref_loss, logits.astype(F32)), grad(ref_loss, logits), FLOOR_KERNEL)
    assert not np.asarray(got)[np.asarray(target) == ignore].any()  # ignored rows: zero gradient

    # the broadcast variant: one dloss for every row, with the lse the forward saved
    lse = jax.nn.logsumexp(logits.astype(F32), axis=-1)
    one = jnp.full((1,), 1.0 / m, F32)
    b = jax.jit(lambda lg, t, d, s: ks.quack_cross_entropy_bwd_bcast(lg, t, d, s, ignore_index=ignore))(
        logits, target, one, lse)
    dense = jax.jit(lambda lg, t, d, s: ks.quack_cross_entropy_bwd(lg, t, d, s, ignore_index=ignore))(
        logits, target, jnp.full((m,), 1.0 / m, F32), lse)
    np.testing.assert_array_equal(np.asarray(b.astype(F32)), np.asarray(dense.astype(F32)))


# --- flash-attn-4 Hopper backward: preprocess, main kernel, postprocess -------------------

def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, causal: bool) -> jax.Array:
    """XLA's attention; FA4's causal mask is aligned to the bottom right."""
    s_q, s_k = q.shape[1], k.shape[1]
    mask = None
    if causal:
        mask = (jnp.arange(s_k)[None, :] <= jnp.arange(s_q)[:, None] + (s_k - s_q))[None, None]
    return jax.nn.dot_product_attention(q, k, v, scale=scale, mask=mask, implementation="xla")


# (batch, s_q, s_k, heads): tile multiples, lengths that are not multiples of the 64-row
# backward tile or the 128-row forward tile, s_q != s_k (causal keeps s_q <= s_k, so that
# no query row is fully masked), and a long one.
SEQ = [(2, 128, 128, 4), (3, 77, 77, 2), (2, 200, 513, 4), (1, 1, 300, 2), (1, 1000, 1000, 8),
       (1, 2048, 2048, 16)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("b", "s_q", "s_k", "h"), SEQ)
def test_fa4_grad(ks, rng, b: int, s_q: int, s_k: int, h: int, causal: bool) -> None:
    d = 128
    scale = 1 / math.sqrt(d)
    q = rand(rng, (b, s_q, h, d), "bfloat16")
    k, v = rand(rng, (b, s_k, h, d), "bfloat16"), rand(rng, (b, s_k, h, d), "bfloat16")
    ct = rand(rng, (b, s_q, h, d), "bfloat16")
    poison(b * h * (s_q + 64) * d * 4 * 3)  # the fp32 scratch the backward is handed

    def grads(attend, *args):
        return jax.jit(lambda q, k, v, ct: jax.grad(lambda q, k, v: jnp.vdot(
            attend(q, k, v).astype(F32), ct.astype(F32)), argnums=(0, 1, 2))(q, k, v))(*args)

    got = grads(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal), q, k, v, ct)
    ref = grads(lambda q, k, v: attention(q, k, v, scale, causal), *up(q, k, v, ct))
    xla = grads(lambda q, k, v: attention(q, k, v, scale, causal), q, k, v, ct)
    for name, g, r, x in zip(("dq", "dk", "dv"), got, ref, xla):
        check(f"{name} {(b, s_q, s_k, h)} causal={causal}", g, r, x, FLOOR_KERNEL)


def test_fa4_backward_called_as_one_kernel_matches_its_grad(ks, rng) -> None:
    """The composite is also a kernel of its own: (q, k, v, out, lse, dout) -> (dq, dk, dv)."""
    b, s, h, d = 2, 300, 4, 128
    scale = 1 / math.sqrt(d)
    q, k, v, ct = (rand(rng, (b, s, h, d), "bfloat16") for _ in range(4))
    out, vjp = jax.vjp(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=True), q, k, v)
    # the forward's saved lse, (b, h, s_q): log-sum-exp of the scaled, causally masked scores
    scores = jnp.einsum("bqhd,bkhd->bhqk", *up(q, k)) * scale
    lse = jax.nn.logsumexp(jnp.where(jnp.arange(s)[None, :] <= jnp.arange(s)[:, None], scores, -jnp.inf),
                           axis=-1)
    direct = ks.fa4_bwd(q, k, v, out, lse, ct, softmax_scale=scale, causal=True)
    for name, g, r in zip(("dq", "dk", "dv"), direct, vjp(ct)):
        assert rel(g, r) <= 1e-2, name  # only lse differs: its own float32 rounding


@pytest.mark.parametrize("causal", [False, True])
def test_fa4_backward_with_a_live_dout_writes_a_fresh_dq_and_copies_nothing(ks, rng, causal: bool) -> None:
    """Issue 48, item 8: the postprocess allocates dq (sized by q, passed for its extents
    only), so a dout the caller still holds is neither written nor copied: the compiled
    program has no copy, dout is unchanged, and dq, dk, dv are the forward's vjp."""
    b, s, h, d = 2, 300, 4, 128
    scale = 1 / math.sqrt(d)
    assert ks.fa4_bwd.outputs == ("dq", "dk", "dv")
    q, k, v, ct = (rand(rng, (b, s, h, d), "bfloat16") for _ in range(4))
    out, vjp = jax.vjp(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal), q, k, v)
    scores = jnp.einsum("bqhd,bkhd->bhqk", *up(q, k)) * scale
    if causal:
        scores = jnp.where(jnp.arange(s)[None, :] <= jnp.arange(s)[:, None], scores, -jnp.inf)
    lse = jax.nn.logsumexp(scores, axis=-1)
    ct_before = np.asarray(ct.astype(F32))
    # dout is an argument of the jit, not donated: the caller's, live after the call
    f = jax.jit(lambda *a: ks.fa4_bwd(*a, softmax_scale=scale, causal=causal))
    hlo = f.lower(q, k, v, out, lse, ct).compile().as_text()
    assert not hlo_copies(hlo)
    got = f(q, k, v, out, lse, ct)
    assert np.array_equal(np.asarray(ct.astype(F32)), ct_before)
    for name, g, r in zip(("dq", "dk", "dv"), got, vjp(ct)):
        assert rel(g, r) <= 1e-2, name  # only lse differs: its own float32 rounding


@pytest.mark.parametrize("source", ["lock", "pack"])
def test_fa4_grad_through_the_composite_from_a_lock_or_a_pack(ks, rng, tmp_path, monkeypatch,
                                                                source: str) -> None:
    """The committed examples/kernels.lock carries the backward composite's line: loaded
    from it (or from a signed pack of fa4_fwd made from it), jax.grad runs the three-launch
    backward, with the numbers of the reference."""
    cache = os.environ["CUTECC_EXAMPLES_CACHE"]  # set: `ks` skips without it
    lock = Path(__file__).resolve().parents[2] / "examples" / "kernels.lock"
    if source == "lock":
        locked = cutecc.load(cache, lock=lock, allow_unsigned=True)
    else:
        private, public = keygen(tmp_path / "ci")
        report = pack(name="fa4-train", version="1.0", lock=lock, kernels=("fa4_fwd",),
                      cache_dir=cache, out=tmp_path / "dist", sign_key=private)
        with zipfile.ZipFile(report.path) as zf:
            zf.extractall(tmp_path / "site")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        locked = cutecc.load(package="fa4_train", trusted_keys=[public])
        assert sorted(locked) == ["fa4_bwd", "fa4_bwd_main", "fa4_bwd_post", "fa4_bwd_pre", "fa4_fwd"]
    assert locked.fa4_bwd.launches == ("fa4_bwd_pre", "fa4_bwd_main", "fa4_bwd_post")
    b, s_q, s_k, h, d = 2, 200, 513, 4, 128
    scale = 1 / math.sqrt(d)
    q = rand(rng, (b, s_q, h, d), "bfloat16")
    k, v = rand(rng, (b, s_k, h, d), "bfloat16"), rand(rng, (b, s_k, h, d), "bfloat16")
    ct = rand(rng, (b, s_q, h, d), "bfloat16")
    poison(b * h * (s_q + 64) * d * 4 * 3)

    def grads(attend, *args):
        return jax.jit(lambda q, k, v, ct: jax.grad(lambda q, k, v: jnp.vdot(
            attend(q, k, v).astype(F32), ct.astype(F32)), argnums=(0, 1, 2))(q, k, v))(*args)

    got = grads(lambda q, k, v: locked.fa4_fwd(q, k, v, softmax_scale=scale, causal=True), q, k, v, ct)
    ref = grads(lambda q, k, v: attention(q, k, v, scale, True), *up(q, k, v, ct))
    xla = grads(lambda q, k, v: attention(q, k, v, scale, True), q, k, v, ct)
    for name, g, r, x in zip(("dq", "dk", "dv"), got, ref, xla):
        check(f"{name} from the {source}", g, r, x, FLOOR_KERNEL)


# --- the Llama-style block: loss and every gradient ----------------------------------------

@pytest.mark.parametrize(("batch", "seq"), [(2, 256), (1, 200)])
def test_llama_block_loss_and_every_gradient(ks, rng, batch: int, seq: int) -> None:
    cfg = lb.Config()
    key = jax.random.key(int(rng.integers(2**31)))  # random weights and inputs, none zero
    kp, kx = jax.random.split(key)
    params = lb.init_params(kp, cfg, BF16)
    x, target = lb.init_batch(kx, batch, seq, cfg, BF16)

    def step(loss):
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    loss, (gp, gx) = step(lambda p, x, t: lb.loss_cutecc(p, x, t, ks, cfg))(params, x, target)
    p32 = {n: w.astype(F32) for n, w in params.items()}
    loss_ref, (gp_ref, gx_ref) = step(lambda p, x, t: lb.loss_jax(p, x, t, cfg))(p32, x.astype(F32), target)
    loss_xla, (gp_xla, gx_xla) = step(lambda p, x, t: lb.loss_jax(p, x, t, cfg))(params, x, target)

    assert loss.dtype == F32 and np.isfinite(float(loss))
    assert 5 < float(loss_ref) < 20  # ~ log(32768) = 10.4 for random weights: a real loss
    err = abs(float(loss) - float(loss_ref)) / float(loss_ref)
    base = abs(float(loss_xla) - float(loss_ref)) / float(loss_ref)
    assert err <= max(RATIO * base, 1e-2), (f"loss {float(loss)} vs {float(loss_ref)} "
                                            f"(XLA bf16 {float(loss_xla)})")
    assert sorted(gp) == sorted(lb.PARAMS)
    for n in lb.PARAMS:
        assert gp[n].dtype == BF16 and gp[n].shape == params[n].shape, n
        check(f"d{n}", gp[n], gp_ref[n], gp_xla[n], FLOOR_BLOCK)
    check("dx", gx, gx_ref, gx_xla, FLOOR_BLOCK)
