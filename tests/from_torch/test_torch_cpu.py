"""cutecc.torch without a GPU: op schemas, fake implementations, shape inference for every
root kernel, torch.compile(fullgraph=True) with no graph break, autograd's graph, errors in
torch's terms, and an import that pulls in neither JAX nor the DSL.

Fake CUDA tensors (`FakeTensorMode`) stand for the device; `opcheck` runs each op for real
on CPU tensors through a torch reference registered for the CPU in place of the kernel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="cutecc.torch needs torch (the torch or examples extra)")
pytestmark = pytest.mark.extra

from helpers import PY  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import cutecc.torch as ct  # noqa: E402
from cutecc.errors import CuteccError  # noqa: E402
from cutecc.runtime.torch import eager as torch_eager  # noqa: E402
from cutecc.runtime.torch import kernel as torch_kernel  # noqa: E402


@pytest.fixture(scope="module")
def ks(example_cache: Path) -> ct.TorchKernelSet:
    return ct.load(example_cache, arch="sm_90a")


def _fake(*shapes_dtypes: tuple) -> list:
    return [torch.randn(s, dtype=d, device="cuda") for s, d in shapes_dtypes]


def test_op_schemas_of_every_root_kernel(ks: ct.TorchKernelSet) -> None:
    names = ks.register_all()
    assert len(names) == 11 and all(n.startswith("cutecc::") for n in names)
    schemas = {n.split("::")[1].rsplit("_", 1)[0]: str(getattr(torch.ops.cutecc, n.split("::")[1])
                                                      .default._schema) for n in names}
    assert schemas["mul"].endswith("(Tensor x, Tensor y, str cutecc_build) -> Tensor")
    assert schemas["mul_bwd"].endswith(
        "(Tensor x, Tensor y, Tensor dout, str cutecc_build) -> (Tensor, Tensor)")
    assert schemas["rmsnorm"].endswith("(Tensor x, Tensor w, float eps, str cutecc_build) -> Tensor")
    assert schemas["axpy"].endswith("(Tensor x, Tensor(a!) y, float alpha, str cutecc_build) -> ()")
    # names are the kernel's and its contract's digest: the same for every build of a contract
    b = ks.rmsnorm.builds[0]
    assert ct.op_name("rmsnorm", b) == ct.op_name("rmsnorm", b) and len(ct.op_name("rmsnorm", b)) == 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_shape_inference_mul_and_mul_bwd(ks: ct.TorchKernelSet, dtype: torch.dtype) -> None:
    with FakeTensorMode():
        x, y = _fake(((1000,), dtype), ((1000,), dtype))
        out = ks.mul(x, y)
        assert out.shape == (1000,) and out.dtype == dtype and out.device.type == "cuda"
        dx, dy = ks.mul_bwd(x, y, out)
        assert dx.shape == dy.shape == (1000,) and dx.dtype == dy.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1024, 4096])
def test_shape_inference_rmsnorm(ks: ct.TorchKernelSet, dtype: torch.dtype, d: int) -> None:
    with FakeTensorMode():
        x, w = _fake(((37, d), dtype), ((d,), dtype))
        out = ks.rmsnorm(x, w, eps=1e-5)
        assert out.shape == (37, d) and out.dtype == dtype


def test_shape_inference_axpy_is_in_place(ks: ct.TorchKernelSet) -> None:
    with FakeTensorMode():
        x, y = _fake(((4096,), torch.float32), ((4096,), torch.float32))
        assert ks.axpy(x, y, alpha=2.0) is y


def test_compile_fullgraph_two_kernels_no_graph_break(example_cache: Path) -> None:
    fresh = ct.load(example_cache, arch="sm_90a")  # first use of each kernel inside the trace

    def f(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return fresh.rmsnorm(fresh.mul(x, y).view(8, 1024), w, eps=1e-5) * 2

    with FakeTensorMode():
        x, y, w = _fake(((8192,), torch.float32), ((8192,), torch.float32), ((1024,), torch.float32))
        r = torch._dynamo.explain(f)(x, y, w)
    assert r.graph_break_count == 0 and r.graph_count == 1, r.break_reasons
    ops = [n.target for g in r.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum("cutecc" in str(t) for t in ops) == 2, ops
    meta = [torch.empty(s, device="meta") for s in ((8192,), (8192,), (1024,))]
    out = torch.compile(f, backend="eager", fullgraph=True)(*meta)
    assert out.shape == (8, 1024)


def test_compile_fullgraph_in_place(ks: ct.TorchKernelSet) -> None:
    def g(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ks.axpy(x, y, alpha=3.0)
        return ks.mul(y, x).sum()

    with FakeTensorMode():
        x, y = _fake(((4096,), torch.float32), ((4096,), torch.float32))
        r = torch._dynamo.explain(g)(x, y)
    assert r.graph_break_count == 0, r.break_reasons
    ops = [str(n.target) for g in r.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("cutecc.axpy_" in t for t in ops) and any("cutecc.mul_" in t for t in ops), ops


def test_errors_in_torch_terms(ks: ct.TorchKernelSet) -> None:
    cpu = torch.ones(8)
    with pytest.raises(ValueError, match=r'kernel "mul".*cpu.*\.cuda\(\).*built for sm_90a') as e:
        ks.mul(cpu, cpu)
    assert isinstance(e.value, CuteccError) and "dtype=float32(x: float32['n']" in str(e.value)
    with FakeTensorMode():
        x64 = torch.ones(8, dtype=torch.float64, device="cuda")
        with pytest.raises(ValueError, match=r"(?s)no built variant matches.*float64\[8\].*x: dtype float64, "
                                             r"expected float32"):
            ks.mul(x64, x64)
        x, w = _fake(((16, 2048), torch.float32), ((1024,), torch.float32))
        with pytest.raises(ValueError, match="x: dimension 1 is 2048, expected 1024"):
            ks.rmsnorm(x, w)
        strided = torch.empty_strided((8,), (2,), device="cuda")
        with pytest.raises(ValueError, match=r"x: not contiguous \(strides \(2,\)\).*x\.contiguous\(\)"):
            ks.mul(strided, strided)
        y = torch.ones(8, device="cuda")
        with pytest.raises(TypeError, match="runtime scalar 'alpha' must be a Python number"):
            ks.axpy(y, y, alpha=torch.tensor(2.0))
        with pytest.raises(TypeError, match="unknown keyword argument 'beta'"):
            ks.axpy(y, y, beta=1.0)
    with pytest.raises(TypeError, match="argument 1 is a list, not a tensor"):
        ks.mul(cpu, [1.0])


def _axpy(x: torch.Tensor, y: torch.Tensor, alpha: float, key: str) -> None:
    y.add_(alpha * x)


def _cpu_reference(monkeypatch: pytest.MonkeyPatch, ks: ct.TorchKernelSet) -> dict:
    """Each root kernel's op run on CPU tensors by a torch reference (what opcheck runs)."""
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    refs = {
        "mul": lambda x, y, key: x * y,
        "mul_bwd": lambda x, y, dout, key: (dout * y, dout * x),
        "rmsnorm": lambda x, w, eps, key: (x.float() * torch.rsqrt(
            x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype),
        "axpy": _axpy,
    }
    ops = {}
    for n in ks.register_all():
        name = n.split("::")[1]
        kernel = name.rsplit("_", 1)[0]
        lib = torch.library.Library("cutecc", "IMPL")
        lib.impl(name, refs[kernel], "CPU")
        ops[name] = (getattr(torch.ops.cutecc, name).default, lib)
    return ops


def test_opcheck_every_root_op(ks: ct.TorchKernelSet, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _cpu_reference(monkeypatch, ks)
    checked = 0
    for kernel in ("mul", "mul_bwd", "rmsnorm", "axpy"):
        for b in ks[kernel].builds:
            op, _ = ops[ct.op_name(kernel, b)]
            dt = getattr(torch, b.conv.inputs[0].dtype)
            shapes = [tuple(d if isinstance(d, int) else 64 for d in t.shape) for t in b.conv.inputs]
            args = [torch.randn(s, dtype=dt, requires_grad=kernel == "mul") for s in shapes]
            args += [1e-5 if s.name == "eps" else 2.0 for s in b.conv.scalars]
            torch.library.opcheck(op, (*args, b.key))
            checked += 1
    assert checked == 11


def test_cpu_reference_through_the_kernel_call_and_autograd(ks: ct.TorchKernelSet,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _cpu_reference(monkeypatch, ks)  # noqa: F841  (holds the CPU implementations)
    x = torch.randn(300, requires_grad=True)
    y = torch.randn(300, requires_grad=True)
    out = ks.mul(x, y)  # autograd: through the op, its CPU reference standing in for the kernel
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    torch.testing.assert_close(gx, y.detach())
    torch.testing.assert_close(gy, x.detach())
    compiled = torch.compile(lambda a, b: ks.mul(a, b) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, y), 2 * x * y)
    out = ks.rmsnorm(torch.randn(4, 1024, requires_grad=True), torch.randn(1024))
    with pytest.raises(NotImplementedError, match="no derivative rule.*grad = "):
        out.sum().backward()


def _stand_in(kernel: str):
    """A Python stand-in for a kernel's tvm-ffi function: the same arguments (input buffers,
    result buffers, runtime scalars, in that order), results written in place; like the
    kernel, it refuses a tensor that is not dense or not 16-byte aligned."""
    def mul(x, y, out):
        out.copy_(x * y)

    def mul_bwd(x, y, dout, dx, dy):
        dx.copy_(dout * y)
        dy.copy_(dout * x)

    def rmsnorm(x, w, out, eps):
        out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)

    def axpy(x, y, out_y, alpha):
        assert out_y is y  # the inout buffer is passed twice, as operand and result
        y.add_(alpha * x)

    fn = {"mul": mul, "mul_bwd": mul_bwd, "rmsnorm": rmsnorm, "axpy": axpy}[kernel]

    def checked(*args):
        # as the kernel's TVM-FFI wrapper (generated by the DSL) refuses a call before launching
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and not a.is_contiguous():
                raise ValueError(f"Mismatched Tensor on argument #{i}, expected contiguous")
            if isinstance(a, torch.Tensor) and a.data_ptr() % 16:
                raise ValueError(f"Misaligned Tensor data on argument #{i}, expected data alignment=16 bytes")
        return fn(*args)

    return checked


def test_eager_path_passes_buffers_results_and_scalars_in_the_kernels_order(
        example_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ks = ct.load(example_cache, arch="sm_90a")  # its eager plans hold the stand-ins: not shared
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(torch_eager, "build_function", lambda kernel, build: _stand_in(kernel))
    x, y = torch.randn(100), torch.randn(100)
    torch.testing.assert_close(ks.mul(x, y), x * y)
    dx, dy = ks.mul_bwd(x, y, torch.ones(100))
    torch.testing.assert_close((dx, dy), (y, x))
    a, w = torch.randn(3, 1024), torch.randn(1024)
    want = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-3) * w
    torch.testing.assert_close(ks.rmsnorm(a, w, eps=1e-3), want)
    y0 = y.clone()
    assert ks.axpy(x, y, alpha=2.0) is y
    torch.testing.assert_close(y, y0 + 2 * x)
    assert len(ks.mul._plans) == 1 and ks.mul(x, y) is not None and len(ks.mul._plans) == 1
    with pytest.raises(ValueError, match="x: not contiguous"):
        ks.mul(torch.randn(200)[::2], y)
    with pytest.raises(ValueError, match=r"y: its data starts at an address that is not a multiple of 16"):
        ks.mul(x[:99], torch.randn(100)[1:])  # a view 4 bytes in: the kernel assumes 16


IMPORT = r'''
import sys
before = set(sys.modules)
import torch
torch_mods = set(sys.modules)
import cutecc.torch as ct
from torch._subclasses.fake_tensor import FakeTensorMode
ks = ct.load(sys.argv[1], arch="sm_90a")
with FakeTensorMode():
    x = torch.ones(8, device="cuda")
    assert torch.compile(lambda a: ks.mul(a, a), backend="eager", fullgraph=True)(x).shape == (8,)
print("\n".join(sorted(set(sys.modules) - torch_mods)))
'''


def test_import_pulls_in_neither_jax_nor_the_dsl(example_cache: Path) -> None:
    r = subprocess.run([PY, "-c", IMPORT, str(example_cache)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert "cutecc.torch" in modules and "cutecc.runtime.calls" in modules
    bad = [m for m in modules if m.split(".")[0] in ("jax", "jaxlib", "jax_tvm_ffi", "cutlass",
                                                      "nvidia_cutlass_dsl")]
    assert bad == [], bad
    assert "cutecc.runtime.dispatch" not in modules and "cutecc.runtime.primitive" not in modules
    build_side = [m for m in modules if m.startswith(("cutecc.manifest", "cutecc.plan", "cutecc.build",
                                                      "cutecc.commands", "cutecc.cli"))]
    assert build_side == [], build_side


def test_the_jax_runtime_imports_no_torch(example_cache: Path) -> None:
    code = ("import sys, jax, jax.numpy as jnp, cutecc\n"
            "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
            "s = jax.ShapeDtypeStruct((8,), jnp.float32)\n"
            "jax.jit(ks.mul).trace(s, s).lower(lowering_platforms=('cuda',))\n"
            "print('torch' in sys.modules, 'cutecc.torch' in sys.modules)")
    r = subprocess.run([PY, "-c", code, str(example_cache)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]
