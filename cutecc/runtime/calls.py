"""What a kernel call decides without any framework: which build a call's arrays fit,
the symbol bindings and output extents (its runtime scalars: `cutecc.runtime.scalar_values`).

Shared by the JAX runtime (`cutecc.runtime.dispatch`) and the PyTorch one (`cutecc.torch`),
so both accept exactly the same calls; imports neither JAX nor torch. Arrays are anything
with `.shape`; each front end says how to name an array's dtype (`KernelBase._dtype_name`),
how to read a runtime scalar (`KernelBase._scalar`) and how its dimensions compare (`Dims`:
plain ints here, JAX's symbolic dimensions under `jax.export`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cutecc.archs import to_build
from cutecc.contract import expr, refs
from cutecc.contract.args import (
    RESHARD,
    Arg,
    CallingConvention,
    TensorArg,
    args_from_json,
    may_alias_problem,
    shard_problem,
)
from cutecc.contract.cotangents import STOP_GRADIENT, Cotangents
from cutecc.entry.meta import EntryMeta, FileRec, RuntimeLink
from cutecc.errors import CallError, CallTypeError, NoBuildFits
from cutecc.names import call_name_problem
from cutecc.runtime import library
from cutecc.runtime.contract_fit import (  # noqa: F401  (re-exported: front ends import them here)
    MAX_SYMBOLIC_EXTENT,
    PLAIN,
    Dims,
    buffer_shape,
    conv_mismatch,
    extent,
)
from cutecc.runtime.fits import implies, relation_problem, relations_of
from cutecc.runtime.library import RuntimeRef
from cutecc.runtime.variant_choice import ABSENT, chosen_problem, from_shapes_of, slots_problem, without_none
from cutecc.store.layout import Layout


def _shard_of(key_inputs: Mapping[str, Any] | None) -> Any:
    """The `shard` symbols an entry's key inputs record (None: not declared); unchecked."""
    return key_inputs.get("shard") if isinstance(key_inputs, Mapping) else None


def _reshard_of(key_inputs: Mapping[str, Any] | None) -> Any:
    """The `reshard` choice an entry's key inputs record ("error" when not declared); unchecked."""
    return key_inputs.get("reshard", RESHARD[0]) if isinstance(key_inputs, Mapping) else RESHARD[0]


_MAX_PARAMS = 64  # parameters read from an entry's meta.json (a variant has a few)


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
    runtime: RuntimeRef | None = None  # the runtime library it links against
    record_use: bool = True  # touch the entry's `used` file at registration (not in a pack)
    # what the load read (`RuntimeSettings`) that its library is loaded by: check mode
    # ($CUTECC_SYNC_CHECK) and tvm-ffi's interop ($CUTECC_TVM_FFI_TORCH)
    sync_check: bool = False
    tvm_ffi_interop: bool = False
    call: tuple[tuple[str, Any], ...] = ()  # the call keywords that reach this build
    shard: tuple[str, ...] = ()  # the symbols a call may be split along (`runtime.sharding`)
    reshard: str = RESHARD[0]  # a call split otherwise, under an explicit mesh (`runtime.strict`)
    # the call keywords whose values are import references: the object named matches too
    refs: tuple[str, ...] = ()
    # the variant's plain parameters (meta.json's `params`): a one-value axis, the same in
    # every build of the kernel, is a call keyword too (`KernelBase._index_keywords`)
    params: tuple[tuple[str, Any], ...] = ()
    # equalities between the inputs' extents each call must hold (`relations = [..]`), as
    # (lhs, rhs) canonical expressions (`cutecc.contract.expr.relation`)
    relations: tuple[tuple[str, str], ...] = ()
    # the variant axes a call's shapes choose: (axis, expression over input extents, this
    # build's value); a call whose extents give another value is not this build's
    from_shapes: tuple[tuple[str, str, int], ...] = ()

    @classmethod
    def of(cls, rec: EntryMeta, entry_dir: Path) -> Build:
        """The build of a checked entry (`entry_dir` is its directory in the cache)."""
        params = tuple((k, v) for k, v in list(rec.params.items())[:_MAX_PARAMS]
                       if isinstance(k, str) and isinstance(v, (bool, int, float, str)))
        b = cls._make(rec.key, entry_dir, rec.args, rec.library, rec.runtime, rec.call, rec.variant,
                      rec.arch, rec.symbol, _shard_of(rec.key_inputs), _reshard_of(rec.key_inputs),
                      refs.reference_keywords({**dict(params), **rec.call}, rec.key_inputs))
        return dataclasses.replace(b, params=params,
                                   relations=relations_of(b.conv, rec.key_inputs),
                                   from_shapes=from_shapes_of(rec.key_inputs, dict(rec.params)))

    @classmethod
    def _make(cls, key: str, entry_dir: Path, args_json: Any, lib: FileRec, rt: RuntimeLink,
              call: Mapping[str, Any], variant: str, arch: str, symbol: str, shard_json: Any,
              reshard: Any = RESHARD[0], ref_keywords: tuple[str, ...] = ()) -> Build:
        args = args_from_json(args_json)
        if not all(isinstance(v, (bool, int, float, str)) for v in call.values()):
            raise ValueError(f"call keywords {call!r} are not a table of plain values")
        runtime = library.RuntimeRef(
            rt.key, Layout.of_entry(entry_dir).runtime_library(rt.key, rt.library), rt.sha256, rt.size)
        conv = CallingConvention.of(args)
        bad = may_alias_problem(args)  # XLA is asked to reuse buffers by it: checked again
        if bad is not None:
            raise ValueError(f"{bad[0]}.may_alias: {bad[1]}")
        for s in conv.scalars:  # a keyword of the call, as the manifest checks
            why = call_name_problem(s.name, "runtime scalar")
            if why:
                raise ValueError(why)
        # What a call computes from its arrays (output shapes, padded views) must be bound
        # by them, as the manifest ensures: a contract read from disk is checked again.
        bound = {d for t in conv.inputs for d in t.extents if isinstance(d, str)}
        need: list[tuple[str, Any]] = [(t.name, d) for t in conv.ffi_results if t.role != "inout"
                                       for d in t.symbols]
        need += [(t.name, t.shape[i]) for t in conv.inputs for i in t.padded]
        need += [(s.name, d) for s in conv.scalars if isinstance(s.value, str)
                 for d in expr.names(s.value)]
        for name, d in need:
            if isinstance(d, str) and d not in bound:
                raise ValueError(f'{name}: extent "{d}" is bound by no input array')
        shard = shard_json or []
        if not isinstance(shard, list) or not all(isinstance(s, str) for s in shard):
            raise ValueError(f"shard {shard!r} is not a list of symbols")
        why = shard_problem(conv, tuple(shard)) if shard else None  # read from disk: checked again
        if why:
            raise ValueError(f"shard: {why}")
        if reshard not in RESHARD:
            raise ValueError(f"reshard {reshard!r} is not one of {', '.join(RESHARD)}")
        return cls(key, variant, arch, args, conv, entry_dir / lib.name, lib.sha256, lib.size, symbol,
                   runtime, call=tuple(call.items()), shard=tuple(shard), reshard=reshard, refs=ref_keywords)

    @property
    def label(self) -> str:
        return f"[{self.variant}]@{self.arch} ({self.key[:12]})"

    def signature(self) -> str:
        """`(x: float32['m', 64], ..., causal=True)`: each array as a call passes it (a tensor
        declared with `mode` in the caller's order, as the call's shape errors name it)."""
        def held(dims: tuple[Any, ...], t: TensorArg) -> list[Any]:
            return [dims[p] for p in t.held]
        tensors = iter(self.conv.inputs)
        shown = []  # in slot order: an optional slot built as None shows so
        for name, here in self.conv.slots:
            if not here:
                shown.append(f"{name}: None")
                continue
            t = next(tensors)
            shown.append(f"{t.name}: {t.dtype}{held(t.shape, t)}"
                         + ("" if t.buffer is None else f" in {held(t.buffer, t)}"))
        ins = ", ".join(shown)
        sc = "".join(f", {s.name}: {s.dtype}" for s in self.conv.given)
        kw = "".join(f", {k}={v!r}" for k, v in self.call)
        return f"({ins}{sc}{kw})"

    def takes(self, keywords: Mapping[str, Any]) -> bool:
        """Whether the call keywords given (a subset of this kernel's) reach this build."""
        mine = {**dict(self.params), **dict(self.call)}
        return all(k in mine and _same(mine[k], v) for k, v in keywords.items())

    def register(self, kernel: str) -> str:
        return library.ensure_registered(
            self.key, self.library, self.sha256, self.size, self.symbol,
            tuple(s.name for s in self.conv.scalars), f"kernel \"{kernel}\" {self.label}",
            record_use=self.record_use, runtime=self.runtime, sync_check=self.sync_check,
            interop=self.tvm_ffi_interop)


def _same(a: Any, b: Any) -> bool:
    """Call keyword equality: `True` is not `1`, `1` is `1.0`."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def mismatch(b: Build, shapes: Sequence[tuple[Any, ...]], dtypes: Sequence[str],
             dims: Dims = PLAIN) -> tuple[dict[str, int] | None, str]:
    """(symbol bindings, "") if arrays of these shapes and dtype names fit `b`'s inputs and
    hold its relations between extents, else (None, why not)."""
    env, why = conv_mismatch(b.conv, shapes, dtypes, dims)
    relations: Sequence[tuple[str, str]] = getattr(b, "relations", None) or ()  # (a stand-in has none)
    if env is not None and relations:
        why = relation_problem(b.conv, relations, env, dims)
        if why:
            return None, why
    return env, why


def _static(b: Build) -> int:
    """How specific a build's contract is: the static extents and divisibility facts of
    its arrays (a padded view's static extent is no fact about the array passed)."""
    return sum(isinstance(d, int) for t in b.conv.inputs for d in t.extents) + sum(
        t.multiple(i) > 1 for t in b.conv.inputs for i in range(len(t.shape)))



class KernelBase:
    """A kernel of the cache: its builds, call keywords and the choice of a build for a
    call; each front end adds how it is called (`cutecc.runtime.dispatch.KernelFn` for JAX,
    `cutecc.torch` for PyTorch)."""

    _dims: Dims = PLAIN  # how its dimensions compare (private: kernel attributes are reserved names)

    @staticmethod
    def _dtype_name(a: Any) -> str:
        """The dtype name of an array (`float32`, `bfloat16`), as contracts spell it."""
        return np.dtype(a.dtype).name


    def __init__(self, name: str, builds: Sequence[Build], *, backward: str | None = None,
                 owner: Any = None, unusable: Sequence[str] = (), arch: str = "?",
                 grad: Mapping[str, Any] | None = None) -> None:
        self.name = name
        # A named pairing (manifest grad.args / grad.returns): what the backward takes by
        # name (forward inputs, outputs saved or not, "cotangent.<output>") and which forward
        # input each of its results is the gradient of; the returned outputs declared
        # stop-gradient (`cutecc.contract.cotangents`). None: inputs then cotangents.
        self.grad: dict[str, Any] | None = None if grad is None else {
            "args": tuple(grad["args"]), "returns": grad.get("returns"),
            STOP_GRADIENT: tuple(grad.get(STOP_GRADIENT) or ())}
        # More static extents first: the most specific variant wins.
        self.builds = sorted(builds, key=lambda b: -_static(b))
        self.backward = backward
        self._owner = owner
        self.unusable = tuple(unusable)
        self.arch = arch
        self._eager: dict[tuple, Any] = {}  # keyword values -> jitted call, see _eager_fn
        self._keywords: dict[str, list[Any]] = {}
        self._refs: set[tuple[str, str]] = set()  # (keyword, built value) import references
        self._index_keywords()
        self.tuning: Any = None  # a cutecc.runtime.tuning.TuningTable: recorded winners per bucket
        # a cutecc.runtime.fallback.Fallback: what serves a call no build fits (the loader
        # sets it where the kernel declares one); private: kernel attributes are reserved names
        self._fallback: Any = None
        # development builds (`load(jit=True)`): `_jit(self, arrays_sig, keywords, miss)` adds
        # the build serving a missed call and returns None, or says why it cannot (str)
        self._jit: Any = None

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
        for b in sorted(self.builds, key=lambda b: -len(b.conv.slots)):  # optional slots in place
            for n, _ in b.conv.slots:
                params.setdefault(n, P(n, P.POSITIONAL_ONLY))
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

    def _cotangents(self, build: Build) -> Cotangents:
        """Which returned outputs' cotangents the paired backward takes, for `build`'s
        contract (the rest are non-differentiable or stop-gradient)."""
        return Cotangents.of_pairing(self.backward or "", [t.name for t in build.conv.visible],
                                     self.grad)

    def select(self, *arrays: Any, **keywords: Any) -> tuple[Build, dict[str, int]]:
        """The build whose contract the arrays fit and whose call keywords are those
        given, and the symbol bindings. Among several fits the most specific (most
        static extents) wins; equals are an error, never a silent pick."""
        if not self.builds:
            why = "; ".join(self.unusable) or "nothing was built for it"
            raise NoBuildFits(f"no usable build for arch {self.arch}: {why}. Build it with "
                            f"`cutecc build --arch {to_build(self.arch)} --kernel {self.name}`",
                            where=f'kernel "{self.name}"')
        known = self._keywords
        absent = keywords.get(ABSENT)
        if any(a is None for a in arrays):  # None in an optional slot: `without_none`
            arrays, absent = self._without_none(arrays)
        keywords = {k: self._keyword(k, v) for k, v in keywords.items() if k != ABSENT}
        for k, v in keywords.items():
            if k not in known:
                raise CallTypeError(f"unknown keyword argument {k!r}; call keywords: "
                                    f"{', '.join(sorted(known)) or 'none'}",
                                    where=f'kernel "{self.name}"')
            if not any(_same(v, w) for w in known[k]):
                raise NoBuildFits(f"{k}={v!r} was not built; built: "
                                + ", ".join(f"{k}={w!r}" for w in known[k]),
                                where=f'kernel "{self.name}"')
        reasons = []
        fits: list[tuple[Build, dict[str, int]]] = []
        for b in self.builds:
            if absent is not None and b.conv.absent != absent:
                reasons.append(f"  {b.variant}{b.signature()}: {slots_problem(b.conv.absent, absent)}")
                continue
            env, why = mismatch(b, [tuple(a.shape) for a in arrays],
                                [self._dtype_name(a) for a in arrays], self._dims)
            if env is not None and b.from_shapes:  # an axis the call's extents choose
                why = chosen_problem(b.from_shapes, env)
                env = None if why else env
            if env is not None and b.takes(keywords):
                fits.append((b, env))
            elif env is not None:
                reasons.append(f"  {b.variant}{b.signature()}: other call keywords")
            else:
                reasons.append(f"  {b.variant}{b.signature()}: {why}")
        if fits:
            return self._one_of(fits, keywords)
        got = ", ".join(f"{self._dtype_name(a)}{list(a.shape)}" for a in arrays)
        # No build takes this many arrays: a wrong call, as a wrong count of arguments is.
        cls = CallTypeError if all(len(arrays) != len(b.conv.inputs) for b in self.builds) else NoBuildFits
        raise cls(
            f"no built variant matches the call ({got}). Built for {self.arch}:\n"
            + "\n".join(reasons)
            + f"\nTo add one, extend [kernel.{self.name}] variants in the manifest and run "
            "`cutecc build`.", where=f'kernel "{self.name}"')

    def _without_none(self, arrays: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[str, ...] | None]:
        """The call's arrays without the Nones it passed in optional slots, and those slots'
        names (`cutecc.runtime.variant_choice.without_none`)."""
        return without_none(self.name, [b.conv.slots for b in self.builds], arrays)

    def _served_by_fallback(self, arrays: Sequence[Any], kwargs: Mapping[str, Any],
                            keywords: Mapping[str, Any], once: bool = False) -> tuple[bool, Any]:
        """(True, the fallback's result) when no build serves this call and the kernel
        declares a fallback (strict: its error); (False, None) when a build fits, or when
        there is no fallback (the call then raises as it always did). Under `load(jit=True)`
        a miss first compiles the variant that serves it (then a build fits), and falls to
        the fallback, or raises, only where it cannot. `kwargs` are all the call's keywords,
        `keywords` its call keywords among them; `once`: see `Use.record`."""
        if self._fallback is None and self._jit is None:
            return False, None
        try:
            self.select(*arrays, **keywords)
        except NoBuildFits as miss:
            sig = [(self._dtype_name(a), tuple(a.shape)) for a in arrays]
            no_builds, note = not self.builds, ""
            if self._jit is not None:
                why = self._jit(self, sig, {k: v for k, v in keywords.items() if k != ABSENT}, miss)
                if why is None:
                    return False, None
                note = f"just-in-time build: {why}"
                miss = NoBuildFits(f"{miss.message}\n({note})", where=miss.where)
                if self._fallback is None:
                    raise miss from None
            out, use = self._fallback.serve(arrays, kwargs, keywords, miss, sig, no_builds, note)
            self._fallback.check_result(out, sig, self._dtype_name)  # what the contract returns
            return True, self._served(out, use, once)
        return False, None

    def _served(self, out: Any, use: Any, once: bool) -> Any:
        """`out`, the fallback's result, with its use (`cutecc.runtime.fallback.Use`)
        recorded: here at once (an eager call); JAX's front end records it when the call
        is lowered or run, not when it is only traced (`cutecc.runtime.fallback_mark`)."""
        use.record(once)
        return out

    def _add_build(self, b: Build) -> None:
        """Offer `b` too (a just-in-time build), as if loaded with the others."""
        self.builds = sorted([*self.builds, b], key=lambda x: -_static(x))
        self._index_keywords()

    def _index_keywords(self) -> None:
        """The call keywords and the values built for each: the builds' `call` (parameters
        that tell variants apart), and a parameter with one value in every build (a one-value
        axis, `alpha = [2.5]`: no variant needs it told apart, a call may still say it)."""
        self._keywords, self._refs = {}, set()
        for b in self.builds:
            for k, v in b.call:
                if not any(_same(v, w) for w in self._keywords.setdefault(k, [])):
                    self._keywords[k].append(v)
        scalars = self.scalar_names()
        for k, v in self.builds[0].params if self.builds else ():
            if k in self._keywords or k in scalars or call_name_problem(k) is not None:
                continue
            if all(any(k2 == k and _same(v2, v) for k2, v2 in b.params) for b in self.builds):
                self._keywords[k] = [v]
        for b in self.builds:
            self._refs |= {(k, v) for k, v in (*b.params, *b.call) if k in b.refs and k in self._keywords}

    def _keyword(self, k: str, v: Any) -> Any:
        """A call keyword's value as builds record it: the reference's text for the object
        an import reference names (`op=operator.add` for `{ import = "operator:add" }`),
        else `v` itself."""
        if self._refs and not isinstance(v, (bool, int, float, str)):
            for w in self._keywords.get(k, ()):
                if (k, w) in self._refs and refs.names(w, v):
                    return w
        return v

    def _one_of(self, fits: list[tuple[Build, dict[str, int]]],
                keywords: Mapping[str, Any]) -> tuple[Build, dict[str, int]]:
        """The most specific of the builds a call fits: the one whose contract implies every
        other's (`implies`: `n % 4 == 0` implies `n % 2 == 0`). Builds no call tells apart
        (the same contract) are refused, and so is a call leaving out a keyword built with
        several values even where its arrays fit one (a padded tensor's static logical
        extent: a large buffer would fit them all); so are fits none of which implies the
        others (`m % 2` beside `n % 2`), naming the most specific ones: never a silent pick."""
        n = len(fits)
        over = [[i == j or (implies(fits[i][0].conv, fits[j][0].conv)
                            and set(fits[j][0].relations) <= set(fits[i][0].relations))
                 for j in range(n)] for i in range(n)]
        top = [fits[i] for i in range(n) if all(over[i])]
        # none implies every other: the fits no other is strictly more specific than
        best = top or [fits[i] for i in range(n)
                       if not any(over[j][i] and not over[i][j] for j in range(n))]
        missing = sorted({k for b, _ in best for k, _ in b.call
                          if k not in keywords and len(self._keywords[k]) > 1})
        if len(top) == 1 and not missing:
            return top[0]
        if missing:
            choices = "; ".join(f"{k} = " + " or ".join(sorted({repr(v) for b, _ in best
                                                                for k2, v in b.call if k2 == k}))
                                for k in missing)
            built = "; ".join(f"{k} = " + " or ".join(map(repr, self._keywords[k])) for k in missing)
            raise CallTypeError(f"missing call keyword {', '.join(map(repr, missing))}: these arrays "
                                f"fit {len(best)} variant(s), chosen by {choices} (built: {built}) "
                                f"(e.g. {self.name}(..., {missing[0]}=...))",
                                where=f'kernel "{self.name}"')
        names = ", ".join(sorted(b.variant for b, _ in best))
        if top:
            raise CallError(f"the call fits several variants equally: {names}; declare contracts "
                            "that tell them apart", where=f'kernel "{self.name}"')
        raise CallError(f"the call fits several variants, none more specific than the others: {names} "
                        "(no one's contract implies the others'); declare contracts that tell them "
                        "apart, or one that implies them", where=f'kernel "{self.name}"')
