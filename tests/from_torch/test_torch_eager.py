"""cutecc.torch's eager path without a GPU: a call's plan is made once per signature
(tensor classes, shapes, dtypes, devices, grad, keywords and their types), and a call the
kernel refuses is explained in torch's terms naming the argument, or else passed on as the
kernel's own error. CPU tensors and a Python function stand in for the device and the
kernel's tvm-ffi function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="cutecc.torch needs torch (the torch or examples extra)")
pytestmark = pytest.mark.extra

import cutecc.torch as ct  # noqa: E402
from cutecc.runtime.torch import eager as torch_eager  # noqa: E402
from cutecc.runtime.torch import kernel as torch_kernel  # noqa: E402


class Kernel:
    """A stand-in for mul's tvm-ffi function (x, y, out): it records its calls and, like the
    kernel's DSL-generated wrapper, refuses a tensor that is not dense (a ValueError)."""

    def __init__(self) -> None:
        self.calls = 0
        self.refusal: str | None = None  # a refusal of its own, for any call

    def __call__(self, x: Any, y: Any, out: Any) -> None:
        self.calls += 1
        for i, a in enumerate((x, y, out)):
            if not a.is_contiguous():
                raise ValueError(f"Mismatched Tensor on argument #{i}, expected contiguous")
        if self.refusal:
            raise ValueError(self.refusal)
        out.copy_(x * y)


@pytest.fixture
def setup(example_cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Kernel]:
    kernel = Kernel()
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(torch_eager, "build_function", lambda name, build: kernel)
    return ct.load(example_cache, arch="sm_90a"), kernel


def test_a_signature_is_planned_once(setup) -> None:
    ks, kernel = setup
    x, y = torch.randn(100), torch.randn(100)
    for _ in range(3):
        torch.testing.assert_close(ks.mul(x, y), x * y)
    assert len(ks.mul._plans) == 1 and kernel.calls == 3
    a, b = torch.randn(64), torch.randn(64)  # another shape: another plan
    torch.testing.assert_close(ks.mul(a, b), a * b)
    ks.mul(x.half(), y.half())  # another dtype: another build
    assert len(ks.mul._plans) == 3
    with pytest.raises(ValueError, match="dimension 0 is 99"):
        ks.mul(x, y[:99])  # a signature no build takes: refused when planned, and not kept
    assert len(ks.mul._plans) == 3


def test_keywords_are_keyed_with_their_types(setup) -> None:
    ks, _ = setup
    w = torch.randn(1024)
    x = torch.randn(2, 1024)
    rms = ks.rmsnorm
    rms._plans.clear()
    ks_plan = [rms._plan_of((x, w), {"eps": v}) for v in (1e-6, 1e-6, 1.0, 1)]
    assert ks_plan[0] is ks_plan[1] and ks_plan[2] is not ks_plan[3]  # 1.0 == 1, not the same call
    assert len(rms._plans) == 3


def test_a_refused_call_names_the_argument(setup) -> None:
    ks, kernel = setup
    x, y = torch.randn(100), torch.randn(100)
    ks.mul(x, y)
    with pytest.raises(ct.KernelCallError, match=r"y: not contiguous \(strides \(2,\)\)") as e:
        ks.mul(x, torch.randn(200)[::2])  # the same signature: the kernel's check refuses it
    assert "argument #1, expected contiguous" in str(e.value.__cause__)


def test_a_refusal_the_checks_cannot_explain_is_the_kernels_own(setup) -> None:
    ks, kernel = setup
    kernel.refusal = "Mismatched Shape on argument #0, something only the kernel checks"
    with pytest.raises(ValueError, match="something only the kernel checks"):
        ks.mul(torch.randn(8), torch.randn(8))


def test_what_the_kernel_cannot_take_goes_through_the_op(setup) -> None:
    ks, kernel = setup
    x = torch.randn(100, requires_grad=True)
    m = torch.empty(100, device="meta")
    out = ks.mul(m, m)  # shapes only: the op's fake implementation
    assert out.device.type == "meta" and out.shape == (100,) and kernel.calls == 0
    assert ks.mul._plan_of((m, m), {}) is None and ks.mul._plan_of((x, x), {}) is None
    with pytest.raises(TypeError, match="argument 1 is a float, not a tensor"):
        ks.mul(m, 2.0)


def test_a_signature_seen_is_found_again_by_the_eager_lookup(
        example_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager call builds its key inline (by the number of tensors); `_plan_of` stores
    plans under `_signature`'s: the two must agree, or every call would plan again."""
    monkeypatch.setattr(torch_kernel, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(torch_eager, "build_function", lambda name, build: lambda *a: None)
    ks = ct.load(example_cache, arch="sm_90a")
    x, y, d = torch.randn(64), torch.randn(64), torch.randn(64)
    a, w = torch.randn(2, 1024), torch.randn(1024)
    calls = [(ks.mul, (x, y), {}), (ks.mul_bwd, (x, y, d), {}), (ks.rmsnorm, (a, w), {"eps": 1e-5})]
    for fn, tensors, kw in calls:
        made, slow = [], []
        real, call = fn._make_plan, fn._call
        monkeypatch.setattr(fn, "_make_plan", lambda t, k, real=real, made=made: made.append(1) or real(t, k))
        monkeypatch.setattr(fn, "_call", lambda t, k, call=call, slow=slow: slow.append(1) or call(t, k))
        for _ in range(3):
            fn(*tensors, **kw)
        # planned once, and only the first call missed the fast path's lookup
        assert len(made) == 1 and len(slow) == 1 and len(fn._plans) == 1, fn.name
        assert fn._plan_of(tensors, kw) is fn._plans[torch_eager._signature(tensors, kw)] and len(made) == 1
    ks.rmsnorm(a, w, eps=1)  # an int where a float was: another key, planned anew
    assert len(ks.rmsnorm._plans) == 2


def test_the_eager_path_steps_aside_while_torch_compiles_or_exports(
        setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.export (and a torch.compile session) set `torch.compiler._is_compiling_flag`; the
    eager call's cheaper test reads it as `torch.compiler.is_compiling()` does, so a signature
    planned eagerly still takes the op then."""
    ks, kernel = setup
    x, y = torch.randn(32), torch.randn(32)
    ks.mul(x, y)
    assert kernel.calls == 1 and len(ks.mul._plans) == 1
    seen = []
    monkeypatch.setattr(ks.mul, "_through_op", lambda t, kw, every=False: seen.append(t) or "op")
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    assert ks.mul(x, y) == "op" and kernel.calls == 1 and len(seen) == 1
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    assert not torch.compiler.is_compiling()
    torch.testing.assert_close(ks.mul(x, y), x * y)
    assert kernel.calls == 2 and len(seen) == 1


def test_a_cpu_call_after_a_meta_call_of_the_same_shape_is_refused(
        example_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager key holds a tensor's device index, -1 for CPU and meta tensors alike: a
    meta call's plan (None: the op's fake implementation) is found again by a CPU call of
    the same shapes, which the op then refuses as the eager path would, naming CUDA."""
    kernel = Kernel()
    monkeypatch.setattr(torch_eager, "build_function", lambda name, build: kernel)
    ks = ct.load(example_cache, arch="sm_90a")  # production devices: CUDA (and meta)
    m = torch.empty(64, device="meta")
    assert ks.mul(m, m).device.type == "meta"
    x, y = torch.randn(64), torch.randn(64)
    for _ in range(2):  # the lookup hit, then again
        with pytest.raises(ValueError, match=r"tensors on cpu; cutecc kernels run on CUDA devices"):
            ks.mul(x, y)
    assert kernel.calls == 0
    fresh = ct.load(example_cache, arch="sm_90a")  # and CPU first: refused by the eager path
    with pytest.raises(ValueError, match=r"\.cuda\(\)"):
        fresh.mul(x, y)
    assert kernel.calls == 0
