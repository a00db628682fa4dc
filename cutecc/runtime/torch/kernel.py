"""A kernel (and a composite) of the cache callable from PyTorch, the kernel set, the
device it serves and `load`."""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cutecc.errors import CuteccError
from cutecc.runtime import calls, scalar_values
from cutecc.runtime.calls import Build
from cutecc.runtime.composite_call import CompositeBase
from cutecc.runtime.loader import FrontEnd, KernelSet, load_with
from cutecc.runtime.runtime_settings import RuntimeSettings
from cutecc.runtime.torch.conversions import (
    _TENSOR_FACTS,
    TORCH_DIMS,
    KernelCallError,
    KernelTypeError,
    _as_call_error,
    _dtype_name,
    _env_of,
    _layouts,
    _Spec,
    _torch_scalar,
)
from cutecc.runtime.torch.eager import _compiler, _Eager, _is_compiling, _is_dynamo_compiling, _signature
from cutecc.runtime.torch.op import NAMESPACE, _op, op_name
from cutecc.runtime.variant_choice import ABSENT

DEVICE_TYPES = ("cuda", "meta")  # where a call's tensors may live (meta: shapes only)
MAX_PLANS = 1024  # eager call plans kept per kernel (one per shapes, dtypes, device, keywords)


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
        if ABSENT in kw:
            raise KernelTypeError(f"unknown keyword argument {ABSENT!r}", where=f'kernel "{self.name}"')
        if any(t is None for t in tensors):  # None in an optional slot picks its variant
            try:
                tensors, absent = self._without_none(tensors)
            except CuteccError as e:
                raise _as_call_error(e) from None
            kw = {**kw, ABSENT: absent}
        # The eager fast path: one dict lookup by the call's signature (`_signature`, built
        # here without its calls for one to three tensors) gives the plan the contract
        # decided for it, checked when the signature was first seen.
        if not (_is_dynamo_compiling() or _compiler._is_compiling_flag):
            n = len(tensors)
            key: tuple
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
                tensors, {k: v for k, v in kw.items() if k != ABSENT},
                {k: v for k, v in kw.items() if k in self._keywords or k == ABSENT}, once=True)
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
                                      "scalars are keyword arguments)", where=f'kernel "{self.name}"')
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
                              f"assumes: pass {spec[1]}.clone()", where=f'kernel "{self.name}"')

    def _not_contiguous(self, a: Any, spec: tuple) -> None:
        _, name, padded = spec
        what = "the padded tensor (whole, not a slice of it)" if padded else "a dense tensor"
        raise KernelCallError(f"{name}: not contiguous (strides {tuple(a.stride())}); the kernel reads "
                              f"{what}: pass {name}.contiguous()", where=f'kernel "{self.name}"')

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
                                  where=f'kernel "{self.name}"')
        device = next(iter(devices)) if devices else torch.device("cuda", torch.cuda.current_device())
        if device.type not in DEVICE_TYPES:
            raise KernelCallError(f"tensors on {device}; cutecc kernels run on CUDA devices: move them "
                                  f"with .cuda() (built for {self.arch}:{self._signatures()})",
                                  where=f'kernel "{self.name}"')
        return device

    def _signatures(self) -> str:
        return "".join(f"\n  {b.variant}{b.signature()}" for b in self.builds)

    def _choose(self, tensors: Sequence[Any], kw: Mapping[str, Any]) -> tuple[Build, dict[str, Any], list]:
        """The build, symbol bindings and runtime scalars (values, launcher order) of a call."""
        # the call keywords, and the optional slots the call passed None in (`without_none`)
        keywords = {k: v for k, v in kw.items() if k in self._keywords or k == ABSENT}
        given = {k: v for k, v in kw.items() if k not in keywords}
        build, env = self.select(*tensors, **keywords)
        if self.tuning is not None:
            build = self.tuning.pick(build, env)
        try:
            sc = scalar_values.attrs(self.name, build.conv.scalars, given, self._keywords, env,
                                     TORCH_DIMS, _torch_scalar)
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
                                      "scalars are keyword arguments)", where=f'kernel "{self.name}"')
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
            if k == ABSENT:  # the optional slots passed None: a constant of the trace
                keywords.append((k, v))
            elif k in self._keywords:
                v = self._keyword(k, v)
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
                                  where=f'kernel "{self.name}"')
        if devices and devices[0].split(":")[0] not in DEVICE_TYPES:
            raise KernelCallError(f"tensors on {devices[0]}; cutecc kernels run on CUDA devices: move "
                                  f"them with .cuda() (built for {self.arch}:{self._signatures()})",
                                  where=f'kernel "{self.name}"')
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
        # A launch writing a tensor in place gets a copy of one the caller passed: the call
        # is functional, as for JAX (the caller's tensor may be autograd's cotangent or the
        # user's own). A launch that sizes a fresh output by a tensor passed `extents_only`
        # (FA4's postprocess: dq by q) writes none and copies none.
        written = {t.name for b in fn.builds for t in b.conv.inputs if t.role == "inout"}
        if written:
            callers = {id(t) for t in given}
            args = tuple(a.clone() if n in written and id(a) in callers else a
                         for n, a in zip(fn.input_names(), args))
        return fn._call(args, kw, every=True)


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


def device_arch(given: RuntimeSettings | None = None) -> str | None:
    """`$CUTECC_ARCH` (as `given` read it; None: read now), else the current CUDA device's
    arch as torch sees it (`sm_90` for compute capability 9.0), else None."""
    rs = RuntimeSettings.from_environment() if given is None else given
    if rs.arch:
        return rs.arch  # checked as an arch name where it was read
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def device_kind(given: RuntimeSettings | None = None) -> str | None:
    """The current GPU's name as the tuning records name it (`NVIDIA H100 80GB HBM3`);
    without a GPU, `$CUTECC_DEVICE_KIND` (as `given` read it; None: read now), else None."""
    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name())
    return (RuntimeSettings.from_environment() if given is None else given).device_kind


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
