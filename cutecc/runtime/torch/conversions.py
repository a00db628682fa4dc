"""What the torch front end converts: dtype names, dimensions (SymInts too), runtime
scalars, the runtime's errors, and tensors to and from the dense buffers a build declares."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from cutecc.contract.args import ScalarArg, TensorArg
from cutecc.errors import CallError, CallTypeError, CuteccError
from cutecc.runtime import calls, scalar_values
from cutecc.runtime.calls import Build

# The torch front end's names for the runtime's call errors (the same classes as the JAX side's).
KernelCallError = CallError
KernelTypeError = CallTypeError


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


class TorchDims(calls.Dims):
    """torch's dimensions: ints, or `SymInt`s under `torch.compile(dynamic=True)` (a
    comparison guards on them, so it is always decided)."""

    def concrete(self, n: Any) -> bool:
        return isinstance(n, int)


TORCH_DIMS = TorchDims()


def _torch_scalar(kernel: str, s: ScalarArg, v: Any) -> Any:
    """A runtime scalar as torch may pass it: a Python number; a tensor would need a
    device-to-host copy (it travels by value), so it is refused."""
    if isinstance(v, torch.Tensor):
        raise KernelTypeError(f"runtime scalar {s.name!r} must be a Python number (it is passed by "
                              "value to the kernel), not a tensor; use .item() if you mean it",
                              where=f'kernel "{kernel}"')
    return scalar_values.plain_scalar(kernel, s, v)


def _as_call_error(e: CuteccError) -> CuteccError:
    """A CuteccError of the shared checks as a call error: those raise CallError or
    CallTypeError themselves; anything else is a ValueError subclass here."""
    if isinstance(e, (KernelCallError, KernelTypeError)):
        return e
    return KernelCallError(e.message, where=e.where, key_path=e.key_path)


def _env_of(build: Build, buffers: Sequence[Any]) -> dict[str, Any]:
    """The symbol bindings of a call from its input buffers (each in its `perm` order)."""
    env: dict[str, Any] = {}
    for t, b in zip(build.conv.inputs, buffers):
        for j, p in enumerate(t.perm):
            d = t.extents[p]
            if isinstance(d, str):
                env.setdefault(d, b.shape[j])
    return env


def _summed(o: Any, t: TensorArg) -> Any:
    return o.sum(dim=0, dtype=o.dtype) if t.reduce == "sum" else o


def _grad_like(g: Any, x: Any) -> Any:
    """A gradient in its input's dtype (a backward may return a wider one, e.g. quack
    RMSNorm's dw summed from fp32 partials for a bf16 weight), as the JAX side does."""
    return g.to(x.dtype) if x.dtype.is_floating_point and g.dtype != x.dtype else g


def _to_buffer(a: Any, t: TensorArg) -> Any:
    """The tensor passed as the dense buffer `t` declares (its dimensions in `perm` order;
    declared with `mode`, the caller passes that buffer as it holds it)."""
    if t.transpose is None:
        return a
    return a.permute(t.transpose).contiguous()


def _from_buffer(b: Any, t: TensorArg) -> Any:
    """A buffer in `t`'s declared order as the logical tensor (a view)."""
    if t.transpose is None:
        return b
    inv = sorted(range(len(t.transpose)), key=t.transpose.__getitem__)
    return b.permute(inv)


# -- kernels -------------------------------------------------------------------------------


class _Spec:
    """A tensor's shape and dtype name, all the contract checks read of it."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


def _layouts(build: Build) -> tuple[tuple, tuple]:
    """Per input (its buffer permutation or None, its name, whether padded) and per result
    (the input it is written into or None, the permutation back to logical or None,
    whether it is summed over its leading axis, whether it is saved, not returned; its name)."""
    conv = build.conv
    inputs = tuple((t.transpose, t.name, t.buffer is not None) for t in conv.inputs)
    results = tuple((conv.inputs.index(t) if t.role == "inout" else None,
                     None if t.transpose is None else tuple(sorted(range(len(t.transpose)),
                                                                   key=t.transpose.__getitem__)),
                     t.reduce == "sum", t.saved, t.name) for t in conv.results)
    return inputs, results
# What the op path's plans are keyed by, per tensor, in one C call: its class, shape, dtype,
# device and whether it requires grad.
_TENSOR_FACTS = operator.attrgetter("__class__", "shape", "dtype", "device", "requires_grad")
