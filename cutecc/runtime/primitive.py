"""`cutecc_call`: the JAX primitive every cutecc kernel call binds.

It carries the FFI target and the output contract as static parameters, so abstract
evaluation needs no kernel code, and it lowers to one `stablehlo.custom_call` through
`jax.ffi.ffi_call`. A call runs where its arrays are: the lowering is refused only where the
computation being lowered spans several devices and the call is no single device's part of
it (`jax.shard_map`, a shard rule's per-device body), see `cutecc.runtime.placement`.
Differentiation and batching of a bare call raise errors that name the kernel and say what
to do (pair a backward kernel; add a batch dimension to the contract), rather than JAX's
generic ones.
"""

from __future__ import annotations

import contextvars
import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, mlir

from cutecc.errors import CopyWarning
from cutecc.runtime.fallback import caller_stacklevel
from cutecc.runtime.placement import check_lowering

try:  # what jax.extend.core.Primitive is; `import jax.extend` also imports Pallas (~30 ms)
    from jax._src.core import Primitive
except ImportError:  # pragma: no cover  (a JAX that moved it: the public path)
    from jax.extend.core import Primitive

cutecc_call_p = Primitive("cutecc_call")
cutecc_call_p.multiple_results = True

# Params: target (str), kernel (str), results ((shape, dtype name), ...),
#         aliases ((input index, result index), ...), attrs ((name, dtype name, value), ...),
#         inputs (the operands' names, for messages; dropped before a lowering rule)

# Set while an eager call's own `jax.jit` runs (`KernelFn.__call__`): its arguments are the
# caller's arrays, which no caller can donate, so their copies are not warned of.
EAGER: contextvars.ContextVar[bool] = contextvars.ContextVar("cutecc_eager", default=False)
_COPIES_WARNED: set[tuple[str, str]] = set()


def _abstract_eval(*avals: Any, results: tuple, **_: Any) -> list[ShapedArray]:
    """Results of the contract's shapes; inside `shard_map` they vary over the manual mesh
    axes the inputs vary over (the inputs are unified first, see `unify_varying`)."""
    if avals and varying(avals[0]):  # typed like the inputs: keeps their manual axis type
        return [avals[0].update(shape=tuple(shape), dtype=jnp.dtype(dtype), weak_type=False)
                for shape, dtype in results]
    return [ShapedArray(shape, jnp.dtype(dtype)) for shape, dtype in results]


def varying(aval: Any) -> frozenset[str]:
    """The manual mesh axes a value varies over inside `shard_map` (JAX spells this
    `aval.vma` in some releases and `aval.manual_axis_type.varying` in others)."""
    v = getattr(aval, "vma", None)
    if v is None:
        v = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(v or ())


def to_varying(x: Any, axes: tuple[str, ...]) -> Any:
    """`x` made to vary over `axes` (its transpose sums over them)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)  # type: ignore[attr-defined]  # older spelling


def unify_varying(arrays: Any) -> list[Any]:
    """Inside `shard_map`, make every input vary over the union of the manual axes any of
    them varies over, so the call's results have one type and `custom_vjp`'s backward
    matches its primal's inputs (the transpose of that cast is the sum a gradient of a
    replicated input needs). Outside `shard_map` nothing changes."""
    vmas = [varying(jax.typeof(a)) for a in arrays]
    union = frozenset().union(*vmas)
    if not union:
        return list(arrays)
    return [a if v == union else to_varying(a, tuple(sorted(union - v)))
            for a, v in zip(arrays, vmas)]


def _ffi(*args: Any, target: str, kernel: str, results: tuple, aliases: tuple,
         attrs: tuple) -> Any:
    del kernel
    call = jax.ffi.ffi_call(
        target,
        [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype in results],
        input_output_aliases=dict(aliases),
    )
    return call(*args, **{name: np.dtype(dt).type(v) for name, dt, v in attrs})


@functools.lru_cache(maxsize=4096)
def _eager(params: tuple) -> Any:
    kw = dict(params)
    return jax.jit(lambda *a: cutecc_call_p.bind(*a, **kw))


def _impl(*args: Any, **params: Any) -> Any:
    return _eager(tuple(sorted(params.items())))(*args)


def placed(rule: Callable[..., Any]) -> Callable[..., Any]:
    """The lowering `rule` of `cutecc_call`, behind the placement check
    (`cutecc.runtime.placement.check_lowering`): every platform's lowering is registered
    through it, and so is a test's CPU stand-in."""

    def lower(ctx: Any, *args: Any, kernel: str, inputs: tuple[str, ...] = (), **params: Any) -> Any:
        check_lowering(ctx.module_context.axis_context, kernel)
        if not EAGER.get():
            _warn_copies(kernel, args, params.get("aliases", ()), inputs)
        return rule(ctx, *args, kernel=kernel, **params)

    return lower


def _warn_copies(kernel: str, args: Any, aliases: Any, inputs: tuple[str, ...]) -> None:
    """`CopyWarning`, once per kernel and operand, for each operand written in place that is
    an argument of the `jax.jit` being lowered (its `main`) without donation: XLA copies it
    before the call. A value computed in the program, or an argument of an inner function,
    is left to XLA (it reuses a dead buffer)."""
    for i, _ in aliases:
        v = args[i] if i < len(args) else None
        if not isinstance(v, mlir.ir.BlockArgument):
            continue
        func = v.owner.owner
        try:
            if mlir.ir.StringAttr(func.attributes["sym_name"]).value != "main":
                continue
            attrs = mlir.ir.DictAttr(mlir.ir.ArrayAttr(func.attributes["arg_attrs"])[v.arg_number])
        except (KeyError, IndexError, ValueError, TypeError):
            continue  # no argument attributes: nothing is donated
        if "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs:
            continue
        name = inputs[i] if i < len(inputs) else f"operand {i}"
        if (kernel, name) in _COPIES_WARNED:
            continue
        _COPIES_WARNED.add((kernel, name))
        warnings.warn(f'cutecc kernel "{kernel}": {name} is written in place but is an argument of '
                      "the jax.jit being lowered that is not donated, so XLA copies it before every "
                      "call; donate it (jax.jit(f, donate_argnums=...)) or pass a value that is dead "
                      "after the call", CopyWarning, stacklevel=caller_stacklevel())


def _no_lowering(ctx: Any, *args: Any, kernel: str, **_: Any) -> Any:
    platforms = getattr(ctx.module_context, "platforms", ("this platform",))
    raise NotImplementedError(
        f"cutecc kernel '{kernel}' runs on CUDA GPUs only; this computation is being "
        f"lowered for {', '.join(platforms)}")


def _no_jvp(primals: Any, tangents: Any, *, kernel: str, **_: Any) -> Any:
    raise NotImplementedError(
        f"cutecc kernel '{kernel}' has no derivative rule. Pair it with a backward kernel "
        f'in the manifest (grad = {{ backward = "..." }}) to use jax.grad, or wrap the call '
        "in jax.custom_vjp yourself.")


def _no_batch(args: Any, dims: Any, *, kernel: str, **_: Any) -> Any:
    raise NotImplementedError(
        f"cutecc kernel '{kernel}' cannot be batched with jax.vmap: its contract has fixed "
        "ranks. Declare a kernel with a leading batch dimension, or loop with lax.map.")


cutecc_call_p.def_abstract_eval(_abstract_eval)
cutecc_call_p.def_impl(_impl)
# Lowered where the call is, not in a function of its own shared by like calls (JAX's cache of
# primitive lowerings): the rule then sees the program's own values, which `_warn_copies` reads.
try:
    mlir.register_lowering(cutecc_call_p, placed(_no_lowering), cacheable=False)
except TypeError:  # pragma: no cover  (a JAX without that cache)
    mlir.register_lowering(cutecc_call_p, placed(_no_lowering))
mlir.register_lowering(cutecc_call_p, placed(mlir.lower_fun(_ffi, multiple_results=True)), platform="cuda")
ad.primitive_jvps[cutecc_call_p] = _no_jvp
batching.primitive_batchers[cutecc_call_p] = _no_batch
