"""From PyTorch on a real GPU, beyond the root kernels: layouts, padded buffers and
call keywords (tests/gpu/layout_kernels, CUTECC_LAYOUT_CACHE), derived extents, scratch,
saved residuals, reductions and a named pairing (train_kernels, CUTECC_TRAIN_CACHE), and the
published examples (quack RMSNorm and cross-entropy, FA4's Hopper forward;
CUTECC_EXAMPLES_CACHE) against torch references. Each group skips without its cache."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from .test_torch_gpu import close, poison, rand  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")]
BF16 = torch.bfloat16


def _load(var: str):
    import cutecc.torch as ct

    pre = os.environ.get(var)
    if not pre or not Path(pre).is_dir():
        pytest.skip(f"{var} is not set to a built cache (tests/gpu/prepare.sh)")
    return ct.load(pre)


@pytest.fixture(scope="module")
def lay():
    return _load("CUTECC_LAYOUT_CACHE")


@pytest.fixture(scope="module")
def train():
    return _load("CUTECC_TRAIN_CACHE")


@pytest.fixture(scope="module")
def ex():
    return _load("CUTECC_EXAMPLES_CACHE")


def both(fn):
    return [fn, lambda *a, **k: fn._through_op(a, k)]


@pytest.mark.parametrize("m, k", [(8, 1), (64, 300)])
def test_column_major(lay, gen, m: int, k: int) -> None:
    x = rand(gen, (m, k), BF16)
    for call in both(lay.cols):
        assert torch.equal(call(x), x)
    w = rand(gen, (k, m), BF16)  # its transpose is the column-major buffer: no copy
    assert torch.equal(lay.cols(w.T), w.T)


@pytest.mark.parametrize("causal", [False, True])
def test_stride_orders_keywords_and_grad(lay, gen, causal: bool) -> None:
    x = rand(gen, (3, 40, 5), torch.float32)
    f = 2.0 if causal else 1.0
    for call in both(lay.scale):
        close(call(x, causal=causal), x * f, torch.float32)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((lay.scale(xg, causal=causal) * x).sum(), (xg,))
    close(g, x * f, torch.float32)


@pytest.mark.parametrize("k, ldx, ldy", [(64, 64, 72), (1024, 1032, 1040)])
def test_padded_inout_keeps_its_padding(lay, gen, k: int, ldx: int, ldy: int) -> None:
    x = rand(gen, (37, ldx), BF16)
    for call in both(lay.pad_rows):
        y = torch.full((37, ldy), 7.0, dtype=BF16, device="cuda")
        assert call(x, y, k=k) is y
        assert torch.equal(y[:, :k], x[:, :k]) and (y[:, k:] == 7).all()


def test_padded_operands(lay, gen) -> None:
    a, v = rand(gen, (300, 4104), torch.float32), rand(gen, (4096,), torch.float32)
    for call in both(lay.row_dot):
        torch.testing.assert_close(call(a, v), a[:, :4096] @ v, rtol=1e-4, atol=1e-3)
    x = rand(gen, (72, 33), BF16)
    for call in both(lay.pad_cols):
        assert torch.equal(call(x), x[:64])


def test_derived_extents_scratch_and_broadcast(train, gen) -> None:
    x = rand(gen, (300, 70), torch.float32)
    for call in both(train.pad_cols):
        out = call(x)
        assert out.shape == (300, 96) and torch.equal(out[:, :70], x) and (out[:, 70:] == 0).all()
    n = rand(gen, (4099,), torch.float32)
    for call in both(train.triple):
        close(call(n), 3 * n, torch.float32)
    b = rand(gen, (1, 70), torch.float32)
    for call in both(train.add_bias):
        assert torch.equal(call(x, b), x + b)
    p = train.col_partials(x)
    torch.testing.assert_close(p.sum(0), x.sum(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("compiled", [False, True])
def test_named_pairing_through_a_saved_residual(train, gen, compiled: bool) -> None:
    x = (rand(gen, (1000, 257), torch.float32) * 0.5).requires_grad_(True)
    w = rand(gen, (257,), torch.float32).requires_grad_(True)
    t = rand(gen, (1000, 257), torch.float32)

    def loss(f):
        return lambda a, b: ((f(a, b) - t) ** 2).sum()

    f = loss(train.expw)
    if compiled:
        torch._dynamo.reset()
        f = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(f(x, w), (x, w))
    want = torch.autograd.grad(loss(lambda a, b: a.exp() * b)(x, w), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("m", [1, 37, 4099])
def test_quack_rmsnorm_and_its_gradient(ex, gen, dtype, m: int) -> None:
    """Forward (rstd saved, not returned) and backward (named pairing; dw from per-SM fp32
    partials, summed and cast to w's dtype) against torch's own RMSNorm."""
    x, w, c = rand(gen, (m, 4096), dtype), rand(gen, (4096,), dtype), rand(gen, (m, 4096), dtype)
    eps = 1e-5

    def ref(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    poison(m * 4096 * 8)
    for call in both(ex.quack_rmsnorm):
        out = call(x, w, eps=eps)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype
        close(out, ref(x, w), dtype)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    got = torch.autograd.grad((ex.quack_rmsnorm(xg, wg, eps=eps).float() * c.float()).sum(), (xg, wg))
    want = torch.autograd.grad((ref(xg, wg).float() * c.float()).sum(), (xg, wg))
    for g, r in zip(got, want):
        assert g.dtype == dtype
        err = ((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
        assert err <= (2e-2 if dtype == BF16 else 1e-4), err


@pytest.mark.parametrize("ignore_index", [-100, 7])
def test_quack_cross_entropy(ex, gen, ignore_index: int) -> None:
    m, vocab = 513, 32768
    logits = (rand(gen, (m, vocab), torch.float32) * 3).to(BF16)
    target = torch.randint(0, vocab, (m,), device="cuda", generator=gen, dtype=torch.int32)
    target[torch.rand(m, device="cuda", generator=gen) < 0.25] = ignore_index
    want = torch.nn.functional.cross_entropy(logits.float(), target.long(), reduction="none",
                                             ignore_index=ignore_index)
    for call in both(ex.quack_cross_entropy):
        loss = call(logits, target, ignore_index=ignore_index)
        assert loss.dtype == torch.float32 and loss.shape == (m,)
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
    lg = logits.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(ex.quack_cross_entropy(lg, target, ignore_index=ignore_index).sum(), (lg,))
    lf = logits.float().requires_grad_(True)
    (ref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(
        lf, target.long(), reduction="sum", ignore_index=ignore_index), (lf,))
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, s_q, s_k, h", [(2, 128, 128, 4), (3, 77, 77, 2), (2, 200, 513, 4)])
def test_fa4_forward(ex, gen, causal: bool, b: int, s_q: int, s_k: int, h: int) -> None:
    d = 128
    q = rand(gen, (b, s_q, h, d), BF16)
    k, v = rand(gen, (b, s_k, h, d), BF16), rand(gen, (b, s_k, h, d), BF16)
    scale = 1.0 / math.sqrt(d)
    mask = None
    if causal:  # FA4's causal mask is aligned to the bottom right
        rows, cols = torch.arange(s_q, device="cuda"), torch.arange(s_k, device="cuda")
        mask = cols[None, :] <= rows[:, None] + (s_k - s_q)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2), attn_mask=mask,
        scale=scale).transpose(1, 2)
    for call in both(ex.fa4_fwd):
        out = call(q, k, v, softmax_scale=scale, causal=causal)
        assert out.shape == q.shape and out.dtype == BF16
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        assert err <= 2e-2, err
    compiled = torch.compile(lambda q, k, v: ex.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal),
                             backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), ex.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal))
    # the gradient through FA4's three-launch backward (a composite kernel)
    qkv = [t.clone().requires_grad_(True) for t in (q, k, v)]
    do = rand(gen, q.shape, BF16)
    got = torch.autograd.grad(
        (ex.fa4_fwd(*qkv, softmax_scale=scale, causal=causal).float() * do.float()).sum(), qkv)
    f32 = [t.float().requires_grad_(True) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in f32), attn_mask=mask, scale=scale).transpose(1, 2)
    want = torch.autograd.grad((ref * do.float()).sum(), f32)
    for g, r in zip(got, want):
        err = ((g.float() - r).abs().max() / r.abs().max()).item()
        assert err <= 3e-2, err
