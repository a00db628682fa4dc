"""The root kernels called from PyTorch on a real GPU, from the same cache the
JAX tests use (`CUTECC_TEST_CACHE`, built elsewhere: nothing is rebuilt here).

Each kernel on fresh random inputs against a torch reference, eagerly (the direct tvm-ffi
call) and through its custom op; the same library bytes as the JAX path, loaded once per
process and agreeing bit for bit; torch.compile(fullgraph=True) of two kernels, eager ==
compiled; autograd of the grad-paired mul; a non-default stream; CUDA-graph capture and
replay. Outputs land in memory filled with NaN just before, so an unwritten element fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")]

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
SIZES = [1, 1000, (1 << 20) + 3]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    import cutecc.torch as ct

    k = ct.load(example_cache)  # the device's own arch, as torch sees it
    assert k.arch.startswith("sm_9"), k.arch
    return k


def rand(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def poison(nbytes: int) -> None:
    """Fill and free device memory with NaN so torch's caching allocator hands it out next."""
    junk = torch.full((max(nbytes // 4, 1) * 2,), float("nan"), device="cuda")
    del junk


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    g, w = got.float(), want.float()
    assert g.shape == w.shape
    assert torch.isfinite(g).all(), f"{(~torch.isfinite(g)).sum().item()} unwritten or non-finite elements"
    err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _path(ks, kernel: str, mode: str):
    """The kernel eagerly (the direct call) or through its custom op."""
    fn = ks[kernel]
    return fn if mode == "eager" else (lambda *a, **k: fn._through_op(a, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["eager", "op"])
def test_mul(ks, gen, dtype, n: int, mode: str) -> None:
    x, y = rand(gen, (n,), dtype), rand(gen, (n,), dtype)
    poison(n * 4)
    close(_path(ks, "mul", mode)(x, y), x * y, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["eager", "op"])
def test_mul_bwd(ks, gen, dtype, n: int, mode: str) -> None:
    x, y, g = (rand(gen, (n,), dtype) for _ in range(3))
    poison(n * 8)
    dx, dy = _path(ks, "mul_bwd", mode)(x, y, g)
    close(dx, g * y, dtype)
    close(dy, g * x, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1024, 4096])
@pytest.mark.parametrize("m", [1, 37, 2048])
@pytest.mark.parametrize("mode", ["eager", "op"])
def test_rmsnorm(ks, gen, dtype, d: int, m: int, mode: str) -> None:
    x, w = rand(gen, (m, d), dtype), rand(gen, (d,), dtype)
    eps = float(torch.empty(1).uniform_(1e-6, 1e-2).item())
    poison(m * d * 4)
    close(_path(ks, "rmsnorm", mode)(x, w, eps=eps), rmsnorm_ref(x, w, eps), dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["eager", "op"])
def test_axpy_in_place(ks, gen, n: int, mode: str) -> None:
    x, y = rand(gen, (n,), torch.float32), rand(gen, (n,), torch.float32)
    alpha = 1.75
    want = alpha * x + y
    got = _path(ks, "axpy", mode)(x, y, alpha=alpha)
    assert got is y
    close(y, want, torch.float32)


def test_the_same_library_bytes_as_the_jax_path(ks, gen, example_cache: Path) -> None:
    """The torch kernel set chooses the same entries as cutecc.load from the same cache, and
    both run the one verified copy of each library in this process, agreeing bit for bit."""
    import jax.numpy as jnp
    import numpy as np

    import cutecc
    from cutecc.runtime import library

    jks = cutecc.load(example_cache)
    for name in ("mul", "mul_bwd", "rmsnorm", "axpy"):
        assert [(b.key, b.sha256) for b in ks[name].builds] == [(b.key, b.sha256) for b in jks[name].builds]
    x, y = rand(gen, (4099,), torch.float32), rand(gen, (4099,), torch.float32)
    got = ks.mul(x, y)
    want = jks.mul(jnp.asarray(x.cpu().numpy()), jnp.asarray(y.cpu().numpy()))
    assert np.array_equal(got.cpu().numpy(), np.asarray(want))
    build, _ = ks.mul.select(x, y)
    name = library.target_name(build.key)
    assert name in library._registered and name in library._functions  # one load, both front ends


def test_compile_fullgraph_two_kernels(ks, gen) -> None:
    def f(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ks.rmsnorm(ks.mul(x, y).view(64, 1024), w, eps=1e-5) * 2 + 1

    x, y = rand(gen, (65536,), torch.bfloat16), rand(gen, (65536,), torch.bfloat16)
    w = rand(gen, (1024,), torch.bfloat16)
    eager = f(x, y, w)
    for backend in ("aot_eager", "inductor"):
        if backend == "inductor":
            pytest.importorskip("triton")
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=backend, fullgraph=True)
        got = compiled(x, y, w)
        if backend == "aot_eager":  # the same ops: the same bits
            assert torch.equal(got, eager)
        else:  # inductor fuses `* 2 + 1` in fp32 and rounds to bf16 once, eager twice
            torch.testing.assert_close(got, eager, rtol=1.6e-2, atol=1.6e-2)
    r = torch._dynamo.explain(f)(x, y, w)
    assert r.graph_break_count == 0, r.break_reasons


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_an_in_place_kernel(ks, gen, backend: str) -> None:
    """axpy's op mutates y (declared `Tensor(a!)`): compiled, the write reaches the caller's y."""
    if backend == "inductor":
        pytest.importorskip("triton")

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ks.axpy(x, y, alpha=2.0)
        return ks.mul(y, x)

    x, y = rand(gen, (4099,), torch.float32), rand(gen, (4099,), torch.float32)
    y0 = y.clone()
    torch._dynamo.reset()
    out = torch.compile(f, backend=backend, fullgraph=True)(x, y)
    close(y, y0 + 2 * x, torch.float32)
    close(out, (y0 + 2 * x) * x, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_autograd_of_mul(ks, gen, dtype, compiled: bool) -> None:
    n = 4099
    x, y, c = (rand(gen, (n,), dtype) for _ in range(3))
    x.requires_grad_(True)
    y.requires_grad_(True)

    def loss(f):
        return lambda a, b: (f(a, b).float() * c.float()).sum()

    f = loss(ks.mul)
    if compiled:
        torch._dynamo.reset()
        f = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(f(x, y), (x, y))
    want = torch.autograd.grad(loss(lambda a, b: a * b)(x, y), (x, y))
    for g, w in zip(got, want):
        close(g, w, dtype)


def test_runs_on_torchs_current_stream(ks, gen) -> None:
    x, y = rand(gen, (1 << 22,), torch.float32), rand(gen, (1 << 22,), torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = ks.mul(x, y)
        out2 = ks.mul(out, y)  # ordered after the first on the same stream
    torch.cuda.current_stream().wait_stream(s)
    close(out2, x * y * y, torch.float32)


def test_cuda_graph_capture_and_replay(ks, gen) -> None:
    x, y = rand(gen, (1 << 16,), torch.float32), rand(gen, (1 << 16,), torch.float32)
    z = torch.zeros_like(x)
    w = rand(gen, (1024,), torch.float32)
    s = torch.cuda.Stream()  # warm up (load the libraries) off the capture, as torch advises
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ks.mul(x, y)
        ks.axpy(x, z, alpha=0.0)
        ks.rmsnorm(x.view(64, 1024), w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        prod = ks.mul(x, y)
        ks.axpy(prod, z, alpha=2.0)
        norm = ks.rmsnorm(prod.view(64, 1024), w, eps=1e-5)
    for _ in range(2):
        x.copy_(rand(gen, x.shape, torch.float32))
        z.zero_()
        g.replay()
        torch.cuda.synchronize()
        close(prod, x * y, torch.float32)
        close(z, 2 * x * y, torch.float32)
        close(norm, rmsnorm_ref((x * y).view(64, 1024), w, 1e-5), torch.float32)


def test_errors_on_the_device(ks, gen) -> None:
    import cutecc.torch as ct

    x = rand(gen, (100,), torch.float32)
    with pytest.raises(ValueError, match="several devices"):
        ks.mul(x, x.cpu())
    with pytest.raises(ct.KernelCallError, match=r"(?s)x: dtype float64, expected float32"):
        ks.mul(x.double(), x.double())
    with pytest.raises(ValueError, match=r"x: not contiguous"):
        ks.mul(x[::2], x[::2])
    # The eager path leaves strides and addresses to the kernel's own checks (its TVM-FFI
    # wrapper), then names the argument: a signature already planned, then a view of it.
    ks.mul(x[:50].clone(), x[:50].clone())
    with pytest.raises(ValueError, match=r"y: not contiguous") as e:
        ks.mul(x[:50], x[::2])
    assert e.value.__cause__ is not None  # the kernel's refusal
    with pytest.raises(ValueError, match=r"x: its data starts at an address that is not a multiple of 16"):
        ks.mul(x[1:51], x[:50])
