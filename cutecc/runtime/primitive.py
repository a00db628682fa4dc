"""`cutecc_call`: the JAX primitive every cutecc kernel call binds.

It carries the FFI target and the output contract as static parameters, so abstract
evaluation needs no kernel code, and it lowers to one `stablehlo.custom_call` through
`jax.ffi.ffi_call`. A call runs where its arrays are: the lowering is refused only where the
computation being lowered spans several devices and the call is no single device's part of
it (`jax.shard_map`, a shard rule's per-device body): decided from the lowering's own device
context, never from how many devices the process sees. Differentiation and batching of a
bare call raise errors that name the kernel and say what to do (pair a backward kernel; add
a batch dimension to the contract), rather than JAX's generic ones.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, mlir

from cutecc.errors import CallError

try:  # what jax.extend.core.Primitive is; `import jax.extend` also imports Pallas (~30 ms)
    from jax._src.core import Primitive
except ImportError:  # pragma: no cover  (a JAX that moved it: the public path)
    from jax.extend.core import Primitive

cutecc_call_p = Primitive("cutecc_call")
cutecc_call_p.multiple_results = True

# Params: target (str), kernel (str), results ((shape, dtype name), ...),
#         aliases ((input index, result index), ...), attrs ((name, dtype name, value), ...)


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


def devices_spanned(axis_context: Any) -> int:
    """How many devices one `cutecc_call` lowered in `axis_context` (a lowering's
    `ctx.module_context.axis_context`) would have to compute across: under `jax.jit`, the
    computation's device count (1 when its arrays are on one device, whichever it is);
    inside `jax.shard_map` (or a shard rule's body) the product of the mesh axes not in
    manual mode (1 when every axis is: each device runs its own shard); 1 for a `pmap`
    replica. Read by duck typing: JAX's context classes are private."""
    n = getattr(axis_context, "num_devices", None)
    if n is not None:
        return int(n)
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None:
        manual = set(getattr(axis_context, "manual_axes", ()))
        return math.prod(int(size) for name, size in dict(mesh.shape).items() if name not in manual)
    return 1


def check_placement(ctx: Any, kernel: str) -> None:
    """Refuse a call whose computation spans several devices with no per-device rule: the
    kernel computes on whole arrays, so XLA would have to gather them onto every device
    (never done silently); the error says the three ways to place it."""
    n = devices_spanned(ctx.module_context.axis_context)
    if n > 1:
        raise CallError(
            f"this call is part of a computation over {n} devices, and the kernel has no rule "
            "for running on shards of its arrays. Put all of the call's arrays on one device "
            "(jax.device_put(x, jax.devices()[k]): the call then runs on device k, eagerly or "
            "under jax.jit), call it inside jax.shard_map (each device runs it on its shard), or "
            "declare the axes it is independent along (shard = [..] in the manifest)",
            where=f'kernel "{kernel}"', exit_code=1)


def placed(rule: Callable[..., Any]) -> Callable[..., Any]:
    """The lowering `rule` of `cutecc_call`, behind `check_placement` (every platform's
    lowering is registered through it; a test's CPU stand-in too)."""

    def lower(ctx: Any, *args: Any, kernel: str, **params: Any) -> Any:
        check_placement(ctx, kernel)
        return rule(ctx, *args, kernel=kernel, **params)

    return lower


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
mlir.register_lowering(cutecc_call_p, placed(_no_lowering))
mlir.register_lowering(cutecc_call_p, placed(mlir.lower_fun(_ffi, multiple_results=True)), platform="cuda")
ad.primitive_jvps[cutecc_call_p] = _no_jvp
batching.primitive_batchers[cutecc_call_p] = _no_batch
