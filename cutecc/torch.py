"""`cutecc.torch`: the kernels of a cutecc cache or pack, called from PyTorch.

The same libraries the JAX runtime runs, found, checked and verified by the same loader
(`cutecc.runtime.loader.load_with`) and chosen per call by the same contract logic
(`cutecc.runtime.calls`); this module adds only how torch calls them. Imports torch and
apache-tvm-ffi, never JAX nor the DSL.

Each build's kernel is a `tvm_ffi.Function` taking the kernel's dense buffers (inputs,
then results, then runtime scalars); tvm-ffi accepts torch tensors through DLPack and
sets torch's current CUDA stream as the call's environment stream, which is the stream
the kernels launch on. Two ways reach it:

- eager (not compiling, no autograd needed, plain tensors): the function is called
  directly, with outputs allocated from the contract; a call costs the contract check
  (cached per signature) and the launch;
- otherwise through a `torch.library` custom op per kernel and contract
  (`torch.ops.cutecc.<kernel>_<contract digest>`), with a fake implementation computing
  output shapes from the contract, `inout` tensors declared mutated and autograd from the
  manifest's `grad` pairing: `torch.compile(fullgraph=True)` traces it without a graph
  break and `torch.autograd` differentiates it.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cutecc.contract import ScalarArg, TensorArg
from cutecc.entry import contract_digest
from cutecc.errors import CallError, CallTypeError, CuteccError
from cutecc.runtime import calls, library
from cutecc.runtime.calls import Build
from cutecc.runtime.composite_call import CompositeBase
from cutecc.runtime.loader import FrontEnd, KernelSet, load_with
from cutecc.runtime.placement import device_launcher

__all__ = ["KernelCallError", "KernelTypeError", "TorchCompositeFn", "TorchKernelFn", "TorchKernelSet",
           "load"]

NAMESPACE = "cutecc"  # torch.ops.cutecc.<kernel>_<12 hex of the contract's digest>
DEVICE_TYPES = ("cuda", "meta")  # where a call's tensors may live (meta: shapes only)
MAX_PLANS = 1024  # eager call plans kept per kernel (one per shapes, dtypes, device, keywords)


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
                              where=f'kernel "{kernel}"', exit_code=1)
    return calls.plain_scalar(kernel, s, v)


def _as_call_error(e: CuteccError) -> CuteccError:
    """A CuteccError of the shared checks as a call error: those raise CallError or
    CallTypeError themselves; anything else is a ValueError subclass here."""
    if isinstance(e, (KernelCallError, KernelTypeError)):
        return e
    return KernelCallError(e.message, where=e.where, key_path=e.key_path, exit_code=e.exit_code)


# -- custom ops ----------------------------------------------------------------------------

_ops_lock = threading.RLock()
_library: torch.library.Library | None = None
_ops: dict[str, Any] = {}  # op name -> torch.ops overload
_builds: dict[str, tuple[TorchKernelFn, Build]] = {}  # build key -> (kernel, build)

_SCALAR_SCHEMA = {"float32": "float", "float64": "float", "int32": "int", "int64": "int", "bool": "bool"}


def op_name(kernel: str, build: Build) -> str:
    """The custom op's name: the kernel's and 12 hex of its contract's digest, so every
    build of one contract (any toolchain, any tuning) is the same op in every process."""
    from cutecc.contract import args_to_json

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


def _op(fn: TorchKernelFn, build: Build) -> Any:
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


def _built(key: str) -> tuple[TorchKernelFn, Build]:
    got = _builds.get(key)
    if got is None:
        raise CuteccError(f"no cutecc build {key[:12]} is loaded in this process; cutecc.torch.load "
                          "the cache or pack holding it first", where="cutecc custom op", exit_code=1)
    return got


def _env_of(build: Build, buffers: Sequence[Any]) -> dict[str, Any]:
    """The symbol bindings of a call from its input buffers (each in its `perm` order)."""
    env: dict[str, Any] = {}
    for t, b in zip(build.conv.inputs, buffers):
        for j, p in enumerate(t.perm):
            d = t.extents[p]
            if isinstance(d, str):
                env.setdefault(d, b.shape[j])
    return env


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
    # or stop_gradient, `cutecc.cotangents`) come back with requires_grad=False, as torch's
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


class _Eager:
    """A build's launch for one call signature: the function, what to allocate (shape and
    dtype, or the index of the operand an aliased result is), the scalars' values."""

    def __init__(self, fn: TorchKernelFn, build: Build, env: Mapping[str, Any], scalars: Sequence[Any],
                 device: Any) -> None:
        conv = build.conv
        self.device = device
        self.function = build_function(fn.name, build)
        self.scalars = tuple(scalars)
        self.inputs, self.results = _layouts(build)
        shapes = [(calls.buffer_shape(fn.name, t, env, TORCH_DIMS), _torch_dtype(t.dtype))
                  for t in conv.ffi_results]
        self.zeroed = [shapes[len(conv.results) + conv.scratch.index(t)] for t in conv.scratch if t.zero]
        aliased = {r: i for i, r in conv.ffi_aliases}
        self.allocs = [aliased.get(j, sh) for j, sh in enumerate(shapes)]
        self.own = [j < len(conv.results) and conv.results[j].role != "inout" for j in range(len(shapes))]
        self.simple = not (conv.scratch or conv.aliases or any(t.transpose is not None for t in conv.inputs)
                           or any(t.transpose is not None or t.reduce or t.saved for t in conv.results))
        self.index = device.index
        self.aligns = tuple(t.align for t in conv.inputs)
        # Per result, an input of its shape and dtype (dense, checked per call): torch.empty_like
        # of it allocates with less argument parsing than torch.empty (~0.5 us a call)
        ins = [(tuple(t.extents[p] for p in t.held), t.dtype) for t in conv.inputs]  # as passed
        self.like = [None if isinstance(a, int) or t.transpose is not None else next(
            (i for i, (e, dt) in enumerate(ins) if dt == t.dtype and conv.inputs[i].transpose is None
             and conv.inputs[i].buffer is None and tuple(env.get(x, x) for x in e) == tuple(a[0])), None)
            for a, t in zip(self.allocs, conv.ffi_results)]
        # On the tensors' device, made current for the launch where it is not (one device:
        # the function itself, no check per call): the kernel then runs in that device's
        # context, and tvm-ffi passes that device's current torch stream.
        self.launch = device_launcher(self.function, self.index, torch.cuda.device_count(),
                                      torch.cuda.current_device, torch.cuda.device)
        self.run = _simple_run(fn, self) if self.simple else (lambda tensors: fn._run(self, tensors))


def _simple_run(fn: TorchKernelFn, plan: _Eager) -> Any:
    """The eager call of a simple plan (dense row-major tensors in, fresh results out) as one
    closure over what the signature decided: allocate the results, launch, return them.

    The tensors' strides and addresses are not checked here: the kernel's own TVM-FFI
    wrapper (generated by the DSL for every build) checks each tensor's rank, dtype,
    extents, strides, alignment and device on every call, before anything launches, and
    refuses a call with a ValueError. Only then are the same facts checked here, to name
    the argument in torch's terms (`TorchKernelFn._refused`)."""
    launch, scalars, empty, empty_like = plan.launch, plan.scalars, torch.empty, torch.empty_like
    device = plan.device
    allocs = tuple((like, shape, dtype) for (shape, dtype), like in zip(plan.allocs, plan.like))
    if len(allocs) == 1 and allocs[0][0] is not None:  # one result shaped like an input
        like = allocs[0][0]
        # The function called with positional arguments where the call has one to three
        # tensors and at most one runtime scalar: a call spelled `launch(*tensors, out,
        # *scalars)` builds its argument tuple from three pieces (~50-80 ns a call on the CPU host)
        arity = len(plan.inputs) if len(scalars) <= 1 else 0
        one, s0 = len(scalars) == 1, scalars[0] if scalars else None
        if arity == 1:
            def run_like1(tensors: Sequence[Any]) -> Any:
                out = empty_like(tensors[like])
                try:
                    if one:
                        launch(tensors[0], out, s0)
                    else:
                        launch(tensors[0], out)
                except (ValueError, TypeError) as e:
                    fn._refused(plan, tensors, e)
                return out

            return run_like1
        if arity == 2:
            def run_like2(tensors: Sequence[Any]) -> Any:
                out = empty_like(tensors[like])
                try:
                    if one:
                        launch(tensors[0], tensors[1], out, s0)
                    else:
                        launch(tensors[0], tensors[1], out)
                except (ValueError, TypeError) as e:
                    fn._refused(plan, tensors, e)
                return out

            return run_like2
        if arity == 3:
            def run_like3(tensors: Sequence[Any]) -> Any:
                out = empty_like(tensors[like])
                try:
                    if one:
                        launch(tensors[0], tensors[1], tensors[2], out, s0)
                    else:
                        launch(tensors[0], tensors[1], tensors[2], out)
                except (ValueError, TypeError) as e:
                    fn._refused(plan, tensors, e)
                return out

            return run_like3

        def run_like(tensors: Sequence[Any]) -> Any:
            out = empty_like(tensors[like])
            try:
                launch(*tensors, out, *scalars)
            except (ValueError, TypeError) as e:
                fn._refused(plan, tensors, e)
            return out

        return run_like

    def run(tensors: Sequence[Any]) -> Any:
        outs = [empty(shape, dtype=dtype, device=device) if like is None else empty_like(tensors[like])
                for like, shape, dtype in allocs]
        try:
            launch(*tensors, *outs, *scalars)
        except (ValueError, TypeError) as e:
            fn._refused(plan, tensors, e)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


_is_compiling = torch.compiler.is_compiling  # torch.compile folds it to True while tracing
# The eager call's test of the same, cheaper (~30 ns a call): outside TorchScript,
# `is_compiling()` is `torch.compiler._is_compiling_flag` (set by torch.export, and on newer
# torch for a whole torch.compile session); while Dynamo traces, `is_dynamo_compiling()` is
# folded to True first, so the flag is never read (nor guarded on) in a trace.
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
_compiler: Any = torch.compiler


class _NoFlag:
    """torch.compiler's stand-in for that test on a torch without `_is_compiling_flag`
    (whose `is_compiling` reads something else): the test is then `is_compiling()` itself."""

    _is_compiling_flag = False


if not hasattr(_compiler, "_is_compiling_flag"):
    _is_dynamo_compiling, _compiler = _is_compiling, _NoFlag
# What the op path's plans are keyed by, per tensor, in one C call: its class, shape, dtype,
# device and whether it requires grad.
_TENSOR_FACTS = operator.attrgetter("__class__", "shape", "dtype", "device", "requires_grad")


def _signature(tensors: Sequence[Any], kw: Mapping[str, Any]) -> tuple:
    """The key of an eager call's plan, one flat tuple: per tensor its class (a subclass,
    such as a fake tensor, takes the op), shape, dtype, device index (`get_device()`: -1
    off CUDA) and whether it requires grad (autograd takes the op); then the keywords'
    (name, value) pairs, then their values' types (1, 1.0 and True are equal keys but not
    the same call). Flat, with the device as an int, it costs ~120 ns less a call than
    per-tensor tuples holding `torch.device`s (hashing and comparing those dominates).
    It reads back one way: a tensor's five facts start with a type, a keyword's pair is a
    2-tuple. The device index alone cannot tell a CPU tensor from a meta one (both -1):
    no plan is ever made for a CPU tensor (the call is refused), and a meta tensor's is
    None (the op), whose plans are keyed by the devices themselves: it refuses CPU
    tensors in the same words. A torch build has one
    accelerator device type, so a non-negative index is a CUDA device. Hashing the key
    raises a TypeError where a value is unhashable (or a shape symbolic); a non-tensor
    raises AttributeError. `TorchKernelFn.__call__` builds the same key inline."""
    key: tuple = ()
    for a in tensors:
        key = (*key, a.__class__, a.shape, a.dtype, a.get_device(), a.requires_grad)
    if kw:
        key = (*key, *kw.items(), *map(type, kw.values()))
    return key


# id -> kernel, for `_op_plan` (whose arguments must be constants); a kernel set dropped is freed
_kernels: weakref.WeakValueDictionary[str, TorchKernelFn] = weakref.WeakValueDictionary()


@torch.compiler.assume_constant_result
def _op_plan(kernel: str, shapes: tuple, dtypes: tuple, devices: tuple, keywords: tuple,
             given: tuple) -> tuple:
    return _kernels[kernel]._op_plan(shapes, dtypes, devices, keywords, given)


class TorchKernelFn(calls.KernelBase):
    """A kernel of the cache, callable from PyTorch: `kernel(*tensors, **keywords)` returns
    the result tensor, or a tuple of them; an `inout` tensor is written in place and
    returned (the tensor passed)."""

    _dims = TORCH_DIMS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[tuple, _Eager | None] = {}  # signature -> eager plan (None: the op)
        self._plans_lock = threading.Lock()
        self._op_plans: dict[tuple, tuple] = {}  # the op path's plans, called eagerly (autograd)
        self._op_launches: dict[tuple, _Eager] = {}  # the op's implementation's plans
        self._id = f"{self.name}@{id(self):x}"  # a str: torch.compile never makes it a dynamic int
        _kernels[self._id] = self

    @staticmethod
    def _dtype_name(a: Any) -> str:
        return a.dtype if isinstance(a, _Spec) else _dtype_name(a.dtype)

    def select(self, *arrays: Any, **keywords: Any) -> tuple[Build, dict[str, int]]:
        try:
            return super().select(*arrays, **keywords)
        except CuteccError as e:
            raise _as_call_error(e) from None

    def __call__(self, *tensors: Any, **kw: Any) -> Any:
        # The eager fast path: one dict lookup by the call's signature (`_signature`, built
        # here without its calls for one to three tensors) gives the plan the contract
        # decided for it, checked when the signature was first seen.
        if not (_is_dynamo_compiling() or _compiler._is_compiling_flag):
            n = len(tensors)
            try:
                if n == 2:
                    a, b = tensors
                    key = (a.__class__, a.shape, a.dtype, a.get_device(), a.requires_grad,
                           b.__class__, b.shape, b.dtype, b.get_device(), b.requires_grad)
                elif n == 1:
                    a, = tensors
                    key = (a.__class__, a.shape, a.dtype, a.get_device(), a.requires_grad)
                elif n == 3:
                    a, b, c = tensors
                    key = (a.__class__, a.shape, a.dtype, a.get_device(), a.requires_grad,
                           b.__class__, b.shape, b.dtype, b.get_device(), b.requires_grad,
                           c.__class__, c.shape, c.dtype, c.get_device(), c.requires_grad)
                else:
                    key = _signature(tensors, {})
                if kw:
                    key = (*key, *kw.items(), *map(type, kw.values()))
                plan = self._plans[key]
            except (KeyError, AttributeError, TypeError):  # a new signature, a non-tensor, unhashable
                return self._call(tensors, kw)
            if plan is not None:
                return plan.run(tensors)
        return self._call(tensors, kw)

    def _call(self, tensors: Sequence[Any], kw: Mapping[str, Any], every: bool = False) -> Any:
        """The call, eagerly where it can be, else through the op; with `every`, all the
        kernel's results by name, saved ones too (for a composite's later launches). A call
        no build serves goes to the kernel's declared `fallback_torch` (a plain PyTorch
        function: autograd differentiates it), where there is one."""
        if self._fallback is not None and not every:
            served, out = self._served_by_fallback(
                tensors, kw, {k: v for k, v in kw.items() if k in self._keywords}, once=True)
            if served:
                return out
        if not _is_compiling():
            plan = self._plan_of(tensors, kw)
            if plan is not None:
                return self._run(plan, tensors, every) if every else plan.run(tensors)
        return self._through_op(tensors, kw, every)

    # The eager path: the tvm-ffi function called directly ----------------------------------

    def _plan_of(self, tensors: Sequence[Any], kw: Mapping[str, Any]) -> _Eager | None:
        """The cached plan of an eager call, or None where the call must take the op: fake
        or meta tensors, autograd, an unhashable keyword. Keyed by `_signature`, so the
        contract is checked once per signature."""
        for i, a in enumerate(tensors):
            if not isinstance(a, torch.Tensor):
                raise KernelTypeError(f"argument {i} is a {type(a).__name__}, not a tensor (runtime "
                                      "scalars are keyword arguments)", where=f'kernel "{self.name}"',
                                      exit_code=1)
        key = _signature(tensors, kw)
        try:
            return self._plans[key]
        except KeyError:
            pass
        except TypeError:  # unhashable
            return None
        plan = self._make_plan(tensors, kw)
        with self._plans_lock:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _make_plan(self, tensors: Sequence[Any], kw: Mapping[str, Any]) -> _Eager | None:
        if any(type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter for a in tensors):
            return None  # a tensor subclass (fake tensors): the op sees it through
        if any(a.requires_grad for a in tensors):  # autograd, or (under no_grad) a tensor DLPack
            return None  # exports detached
        device = self._device_of(tensors)
        if device.type == "meta":
            return None  # shapes only: the op's fake implementation
        build, env, scalars = self._choose(tensors, kw)
        return _Eager(self, build, env, scalars, device)

    def _run(self, plan: _Eager, tensors: Sequence[Any], every: bool = False) -> Any:
        """An eager call: buffers checked, results allocated from the contract, the kernel
        launched on torch's current stream (tvm-ffi passes it to the call)."""
        if plan.simple:  # dense row-major tensors in, fresh outputs out
            outs = plan.run(tensors)
            if every:
                outs = outs if isinstance(outs, tuple) else (outs,)
                return {r[-1]: o for r, o in zip(plan.results, outs)}
            return outs
        bufs = self._buffers(tensors, plan.inputs)
        self._check_aligned(bufs, plan)
        ffi_in = bufs + [torch.zeros(s, dtype=d, device=plan.device) for s, d in plan.zeroed]
        res = [ffi_in[a] if isinstance(a, int) else torch.empty(a[0], dtype=a[1], device=plan.device)
               for a in plan.allocs]
        plan.launch(*ffi_in, *res, *plan.scalars)
        return self._post(plan.results, tensors, bufs, [r for r, keep in zip(res, plan.own) if keep],
                          every)

    def _refused(self, plan: _Eager, tensors: Sequence[Any], e: Exception) -> None:
        """The kernel refused a simple plan's call (its wrapper's argument checks): the
        error in torch's terms naming the argument, or the kernel's own where these checks
        find nothing (it is raised again)."""
        try:
            self._buffers(tensors, plan.inputs)
            self._check_aligned(tensors, plan)
        except KernelCallError as mine:
            raise mine from e
        raise e

    def _buffers(self, tensors: Sequence[Any], inputs: tuple) -> list[Any]:
        """The dense buffers the kernel reads (each in its declared order), or an error
        naming the argument that is not one."""
        bufs = []
        for a, spec in zip(tensors, inputs):
            perm = spec[0]
            b = a if perm is None else a.permute(perm).contiguous()
            if not b.is_contiguous():
                self._not_contiguous(a, spec)
            bufs.append(b)
        return bufs

    def _check_aligned(self, bufs: Sequence[Any], plan: _Eager) -> None:
        for b, spec, align in zip(bufs, plan.inputs, plan.aligns):
            if b.data_ptr() % align:
                self._misaligned(b, spec, align)

    def _misaligned(self, a: Any, spec: tuple, align: int) -> None:
        """The kernel was compiled assuming `align`-byte aligned data (the contract's `align`,
        16 by default: 128-bit vector accesses); a view at an offset may not be."""
        raise KernelCallError(f"{spec[1]}: its data starts at an address that is not a multiple of "
                              f"{align} bytes (a view at offset {a.storage_offset()}), which the kernel "
                              f"assumes: pass {spec[1]}.clone()", where=f'kernel "{self.name}"',
                              exit_code=1)

    def _not_contiguous(self, a: Any, spec: tuple) -> None:
        _, name, padded = spec
        what = "the padded tensor (whole, not a slice of it)" if padded else "a dense tensor"
        raise KernelCallError(f"{name}: not contiguous (strides {tuple(a.stride())}); the kernel reads "
                              f"{what}: pass {name}.contiguous()", where=f'kernel "{self.name}"',
                              exit_code=1)

    @staticmethod
    def _post(results: tuple, tensors: Sequence[Any], bufs: Sequence[Any], got: list[Any],
              every: bool = False) -> Any:
        """What the call returns from the kernel's result buffers `got` (the non-inout ones):
        logical layouts, inout tensors (written back where laid out otherwise: the tensor
        passed is what comes back), declared reductions summed, saved results dropped (with
        `every`, all by name)."""
        got = list(got)
        outs: list[Any] = []
        named: dict[str, Any] = {}
        for inout, perm, reduce, saved, name in results:
            if inout is not None:
                if bufs[inout] is not tensors[inout]:
                    tensors[inout].copy_(bufs[inout].permute(perm))
                o = tensors[inout]
            else:
                o = got.pop(0)
                o = o if perm is None else o.permute(perm)
            o = o.sum(dim=0, dtype=o.dtype) if reduce else o
            named[name] = o
            if not saved:
                outs.append(o)
        if every:
            return named
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _device_of(self, tensors: Sequence[Any]) -> Any:
        devices = {a.device for a in tensors}
        if len(devices) > 1:
            raise KernelCallError(f"tensors on several devices ({', '.join(sorted(map(str, devices)))}); "
                                  "a call needs all of them on one CUDA device",
                                  where=f'kernel "{self.name}"', exit_code=1)
        device = next(iter(devices)) if devices else torch.device("cuda", torch.cuda.current_device())
        if device.type not in DEVICE_TYPES:
            raise KernelCallError(f"tensors on {device}; cutecc kernels run on CUDA devices: move them "
                                  f"with .cuda() (built for {self.arch}:{self._signatures()})",
                                  where=f'kernel "{self.name}"', exit_code=1)
        return device

    def _signatures(self) -> str:
        return "".join(f"\n  {b.variant}{b.signature()}" for b in self.builds)

    def _choose(self, tensors: Sequence[Any], kw: Mapping[str, Any]) -> tuple[Build, dict[str, Any], list]:
        """The build, symbol bindings and runtime scalars (values, launcher order) of a call."""
        keywords = {k: v for k, v in kw.items() if k in self._keywords}
        given = {k: v for k, v in kw.items() if k not in self._keywords}
        build, env = self.select(*tensors, **keywords)
        if self.tuning is not None:
            build = self.tuning.pick(build, env)
        try:
            sc = calls.attrs(self.name, build.conv.scalars, given, self._keywords, env, TORCH_DIMS,
                             _torch_scalar)
        except CuteccError as e:
            raise _as_call_error(e) from None
        return build, env, [v for _, _, v in sc]

    # The custom-op path (compiling, autograd, fake tensors) ----------------------------------

    def _through_op(self, tensors: Sequence[Any], kw: Mapping[str, Any], every: bool = False) -> Any:
        """The call through the build's custom op. What the contract decides (the build,
        layouts, which scalars go where) is computed by `_op_plan` from the tensors' shapes,
        dtypes and devices and the call keywords, which torch.compile takes as a constant of
        the trace (no graph break); the runtime scalars' values stay values of the trace (a
        new `eps` is no new plan). What is traced is the op and the torch ops around it."""
        for i, a in enumerate(tensors):
            if not isinstance(a, torch.Tensor):
                raise KernelTypeError(f"argument {i} is a {type(a).__name__}, not a tensor (runtime "
                                      "scalars are keyword arguments)", where=f'kernel "{self.name}"',
                                      exit_code=1)
        if _is_compiling():
            name, key, scalars, inputs, results = _op_plan(self._id, *self._op_args(tensors, kw))
        else:  # eagerly (autograd): planned once per signature, values checked as eagerly
            try:
                # keyed by the devices themselves: a CPU call must not find a meta call's plan
                ck: tuple | None = (*map(_TENSOR_FACTS, tensors), *_signature((), kw))
                plan = self._op_plans.get(ck)  # type: ignore[arg-type]
            except TypeError:
                ck, plan = None, None
            if plan is None:
                plan = self._op_plan(*self._op_args(tensors, kw))
                self._choose(tensors, kw)
                if ck is not None:
                    with self._plans_lock:
                        if len(self._op_plans) >= MAX_PLANS:
                            self._op_plans.clear()
                        self._op_plans[ck] = plan
            name, key, scalars, inputs, results = plan
        values = [kw.get(n, d) for n, d in scalars]
        bufs = self._buffers(tensors, inputs)
        got = getattr(getattr(torch.ops, NAMESPACE), name).default(*bufs, *values, key)
        got = [] if got is None else list(got) if isinstance(got, (tuple, list)) else [got]
        return self._post(results, tensors, bufs, got, every)

    def _op_args(self, tensors: Sequence[Any], kw: Mapping[str, Any]) -> tuple:
        """`_op_plan`'s arguments for a call: the tensors' shapes (a SymInt is guarded to
        a constant), dtypes and devices, the call keywords (each the built value equal to
        it: a constant even if traced) and the runtime scalars passed, with their types."""
        keywords, given = [], []
        for k in sorted(kw):
            v = kw[k]
            if k in self._keywords:
                v = next((w for w in self._keywords[k] if calls._same(w, v)), v)
                keywords.append((k, v))
            else:
                given.append((k, "Tensor" if isinstance(v, torch.Tensor) else type(v).__name__))
        return (tuple(tuple(operator.index(d) for d in a.shape) for a in tensors),
                tuple(_dtype_name(a.dtype) for a in tensors), tuple(str(a.device) for a in tensors),
                tuple(keywords), tuple(given))

    def _op_plan(self, shapes: tuple, dtypes: tuple, devices: tuple, keywords: tuple,
                 given: tuple) -> tuple:
        """What a call through the op needs, as constants: the op's name, the build's key,
        per runtime scalar (launcher order) its name and its value when the call does not
        pass it (default or derived), and the build's `_layouts`. `given` names the scalars
        the call passes, with their Python types (checked against the dtypes)."""
        if len(set(devices)) > 1:
            raise KernelCallError(f"tensors on several devices ({', '.join(sorted(set(devices)))}); "
                                  "a call needs all of them on one CUDA device",
                                  where=f'kernel "{self.name}"', exit_code=1)
        if devices and devices[0].split(":")[0] not in DEVICE_TYPES:
            raise KernelCallError(f"tensors on {devices[0]}; cutecc kernels run on CUDA devices: move "
                                  f"them with .cuda() (built for {self.arch}:{self._signatures()})",
                                  where=f'kernel "{self.name}"', exit_code=1)
        stand_in = {"float": 0.0, "int": 0, "bool": False, "SymFloat": 0.0, "SymInt": 0, "SymBool": False,
                    "Tensor": torch.zeros(())}
        kw = {**dict(keywords), **{k: stand_in.get(t, t) for k, t in given}}
        build, _, values = self._choose([_Spec(sh, dt) for sh, dt in zip(shapes, dtypes)], kw)
        _op(self, build)
        passed = dict(given)
        scalars = tuple((s.name, None if s.name in passed and s.value is None else v)
                        for s, v in zip(build.conv.scalars, values))
        return (op_name(self.name, build), build.key, scalars, *_layouts(build))

    def _launch(self, build: Build, bufs: Sequence[Any], scalars: Sequence[Any]) -> list[Any]:
        """The op's real implementation: run `build` on the input buffers; returns the
        buffers of its non-inout results. The call checked its tensors; a compiler may still
        hand the op other strides or a view at an offset (inductor's buffers): such an input
        is copied to a fresh dense buffer (and an inout one written back after). Tensors that
        require grad are passed detached (DLPack exports no autograd state). What to
        allocate is planned once per build, buffers' signature and scalars' values."""
        key: tuple | None = (build.key, tuple(map(_TENSOR_FACTS, bufs)), tuple(scalars))
        try:
            plan = self._op_launches.get(key)  # type: ignore[arg-type]
        except TypeError:  # a symbolic shape, an unhashable scalar
            key, plan = None, None
        if plan is None:
            plan = _Eager(self, build, _env_of(build, bufs), scalars, self._device_of(bufs))
            if key is not None:
                with self._plans_lock:
                    if len(self._op_launches) >= MAX_PLANS:
                        self._op_launches.clear()
                    self._op_launches[key] = plan
        fixed = []
        for b, align in zip(bufs, plan.aligns):
            if b.requires_grad:
                b = b.detach()
            if not b.is_contiguous() or b.data_ptr() % align:
                b = torch.empty(b.shape, dtype=b.dtype, device=b.device).copy_(b)
            fixed.append(b)
        ffi_in = fixed + [torch.zeros(s, dtype=d, device=plan.device) for s, d in plan.zeroed]
        res = [ffi_in[a] if isinstance(a, int) else torch.empty(a[0], dtype=a[1], device=plan.device)
               for a in plan.allocs]
        plan.launch(*ffi_in, *res, *plan.scalars)
        for i, _ in build.conv.aliases:
            if fixed[i].data_ptr() != bufs[i].data_ptr():
                bufs[i].copy_(fixed[i])
        return [r for r, keep in zip(res, plan.own) if keep]

    def _backward(self, build: Build, xs: Sequence[Any], outs: Mapping[str, Any],
                  cts: Mapping[str, Any], scalars: Mapping[str, Any]) -> list[Any]:
        """The gradients of the forward's logical inputs (None where none is given), from
        the paired backward kernel: inputs then cotangents, or a named pairing's arguments."""
        back = self._owner.get(self.backward) if self._owner is not None and self.backward else None
        if back is None and self.backward:
            raise NotImplementedError(
                f"cutecc kernel '{self.name}' is paired with '{self.backward}', which is not in this "
                "kernel set (load it too)")
        if back is None:
            raise NotImplementedError(
                f"cutecc kernel '{self.name}' has no derivative rule. Pair it with a backward kernel "
                f'in the manifest (grad = {{ backward = "..." }}) to use torch.autograd, or wrap the '
                "call in a torch.autograd.Function yourself.")
        conv = build.conv
        bkw = {k: v for k, v in build.call if k in back._keywords}
        bkw.update({k: v for k, v in scalars.items()
                    if k in back.scalar_names() and any(s.name == k for s in conv.given)})
        visible = [t.name for t in conv.visible]
        names = [t.name for t in conv.inputs]
        if self.grad is None:
            g = back._call((*xs, *(cts[n] for n in visible)), bkw)
            g = list(g) if isinstance(g, tuple) else [g]
            return g + [None] * (len(xs) - len(g))
        have = {**dict(zip(names, xs)), **outs, **{f"cotangent.{n}": cts[n] for n in visible}}
        g = back._call(tuple(have[n] for n in self.grad["args"]), bkw)
        g = dict(zip(self.grad["returns"] or names, g if isinstance(g, tuple) else (g,)))
        return [g.get(n) for n in names]


class TorchCompositeFn(CompositeBase):
    """A composite kernel from PyTorch (see `cutecc.runtime.composite_call`). Each launch is a
    kernel of the set (eager or through its op), so a composite compiles and serves as a
    backward."""

    _noun = "tensor"

    def __call__(self, *tensors: Any, **kw: Any) -> Any:
        return self._call(tensors, kw)

    def _call(self, tensors: Sequence[Any], kw: Mapping[str, Any], every: bool = False) -> Any:
        return self._run(tensors, kw, every)

    def _launch(self, fn: Any, args: tuple[Any, ...], kw: Mapping[str, Any],
                given: Sequence[Any]) -> Mapping[str, Any]:
        # A launch writing a tensor in place (FA4's postprocess writes dq over dout) gets a
        # copy of one the caller passed: the call is functional, as for JAX (the caller's
        # dout may be autograd's cotangent or the user's own tensor).
        written = {t.name for b in fn.builds for t in b.conv.inputs if t.role == "inout"}
        if written:
            callers = {id(t) for t in given}
            args = tuple(a.clone() if n in written and id(a) in callers else a
                         for n, a in zip(fn.input_names(), args))
        return fn._call(args, kw, every=True)


def build_function(kernel: str, build: Build) -> Any:
    """The build's `tvm_ffi.Function`, verified and loaded once per process (as for JAX)."""
    return library.load_function(build.key, build.library, build.sha256, build.size, build.symbol,
                                 f"kernel \"{kernel}\" {build.label}", record_use=build.record_use,
                                 runtime=build.runtime)


class TorchKernelSet(KernelSet):
    """The kernels of a cache usable on this GPU's arch, callable from PyTorch:
    `ks.rmsnorm(x, w, eps=1e-5)`."""

    def _kernel(self, name: str) -> Any:
        fn = super()._kernel(name)
        self.__dict__[name] = fn  # later `ks.name` is a plain attribute lookup (eager calls)
        return fn

    def register_all(self) -> list[str]:
        """Define every usable build's custom op (e.g. before loading a compiled artifact
        that calls them); returns their qualified names."""
        out = []
        for n in sorted(self._names):
            fn = self._kernel(n)
            for b in fn.builds:
                _op(fn, b)
                out.append(f"{NAMESPACE}::{op_name(n, b)}")
        return out

    def disabled_safety_checks(self) -> list[Any]:
        raise AttributeError("disabled_safety_checks is for jax.export; the PyTorch kernel set has none")


def device_arch() -> str | None:
    """`$CUTECC_ARCH`, else the current CUDA device's arch as torch sees it (`sm_90` for
    compute capability 9.0), else None."""
    import os

    from cutecc import environ
    from cutecc.archs import check_arch

    env = os.environ.get(environ.ARCH)
    if env:
        return check_arch(env, f"${environ.ARCH}")
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def device_kind() -> str | None:
    """The current GPU's name as the tuning records name it (`NVIDIA H100 80GB HBM3`);
    without a GPU, `$CUTECC_DEVICE_KIND`, else None."""
    import os

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return os.environ.get("CUTECC_DEVICE_KIND") or None


FRONT = FrontEnd("PyTorch", TorchKernelFn, TorchCompositeFn, TorchKernelSet, device_arch, device_kind)


def load(cache_dir: str | Path | None = None, *, arch: str | None = None,
         kernels: tuple[str, ...] | list[str] | None = None,
         manifest: str | Path | None = None, strict: bool = False,
         lock: str | Path | None = None, package: str | None = None,
         trusted_keys: list[str | Path] | None = None, allow_unsigned: bool = False) -> TorchKernelSet:
    """Load the kernels of a cache (or an installed pack) for this GPU, or for `arch`
    (e.g. `sm_90a`, to trace with fake tensors on a machine without one). Arguments,
    sources, integrity and trust checks are `cutecc.load`'s (see its docstring): the same
    entries are chosen and their bytes verified before any library is opened."""
    ks = load_with(FRONT, cache_dir, arch=arch, kernels=kernels, manifest=manifest, strict=strict,
                   lock=lock, package=package, trusted_keys=trusted_keys,
                   allow_unsigned=allow_unsigned)
    assert isinstance(ks, TorchKernelSet)
    for name in ks:  # each kernel's entries read now (no library is opened), so that a first
        ks.get(name)  # use inside torch.compile traces no file access
    return ks
