"""The custom ops: one `torch.library` op per kernel and contract
(`torch.ops.cutecc.<kernel>_<12 hex of the contract's digest>`), defined on first use, with
its fake implementation (output shapes from the contract), its real one and its autograd
from the manifest's grad pairing."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from cutecc.contract.cotangents import Cotangents
from cutecc.entry.rules import contract_digest
from cutecc.errors import WorkError
from cutecc.runtime import calls
from cutecc.runtime.calls import Build
from cutecc.runtime.torch.conversions import (
    TORCH_DIMS,
    _env_of,
    _from_buffer,
    _grad_like,
    _summed,
    _to_buffer,
    _torch_dtype,
)

NAMESPACE = "cutecc"  # torch.ops.cutecc.<kernel>_<12 hex of the contract's digest>



class OpKernel(Protocol):
    """What the op's implementations ask of the kernel serving a build
    (`cutecc.runtime.torch.kernel.OpKernel`)."""

    name: str
    backward: str | None

    def _launch(self, build: Build, bufs: Sequence[Any], scalars: Sequence[Any]) -> list[Any]: ...

    def _backward(self, build: Build, xs: Sequence[Any], outs: Mapping[str, Any],
                  cts: Mapping[str, Any], scalars: Mapping[str, Any]) -> list[Any]: ...

    def _cotangents(self, build: Build) -> Cotangents: ...


# -- custom ops ----------------------------------------------------------------------------

_ops_lock = threading.RLock()
_library: torch.library.Library | None = None
_ops: dict[str, Any] = {}  # op name -> torch.ops overload
_builds: dict[str, tuple[OpKernel, Build]] = {}  # build key -> (kernel, build)

_SCALAR_SCHEMA = {"float32": "float", "float64": "float", "int32": "int", "int64": "int", "bool": "bool"}


def op_name(kernel: str, build: Build) -> str:
    """The custom op's name: the kernel's and 12 hex of its contract's digest, so every
    build of one contract (any toolchain, any tuning) is the same op in every process."""
    from cutecc.contract.args import args_to_json

    return f"{kernel}_{contract_digest(args_to_json(build.args))[:12]}"


def op_schema(build: Build) -> str:
    """The op's schema: the call's input buffers (`inout` ones mutated), its runtime
    scalars (derived ones too: the runtime computes them), the build's key; it returns
    the non-`inout` results' buffers (saved ones too, for the backward)."""
    conv = build.conv
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    params = [f"Tensor({next(letters)}!) {t.name}" if t.role == "inout" else f"Tensor {t.name}"
              for t in conv.inputs]
    params += [f"{_SCALAR_SCHEMA[s.dtype]} {s.name}" for s in conv.scalars]
    params.append("str cutecc_build")
    outs = [t for t in conv.results if t.role != "inout"]
    ret = "()" if not outs else "Tensor" if len(outs) == 1 else "(" + ", ".join(["Tensor"] * len(outs)) + ")"
    return f"({', '.join(params)}) -> {ret}"


def _op(fn: OpKernel, build: Build) -> Any:
    """The custom op serving `build` (defined on first use, once per process)."""
    global _library
    name = op_name(fn.name, build)
    with _ops_lock:
        _builds[build.key] = (fn, build)
        op = _ops.get(name)
        if op is not None:
            return op
        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        qual = f"{NAMESPACE}::{name}"
        _library.define(name + op_schema(build))
        torch.library.impl(qual, "CUDA", _op_impl, lib=_library)
        torch.library.register_fake(qual, _op_fake, lib=_library)
        if not build.conv.aliases:  # torch differentiates no op that mutates (nor may a pairing)
            torch.library.register_autograd(qual, _op_backward, setup_context=_op_setup, lib=_library)
        op = _ops[name] = getattr(getattr(torch.ops, NAMESPACE), name).default
        return op


def _split(build: Build, args: Sequence[Any]) -> tuple[list[Any], list[Any], str]:
    n = len(build.conv.inputs)
    return list(args[:n]), list(args[n:-1]), args[-1]


def _built(key: str) -> tuple[OpKernel, Build]:
    got = _builds.get(key)
    if got is None:
        raise WorkError(f"no cutecc build {key[:12]} is loaded in this process; cutecc.torch.load "
                        "the cache or pack holding it first", where="cutecc custom op")
    return got


def _op_fake(*args: Any) -> Any:
    """Output buffers of the contract's shapes, computed from the inputs' (no kernel runs)."""
    fn, build = _built(args[-1])
    ins, _, _ = _split(build, args)
    env = _env_of(build, ins)
    outs = [torch.empty(calls.buffer_shape(fn.name, t, env, TORCH_DIMS), dtype=_torch_dtype(t.dtype),
                        device=ins[0].device if ins else "cuda")
            for t in build.conv.results if t.role != "inout"]
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


def _op_impl(*args: Any) -> Any:
    fn, build = _built(args[-1])
    ins, scalars, _ = _split(build, args)
    outs = fn._launch(build, ins, scalars)
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    fn, build = _built(inputs[-1])
    ins, scalars, key = _split(build, inputs)
    outs = output if isinstance(output, tuple) else (output,) if output is not None else ()
    ctx.cutecc = (key, scalars)
    ctx.save_for_backward(*ins, *outs)
    # Returned outputs whose cotangent the paired backward does not take (declared nondiff
    # or stop_gradient, `cutecc.contract.cotangents`) come back with requires_grad=False, as torch's
    # own non-differentiable outputs do: backward() of a loss on one alone is torch's error,
    # never a silent zero. (Eager or compiled alike: AOTAutograd hands a compiled backward
    # every tangent materialized, so a gradient's presence cannot be told there.)
    pairing = fn._cotangents(build) if fn.backward else None
    if pairing is not None and not pairing.complete:
        names = [t.name for t in build.conv.results if t.role != "inout"]
        dropped = {*pairing.nondiff, *pairing.stopped}
        ctx.mark_non_differentiable(*(o for o, n in zip(outs, names) if n in dropped))


def _op_backward(ctx: Any, *grads: Any) -> Any:
    """Gradients of the op's input buffers: the paired backward kernel called on the
    logical tensors (through its own op, so it compiles too), as the JAX side calls it."""
    key, scalars = ctx.cutecc
    fn, build = _built(key)
    conv = build.conv
    saved = ctx.saved_tensors
    n = len(conv.inputs)
    xs = [_from_buffer(b, t) for b, t in zip(saved[:n], conv.inputs)]
    # What the call returned: a declared reduction summed over its leading axis, and the
    # cotangent of that sum (the op's unsummed result got it broadcast: any row is it).
    outs = {t.name: _summed(_from_buffer(b, t), t) for b, t in zip(saved[n:], conv.results)}
    cts = {t.name: (torch.zeros_like(outs[t.name]) if g is None
                    else _from_buffer(g, t)[0 if t.reduce == "sum" else ...].contiguous())
           for g, t in zip(grads, conv.results)}  # a cotangent may be expanded (stride 0)
    gx = fn._backward(build, xs, outs, cts, dict(zip((s.name for s in conv.scalars), scalars)))
    return (*(None if g is None else _grad_like(_to_buffer(g, t), x)
              for g, t, x in zip(gx, conv.inputs, saved[:n])),
            *([None] * (len(scalars) + 1)))
