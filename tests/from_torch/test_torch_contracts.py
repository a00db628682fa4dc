"""cutecc.torch's handling of contracts, on the CPU: layouts, padded buffers, call keywords,
derived extents and scalars, scratch, saved residuals, reductions, broadcast inputs and a
named grad pairing (tests/gpu/layout_kernels and train_kernels, built for sm_90a).

Each kernel's tvm-ffi function is replaced by a Python stand-in taking exactly what the
function would (input buffers, result buffers, runtime scalars, in that order, each buffer
in the order the kernel reads it) and writing its results through the kernel's own view of
them (logical dimensions, padded blocks); the ops' CUDA implementation is registered for
the CPU too. So the eager path, the custom-op path, autograd and torch.compile all run here,
and what reaches the "kernel" is checked against torch references."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="cutecc.torch needs torch (the torch or examples extra)")
pytestmark = pytest.mark.extra

import cutecc.torch as ct  # noqa: E402
from cutecc.runtime import calls  # noqa: E402
from cutecc.runtime.torch import conversions as torch_conv  # noqa: E402
from cutecc.runtime.torch import eager as torch_eager  # noqa: E402
from cutecc.runtime.torch import kernel as torch_kernel  # noqa: E402
from cutecc.runtime.torch import op as torch_op  # noqa: E402


def _views(build: Any, args: tuple) -> tuple[dict, dict, dict]:
    """The kernel's view of the arguments a call passes: logical tensors by name (a padded
    one its logical block), results too, and scalars by name."""
    conv = build.conv
    n_in, n_res = len(conv.ffi_inputs), len(conv.ffi_results)
    ins, res, scalars = args[:n_in], args[n_in:n_in + n_res], args[n_in + n_res:]
    assert len(scalars) == len(conv.scalars)
    for i, r in conv.ffi_aliases:
        assert ins[i] is res[r], "an aliased result must be its operand's buffer"
    env = torch_conv._env_of(build, ins[:len(conv.inputs)])

    def logical(buf: Any, t: Any) -> Any:
        assert buf.is_contiguous(), f"{t.name}: the kernel reads dense buffers"
        v = torch_conv._from_buffer(buf, t)
        for i in t.padded:
            if i not in (t.broadcast or ()):
                v = v.narrow(i, 0, calls.extent("k", t, t.shape[i], env))
        return v

    return ({t.name: logical(b, t) for b, t in zip(ins, conv.ffi_inputs)},
            {t.name: logical(b, t) for b, t in zip(res, conv.ffi_results)},
            {s.name: v for s, v in zip(conv.scalars, scalars)})


def _f(build: Any) -> float:
    return 2.0 if dict(build.call).get("causal") else 1.0


SM = 132  # the h100 profile's sm_count, as the contracts' $hw.sm_count
REFS: dict[str, Callable[[Any, dict, dict, dict], None]] = {
    "rows": lambda b, i, r, s: r["y"].copy_(i["x"]),
    "cols": lambda b, i, r, s: r["y"].copy_(i["x"]),
    "pad_rows": lambda b, i, r, s: r["y"].copy_(i["x"]),
    "pad_cols": lambda b, i, r, s: r["y"].copy_(i["x"]),
    "scale": lambda b, i, r, s: r["out"].copy_(i["x"] * _f(b)),
    "scale_bwd": lambda b, i, r, s: r["dx"].copy_(i["ct"] * _f(b)),
    "row_dot": lambda b, i, r, s: r["out"].copy_((i["a"] * i["v"]).sum(1)),
}


def _train_pad_cols(b: Any, i: dict, r: dict, s: dict) -> None:
    n = i["x"].shape[1]
    assert s["cols"] == r["out"].shape[1] == -(-n // 32) * 32
    r["out"].zero_()
    r["out"][:, :n] = i["x"]


def _col_partials(b: Any, i: dict, r: dict, s: dict) -> None:
    m = i["x"].shape[0]
    assert s["blocks"] == SM == r["partials"].shape[0] and s["rows_per"] == -(-m // SM)
    for k in range(SM):
        r["partials"][k] = i["x"][k * s["rows_per"]:(k + 1) * s["rows_per"]].sum(0)


def _triple(b: Any, i: dict, r: dict, s: dict) -> None:
    assert (i["acc"] == 0).all() and r["acc"].shape[0] == -(-i["x"].shape[0] // 64) * 64
    r["tmp"].copy_(2 * i["x"])
    r["acc"][:i["x"].shape[0]] += i["x"]
    r["out"].copy_(r["tmp"] + r["acc"][:i["x"].shape[0]])


def _expw_bwd(b: Any, i: dict, r: dict, s: dict) -> None:
    m = i["e"].shape[0]
    r["dx"].copy_(i["dout"] * i["e"] * i["w"])
    g = i["dout"] * i["e"]
    r["dw"].zero_()
    for k in range(SM):
        r["dw"][k] = g[k * s["rows_per"]:(k + 1) * s["rows_per"]].sum(0)
    assert s["rows_per"] == -(-m // SM)


TRAIN = {
    "pad_cols": _train_pad_cols,
    "col_partials": _col_partials,
    "triple": _triple,
    "expw": lambda b, i, r, s: (r["e"].copy_(i["x"].exp()), r["out"].copy_(r["e"] * i["w"])),
    "expw_bwd": _expw_bwd,
    "add_bias": lambda b, i, r, s: r["out"].copy_(i["x"] + i["b"]),
}
TRAIN["expw2"] = TRAIN["expw_r"] = TRAIN["expw_rs"] = TRAIN["expw"]
TRAIN["bwd_g"] = lambda b, i, r, s: r["g"].copy_(i["e"] * i["dout"])


def _bwd_dxdw(b: Any, i: dict, r: dict, s: dict) -> None:
    r["dx"].copy_(i["g"] * i["w"])
    r["dw"].zero_()
    for k in range(SM):
        r["dw"][k] = i["g"][k * s["rows_per"]:(k + 1) * s["rows_per"]].sum(0)


TRAIN["bwd_dxdw"] = _bwd_dxdw


def _on_cpu(monkeypatch: pytest.MonkeyPatch, cache: Path, refs: dict) -> ct.TorchKernelSet:
    """A fresh kernel set whose kernels run on the CPU through the stand-ins."""
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))

    def function(kernel: str, build: Any) -> Any:
        ref = refs[kernel]
        return lambda *args: ref(build, *_views(build, args))

    monkeypatch.setattr(torch_eager, "build_function", function)
    ks = ct.load(cache, arch="sm_90a")
    libs = []
    for name in ks.register_all():
        lib = torch.library.Library("cutecc", "IMPL")
        with warnings.catch_warnings():  # an earlier test's set may still hold the CPU kernel
            warnings.simplefilter("ignore", UserWarning)
            lib.impl(name.split("::")[1], torch_op._op_impl, "CPU")
        libs.append(lib)
    ks._test_libs = libs  # kept alive as long as the set
    return ks


@pytest.fixture
def lay(monkeypatch: pytest.MonkeyPatch, layout_cache: Path) -> ct.TorchKernelSet:
    return _on_cpu(monkeypatch, layout_cache, REFS)


@pytest.fixture
def train(monkeypatch: pytest.MonkeyPatch, train_cache: Path) -> ct.TorchKernelSet:
    return _on_cpu(monkeypatch, train_cache, TRAIN)


def both(fn: Any) -> list[Any]:
    """The kernel eagerly and through its op."""
    return [fn, lambda *a, **k: fn._through_op(a, k)]


def test_column_major_operands_are_logical_and_a_transposed_tensor_is_not_copied(lay) -> None:
    x = torch.randn(24, 40).to(torch.bfloat16)
    for call in both(lay.cols):
        y = call(x)
        assert torch.equal(y, x) and y.shape == (24, 40) and y.stride() == (1, 24)
    seen = []
    w = torch.randn(40, 24).to(torch.bfloat16)  # the (k, m) memory a column-major (m, k) is
    real = torch_eager.build_function
    ct_fn = real("cols", lay.cols.builds[0])
    lay.cols._plans.clear()

    def spy(kernel: str, build: Any) -> Any:
        return lambda *a: (seen.append(a[0].data_ptr()), ct_fn(*a))

    torch_eager.build_function = spy
    try:
        assert torch.equal(lay.cols(w.T), w.T)
    finally:
        torch_eager.build_function = real
    assert seen == [w.data_ptr()]


@pytest.mark.parametrize("causal", [False, True])
def test_stride_orders_call_keywords_and_grad(lay, causal: bool) -> None:
    x = torch.randn(3, 5, 7)
    for call in both(lay.scale):
        torch.testing.assert_close(call(x, causal=causal), x * (2.0 if causal else 1.0))
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((lay.scale(xg, causal=causal) * x).sum(), (xg,))
    torch.testing.assert_close(g, x * (2.0 if causal else 1.0))
    f = torch.compile(lambda a: lay.scale(a, causal=causal).sum(), backend="aot_eager", fullgraph=True)
    (g2,) = torch.autograd.grad(f(xg), (xg,))
    torch.testing.assert_close(g2, torch.full_like(x, 2.0 if causal else 1.0))
    with pytest.raises(TypeError, match="missing call keyword 'causal'"):
        lay.scale(x)


def test_divisibility_is_checked(lay) -> None:
    with pytest.raises(ValueError, match=r"x: dimension 1 is 12, expected a multiple of 8"):
        lay.rows(torch.zeros(4, 12, dtype=torch.bfloat16))


@pytest.mark.parametrize("k", [64, 1024])
def test_padded_inout_rows_keep_their_padding(lay, k: int) -> None:
    m, ldx, ldy = 5, k + 16, k + 8
    x = torch.randn(m, ldx).to(torch.bfloat16)
    for call in both(lay.pad_rows):
        y = torch.full((m, ldy), 7.0, dtype=torch.bfloat16)
        assert call(x, y, k=k) is y
        assert torch.equal(y[:, :k], x[:, :k]) and (y[:, k:] == 7).all()
    with pytest.raises(ValueError, match="dimension 1 of the buffer is 40"):
        lay.pad_rows(torch.zeros(m, 40, dtype=torch.bfloat16), torch.zeros(m, 72, dtype=torch.bfloat16),
                     k=64)
    with pytest.raises(ValueError, match="not contiguous.*padded tensor"):
        lay.pad_rows(x[:, :k], torch.zeros(m, ldy, dtype=torch.bfloat16), k=k)


def test_a_padded_operand_and_a_padded_column_major_one(lay) -> None:
    a, v = torch.randn(9, 48), torch.randn(33)
    for call in both(lay.row_dot):
        torch.testing.assert_close(call(a, v), a[:, :33] @ v)
    x = torch.randn(72, 16).to(torch.bfloat16)  # (ldm, k): the kernel views its (64, k) block
    for call in both(lay.pad_cols):
        assert torch.equal(call(x), x[:64])


def test_derived_extent_and_scalar(train) -> None:
    x = torch.randn(3, 45)
    for call in both(train.pad_cols):
        out = call(x)
        assert out.shape == (3, 64) and torch.equal(out[:, :45], x) and (out[:, 45:] == 0).all()


def test_hardware_scalars_and_per_sm_partials(train) -> None:
    x = torch.randn(300, 7)
    for call in both(train.col_partials):
        p = call(x)
        assert p.shape == (SM, 7)
        torch.testing.assert_close(p.sum(0), x.sum(0), rtol=1e-5, atol=1e-5)


def test_scratch_zeroed_and_not(train) -> None:
    x = torch.randn(100)
    for call in both(train.triple):
        torch.testing.assert_close(call(x), 3 * x)


def test_broadcast_input(train) -> None:
    x, b = torch.randn(6, 5), torch.randn(1, 5)
    for call in both(train.add_bias):
        torch.testing.assert_close(call(x, b), x + b)


def test_saved_residual_reduced_partials_and_a_named_pairing(train) -> None:
    x = (torch.randn(300, 70) * 0.5).requires_grad_(True)
    w = torch.randn(70).requires_grad_(True)
    t = torch.randn(300, 70)
    out = train.expw(x.detach(), w.detach())  # eager: the saved e is not returned
    assert isinstance(out, torch.Tensor) and out.shape == (300, 70)

    def loss(f: Any) -> Any:
        return lambda a, b: ((f(a, b) - t) ** 2).sum()

    got = torch.autograd.grad(loss(train.expw)(x, w), (x, w))
    want = torch.autograd.grad(loss(lambda a, b: a.exp() * b)(x, w), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)
    compiled = torch.compile(loss(train.expw), backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, w), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["expw_r", "expw_rs"])
def test_an_output_whose_cotangent_the_backward_drops_is_not_differentiable(train, name: str) -> None:
    """expw_r / expw_rs return e beside out; their backward takes no cotangent of e
    (declared nondiff / stop_gradient): e comes back with requires_grad=False, so a loss on
    e alone is torch's error rather than a silent zero, and out differentiates as expw's."""
    x = (torch.randn(300, 70) * 0.5).requires_grad_(True)
    w = torch.randn(70).requires_grad_(True)
    t = torch.randn(300, 70)
    out, e = getattr(train, name)(x, w)
    assert out.requires_grad and not e.requires_grad
    torch.testing.assert_close(e, x.detach().exp(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="does not require grad"):
        e.sum().backward()
    got = torch.autograd.grad(((out - t) ** 2).sum(), (x, w))
    want = torch.autograd.grad((((x.exp() * w) - t) ** 2).sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)


def test_a_composite_kernel_and_a_composite_backward(train) -> None:
    """expw2 is paired with expw2_bwd, two launches sharing g by name (bwd_g, bwd_dxdw)."""
    w, e, dout = torch.randn(5), torch.randn(300, 5), torch.randn(300, 5)
    dx, dw = train.expw2_bwd(w, e, dout)
    torch.testing.assert_close(dx, dout * e * w)
    torch.testing.assert_close(dw, (dout * e).sum(0), rtol=1e-5, atol=1e-5)
    x = (torch.randn(300, 5) * 0.5).requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    got = torch.autograd.grad((train.expw2(x, wg) ** 2).sum(), (x, wg))
    want = torch.autograd.grad(((x.exp() * wg) ** 2).sum(), (x, wg))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)
    f = torch.compile(lambda a, b: (train.expw2(a, b) ** 2).sum(), backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(f(x, wg), (x, wg))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)
    with pytest.raises(TypeError, match="takes 3 tensor"):  # a wrong count: CallTypeError, as for JAX
        train.expw2_bwd(w, e)


ROOT = {
    "mul": lambda b, i, r, s: r["out"].copy_(i["x"] * i["y"]),
    "mul_bwd": lambda b, i, r, s: (r["dx"].copy_(i["dout"] * i["y"]), r["dy"].copy_(i["dout"] * i["x"])),
    "rmsnorm": lambda b, i, r, s: r["out"].copy_(
        i["x"] * torch.rsqrt(i["x"].pow(2).mean(-1, keepdim=True) + s["eps"]) * i["w"]),
    "axpy": lambda b, i, r, s: r["y"].add_(s["alpha"] * i["x"]),
}


def test_a_runtime_scalar_is_a_value_of_the_compiled_trace(monkeypatch: pytest.MonkeyPatch,
                                                           example_cache: Path) -> None:
    ks = _on_cpu(monkeypatch, example_cache, ROOT)
    x, w = torch.randn(4, 1024), torch.randn(1024)
    f = torch.compile(lambda x, w, eps: ks.rmsnorm(x, w, eps=eps), backend="aot_eager", fullgraph=True)
    for eps in (1e-5, 1e-2, 0.5, 2.0):
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        torch.testing.assert_close(f(x, w, eps), want)
    y = torch.zeros(64)
    g = torch.compile(lambda x, y, a: ks.axpy(x, y, alpha=a), backend="aot_eager", fullgraph=True)
    g(torch.ones(64), y, 1.5)
    g(torch.ones(64), y, 2.5)
    torch.testing.assert_close(y, torch.full((64,), 4.0))
    with pytest.raises(TypeError, match="runtime scalar 'alpha'.*must be a number"):
        ks.axpy(torch.ones(64), y, alpha="2")


def test_the_op_takes_what_a_compiler_hands_it(monkeypatch: pytest.MonkeyPatch, example_cache: Path) -> None:
    """Called directly (as compiled code calls it), the op copies a strided or offset input to
    a dense buffer and writes an inout one back; the call itself refuses those (eagerly)."""
    ks = _on_cpu(monkeypatch, example_cache, ROOT)
    b = ks.axpy.builds[0]
    op = getattr(torch.ops.cutecc, ct.op_name("axpy", b)).default
    base = torch.zeros(130)
    y = base[2:130:2]  # 64 elements, stride 2, 8 bytes in
    x = torch.arange(64.0)
    op(x, y, 0.5, b.key)
    torch.testing.assert_close(y, 0.5 * x)
    assert (base[3::2] == 0).all()
    m = ks.mul.builds[0]
    mul = getattr(torch.ops.cutecc, ct.op_name("mul", m)).default
    dt = getattr(torch, m.conv.inputs[0].dtype)
    a = torch.randn(101).to(dt)
    torch.testing.assert_close(mul(a[1:], a[1:], m.key), a[1:] * a[1:])
    with torch.no_grad():  # a tensor that requires grad, outside autograd: passed detached
        w = torch.randn(64, requires_grad=True)
        out = ks.mul(w, w)
        assert not out.requires_grad
        torch.testing.assert_close(out, w * w)


def test_compile_dynamic_specializes_the_shapes_a_call_reads(monkeypatch: pytest.MonkeyPatch,
                                                             example_cache: Path) -> None:
    """Under dynamic=True the contract's choice guards on the shapes (each is a constant of
    the trace), so the call compiles and stays right as sizes change."""
    ks = _on_cpu(monkeypatch, example_cache, ROOT)
    f = torch.compile(lambda a, b: ks.mul(a, b) + 1, backend="aot_eager", fullgraph=True, dynamic=True)
    for n in (8, 16, 33):
        x = torch.randn(n)
        torch.testing.assert_close(f(x, x), x * x + 1)


def test_the_gradient_of_a_forward_that_declares_a_reduction(monkeypatch: pytest.MonkeyPatch,
                                                             train_cache: Path) -> None:
    """A forward returning per-block partials summed by the runtime (`reduce = "sum"`), paired
    with a backward taking the cotangent of the sum: the op's unsummed result receives that
    cotangent broadcast, and the backward gets it once, as the JAX side hands it over.
    Contracts made here (a column sum and its backward), run by stand-ins."""
    import dataclasses

    from cutecc.contract.args import CallingConvention, StreamArg, TensorArg

    def build(args: tuple, key: str) -> Any:
        base = ct.load(train_cache, arch="sm_90a").col_partials.builds[0]
        return dataclasses.replace(base, key=key, args=args, conv=CallingConvention.of(args),
                                   variant="default", call=())

    fwd = build((TensorArg("x", "input", "float32", ("m", "d")),
                 TensorArg("parts", "output", "float32", (4, "d"), reduce="sum"), StreamArg()), "f" * 64)
    bwd = build((TensorArg("x", "input", "float32", ("m", "d")),
                 TensorArg("dparts", "input", "float32", ("d",)),
                 TensorArg("dx", "output", "float32", ("m", "d")), StreamArg()), "b" * 64)
    refs = {"colsum": lambda b, i, r, s: [r["parts"][k].copy_(i["x"][k::4].sum(0)) for k in range(4)],
            "colsum_bwd": lambda b, i, r, s: r["dx"].copy_(i["dparts"].expand_as(i["x"]))}
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(torch_eager, "build_function", lambda k, b: lambda *a: refs[k](b, *_views(b, a)))
    fns = {"colsum": ct.TorchKernelFn("colsum", [fwd], backward="colsum_bwd", arch="sm_90a"),
           "colsum_bwd": ct.TorchKernelFn("colsum_bwd", [bwd], arch="sm_90a")}
    ks = ct.TorchKernelSet(Path("/nonexistent"), "sm_90a", fns.__getitem__, lambda: list(fns),
                           fns.__contains__)
    libs = []
    for name in ks.register_all():
        lib = torch.library.Library("cutecc", "IMPL")
        lib.impl(name.split("::")[1], torch_op._op_impl, "CPU")
        libs.append(lib)
    x = torch.randn(10, 3, requires_grad=True)
    c = torch.randn(3)
    out = ks.colsum(x)
    torch.testing.assert_close(out, x.detach().sum(0))
    (g,) = torch.autograd.grad((out * c).sum(), (x,))
    torch.testing.assert_close(g, c.expand(10, 3))


def test_compile_an_in_place_kernel(monkeypatch: pytest.MonkeyPatch, example_cache: Path) -> None:
    ks = _on_cpu(monkeypatch, example_cache, ROOT)

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ks.axpy(x, y, alpha=2.0)
        return ks.mul(y, x)

    x, y = torch.randn(64), torch.randn(64)
    y0 = y.clone()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x, y)
    torch.testing.assert_close(y, y0 + 2 * x)
    torch.testing.assert_close(out, (y0 + 2 * x) * x)


def test_a_composite_does_not_write_the_callers_tensors(monkeypatch: pytest.MonkeyPatch,
                                                        example_cache: Path) -> None:
    """A launch that writes in place (as FA4's postprocess wrote dq over dout) gets a copy of
    a tensor the caller passed; the composite returns the written copy."""
    ks = _on_cpu(monkeypatch, example_cache, ROOT)
    comp = ct.TorchCompositeFn("axpy_twice", ["axpy", "axpy"], ["x", "y"], ["y"], owner=ks)
    x, y = torch.ones(64), torch.zeros(64)
    out = comp(x, y, alpha=1.5)
    assert (y == 0).all()
    torch.testing.assert_close(out, torch.full((64,), 3.0))
