"""A loaded kernel as a JAX-callable: `kernel(*inputs, **keywords) -> result(s)`.

Each call checks its arrays against the contracts of the variants that were built
(count, dtype, rank, static extents, shared symbolic extents, divisibility, and for
a padded tensor that its buffer holds the logical extents), keeps
those whose call keywords (variant parameters the arrays cannot tell apart, such as
`causal=True`) equal the call's, picks the most specific one (the one whose contract
implies the others', `calls.implies`; never one of equals, nor of fits none of which
implies the others: that is an error naming them), computes output shapes from the contract, and binds
the `cutecc_call` primitive. Arrays are logical; a tensor declared with another
layout is transposed to the buffer order the kernel was compiled for (XLA folds a
caller's own `.T` into it), and results back. A tensor declared with `mode`
(cutlass_call's) is passed and returned as the caller holds it: the kernel views it
through the mode, nothing is transposed.
Works eagerly and under `jax.jit`, and a call runs where its arrays are: on the one device
they sit on (committed there or by default), whatever the number of devices; a computation
over several devices calls the kernel inside `jax.shard_map` (each device on its shard), or
under `jax.jit` when the kernel declares the axes it is independent along (`shard = [..]`:
`cutecc.runtime.sharding`), and is refused otherwise when it is lowered
(`cutecc.runtime.placement`). Calls from several threads at once, each on
its own device, share one loaded and registered library per build (`cutecc.runtime.library`).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from cutecc.contract.args import ScalarArg, TensorArg, shard_factors
from cutecc.contract.cotangents import COTANGENT
from cutecc.errors import CallError, CallTypeError
from cutecc.runtime import calls, fallback_mark, scalar_values, sharding, strict
from cutecc.runtime.calls import (  # noqa: F401  (re-exported: tests and tools import them here)
    MAX_SYMBOLIC_EXTENT,
    Build,
    Dims,
    _same,
    _static,
)
from cutecc.runtime.composite_call import CompositeBase
from cutecc.runtime.primitive import EAGER, cutecc_call_p, unify_varying, varying
from cutecc.runtime.variant_choice import ABSENT

MAX_EAGER_SIGNATURES = 256  # jitted eager calls kept per kernel (one per keyword values)


class JaxDims(Dims):
    """JAX's dimensions: ints, or symbolic ones under `jax.export` (whose comparisons JAX
    may leave undecided, and whose min and max are `jax.core.min_dim` / `max_dim`)."""

    inconclusive = (jax.errors.InconclusiveDimensionOperation,)

    def min(self, a: Any, b: Any) -> Any:
        return _min_dim(a, b)

    def max(self, a: Any, b: Any) -> Any:
        return _max_dim(a, b)


JAX_DIMS = JaxDims()


def _mismatch(b: Build, arrays: Sequence[Any]) -> tuple[dict[str, int] | None, str]:
    """(symbol bindings, "") if `arrays` fit `b`'s inputs, else (None, why not)."""
    return calls.mismatch(b, [tuple(a.shape) for a in arrays],
                          [jnp.dtype(a.dtype).name for a in arrays], JAX_DIMS)


def _concrete(n: Any) -> bool:
    """Whether a dimension is a number (not a symbolic one of `jax.export`)."""
    return JAX_DIMS.concrete(n)


def _buffer_shape(kernel: str, t: TensorArg, env: Mapping[str, Any]) -> tuple[Any, ...]:
    """The shape of the dense buffer of `t` the kernel sees (its dimensions in `perm` order)."""
    return calls.buffer_shape(kernel, t, env, JAX_DIMS)


def _jax_scalar(kernel: str, s: ScalarArg, v: Any) -> Any:
    """A runtime scalar as JAX may pass it: a Python, NumPy or concrete 0-d JAX number, never
    a traced value (it travels as an FFI attribute, fixed when the call is traced)."""
    if isinstance(v, jax.core.Tracer) or (isinstance(v, jax.Array) and v.ndim):
        raise CallTypeError(f"runtime scalar {s.name!r} must be a Python or NumPy number "
                            "known when the call is traced (it travels as an FFI attribute), "
                            "not a traced or array value", where=f'kernel "{kernel}"')
    if isinstance(v, jax.Array):
        return v.item()
    return scalar_values.plain_scalar(kernel, s, v)


def _attrs(kernel: str, declared: Sequence[ScalarArg], given: Mapping[str, Any],
           keywords: Collection[str] = (), env: Mapping[str, Any] | None = None) -> tuple:
    """The runtime scalars' FFI attributes (see `scalar_values.attrs`)."""
    return scalar_values.attrs(kernel, declared, given, keywords, env, JAX_DIMS, _jax_scalar)


class KernelFn(calls.KernelBase):
    """A kernel of the cache, callable from JAX with the canonical convention."""

    _dims = JAX_DIMS
    _out_of_place: KernelFn | None = None  # set on the view `in_place` returns: the kernel itself

    @staticmethod
    def _dtype_name(a: Any) -> str:
        return jnp.dtype(a.dtype).name

    @property
    def in_place(self) -> KernelFn:
        """This kernel with each output declared `may_alias = "x"` written in the memory of
        input x: XLA reuses x's buffer where x is dead after the call (a loop carry, a
        donated argument, an intermediate used once) and copies x first where it stays live
        (a jit argument not donated, a value used again). Use it where the input is dead;
        the plain call never costs such a copy. An eager call runs the plain call (its
        arguments stay the caller's: nothing to reuse)."""
        if self._out_of_place is not None:
            return self
        view = self.__dict__.get("_in_place_view")
        if view is None:
            if not self.builds:
                self.select()  # raises: no usable build here, and why
            if not any(b.conv.may_aliases for b in self.builds):
                inout = [t.name for b in self.builds[:1] for t in b.conv.inputs if t.role == "inout"]
                raise CallError("no output of it may be written in an input's memory: declare "
                                'one in the manifest (may_alias = "<input>" on the output) '
                                + (f"; its inout {', '.join(inout)} is always written in place "
                                   "(donate it: jax.jit(..., donate_argnums=...))" if inout else ""),
                                where=f'kernel "{self.name}"')
            view = copy.copy(self)
            view._out_of_place = self
            view._eager = {}
            self.__dict__["_in_place_view"] = view
        return view

    def __call__(self, *arrays: Any, **scalars: Any) -> Any:
        if ABSENT in scalars:
            raise CallTypeError(f"unknown keyword argument {ABSENT!r}", where=f'kernel "{self.name}"')
        arrays, absent = self._without_none(arrays)  # None in an optional slot picks its variant
        if absent is not None:
            scalars = {**scalars, ABSENT: absent}
        for i, a in enumerate(arrays):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise CallTypeError(f"argument {i} is a {type(a).__name__}, not an array "
                                    "(runtime scalars are keyword arguments)",
                                    where=f'kernel "{self.name}"')
        if not any(isinstance(a, jax.core.Tracer) for a in arrays):
            fn = (self._out_of_place or self)._eager_fn(scalars)
            if fn is not None:
                eager = EAGER.set(True)  # the caller's arrays: theirs to keep, no copy warned of
                try:
                    return fn(*arrays)
                except ValueError:  # JAX's refusal of committed arrays on different devices
                    spread = _spread(self.name, arrays)
                    if spread is None:
                        raise
                finally:
                    EAGER.reset(eager)
                raise spread from None  # in cutecc's words: which devices, and what to do
        return self._traced(arrays, scalars)

    def _served(self, out: Any, use: Any, once: bool) -> Any:
        """The fallback's result, its use recorded where the call is lowered or run, never
        where it is only traced (`jax.eval_shape`, `custom_partitioning`'s global trace)."""
        return fallback_mark.marked(out, use)

    def _eager_fn(self, scalars: Mapping[str, Any]) -> Any:
        """A call outside any transformation runs as one cached `jax.jit` of the whole call,
        so choosing the variant, checking scalars and (for a grad-paired kernel) building
        its `custom_vjp` happen once per signature, in jit's trace, instead of on every
        call: an eager call then costs one jit dispatch, as an XLA op's eager call does.
        Keyed by the keyword values and their types (1, 1.0 and True hash alike but are
        checked differently); None for an unhashable value (the traced path reports it)."""
        try:
            key = tuple(sorted((k, type(v), v) for k, v in scalars.items()))
            fn = self._eager.get(key)
        except TypeError:
            return None
        if fn is None:
            if len(self._eager) >= MAX_EAGER_SIGNATURES:
                self._eager.clear()
            fixed = dict(scalars)
            fn = self._eager[key] = jax.jit(lambda *xs: self._traced(xs, fixed))
        return fn

    def _traced(self, arrays: Sequence[Any], scalars: Mapping[str, Any]) -> Any:
        keywords: dict[str, Any] = {}
        absent = scalars.get(ABSENT)
        if absent is not None:  # the optional slots the call passed None in (`without_none`)
            scalars = {k: v for k, v in scalars.items() if k != ABSENT}
        given = scalars
        if self._keywords:
            keywords = {k: v for k, v in scalars.items() if k in self._keywords}
            scalars = {k: v for k, v in scalars.items() if k not in self._keywords}
        if absent is not None:
            keywords[ABSENT] = absent
        if self._fallback is not None or self._jit is not None:  # a plain JAX function (jit, grad,
            # vmap and export trace it), or a just-in-time build of the variant (`load(jit=True)`)
            served, out = self._served_by_fallback(arrays, given, keywords)
            if served:
                return out
        back = self._owner.get(self.backward) if self._owner and self.backward else None
        if back is None and self.backward:  # declared, but not in this kernel set
            return self._without_backward(arrays, scalars, keywords)
        if back is None:
            return self._plain(arrays, scalars, keywords)
        return self._with_vjp(back, arrays, scalars, keywords)

    def _without_backward(self, arrays: Sequence[Any], scalars: Mapping[str, Any],
                          keywords: Mapping[str, Any]) -> Any:
        """The forward of a kernel whose declared backward is not loaded here: the call
        works, and `jax.grad` of it says which backward is missing and why, rather than
        that the kernel has none."""
        missing = self.backward

        @jax.custom_vjp
        def f(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords)

        def fwd(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords), None

        def bwd(res: Any, cts: Any) -> Any:
            raise CallError(f"its backward kernel {missing!r} is not in this kernel set: it was not "
                            "loaded (kernels=), or its lock (a pack's) pins neither it nor, for a "
                            "composite, every one of its launches (build and lock it with this "
                            "kernel)", where=f'kernel "{self.name}"')

        f.defvjp(fwd, bwd)
        return f(*arrays)

    def _plain(self, arrays: Sequence[Any], scalars: Mapping[str, Any],
               keywords: Mapping[str, Any], every: bool = False) -> Any:
        """The call's results (a tuple of several, else the one); with `every`, a dict of
        all the kernel's results by name, saved ones included (for a backward, a composite)."""
        build, env = self.select(*arrays, **keywords)
        conv = build.conv
        factors = [shard_factors(t, build.shard) for t in conv.inputs]
        explicit = _explicit_specs(arrays)
        if explicit is not None:  # never a silent collective, unless the manifest allows it
            found = strict.reshards([t.name for t in conv.inputs], [tuple(a.shape) for a in arrays],
                                    explicit[0], factors, explicit[1])
            strict.check(self.name, build.reshard, build.shard, found)
        if (build.shard or build.reshard != "error") and not jax.sharding.get_abstract_mesh().manual_axes:
            # Declared independent along some axes (or allowed to be gathered): under several
            # devices each runs its shard (a call of the local arrays, which picks its own
            # build), whatever the placement.
            out = sharding.call(lambda *xs: self._results(xs, scalars, keywords), arrays, factors,
                                [shard_factors(t, build.shard, result=True) for t in conv.results])
        else:
            _check_placement(self.name, arrays)  # concrete arrays; the lowering checks the rest
            out = self._results(arrays, scalars, keywords, (build, env))
        if every:
            return {t.name: o for t, o in zip(conv.results, out)}
        out = [o for o, t in zip(out, conv.results) if not t.saved]
        return out[0] if len(out) == 1 else tuple(out)

    def _results(self, arrays: Sequence[Any], scalars: Mapping[str, Any], keywords: Mapping[str, Any],
                 chosen: tuple[Build, dict[str, Any]] | None = None) -> list[Any]:
        """Every result of one call of the kernel on `arrays` (on one device, or one shard),
        saved ones included, in contract order; `chosen` is the build and bindings when
        already selected for these arrays."""
        build, env = chosen if chosen is not None else self.select(*arrays, **keywords)
        if self.tuning is not None:  # the tuned winner of the call's bucket (a table lookup)
            build = self.tuning.pick(build, env)
        conv = build.conv
        attrs = _attrs(self.name, conv.scalars, scalars, self._keywords, env)
        target = build.register(self.name)
        # The kernel sees each tensor's buffer in its declared order (`TensorArg.perm`); an
        # inout padded tensor's result is its whole buffer. Scratch comes last: zeroed scratch
        # as `jnp.zeros` operands aliased to their results, the rest as results; all dropped.
        results = tuple((_buffer_shape(self.name, t, env), t.dtype) for t in conv.ffi_results)
        buffers = [_to_buffer(a, t) for a, t in zip(arrays, conv.inputs)]
        buffers += [jnp.zeros(_buffer_shape(self.name, t, env), t.dtype)
                    for t in conv.ffi_inputs[len(conv.inputs):]]
        aliases = conv.ffi_aliases
        if self._out_of_place is not None:  # `in_place`: the declared outputs too
            if not conv.may_aliases:
                raise CallError(f"variant {build.variant} declares no output that may be written "
                                "in an input's memory (may_alias): call it without .in_place",
                                where=f'kernel "{self.name}"')
            aliases += conv.may_aliases
        names = tuple(t.name for t in conv.ffi_inputs)
        out = cutecc_call_p.bind(*unify_varying(buffers), target=target, kernel=self.name,
                                 results=results, aliases=aliases, attrs=attrs, inputs=names)
        out = [_from_buffer(o, t) for o, t in zip(out[:len(conv.results)], conv.results)]
        # A declared reduction: per-SM partial sums and the like, summed over the leading axis.
        return [jnp.sum(o, axis=0, dtype=o.dtype) if t.reduce == "sum" else o
                for o, t in zip(out, conv.results)]

    def _with_vjp(self, back: KernelFn, arrays: Sequence[Any], scalars: Mapping[str, Any],
                  keywords: Mapping[str, Any]) -> Any:
        back_scalars = back.scalar_names()
        bscalars = {k: v for k, v in scalars.items() if k in back_scalars}
        bkeywords = {k: v for k, v in keywords.items() if k in back._keywords}

        if self.grad is not None:
            return self._with_named_vjp(back, arrays, scalars, keywords, bscalars, bkeywords)

        @jax.custom_vjp
        def f(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords)

        def fwd(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords), xs

        def bwd(xs: Any, cts: Any) -> Any:
            cts = tuple(cts) if isinstance(cts, (tuple, list)) else (cts,)
            g = _backward_call(back, (*xs, *cts), bscalars, bkeywords)
            g = tuple(g) if isinstance(g, (tuple, list)) else (g,)
            return tuple(_like(gi, x) for gi, x in zip(g, xs))

        f.defvjp(fwd, bwd)
        return f(*arrays)

    def _with_named_vjp(self, back: KernelFn, arrays: Sequence[Any], scalars: Mapping[str, Any],
                        keywords: Mapping[str, Any], bscalars: Mapping[str, Any],
                        bkeywords: Mapping[str, Any]) -> Any:
        """`custom_vjp` for a named pairing: the forward's residuals are its inputs and every
        output (saved ones, which the caller never sees, included); the backward's arguments
        are picked by name, and its results go to the inputs `returns` names (the others
        get no gradient)."""
        build, _ = self.select(*arrays, **keywords)
        names = [t.name for t in build.conv.inputs]
        visible = [t.name for t in build.conv.visible]
        returns = tuple(self.grad["returns"] or names)  # type: ignore[index]
        args: tuple[str, ...] = tuple(self.grad["args"])  # type: ignore[index, arg-type]
        # A returned output whose cotangent the backward does not take: JAX's symbolic zeros
        # tell an unused output (fine) from one a gradient flows into (an error if it is
        # non-differentiable, dropped if declared stop-gradient); never a silent zero.
        pairing = self._cotangents(build)
        symbolic = not pairing.complete

        def visible_of(outs: Mapping[str, Any]) -> Any:
            v = tuple(outs[n] for n in visible)
            return v[0] if len(v) == 1 else v

        @jax.custom_vjp
        def f(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords)

        def fwd(*xs: Any) -> Any:
            if symbolic:  # primals come wrapped, with whether each is perturbed
                xs = tuple(x.value for x in xs)
            outs = self._plain(xs, scalars, keywords, every=True)
            return visible_of(outs), (xs, outs)

        def bwd(res: Any, cts: Any) -> Any:
            xs, outs = res
            cts = dict(zip(visible, tuple(cts) if len(visible) > 1 else (cts,)))
            if symbolic:
                pairing.check(self.name, [n for n, c in cts.items() if not _symbolic_zero(c)])
                if all(_symbolic_zero(cts[n]) for n in pairing.taken):
                    return tuple(None for _ in xs)  # no gradient reaches the backward
                cts = {n: jnp.zeros(c.shape, c.dtype) if _symbolic_zero(c) else c
                       for n, c in cts.items()}
            have = {**dict(zip(names, xs)), **outs,
                    **{f"{COTANGENT}{n}": c for n, c in cts.items()}}
            g = _backward_call(back, tuple(have[n] for n in args), bscalars, bkeywords)
            g = dict(zip(returns, tuple(g) if isinstance(g, (tuple, list)) else (g,)))
            return tuple(None if n not in g else _like(g[n], x) for n, x in zip(names, xs))

        f.defvjp(fwd, bwd, symbolic_zeros=symbolic)
        return f(*arrays)


class CompositeFn(CompositeBase):
    """A composite kernel from JAX (see `cutecc.runtime.composite_call`): called outside any
    transformation, one cached `jax.jit` of the whole call, as for a kernel."""

    def __init__(self, name: str, launches: Sequence[str], inputs: Sequence[str],
                 outputs: Sequence[str], owner: Any = None) -> None:
        super().__init__(name, launches, inputs, outputs, owner)
        self._eager: dict[tuple, Any] = {}

    def __call__(self, *arrays: Any, **kw: Any) -> Any:
        known = self._keywords
        keywords = {k: v for k, v in kw.items() if k in known}
        scalars = {k: v for k, v in kw.items() if k not in known}
        if not any(isinstance(a, jax.core.Tracer) for a in arrays):
            try:
                key = tuple(sorted((k, type(v), v) for k, v in kw.items()))
                fn = self._eager.get(key)
            except TypeError:
                fn, key = None, None
            if key is not None:
                if fn is None:
                    if len(self._eager) >= MAX_EAGER_SIGNATURES:  # a scalar that changes every call
                        self._eager.clear()
                    fn = self._eager[key] = jax.jit(lambda *xs: self._plain(xs, scalars, keywords))
                eager = EAGER.set(True)
                try:
                    return fn(*arrays)
                finally:
                    EAGER.reset(eager)
        return self._plain(arrays, scalars, keywords)

    def _plain(self, arrays: Sequence[Any], scalars: Mapping[str, Any],
               keywords: Mapping[str, Any], every: bool = False) -> Any:
        return self._run(arrays, {**scalars, **keywords}, every)

    def _launch(self, fn: Any, args: tuple[Any, ...], kw: Mapping[str, Any],
                given: Sequence[Any]) -> Mapping[str, Any]:
        scalars = {k: v for k, v in kw.items() if k not in fn._keywords}
        return fn._plain(args, scalars, {k: v for k, v in kw.items() if k in fn._keywords}, every=True)


def _backward_call(back: Any, arrays: Sequence[Any], scalars: Mapping[str, Any],
                   keywords: Mapping[str, Any]) -> Any:
    """The paired backward's results for `arrays`: its build's, or where none takes them (a
    backward built for fewer shapes than its forward) its own declared fallback's."""
    if getattr(back, "_fallback", None) is not None or getattr(back, "_jit", None) is not None:
        served, out = back._served_by_fallback(arrays, {**scalars, **keywords}, keywords)
        if served:
            return out
    return back._plain(arrays, scalars, keywords)


def _dim_op(name: str) -> Any:
    """`jax.core.min_dim` / `max_dim` (min and max of symbolic dimensions), wherever this
    JAX keeps them."""
    op = getattr(jax.core, name, None)
    if op is None:  # pragma: no cover  (a JAX that dropped the public alias)
        from jax._src import core

        op = getattr(core, name)
    return op


def _min_dim(a: Any, b: Any) -> Any:
    return min(a, b) if _concrete(a) and _concrete(b) else _dim_op("min_dim")(a, b)


def _max_dim(a: Any, b: Any) -> Any:
    return max(a, b) if _concrete(a) and _concrete(b) else _dim_op("max_dim")(a, b)


def _to_buffer(a: Any, t: TensorArg) -> Any:
    """The array passed as the buffer `t` declares (a transpose; none if row-major, or if
    declared with `mode`: the caller passes the buffer as it holds it)."""
    return a if t.transpose is None else jnp.transpose(a, t.transpose)


def _from_buffer(b: Any, t: TensorArg) -> Any:
    """A result buffer in `t`'s declared order as the call returns it (the logical array;
    with `mode`, the buffer itself, in the caller's order)."""
    return b if t.transpose is None else jnp.transpose(b, np.argsort(t.transpose).tolist())


def _symbolic_zero(c: Any) -> bool:
    """Whether a cotangent `custom_vjp` hands over (with symbolic zeros) is JAX's marker
    for "no gradient flows here" (or an integer output's float0 zero), not an array."""
    return isinstance(c, SymbolicZero) or jnp.dtype(c.dtype) == jax.dtypes.float0


def _like(g: Any, x: Any) -> Any:
    """A gradient typed like its primal input: in its dtype (a backward may return a wider
    one, e.g. quack RMSNorm's dw summed from fp32 partials for a bf16 weight, and jax.grad
    promises the input's dtype), and inside `shard_map` summed over the manual axes it
    varies over and the input does not (the input was the same on every shard)."""
    if jnp.issubdtype(x.dtype, jnp.inexact) and g.dtype != x.dtype:
        g = g.astype(x.dtype)
    extra = varying(jax.typeof(g)) - varying(jax.typeof(x))
    return jax.lax.psum(g, tuple(sorted(extra))) if extra else g


def _explicit_specs(arrays: Sequence[Any]) -> tuple[list[tuple[Any, ...] | None], dict[str, int]] | None:
    """Under an explicit mesh: each array's PartitionSpec entries over the mesh's Explicit
    axes (from its type; None for one with none) and those axes' sizes. None when no array
    is typed over Explicit axes (Auto axes, inside `shard_map`, one device)."""
    specs: list[tuple[Any, ...] | None] = []
    sizes: dict[str, int] = {}
    for a in arrays:
        s = getattr(jax.typeof(a), "sharding", None)
        mesh = getattr(s, "mesh", None)
        names = getattr(mesh, "axis_names", ())
        explicit = {n for n, t in zip(names, getattr(mesh, "axis_types", ()))
                    if t == jax.sharding.AxisType.Explicit}
        spec = getattr(s, "spec", None)
        if not explicit or mesh is None or spec is None:
            specs.append(None)
            continue
        sizes.update((n, int(z)) for n, z in zip(names, mesh.axis_sizes) if n in explicit)
        entries = []
        for e in spec:
            kept = tuple(x for x in sharding.spec_axes(e) if isinstance(x, str) and x in explicit)
            entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
        specs.append(tuple(entries))
    return (specs, sizes) if sizes else None


def _check_placement(kernel: str, arrays: Sequence[Any]) -> None:
    """Refuse concrete arrays committed to different devices (JAX cannot run one call on
    them), naming the devices. Whether the call's computation spans several devices is
    decided when it is lowered (`cutecc.runtime.placement`), from the lowering's own
    devices: a call on arrays on one device runs there, whichever it is."""
    spread = _spread(kernel, arrays)
    if spread is not None:
        raise spread


def _spread(kernel: str, arrays: Sequence[Any]) -> CallError | None:
    """The error for concrete arrays committed to different devices, or None."""
    placements = {tuple(sorted(d.id for d in a.devices())) for a in arrays
                  if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                  and getattr(a, "committed", True)}
    if len(placements) > 1:
        where = ", ".join("device " + "+".join(map(str, p)) for p in sorted(placements))
        return CallError(f"its arrays are committed to different devices ({where}); a call needs "
                         "them on one device (jax.device_put them there) or, sharded alike over a "
                         "mesh, inside jax.shard_map", where=f'kernel "{kernel}"')
    return None
