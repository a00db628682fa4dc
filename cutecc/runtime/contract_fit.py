"""Whether a call's arrays fit a calling convention, without any framework: the symbol
bindings their shapes give (`conv_mismatch`), how a front end's dimensions compare (`Dims`:
plain ints here, JAX's or torch's symbolic ones in their front ends), and the extents a
call's outputs and buffers take (`extent`, `buffer_shape`). `cutecc.runtime.calls` picks a
build with it; `cutecc misses` proposes contracts with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cutecc.contract import expr
from cutecc.contract.args import CallingConvention, TensorArg, dense_strides, stride_text
from cutecc.errors import CallError

MAX_SYMBOLIC_EXTENT = 2**31 - 1  # `cute.sym_int()` is 32-bit: the contract says so


class Dims:
    """How a front end's dimensions compare: Python (and NumPy) ints here. A subclass
    names the exception its symbolic dimensions raise when a comparison is undecided
    (`inconclusive`) and how to take their min and max."""

    inconclusive: tuple[type[BaseException], ...] = ()

    def concrete(self, n: Any) -> bool:
        """Whether a dimension is a number (not a symbolic one)."""
        return isinstance(n, (int, np.integer))

    def at_least(self, n: Any, want: Any) -> bool:
        """Whether `n >= want` holds; for symbolic dimensions whether it is proved (an
        undecided comparison counts as not proved)."""
        try:
            return bool(n >= want)
        except self.inconclusive:
            return False

    def exceeds(self, n: Any, limit: int) -> bool:
        """Whether extent `n` is over `limit`. A symbolic dimension is checked only as far
        as its constraints decide it: its size is known at run time, where the kernel's own
        argument check (the DSL's TVM-FFI function) refuses an extent outside int32 and any
        divisibility it was compiled with."""
        if self.concrete(n):
            return n > limit
        try:
            return bool(n > limit)
        except self.inconclusive:
            return False

    def min(self, a: Any, b: Any) -> Any:
        return min(a, b)

    def max(self, a: Any, b: Any) -> Any:
        return max(a, b)


PLAIN = Dims()


def conv_mismatch(conv: CallingConvention, shapes: Sequence[tuple[Any, ...]], dtypes: Sequence[str],
                  dims: Dims = PLAIN) -> tuple[dict[str, int] | None, str]:
    """`mismatch` against a calling convention (a manifest's variant, before any build)."""
    ins = conv.inputs
    if len(shapes) != len(ins):
        return None, f"takes {len(ins)} array(s), got {len(shapes)}"
    env: dict[str, int] = {}
    ordered = []  # each shape in the kernel's dimension order (`mode`: passed as held)
    for t, shape, dtype in zip(ins, shapes, dtypes):
        if dtype != t.dtype:
            return None, f"{t.name}: dtype {dtype}, expected {t.dtype}"
        what = "" if t.buffer is None else " (the buffer)"
        if len(shape) != len(t.shape):
            held = [t.extents[p] for p in t.held]
            return None, f"{t.name}: rank {len(shape)}, expected {len(t.shape)} {held}{what}"
        shape = _kernel_order(t, tuple(shape))
        ordered.append(shape)
        at = _caller_dims(t)  # a message names the dimension of the array passed
        for i, n in enumerate(shape):
            # A symbolic dimension (jax.export) must be provably a multiple: `8*k`, not `n`.
            if n % t.multiple(i) != 0:  # symbolic: `==` is True only when JAX proves it
                return None, (f"{t.name}: dimension {at[i]} is {n}, expected a multiple of "
                              f"{t.multiple(i)} (symbols.{t.extents[i]}.divisibility)"
                              + ("" if dims.concrete(n) else "; export it with a symbolic shape that is "
                                 f"one, e.g. \"{t.multiple(i)}*{n}\""))
        for i, (d, n) in enumerate(zip(t.extents, shape)):
            if dims.concrete(n) and n == 0:
                return None, f"{t.name}: dimension {at[i]} is empty"
            if isinstance(d, int):
                if n != d:
                    mine = " (the buffer's extent)" if i in t.padded else ""
                    return None, f"{t.name}: dimension {at[i]} is {n}, expected {d}{mine}"
            elif i not in (t.wide or ()) and dims.exceeds(n, MAX_SYMBOLIC_EXTENT):
                return None, (f"{t.name}: dimension {at[i]} (\"{d}\") is {n}; symbolic extents are "
                              f"compiled as int32, so at most 2^31-1 = {MAX_SYMBOLIC_EXTENT}")
            elif env.setdefault(d, n) != n:
                return None, (f"{t.name}: dimension {at[i]} is {n}, but \"{d}\" is {env[d]} "
                              "from an earlier argument")
    for t, shape in zip(ins, ordered):  # once every symbol is bound: the views fit their buffers
        for i in t.padded:
            if i in (t.broadcast or ()):  # stride 0: any logical extent reads the one element
                continue
            d, n = t.shape[i], shape[i]
            want = d if isinstance(d, int) else env[d]
            # A view JAX cannot prove inside its buffer (symbolic shapes) is refused: nothing
            # checks it at run time.
            if not dims.at_least(n, want):
                named = "" if isinstance(d, int) else f' ("{d}")'
                return None, (f"{t.name}: dimension {_caller_dims(t)[i]} of the buffer is {n}, smaller "
                              f"than the logical extent {want}{named} the kernel views in it")
    # Declared strides (`stride = [..]`): the dense arrays a call passes and gets must have them.
    seen: dict[str, Any] = {}
    for t, shape in zip(ins, ordered):
        if t.stride is not None:
            why = _stride_problem(t, tuple(shape[p] for p in t.perm), seen, dims)
            if why:
                return None, why
    for t in conv.results:
        if t.stride is not None and t.role != "inout":
            try:
                buf = buffer_shape("", t, env, dims)
            except CallError:  # a derived extent that fails says so when the call is made
                continue
            why = _stride_problem(t, buf, seen, dims)
            if why:
                return None, why
    return env, ""


def _stride_problem(t: TensorArg, buffer: tuple[Any, ...], seen: dict[str, Any], dims: Dims) -> str:
    """Why the dense buffer of shape `buffer` (`perm` order) has strides other than `t`
    declares, or "": a static stride must be its stride, a symbolic one a multiple of its
    divisibility and, named twice, the same each time (`seen` collects them). A static
    stride on a dimension of extent 1 is any stride: its one index never addresses memory
    (cutlass_call's `(1,256,64,128):(0,8192,128,1)` takes the dense array's)."""
    at = _caller_dims(t)
    extent = {p: buffer[j] for j, p in enumerate(t.perm)}
    for i, (want, got) in enumerate(zip(t.stride or (), dense_strides(t, buffer))):
        try:
            if isinstance(want, int) and dims.concrete(extent[i]) and extent[i] == 1:
                continue
            if isinstance(want, int):
                if got != want:
                    return (f"{t.name}: dimension {at[i]} has stride {got} in the dense array, but the "
                            f"kernel was compiled for stride {want} (stride = {list(stride_text(t))})")
            elif got % want.divisibility != 0:
                return (f"{t.name}: dimension {at[i]} has stride {got}, not a multiple of "
                        f"{want.divisibility} (symbols.{want.name}.divisibility)")
            elif seen.setdefault(want.name, got) != got:
                return (f"{t.name}: dimension {at[i]} has stride {got}, but stride \"{want.name}\" is "
                        f"{seen[want.name]} from an earlier argument")
        except dims.inconclusive:  # symbolic shapes: the kernel's own check decides at run time
            continue
    return ""


def _kernel_order(t: TensorArg, shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """The shape of the array a call passes for `t`, in the kernel's dimension order (a
    tensor declared with `mode` is passed as the caller holds it: the buffer's order)."""
    if not t.mode:
        return shape
    out: list[Any] = [None] * len(shape)
    for j, p in enumerate(t.held):
        out[p] = shape[j]
    return tuple(out)


def _caller_dims(t: TensorArg) -> tuple[int, ...]:
    """Per kernel dimension of `t`, its index in the array the caller passes."""
    return tuple(t.held.index(i) for i in range(len(t.shape)))


def extent(kernel: str, t: TensorArg, d: Any, env: Mapping[str, Any], dims: Dims = PLAIN) -> Any:
    """An extent's value for a call: static, bound by an input array, or derived (evaluated
    from the bindings; under `jax.export` with symbolic shapes, a symbolic dimension)."""
    if isinstance(d, int):
        return d
    if expr.is_symbol(d):
        return env[d]
    try:
        n = expr.evaluate(d, env, minimum=dims.min, maximum=dims.max)
    except expr.ExprError as e:
        raise CallError(f"{t.name}: derived extent {d!r}: {e}", where=f'kernel "{kernel}"') from None
    if isinstance(n, int) and n <= 0:
        raise CallError(f"{t.name}: derived extent {d!r} is {n} for "
                        + ", ".join(f"{k}={env[k]}" for k in expr.names(d))
                        + "; an extent must be positive", where=f'kernel "{kernel}"')
    return n


def buffer_shape(kernel: str, t: TensorArg, env: Mapping[str, Any],
                 dims: Dims = PLAIN) -> tuple[Any, ...]:
    """The shape of the dense buffer of `t` the kernel sees (its dimensions in `perm` order)."""
    return tuple(extent(kernel, t, t.extents[p], env, dims) for p in t.perm)
