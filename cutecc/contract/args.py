"""A kernel's argument contract: the launcher's own argument list, resolved for one variant.

Shared by the compiler (which builds fake arguments and a wrapper from it) and the
runtime (which checks calls against it); imports neither the DSL nor JAX. The contract
is stored as JSON in each cache entry, so the runtime never imports a kernel's Python.

The JAX-side calling convention derived from it is fixed, whatever the launcher's order:
`kernel(*inputs, **scalars) -> results`, where inputs are the tensors of role
"input" or "inout" and results those of role "output" or "inout", each in launcher
order (tuples flattened); "inout" tensors alias their input buffer. Tensors of role
"scratch" are neither: the runtime allocates them (zeroed ones as aliased inputs made
by `jnp.zeros`, the others as extra results) and drops them. An extent may be derived
(an expression over symbols, `cutecc.contract.expr`), and so may a scalar's value: the runtime
computes such a scalar, the caller does not pass it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutecc.contract import expr

# An int is a static extent; a str names a symbolic one, or is an expression over
# symbols (a derived extent, `cutecc.contract.expr`; outputs and scratch only).
Dim = int | str

ROLES = ("input", "output", "inout", "scratch")
LAYOUTS = ("row-major", "column-major")  # or a stride order, see `TensorArg.order`


@dataclass(frozen=True)
class StrideSymbol:
    """A stride compiled as a runtime value (`cute.sym_int`), as published kernels' own
    builds compile their row strides: the kernel takes the stride the array has, a multiple
    of `divisibility`, as a `bits`-bit integer."""

    name: str
    divisibility: int = 1
    bits: int = 32


Stride = int | StrideSymbol


@dataclass(frozen=True)
class TensorArg:
    name: str
    role: str
    dtype: str
    shape: tuple[Dim, ...]
    layout: str = "row-major"  # how the manifest said it; `order` is what counts
    align: int = 16  # bytes the data pointer is assumed aligned to
    param: str | None = None  # passed to the launcher by this keyword (else positionally)
    # Stride order of the logical dimensions, 0 = the stride-1 one (the DSL's
    # `stride_order`); None = row-major, as JAX lays arrays out.
    order: tuple[int, ...] | None = None
    # Per dimension, a number the extent of the array passed (`extents`) is a multiple
    # of (None = no such promise).
    divisibility: tuple[int, ...] | None = None
    # A padded tensor: the shape of the array passed, in logical dimension order, of
    # which the kernel sees the `shape` block at the origin with the buffer's strides
    # (BLAS's `lda`). None = the array is the tensor (no padding).
    buffer: tuple[Dim, ...] | None = None
    zero: bool = False  # a scratch tensor the runtime hands over zeroed
    # An output saved for the backward kernel (a residual: FA4's lse, RMSNorm's rstd): a
    # result of the custom call, not of the JAX call.
    saved: bool = False
    # "sum": the call returns this output summed over its leading axis (per-SM partials).
    reduce: str | None = None
    # The dimensions (of `extents`) whose symbolic extent is compiled as a 64-bit integer
    # (`symbols.n.bits = 64`); None: all 32-bit.
    wide: tuple[int, ...] | None = None
    # Broadcast dimensions: the array passed has extent 1 there (`buffer`), and the kernel
    # sees the logical extent with stride 0 (a `dloss` broadcast over rows).
    broadcast: tuple[int, ...] | None = None
    # An output the kernel may write in the memory of this input (by name), because it
    # reads each element before writing it (elementwise, per-row norms). Nothing of the
    # bytes: what the runtime may ask of XLA (`KernelFn.in_place`). None: never.
    may_alias: str | None = None
    # Declared with `mode` (cutlass_call's): the array a call passes, and gets back for a
    # result, is the buffer itself in its own dimension order (`held`), which the kernel
    # views through `order` with no copy. False: the call's array is in the kernel's
    # (logical) order, transposed to the buffer `order` declares.
    mode: bool = False
    # Per logical dimension, the stride the kernel is compiled with: static (an int) or a
    # runtime value (`StrideSymbol`). None: derived from the extents, as a dense buffer's
    # (static wherever the extents after it are).
    stride: tuple[Stride, ...] | None = None
    # Dimensions whose static or derived extent is compiled as a runtime value (each its own
    # symbol, no divisibility), as the kernel's own build compiles it; the call still checks
    # (for an output: computes) the extent. None: compiled as declared.
    runtime: tuple[int, ...] | None = None
    # An input the call passes only for its extents: they bind symbols an output's shape
    # needs that the launcher's own tensors do not carry (FA4's dq, sized like q by a
    # postprocess that takes only a rounded accumulator). The custom call takes its buffer
    # (a pointer: no copy); the launcher never receives it.
    extents_only: bool = False

    @property
    def held(self) -> tuple[int, ...]:
        """The kernel's dimensions in the order of the array a call passes (or gets back):
        the buffer's (`perm`) for a tensor declared with `mode`, else the kernel's own."""
        return self.perm if self.mode else tuple(range(len(self.shape)))

    @property
    def transpose(self) -> tuple[int, ...] | None:
        """The permutation that takes the array a call passes to the dense buffer the kernel
        sees (`jnp.transpose(a, transpose)`); None when the array is that buffer (row-major,
        or declared with `mode`)."""
        return None if self.order is None or self.mode else self.perm

    @property
    def extents(self) -> tuple[Dim, ...]:
        """The shape of the array a call passes (the buffer's, for a padded tensor)."""
        return self.shape if self.buffer is None else self.buffer

    @property
    def symbols(self) -> tuple[str, ...]:
        """Every symbol the tensor's extents name (those a derived extent reads included),
        logical then buffer, once each."""
        return tuple(dict.fromkeys(n for d in (*self.shape, *(self.buffer or ())) if isinstance(d, str)
                                   for n in ((d,) if expr.is_symbol(d) else expr.names(d))))

    @property
    def padded(self) -> tuple[int, ...]:
        """The dimensions whose logical extent may be smaller than the buffer's."""
        if self.buffer is None:
            return ()
        return tuple(i for i, (d, b) in enumerate(zip(self.shape, self.buffer)) if d != b)

    @property
    def perm(self) -> tuple[int, ...]:
        """The logical dimensions in the buffer's order, slowest first: the buffer the
        kernel sees is the logical array transposed by `perm`, dense and row-major."""
        if self.order is None:
            return tuple(range(len(self.shape)))
        return tuple(sorted(range(len(self.shape)), key=lambda i: -self.order[i]))  # type: ignore[index]

    def multiple(self, i: int) -> int:
        """What dimension `i`'s extent is declared a multiple of (1: nothing)."""
        return 1 if self.divisibility is None else self.divisibility[i]

    @property
    def stride_symbols(self) -> tuple[str, ...]:
        """The names of the strides declared symbolic."""
        return tuple(d.name for d in self.stride or () if isinstance(d, StrideSymbol))


def dense_strides(t: TensorArg, buffer: tuple[Any, ...]) -> tuple[Any, ...]:
    """Per logical dimension of `t`, its stride in the dense buffer of shape `buffer` (its
    dimensions in `perm` order, as a call passes it); ints, or products of them (symbolic
    dimensions under `jax.export`)."""
    out: list[Any] = [1] * len(buffer)
    step: Any = 1
    for j in range(len(buffer) - 1, -1, -1):
        out[t.perm[j]] = step
        step = step * buffer[j]
    return tuple(out)


def stride_text(t: TensorArg) -> list[str]:
    """Per logical dimension, the stride the kernel is compiled with, as `cutecc show` says
    it: an int where static, else the symbol or the product of extents it is read from."""
    if t.stride is not None:
        return [str(d) if isinstance(d, int) else d.name for d in t.stride]
    ext = t.extents
    out = [""] * len(ext)
    factors: list[Dim] = []
    for p in reversed(t.perm):
        static = 1
        names = []
        for f in reversed(factors):  # slowest first, as the dimensions read
            if isinstance(f, int):
                static *= f
            else:
                names.append(f if expr.is_symbol(f) else f"({f})")
        out[p] = "*".join(([str(static)] if static != 1 or not names else []) + names)
        # a `runtime` dimension is compiled as a value of its own: `dim1` for dimension 1
        factors.append(f"dim{p}" if p in (t.runtime or ()) and not expr.is_derived(ext[p]) else ext[p])
    return out


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str
    default: float | int | bool | None = None
    param: str | None = None
    # A derived scalar: an int, or an expression over the contract's symbols, that the
    # runtime computes and passes (not a keyword of the call). None: the caller's.
    value: int | str | None = None


@dataclass(frozen=True)
class NoneArg:
    """An optional tensor slot compiled as `None` (and passed as `None`). `slot`: the name
    of the input tensor other variants put there (`present = "$param"`): a call passes
    `None` in its place, or leaves it out, to reach this variant."""

    param: str | None = None
    slot: str | None = None


@dataclass(frozen=True)
class StreamArg:
    """Where the launcher takes its CUDA stream; the caller's (XLA's) stream is used."""

    param: str | None = None


@dataclass(frozen=True)
class TupleArg:
    items: tuple[Arg, ...]
    param: str | None = None


@dataclass(frozen=True)
class ConstArg:
    """A compile-time value passed in the launcher's order; `value` is its manifest form
    (JSON: numbers, strings, arrays for tuples, typed tables, see `cutecc.values`)."""

    value: Any
    param: str | None = None


@dataclass(frozen=True)
class StructArg:
    """A NamedTuple or dataclass (`type`, "pkg.mod:Name") built from argument `fields`."""

    type: str
    fields: tuple[tuple[str, Arg], ...]
    param: str | None = None


Arg = TensorArg | ScalarArg | NoneArg | StreamArg | TupleArg | ConstArg | StructArg


def flat_leaves(args: tuple[Arg, ...]) -> list[Arg]:
    """All arguments in launcher order with tuples and structs flattened."""
    out: list[Arg] = []
    for a in args:
        if isinstance(a, TupleArg):
            out.extend(flat_leaves(a.items))
        elif isinstance(a, StructArg):
            out.extend(flat_leaves(tuple(f for _, f in a.fields)))
        else:
            out.append(a)
    return out


@dataclass(frozen=True)
class CallingConvention:
    """The canonical JAX-side order derived from a launcher's arguments."""

    inputs: tuple[TensorArg, ...]
    results: tuple[TensorArg, ...]
    scalars: tuple[ScalarArg, ...]  # every runtime scalar, derived ones included
    # (input index, result index) for every "inout" tensor
    aliases: tuple[tuple[int, int], ...]
    scratch: tuple[TensorArg, ...] = ()  # role "scratch": allocated by the runtime, dropped
    # The call's positional slots in launcher order, each (name, present): the inputs, and
    # the optional slots this variant was built with None in (`NoneArg.slot`, present False).
    slots: tuple[tuple[str, bool], ...] = ()

    @property
    def absent(self) -> tuple[str, ...]:
        """The optional slots this variant takes as None."""
        return tuple(n for n, here in self.slots if not here)

    @classmethod
    def of(cls, args: tuple[Arg, ...]) -> CallingConvention:
        leaves = flat_leaves(args)
        tensors = [a for a in leaves if isinstance(a, TensorArg)]
        inputs = tuple(t for t in tensors if t.role in ("input", "inout"))
        results = tuple(t for t in tensors if t.role in ("output", "inout"))
        aliases = tuple(
            (inputs.index(t), results.index(t)) for t in tensors if t.role == "inout"
        )
        scalars = tuple(a for a in leaves if isinstance(a, ScalarArg))
        scratch = tuple(t for t in tensors if t.role == "scratch")
        slots = tuple((a.name, True) if isinstance(a, TensorArg) else (str(a.slot), False)
                      for a in leaves if (isinstance(a, TensorArg) and a.role in ("input", "inout"))
                      or (isinstance(a, NoneArg) and a.slot is not None))
        return cls(inputs, results, scalars, aliases, scratch, slots)

    @property
    def visible(self) -> tuple[TensorArg, ...]:
        """The results a call returns: all but the saved ones (residuals)."""
        return tuple(t for t in self.results if not t.saved)

    @property
    def given(self) -> tuple[ScalarArg, ...]:
        """The scalars a call passes (keywords): those not derived."""
        return tuple(s for s in self.scalars if s.value is None)

    @property
    def ffi_inputs(self) -> tuple[TensorArg, ...]:
        """The custom call's operands: the call's inputs, then the zeroed scratch (made by
        `jnp.zeros` and aliased to its result, so the kernel may write it)."""
        return self.inputs + tuple(t for t in self.scratch if t.zero)

    @property
    def ffi_results(self) -> tuple[TensorArg, ...]:
        """The custom call's results: the call's results, then every scratch tensor (XLA
        allocates it; the runtime drops it)."""
        return self.results + self.scratch

    @property
    def may_aliases(self) -> tuple[tuple[int, int], ...]:
        """(input index, result index) for every output declared `may_alias`: pairs an
        in-place call adds to `ffi_aliases` (checked by `may_alias_problem`)."""
        names = [t.name for t in self.inputs]
        return tuple((names.index(t.may_alias), i) for i, t in enumerate(self.results)
                     if t.may_alias is not None and t.may_alias in names)

    @property
    def ffi_aliases(self) -> tuple[tuple[int, int], ...]:
        zeroed = [t for t in self.scratch if t.zero]
        return self.aliases + tuple((len(self.inputs) + i, len(self.results) + self.scratch.index(t))
                                    for i, t in enumerate(zeroed))


# JSON form, stored in cache metadata ------------------------------------------------

_TENSOR_FIELDS = frozenset({"kind", "name", "role", "dtype", "shape", "layout", "align", "param",
                            "order", "divisibility", "buffer", "zero", "saved", "reduce", "wide",
                            "broadcast", "may_alias", "mode", "stride", "runtime",
                            "extents_only"})


def arg_to_json(a: Arg) -> dict[str, Any]:
    out = _arg_json(a)
    if a.param is not None:  # only when set: contracts without keywords keep their keys
        out["param"] = a.param
    return out


def _arg_json(a: Arg) -> dict[str, Any]:
    if isinstance(a, TensorArg):
        out = {"kind": "tensor", "name": a.name, "role": a.role, "dtype": a.dtype,
               "shape": list(a.shape), "layout": a.layout, "align": a.align}
        if a.order is not None:  # only when set: row-major contracts keep their keys
            out["order"] = list(a.order)
        if a.divisibility is not None:
            out["divisibility"] = list(a.divisibility)
        if a.buffer is not None:  # only when set: unpadded contracts keep their keys
            out["buffer"] = list(a.buffer)
        if a.zero:  # only when set: contracts without zeroed scratch keep their keys
            out["zero"] = True
        if a.saved:
            out["saved"] = True
        if a.reduce is not None:
            out["reduce"] = a.reduce
        if a.wide is not None:
            out["wide"] = list(a.wide)
        if a.broadcast is not None:
            out["broadcast"] = list(a.broadcast)
        if a.may_alias is not None:  # only when set: contracts without it keep their keys
            out["may_alias"] = a.may_alias
        if a.mode:  # only when set: contracts declared with `layout` keep their keys
            out["mode"] = True
        if a.stride is not None:  # only when set: contracts with dense strides keep their keys
            out["stride"] = [d if isinstance(d, int) else
                             {"symbol": d.name, "divisibility": d.divisibility, "bits": d.bits}
                             for d in a.stride]
        if a.runtime is not None:  # only when set: contracts with static extents compiled in keep their keys
            out["runtime"] = list(a.runtime)
        if a.extents_only:  # only when set: contracts without it keep their keys
            out["extents_only"] = True
        return out
    if isinstance(a, ScalarArg):
        out = {"kind": "scalar", "name": a.name, "dtype": a.dtype, "default": a.default}
        if a.value is not None:  # only when set: contracts without derived scalars keep their keys
            out["value"] = a.value
        return out
    if isinstance(a, NoneArg):  # the slot only when set: plain None arguments keep their keys
        return {"kind": "none"} if a.slot is None else {"kind": "none", "slot": a.slot}
    if isinstance(a, StreamArg):
        return {"kind": "stream"}
    if isinstance(a, ConstArg):
        return {"kind": "const", "value": a.value}
    if isinstance(a, StructArg):
        return {"kind": "struct", "type": a.type, "fields": {k: arg_to_json(f) for k, f in a.fields}}
    return {"kind": "tuple", "items": [arg_to_json(i) for i in a.items]}


def arg_from_json(d: dict[str, Any]) -> Arg:
    kind, param = d["kind"], d.get("param")
    if kind == "tensor":
        unknown = set(d) - _TENSOR_FIELDS
        if unknown:  # a newer cutecc's contract: refuse it rather than drop what it says
            raise ValueError(f"unknown tensor field {sorted(unknown)[0]!r} (a newer cutecc's entry?)")
        order, div, buffer = d.get("order"), d.get("divisibility"), d.get("buffer")
        rank = len(d["shape"])
        if order is not None and sorted(int(i) for i in order) != list(range(rank)):
            raise ValueError(f"order {order!r} is not a permutation of 0..{rank - 1}")
        if div is not None and (len(div) != rank or not all(type(k) is int and k > 0 for k in div)):
            raise ValueError(f"divisibility {div!r} is not one positive int per dimension")
        if buffer is not None and (not isinstance(buffer, list) or len(buffer) != rank or not all(
                (type(b) is int and b > 0) or isinstance(b, str) for b in buffer)):
            raise ValueError(f"buffer {buffer!r} is not one extent per dimension")
        zero = d.get("zero", False)
        if zero is not False and (zero is not True or d["role"] != "scratch"):
            raise ValueError(f"zero {zero!r}: only a scratch tensor may be zeroed (zero = true)")
        saved, reduce = d.get("saved", False), d.get("reduce")
        if saved is not False and (saved is not True or d["role"] != "output"):
            raise ValueError(f"saved {saved!r}: only an output may be saved (saved = true)")
        if reduce is not None and (reduce != "sum" or d["role"] != "output" or len(d["shape"]) < 1):
            raise ValueError(f"reduce {reduce!r}: only an output may be reduced, by \"sum\"")
        wide, bcast = d.get("wide"), d.get("broadcast")
        for what, dims in (("wide", wide), ("broadcast", bcast)):
            if dims is not None and (not isinstance(dims, list) or not all(
                    type(i) is int and 0 <= i < rank for i in dims) or len(set(dims)) != len(dims)):
                raise ValueError(f"{what} {dims!r} is not a list of dimensions")
        if bcast is not None and (buffer is None or d["role"] != "input"
                                  or any(buffer[i] != 1 for i in bcast)):
            raise ValueError(f"broadcast {bcast!r}: only an input, whose buffer has extent 1 there")
        for x in (*d["shape"], *(buffer or ())):
            if isinstance(x, str) and not expr.is_symbol(x):
                try:
                    expr.parse(x)
                except expr.ExprError as e:
                    raise ValueError(f"extent {x!r}: {e}") from None
                if d["role"] in ("input", "inout") or buffer is not None:
                    raise ValueError(f"derived extent {x!r} in an {d['role']} (outputs and scratch only)")
        may_alias = d.get("may_alias")
        if may_alias is not None and (not isinstance(may_alias, str) or d["role"] != "output"):
            raise ValueError(f"may_alias {may_alias!r}: only an output may name an input to be "
                             "written in")
        mode = d.get("mode", False)
        if mode is not False and (mode is not True or order is None or d["role"] == "scratch"
                                  or reduce is not None):
            raise ValueError(f"mode {mode!r}: only a tensor a call passes or gets back, in an order "
                             "other than row-major and not reduced, is viewed as the caller holds it")
        stride = None if d.get("stride") is None else _stride_from_json(d["stride"], rank)
        if stride is not None and (buffer is not None or d["role"] == "scratch"):
            raise ValueError("stride: a padded, broadcast or scratch tensor takes its buffer's strides")
        runtime = d.get("runtime")
        if runtime is not None and (not isinstance(runtime, list) or not runtime or any(
                type(i) is not int or not 0 <= i < rank or expr.is_symbol(d["shape"][i]) for i in runtime)):
            raise ValueError(f"runtime {runtime!r}: not indices of static or derived dimensions")
        if buffer is not None and d["role"] == "output":
            raise ValueError("an output cannot be padded (its padding would be undefined)")
        if buffer is not None and any(type(x) is int and type(b) is int and b < x
                                      for x, b in zip(d["shape"], buffer)):
            raise ValueError(f"buffer {buffer!r} is smaller than the shape {d['shape']!r}")
        extents_only = d.get("extents_only", False)
        if extents_only is not False and (extents_only is not True or d["role"] != "input"
                                          or param is not None or buffer is not None):
            raise ValueError(f"extents_only {extents_only!r}: only an unpadded input the launcher "
                             "takes by no keyword may be passed for its extents alone")
        return TensorArg(d["name"], d["role"], d["dtype"], tuple(d["shape"]),
                         d.get("layout", "row-major"), int(d.get("align", 16)), param,
                         None if order is None else tuple(int(i) for i in order),
                         None if div is None else tuple(div),
                         None if buffer is None else tuple(buffer), zero, saved, reduce,
                         None if wide is None else tuple(wide), None if bcast is None else tuple(bcast),
                         may_alias, mode, stride, None if runtime is None else tuple(runtime),
                         extents_only)
    if kind == "scalar":
        value = d.get("value")
        if value is not None and not (type(value) is int or isinstance(value, str)):
            raise ValueError(f"scalar value {value!r} is not an int or an expression")
        if isinstance(value, str):
            try:
                expr.parse(value)
            except expr.ExprError as e:
                raise ValueError(f"scalar {d['name']!r}: {e}") from None
        return ScalarArg(d["name"], d["dtype"], d.get("default"), param, value)
    if kind == "none":
        slot = d.get("slot")
        if slot is not None and not (isinstance(slot, str) and expr.is_symbol(slot)):
            raise ValueError(f"none slot {slot!r} is not a tensor name")
        return NoneArg(param, slot)
    if kind == "stream":
        return StreamArg(param)
    if kind == "tuple":
        return TupleArg(tuple(arg_from_json(i) for i in d["items"]), param)
    if kind == "const":
        return ConstArg(d["value"], param)
    if kind == "struct":
        return StructArg(d["type"], tuple((k, arg_from_json(f)) for k, f in d["fields"].items()), param)
    raise ValueError(f"unknown argument kind {kind!r}")


def _stride_from_json(v: Any, rank: int) -> tuple[Stride, ...]:
    if not isinstance(v, list) or len(v) != rank:
        raise ValueError(f"stride {v!r} is not one stride per dimension")
    out: list[Stride] = []
    for d in v:
        if type(d) is int and d >= 0:
            out.append(d)
        elif (isinstance(d, dict) and set(d) == {"symbol", "divisibility", "bits"}
              and isinstance(d["symbol"], str) and expr.is_symbol(d["symbol"])
              and type(d["divisibility"]) is int and d["divisibility"] > 0 and d["bits"] in (32, 64)):
            out.append(StrideSymbol(d["symbol"], d["divisibility"], d["bits"]))
        else:
            raise ValueError(f"stride {d!r} is neither an int nor a symbol")
    return tuple(out)


def may_alias_problem(args: tuple[Arg, ...]) -> tuple[str, str] | None:
    """(output name, why) for the first `may_alias` XLA could not honour, or None: it must
    name an input (role "input", not padded nor broadcast) of the output's dtype, shape and
    layout, and no input may be named twice. The manifest reports it with its key path; the
    runtime refuses an entry whose contract says otherwise."""
    tensors = [a for a in flat_leaves(args) if isinstance(a, TensorArg)]
    by_name = {t.name: t for t in tensors}
    taken: dict[str, str] = {}
    for t in tensors:
        if t.may_alias is None:
            continue
        src = by_name.get(t.may_alias)
        if src is None or src.role != "input":
            return t.name, f'"{t.may_alias}" is not an input of the kernel (role "input")'
        if src.extents_only:
            return t.name, f'input "{src.name}" is passed for its extents only: the kernel never sees it'
        if src.buffer is not None:
            return t.name, f'input "{src.name}" is padded or broadcast: its buffer is not the output\'s'
        if (src.dtype, src.shape, src.order, src.mode, src.stride) != (t.dtype, t.shape, t.order, t.mode,
                                                                     t.stride):
            return t.name, (f'input "{src.name}" ({src.dtype}{list(src.shape)}) differs from the '
                            f"output ({t.dtype}{list(t.shape)}) in dtype, shape or layout")
        if t.reduce is not None:
            return t.name, "a reduced output is not what the kernel writes: it cannot alias an input"
        if src.name in taken:
            return t.name, f'input "{src.name}" is already named by output "{taken[src.name]}"'
        taken[src.name] = t.name
    return None


def launched(args: tuple[Arg, ...]) -> tuple[Arg, ...]:
    """The launcher's own arguments: `args` less the inputs passed for their extents only
    (`TensorArg.extents_only`, top-level arguments only, as the manifest allows)."""
    return tuple(a for a in args if not (isinstance(a, TensorArg) and a.extents_only))


def args_to_json(args: tuple[Arg, ...]) -> list[dict[str, Any]]:
    return [arg_to_json(a) for a in args]


def args_from_json(items: list[dict[str, Any]]) -> tuple[Arg, ...]:
    args = tuple(arg_from_json(d) for d in items)
    if any(isinstance(a, TensorArg) and a.extents_only for a in flat_leaves(launched(args))):
        raise ValueError("extents_only: a tensor in a tuple or struct is the launcher's own")
    return args


def _result_dims(t: TensorArg) -> tuple[Dim, ...]:
    """The dimensions of the array a call returns for result `t`: the buffer (an inout
    padded tensor's result is its whole buffer), less the leading axis a reduction sums."""
    return t.extents[1:] if t.reduce == "sum" else t.extents


def shard_factors(t: TensorArg, shard: tuple[str, ...], result: bool = False) -> tuple[str | None, ...]:
    """Per dimension of the array passed for input `t` (or returned for result `t`): the
    declared independent symbol it may be split along, or None (replicated). A broadcast
    dimension (passed with extent 1) is never split."""
    dims = _result_dims(t) if result else t.extents
    bcast = () if result else (t.broadcast or ())
    logical = tuple(d if isinstance(d, str) and d in shard and i not in bcast else None
                    for i, d in enumerate(dims))
    return tuple(logical[p] for p in t.held) if t.mode else logical  # `mode`: the buffer's order


# What a kernel's call does under an explicit mesh when its inputs are split where its shard
# rule does not allow (`reshard` in the manifest; `cutecc.runtime.strict`): the first is the default.
RESHARD = ("error", "warn", "allow")


def shard_problem(conv: CallingConvention, shard: tuple[str, ...]) -> str | None:
    """Why `shard` (symbols a kernel declares it is independent along) cannot be a sound
    rule for splitting its calls, or None. Each must be a plain symbolic extent of some
    input, never read by a derived extent of a tensor the call passes or returns, never an
    extent of a padded tensor, at most once per tensor, and a dimension of every result:
    a result without it would be a sum or a choice over all of its indices, which no
    device holds alone. (Scratch and derived scalars follow the local shapes: free.)"""
    if len(set(shard)) != len(shard):
        return "names a symbol twice"
    for s in shard:
        if not expr.is_symbol(s):
            return f'"{s}" is not a symbolic extent'
        if not any(s in t.extents for t in conv.inputs):
            return f'"{s}" is no extent of an input array'
        for t in (*conv.inputs, *conv.results):
            dims = [d for d in t.extents if isinstance(d, str)]
            if dims.count(s) > 1:
                return f'"{s}" is the extent of two dimensions of "{t.name}"'
            if any(not expr.is_symbol(d) and s in expr.names(d) for d in (*t.shape, *t.extents)
                   if isinstance(d, str)):
                return f'"{s}" is read by a derived extent of "{t.name}"'
            if t.buffer is not None and s in t.symbols:
                return f'"{s}" is an extent of "{t.name}", a padded tensor'
        for t in conv.results:
            if s not in _result_dims(t):
                return (f'result "{t.name}" has no dimension "{s}": each of its elements may read '
                        f'every index of "{s}", which no one device holds')
    return None
