"""A loaded kernel as a JAX-callable: `kernel(*inputs, **keywords) -> result(s)`.

Each call checks its arrays against the contracts of the variants that were built
(count, dtype, rank, static extents, shared symbolic extents, divisibility, and for
a padded tensor that its buffer holds the logical extents), keeps
those whose call keywords (variant parameters the arrays cannot tell apart, such as
`causal=True`) equal the call's, picks the most specific one (never one of equals:
that is an error naming them), computes output shapes from the contract, and binds
the `cutecc_call` primitive. Arrays are logical; a tensor declared with another
layout is transposed to the buffer order the kernel was compiled for (XLA folds a
caller's own `.T` into it), and results back.
Works eagerly and under `jax.jit`; placement follows the seed API `cute_call`: all
arrays on one device, and with several accelerators only inside `jax.shard_map`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cutecc import expr
from cutecc.archs import to_build
from cutecc.contract import Arg, CallingConvention, ScalarArg, TensorArg, args_from_json
from cutecc.entry import call_keywords
from cutecc.errors import CuteccError
from cutecc.names import call_name_problem
from cutecc.runtime import library
from cutecc.runtime.primitive import cutecc_call_p, unify_varying, varying


@dataclass(frozen=True)
class Build:
    """One usable cache entry of a kernel, as the runtime needs it."""

    key: str
    variant: str
    arch: str
    args: tuple[Arg, ...]
    conv: CallingConvention
    library: Path
    sha256: str
    size: int
    symbol: str
    runtime: library.RuntimeRef | None = None  # the runtime library it links against
    record_use: bool = True  # touch the entry's `used` file at registration (not in a pack)
    call: tuple[tuple[str, Any], ...] = ()  # the call keywords that reach this build

    @classmethod
    def from_meta(cls, key: str, entry_dir: Path, meta: Mapping[str, Any]) -> Build:
        """The build of a checked entry (`entry_dir` is `<root>/entries/ab/<key>`)."""
        args = args_from_json(meta["args"])
        lib = meta["library"]
        rec = meta["files"][lib]
        call = call_keywords(meta)
        if not all(isinstance(v, (bool, int, float, str)) for v in call.values()):
            raise ValueError(f"call keywords {call!r} are not a table of plain values")
        rt = meta["runtime"]
        runtime = library.RuntimeRef(
            rt["key"], entry_dir.parents[2] / "runtimes" / rt["key"][:2] / rt["key"] / rt["library"],
            rt["sha256"], int(rt["size"]))
        conv = CallingConvention.of(args)
        for s in conv.scalars:  # a keyword of the call, as the manifest checks
            why = call_name_problem(s.name, "runtime scalar")
            if why:
                raise ValueError(why)
        # What a call computes from its arrays (output shapes, padded views) must be bound
        # by them, as the manifest ensures: a contract read from disk is checked again.
        bound = {d for t in conv.inputs for d in t.extents if isinstance(d, str)}
        need = [(t.name, d) for t in conv.ffi_results if t.role != "inout" for d in t.symbols]
        need += [(t.name, t.shape[i]) for t in conv.inputs for i in t.padded]
        need += [(s.name, d) for s in conv.scalars if isinstance(s.value, str)
                 for d in expr.names(s.value)]
        for name, d in need:
            if isinstance(d, str) and d not in bound:
                raise ValueError(f'{name}: extent "{d}" is bound by no input array')
        return cls(key, meta["variant"], meta["arch"], args, conv,
                   entry_dir / lib, rec["sha256"], int(rec["size"]), meta["symbol"], runtime,
                   call=tuple(call.items()))

    @property
    def label(self) -> str:
        return f"[{self.variant}]@{self.arch} ({self.key[:12]})"

    def signature(self) -> str:
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}"
                        + ("" if t.buffer is None else f" in {list(t.buffer)}") for t in self.conv.inputs)
        sc = "".join(f", {s.name}: {s.dtype}" for s in self.conv.given)
        kw = "".join(f", {k}={v!r}" for k, v in self.call)
        return f"({ins}{sc}{kw})"

    def takes(self, keywords: Mapping[str, Any]) -> bool:
        """Whether the call keywords given (a subset of this kernel's) reach this build."""
        mine = dict(self.call)
        return all(k in mine and _same(mine[k], v) for k, v in keywords.items())

    def register(self, kernel: str) -> str:
        return library.ensure_registered(
            self.key, self.library, self.sha256, self.size, self.symbol,
            tuple(s.name for s in self.conv.scalars), f"kernel \"{kernel}\" {self.label}",
            record_use=self.record_use, runtime=self.runtime)


MAX_EAGER_SIGNATURES = 256  # jitted eager calls kept per kernel (one per keyword values)
MAX_SYMBOLIC_EXTENT = 2**31 - 1  # `cute.sym_int()` is 32-bit: the contract says so


def _same(a: Any, b: Any) -> bool:
    """Call keyword equality: `True` is not `1`, `1` is `1.0`."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _mismatch(b: Build, arrays: Sequence[Any]) -> tuple[dict[str, int] | None, str]:
    """(symbol bindings, "") if `arrays` fit `b`'s inputs, else (None, why not)."""
    ins = b.conv.inputs
    if len(arrays) != len(ins):
        return None, f"takes {len(ins)} array(s), got {len(arrays)}"
    env: dict[str, int] = {}
    for t, a in zip(ins, arrays):
        shape = tuple(a.shape)
        dtype = jnp.dtype(a.dtype).name
        if dtype != t.dtype:
            return None, f"{t.name}: dtype {dtype}, expected {t.dtype}"
        what = "" if t.buffer is None else " (the buffer)"
        if len(shape) != len(t.shape):
            return None, f"{t.name}: rank {len(shape)}, expected {len(t.shape)} {list(t.extents)}{what}"
        for i, n in enumerate(shape):
            # A symbolic dimension (jax.export) must be provably a multiple: `8*k`, not `n`.
            if n % t.multiple(i) != 0:  # symbolic: `==` is True only when JAX proves it
                return None, (f"{t.name}: dimension {i} is {n}, expected a multiple of "
                              f"{t.multiple(i)} (symbols.{t.extents[i]}.divisibility)"
                              + ("" if _concrete(n) else "; export it with a symbolic shape that is "
                                 f"one, e.g. \"{t.multiple(i)}*{n}\""))
        for i, (d, n) in enumerate(zip(t.extents, shape)):
            if _concrete(n) and n == 0:
                return None, f"{t.name}: dimension {i} is empty"
            if isinstance(d, int):
                if n != d:
                    mine = " (the buffer's extent)" if i in t.padded else ""
                    return None, f"{t.name}: dimension {i} is {n}, expected {d}{mine}"
            elif i not in (t.wide or ()) and _exceeds(n, MAX_SYMBOLIC_EXTENT):
                return None, (f"{t.name}: dimension {i} (\"{d}\") is {n}; symbolic extents are "
                              f"compiled as int32, so at most 2^31-1 = {MAX_SYMBOLIC_EXTENT}")
            elif env.setdefault(d, n) != n:
                return None, (f"{t.name}: dimension {i} is {n}, but \"{d}\" is {env[d]} "
                              "from an earlier argument")
    for t, a in zip(ins, arrays):  # once every symbol is bound: the views fit their buffers
        for i in t.padded:
            if i in (t.broadcast or ()):  # stride 0: any logical extent reads the one element
                continue
            d, n = t.shape[i], a.shape[i]
            want = d if isinstance(d, int) else env[d]
            # A view JAX cannot prove inside its buffer (symbolic shapes) is refused: nothing
            # checks it at run time.
            if not _at_least(n, want):
                named = "" if isinstance(d, int) else f' ("{d}")'
                return None, (f"{t.name}: dimension {i} of the buffer is {n}, smaller than the "
                              f"logical extent {want}{named} the kernel views in it")
    return env, ""


def _concrete(n: Any) -> bool:
    """Whether a dimension is a number (not a symbolic one of `jax.export`)."""
    return isinstance(n, (int, np.integer))


def _at_least(n: Any, want: Any) -> bool:
    """Whether `n >= want` holds, for symbolic dimensions whether JAX proves it (it raises
    when it cannot decide, which counts as not proved)."""
    try:
        return bool(n >= want)
    except jax.errors.InconclusiveDimensionOperation:
        return False


def _exceeds(n: Any, limit: int) -> bool:
    """Whether extent `n` is over `limit`. A symbolic dimension (`jax.export`) is checked
    only as far as its constraints decide it: its size is known at run time, where the
    kernel's own argument check (the DSL's TVM-FFI function) refuses an extent outside
    int32 and any divisibility it was compiled with."""
    if _concrete(n):
        return n > limit
    try:
        return bool(n > limit)
    except jax.errors.InconclusiveDimensionOperation:
        return False


def _static(b: Build) -> int:
    """How specific a build's contract is: the static extents and divisibility facts of
    its arrays (a padded view's static extent is no fact about the array passed)."""
    return sum(isinstance(d, int) for t in b.conv.inputs for d in t.extents) + sum(
        t.multiple(i) > 1 for t in b.conv.inputs for i in range(len(t.shape)))


class KernelFn:
    """A kernel of the cache, callable from JAX with the canonical convention."""

    def __init__(self, name: str, builds: Sequence[Build], *, backward: str | None = None,
                 owner: Any = None, unusable: Sequence[str] = (), arch: str = "?",
                 grad: Mapping[str, Any] | None = None) -> None:
        self.name = name
        # A named pairing (manifest grad.args / grad.returns): what the backward takes by
        # name (forward inputs, outputs saved or not, "cotangent.<output>") and which forward
        # input each of its results is the gradient of. None: inputs then cotangents.
        self.grad = None if grad is None else {"args": tuple(grad["args"]),
                                               "returns": grad.get("returns")}
        # More static extents first: the most specific variant wins.
        self.builds = sorted(builds, key=lambda b: -_static(b))
        self.backward = backward
        self._owner = owner
        self.unusable = tuple(unusable)
        self.arch = arch
        self._eager: dict[tuple, Any] = {}  # keyword values -> jitted call, see _eager_fn
        self._keywords: dict[str, list[Any]] = {}
        for b in self.builds:
            for k, v in b.call:
                if not any(_same(v, w) for w in self._keywords.setdefault(k, [])):
                    self._keywords[k].append(v)
        self.tuning: Any = None  # a cutecc.runtime.tuning.TuningTable: recorded winners per bucket

    def __repr__(self) -> str:
        sigs = "".join(f"\n  {b.variant}{b.signature()}" for b in self.builds)
        return f"<cutecc kernel {self.name}: {len(self.builds)} variant(s) for {self.arch}{sigs}>"

    @property
    def keywords(self) -> dict[str, list[Any]]:
        """The call keywords and the values built for each (static: Python values)."""
        return {k: list(v) for k, v in self._keywords.items()}

    @property
    def __signature__(self) -> inspect.Signature:
        """For `help()` and `inspect`: arrays, runtime scalars, then call keywords."""
        P = inspect.Parameter  # noqa: N806
        params: dict[str, inspect.Parameter] = {}
        for b in self.builds:
            for t in b.conv.inputs:
                params.setdefault(t.name, P(t.name, P.POSITIONAL_ONLY))
        for b in self.builds:
            for s in b.conv.given:
                params.setdefault(s.name, P(s.name, P.KEYWORD_ONLY, default=s.default))
        for k, vals in self.keywords.items():
            params[k] = P(k, P.KEYWORD_ONLY, annotation=" | ".join(map(repr, vals)))
        return inspect.Signature(list(params.values()))

    @property
    def variants(self) -> list[str]:
        return [b.variant for b in self.builds]

    def scalar_names(self) -> set[str]:
        """The runtime scalars a call may pass (derived ones are not passed)."""
        return {s.name for b in self.builds for s in b.conv.given}

    def input_names(self) -> tuple[str, ...]:
        """The call's arrays by name (of the first build: variants name them alike)."""
        if not self.builds:
            self.select()  # raises: no usable build, and why
        return tuple(t.name for t in self.builds[0].conv.inputs)

    def select(self, *arrays: Any, **keywords: Any) -> tuple[Build, dict[str, int]]:
        """The build whose contract the arrays fit and whose call keywords are those
        given, and the symbol bindings. Among several fits the most specific (most
        static extents) wins; equals are an error, never a silent pick."""
        if not self.builds:
            why = "; ".join(self.unusable) or "nothing was built for it"
            raise CuteccError(f"no usable build for arch {self.arch}: {why}. Build it with "
                              f"`cutecc build --arch {to_build(self.arch)} --kernel {self.name}`",
                              where=f'kernel "{self.name}"', exit_code=1)
        known = self._keywords
        for k, v in keywords.items():
            if k not in known:
                raise CuteccError(f"unknown keyword argument {k!r}; call keywords: "
                                  f"{', '.join(sorted(known)) or 'none'}",
                                  where=f'kernel "{self.name}"', exit_code=1)
            if not any(_same(v, w) for w in known[k]):
                raise CuteccError(f"{k}={v!r} was not built; built: "
                                  + ", ".join(f"{k}={w!r}" for w in known[k]),
                                  where=f'kernel "{self.name}"', exit_code=1)
        reasons = []
        fits: list[tuple[Build, dict[str, int]]] = []
        for b in self.builds:
            env, why = _mismatch(b, arrays)
            if env is not None and b.takes(keywords):
                fits.append((b, env))
            elif env is not None:
                reasons.append(f"  {b.variant}{b.signature()}: other call keywords")
            else:
                reasons.append(f"  {b.variant}{b.signature()}: {why}")
        if fits:
            return self._one_of(fits, keywords)
        got = ", ".join(f"{jnp.dtype(a.dtype).name}{list(a.shape)}" for a in arrays)
        raise CuteccError(
            f"no built variant matches the call ({got}). Built for {self.arch}:\n"
            + "\n".join(reasons)
            + f"\nTo add one, extend [kernel.{self.name}] variants in the manifest and run "
            "`cutecc build`.", where=f'kernel "{self.name}"', exit_code=1)

    def _one_of(self, fits: list[tuple[Build, dict[str, int]]],
                keywords: Mapping[str, Any]) -> tuple[Build, dict[str, int]]:
        """The most specific of the builds a call fits; equals are refused, and so is a
        call leaving out a keyword built with several values even where its arrays fit one
        (a padded tensor's static logical extent: a large buffer would fit them all)."""
        top = [f for f in fits if _static(f[0]) == _static(fits[0][0])]  # builds are sorted
        missing = sorted({k for b, _ in top for k, _ in b.call
                          if k not in keywords and len(self._keywords[k]) > 1})
        if len(top) == 1 and not missing:
            return top[0]
        if missing:
            choices = "; ".join(f"{k} = " + " or ".join(sorted({repr(v) for b, _ in top
                                                                for k2, v in b.call if k2 == k}))
                                for k in missing)
            built = "; ".join(f"{k} = " + " or ".join(map(repr, self._keywords[k])) for k in missing)
            raise CuteccError(f"missing call keyword {', '.join(map(repr, missing))}: these arrays "
                              f"fit {len(top)} variant(s), chosen by {choices} (built: {built}) "
                              f"(e.g. {self.name}(..., {missing[0]}=...))",
                              where=f'kernel "{self.name}"', exit_code=1)
        raise CuteccError("the call fits several variants equally: " + ", ".join(
            b.variant for b, _ in top) + "; declare contracts that tell them apart",
                          where=f'kernel "{self.name}"', exit_code=1)

    def __call__(self, *arrays: Any, **scalars: Any) -> Any:
        for i, a in enumerate(arrays):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise CuteccError(f"argument {i} is a {type(a).__name__}, not an array "
                                  "(runtime scalars are keyword arguments)",
                                  where=f'kernel "{self.name}"', exit_code=1)
        if not any(isinstance(a, jax.core.Tracer) for a in arrays) and not _several_devices():
            fn = self._eager_fn(scalars)
            if fn is not None:
                return fn(*arrays)
        return self._traced(arrays, scalars)

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
        back = self._owner.get(self.backward) if self._owner and self.backward else None
        keywords: dict[str, Any] = {}
        if self._keywords:
            keywords = {k: v for k, v in scalars.items() if k in self._keywords}
            scalars = {k: v for k, v in scalars.items() if k not in self._keywords}
        if back is None:
            return self._plain(arrays, scalars, keywords)
        return self._with_vjp(back, arrays, scalars, keywords)

    def _plain(self, arrays: Sequence[Any], scalars: Mapping[str, Any],
               keywords: Mapping[str, Any], every: bool = False) -> Any:
        """The call's results (a tuple of several, else the one); with `every`, a dict of
        all the kernel's results by name, saved ones included (for a backward, a composite)."""
        build, env = self.select(*arrays, **keywords)
        if self.tuning is not None:  # the tuned winner of the call's bucket (a table lookup)
            build = self.tuning.pick(build, env)
        _check_placement(self.name, arrays)
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
        out = cutecc_call_p.bind(*unify_varying(buffers), target=target, kernel=self.name,
                                 results=results, aliases=conv.ffi_aliases, attrs=attrs)
        out = [_from_buffer(o, t) for o, t in zip(out[:len(conv.results)], conv.results)]
        # A declared reduction: per-SM partial sums and the like, summed over the leading axis.
        out = [jnp.sum(o, axis=0, dtype=o.dtype) if t.reduce == "sum" else o
               for o, t in zip(out, conv.results)]
        if every:
            return {t.name: o for t, o in zip(conv.results, out)}
        out = [o for o, t in zip(out, conv.results) if not t.saved]
        return out[0] if len(out) == 1 else tuple(out)

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
            g = back._plain((*xs, *cts), bscalars, bkeywords)
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
        args = self.grad["args"]  # type: ignore[index]

        def visible_of(outs: Mapping[str, Any]) -> Any:
            v = tuple(outs[n] for n in visible)
            return v[0] if len(v) == 1 else v

        @jax.custom_vjp
        def f(*xs: Any) -> Any:
            return self._plain(xs, scalars, keywords)

        def fwd(*xs: Any) -> Any:
            outs = self._plain(xs, scalars, keywords, every=True)
            return visible_of(outs), (xs, outs)

        def bwd(res: Any, cts: Any) -> Any:
            xs, outs = res
            cts = tuple(cts) if len(visible) > 1 else (cts,)
            have = {**dict(zip(names, xs)), **outs,
                    **{f"cotangent.{n}": c for n, c in zip(visible, cts)}}
            g = back._plain(tuple(have[n] for n in args), bscalars, bkeywords)
            g = dict(zip(returns, tuple(g) if isinstance(g, (tuple, list)) else (g,)))
            return tuple(None if n not in g else _like(g[n], x) for n, x in zip(names, xs))

        f.defvjp(fwd, bwd)
        return f(*arrays)


class CompositeFn:
    """A kernel declared as an ordered list of launches of other kernels sharing tensors by
    name (`[kernel.NAME] launches = [..]`): called as one kernel, `fn(*inputs, **keywords)`,
    each launch takes its arrays by name from the call's inputs and the results of earlier
    launches (saved ones too), and the declared outputs are returned. Pairable as a backward.
    Runtime scalars and call keywords go to each launch that takes them."""

    builds: tuple[Build, ...] = ()  # nothing of its own: its launches are kernels
    unusable: tuple[str, ...] = ()
    backward = None
    grad = None
    tuning = None

    def __init__(self, name: str, launches: Sequence[str], inputs: Sequence[str],
                 outputs: Sequence[str], owner: Any = None) -> None:
        self.name = name
        self.launches, self.inputs, self.outputs = tuple(launches), tuple(inputs), tuple(outputs)
        self._owner = owner
        self._eager: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return (f"<cutecc kernel {self.name}: ({', '.join(self.inputs)}) -> "
                f"({', '.join(self.outputs)}) through {' -> '.join(self.launches)}>")

    def _fns(self) -> list[KernelFn]:
        fns = [self._owner.get(n) if self._owner is not None else None for n in self.launches]
        missing = [n for n, f in zip(self.launches, fns) if f is None]
        if missing:
            raise CuteccError(f"launch kernel {missing[0]!r} is not in this cache; run `cutecc build`",
                              where=f'kernel "{self.name}"', exit_code=1)
        return fns  # type: ignore[return-value]

    @property
    def _keywords(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for f in self._fns():
            for k, vals in f._keywords.items():
                out.setdefault(k, []).extend(v for v in vals if not any(_same(v, w) for w in out[k]))
        return out

    @property
    def keywords(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self._keywords.items()}

    def scalar_names(self) -> set[str]:
        return set().union(*(f.scalar_names() for f in self._fns()))

    def __call__(self, *arrays: Any, **kw: Any) -> Any:
        known = self._keywords
        keywords = {k: v for k, v in kw.items() if k in known}
        scalars = {k: v for k, v in kw.items() if k not in known}
        if not any(isinstance(a, jax.core.Tracer) for a in arrays) and not _several_devices():
            try:
                key = tuple(sorted((k, type(v), v) for k, v in kw.items()))
                fn = self._eager.get(key)
            except TypeError:
                fn, key = None, None
            if key is not None:
                if fn is None:
                    fn = self._eager[key] = jax.jit(lambda *xs: self._plain(xs, scalars, keywords))
                return fn(*arrays)
        return self._plain(arrays, scalars, keywords)

    def _plain(self, arrays: Sequence[Any], scalars: Mapping[str, Any],
               keywords: Mapping[str, Any], every: bool = False) -> Any:
        if len(arrays) != len(self.inputs):
            raise CuteccError(f"takes {len(self.inputs)} array(s) ({', '.join(self.inputs)}), got "
                              f"{len(arrays)}", where=f'kernel "{self.name}"', exit_code=1)
        fns = self._fns()
        taken = set().union(*(f.scalar_names() for f in fns))
        unknown = sorted(set(scalars) - taken)
        if unknown:
            raise CuteccError(f"unknown keyword argument {unknown[0]!r}; runtime scalars of the "
                              f"launches: {', '.join(sorted(taken)) or 'none'}",
                              where=f'kernel "{self.name}"', exit_code=1)
        have = dict(zip(self.inputs, arrays))
        for f in fns:
            args = tuple(have[n] for n in f.input_names())
            sc = {k: v for k, v in scalars.items() if k in f.scalar_names()}
            kw = {k: v for k, v in keywords.items() if k in f._keywords}
            have.update(f._plain(args, sc, kw, every=True))
        if every:
            return {n: have[n] for n in self.outputs}
        out = tuple(have[n] for n in self.outputs)
        return out[0] if len(out) == 1 else out


def _extent(kernel: str, t: TensorArg, d: Any, env: Mapping[str, Any]) -> Any:
    """An extent's value for a call: static, bound by an input array, or derived (evaluated
    from the bindings; under `jax.export` with symbolic shapes, a symbolic dimension)."""
    if isinstance(d, int):
        return d
    if expr.is_symbol(d):
        return env[d]
    try:
        n = expr.evaluate(d, env, minimum=_min_dim, maximum=_max_dim)
    except expr.ExprError as e:
        raise CuteccError(f"{t.name}: derived extent {d!r}: {e}", where=f'kernel "{kernel}"',
                          exit_code=1) from None
    if isinstance(n, int) and n <= 0:
        raise CuteccError(f"{t.name}: derived extent {d!r} is {n} for "
                          + ", ".join(f"{k}={env[k]}" for k in expr.names(d))
                          + "; an extent must be positive", where=f'kernel "{kernel}"', exit_code=1)
    return n


def _buffer_shape(kernel: str, t: TensorArg, env: Mapping[str, Any]) -> tuple[Any, ...]:
    """The shape of the dense buffer of `t` the kernel sees (its dimensions in `perm` order)."""
    return tuple(_extent(kernel, t, t.extents[p], env) for p in t.perm)


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
    """The logical array `a` as the buffer `t` declares (a transpose; none if row-major)."""
    return a if t.order is None else jnp.transpose(a, t.perm)


def _from_buffer(b: Any, t: TensorArg) -> Any:
    """A result buffer in `t`'s declared order as the logical array."""
    return b if t.order is None else jnp.transpose(b, np.argsort(t.perm).tolist())


def _like(g: Any, x: Any) -> Any:
    """A gradient typed like its primal input: in its dtype (a backward may return a wider
    one, e.g. quack RMSNorm's dw summed from fp32 partials for a bf16 weight, and jax.grad
    promises the input's dtype), and inside `shard_map` summed over the manual axes it
    varies over and the input does not (the input was the same on every shard)."""
    if jnp.issubdtype(x.dtype, jnp.inexact) and g.dtype != x.dtype:
        g = g.astype(x.dtype)
    extra = varying(jax.typeof(g)) - varying(jax.typeof(x))
    return jax.lax.psum(g, tuple(sorted(extra))) if extra else g


def _attrs(kernel: str, declared: Sequence[ScalarArg], given: Mapping[str, Any],
           keywords: Collection[str] = (), env: Mapping[str, Any] | None = None) -> tuple:
    """The runtime scalars' FFI attributes; `keywords` (the kernel's call keywords, already
    taken out of `given`) only name the other keywords a call may pass. A derived scalar is
    computed from the call's symbol bindings `env`, never passed."""
    names = {s.name for s in declared if s.value is None}
    for k in given:
        if any(s.name == k and s.value is not None for s in declared):
            raise CuteccError(f"runtime scalar {k!r} is derived ({_declared_value(declared, k)}): "
                              "the runtime computes and passes it, a call does not",
                              where=f'kernel "{kernel}"', exit_code=1)
        if k not in names:
            also = f"; call keywords: {', '.join(sorted(keywords))}" if keywords else ""
            raise CuteccError(f"unknown keyword argument {k!r}; runtime scalars: "
                              f"{', '.join(sorted(names)) or 'none'}{also}",
                              where=f'kernel "{kernel}"', exit_code=1)
    out = []
    for s in declared:
        if s.value is not None:
            out.append((s.name, s.dtype, _derived_scalar(kernel, s, env or {})))
            continue
        v = given.get(s.name, s.default)
        if v is None:
            raise CuteccError(f"missing runtime scalar {s.name!r} ({s.dtype})",
                              where=f'kernel "{kernel}"', exit_code=1)
        if isinstance(v, jax.core.Tracer) or (isinstance(v, jax.Array) and v.ndim):
            raise CuteccError(f"runtime scalar {s.name!r} must be a Python or NumPy number "
                              "known when the call is traced (it travels as an FFI attribute), "
                              "not a traced or array value", where=f'kernel "{kernel}"',
                              exit_code=1)
        out.append((s.name, s.dtype, _scalar_value(kernel, s, v)))
    return tuple(out)


def _declared_value(declared: Sequence[ScalarArg], name: str) -> str:
    """How a derived scalar is declared, for messages: `value = ...`."""
    return next(f"value = {s.value!r}" for s in declared if s.name == name)


def _derived_scalar(kernel: str, s: ScalarArg, env: Mapping[str, Any]) -> int:
    """A derived scalar's value for this call, as an int of its dtype's range."""
    if isinstance(s.value, int):
        return s.value
    assert s.value is not None
    try:
        v = expr.evaluate(s.value, env, minimum=_min_dim, maximum=_max_dim)
    except expr.ExprError as e:
        raise CuteccError(f"runtime scalar {s.name!r} ({s.value!r}): {e}",
                          where=f'kernel "{kernel}"', exit_code=1) from None
    if not isinstance(v, int):  # a symbolic dimension (jax.export): no attribute can hold it
        raise CuteccError(f"runtime scalar {s.name!r} = {s.value!r} depends on a symbolic dimension "
                          f"({v}); it travels as an FFI attribute, which needs a number when the "
                          "call is traced: export with that dimension concrete",
                          where=f'kernel "{kernel}"', exit_code=1)
    return _scalar_value(kernel, s, v)


def _scalar_value(kernel: str, s: ScalarArg, v: Any) -> Any:
    """`v` as the scalar's dtype, refusing what NumPy would silently change (a float for an
    int, anything for a bool, a value out of range) or cannot take (a string, a list)."""
    if isinstance(v, (np.generic, np.ndarray, jax.Array)) and np.ndim(v) == 0:
        v = v.item()  # a concrete NumPy or JAX scalar (tracers were refused above)
    want = "a bool" if s.dtype == "bool" else "an int" if s.dtype.startswith("int") else "a number"
    ok = isinstance(v, bool) if s.dtype == "bool" else (
        isinstance(v, (int, float)) and not isinstance(v, bool)
        and (s.dtype.startswith("float") or isinstance(v, int)))
    if ok:
        with np.errstate(over="ignore"):
            try:
                got = np.dtype(s.dtype).type(v).item()
            except OverflowError:
                got = None
        if got is not None and not (isinstance(got, float) and np.isinf(got) and np.isfinite(v)):
            return got
        why = f"{v!r} is out of range for {s.dtype}"
    else:
        why = f"got {type(v).__name__} {v!r}"[:120]
    raise CuteccError(f"runtime scalar {s.name!r} ({s.dtype}) must be {want}: {why}",
                      where=f'kernel "{kernel}"', exit_code=1)


@functools.cache
def _several_devices() -> bool:
    """Whether more than one device is visible (fixed once JAX's backends are up): eager
    calls then take the checked path, which explains a call outside `shard_map`."""
    return jax.device_count() > 1


def _check_placement(kernel: str, arrays: Sequence[Any]) -> None:
    devices = set()
    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            devices |= set(a.devices())
    if len(devices) > 1:
        raise CuteccError(f"arrays are spread over {len(devices)} devices; a call needs all "
                          "of them on one device (use jax.shard_map to run per shard)",
                          where=f'kernel "{kernel}"', exit_code=1)
    if jax.device_count() > 1 and not jax.sharding.get_abstract_mesh().manual_axes:
        raise CuteccError(f"{jax.device_count()} accelerators are visible: call cutecc kernels "
                          "inside jax.shard_map, where each call runs on one device's shard",
                          where=f'kernel "{kernel}"', exit_code=1)
