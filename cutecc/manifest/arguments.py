"""A kernel's arguments (`args = [..]`): tensors, scalars, tuples, structs and the rest,
their shapes, buffers, layouts and strides, the checks across one launcher's arguments, and
the facts of its symbolic extents (`symbols`)."""

from __future__ import annotations

import dataclasses
import keyword
from typing import Any

from cutecc.contract import dtypes, expr
from cutecc.contract.args import (
    ROLES,
    Arg,
    ConstArg,
    Dim,
    NoneArg,
    ScalarArg,
    StreamArg,
    Stride,
    StrideSymbol,
    StructArg,
    TensorArg,
    TupleArg,
    flat_leaves,
    may_alias_problem,
)
from cutecc.manifest.grammar import (
    _INT_RANGE,
    _SCALAR_KEYS,
    _TENSOR_KEYS,
    IMPORT_RE,
    MAX_ALIGN,
    MAX_DIVISIBILITY,
    MAX_DIVISIBILITY_32,
    MAX_STATIC_EXTENT,
    MAX_TUPLE_DEPTH,
    NAME_RE,
    _Ctx,
    _name,
    _no_unknown,
    _str,
    _tname,
)
from cutecc.manifest.model import Value as _Value
from cutecc.manifest.values import _REF_RE, _dtype, _expression, _scalar_expr, _subst, _value
from cutecc.names import call_name_problem


def _symbols(ctx: _Ctx, kp: str, v: Any) -> tuple[dict[str, int | str], frozenset[str]]:
    """`symbols = { n = { divisibility = 8, bits = 64 } }`: per symbolic extent, what it is a
    multiple of; and the symbols compiled as 64-bit integers (extents of 2^31 and more)."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of symbol = { divisibility = k, bits = 32 | 64 }")
    out: dict[str, int | str] = {}
    wide = set()
    for name, facts in v.items():
        if not NAME_RE.fullmatch(name):
            raise ctx.fail(f"{kp}.{name}", "not a valid symbol name")
        if not isinstance(facts, dict):
            raise ctx.fail(f"{kp}.{name}", f"must be a table {{ divisibility = k }}, got {_tname(facts)}")
        _no_unknown(ctx, facts, {"divisibility", "bits"}, f"{kp}.{name}")
        bits = facts.get("bits", 32)
        if type(bits) is not int or bits not in (32, 64):
            raise ctx.fail(f"{kp}.{name}.bits", f"must be 32 or 64, got {bits!r}")
        if bits == 64:
            wide.add(name)
        k = facts.get("divisibility", 1)
        if isinstance(k, str) and _REF_RE.fullmatch(k):  # "$param": resolved per variant
            out[name] = k
            continue
        _check_divisibility(ctx, f"{kp}.{name}.divisibility", k, bits == 64)
        out[name] = k
    return out, frozenset(wide)


def _check_divisibility(ctx: _Ctx, kp: str, k: Any, wide: bool) -> int:
    """A divisibility a symbol of its width can carry (`bits = 64`: `wide`)."""
    cap = MAX_DIVISIBILITY if wide else MAX_DIVISIBILITY_32
    if type(k) is not int or not 1 <= k <= cap:
        more = "" if wide else f" (up to {MAX_DIVISIBILITY} with bits = 64)"
        raise ctx.fail(kp, f"must be an int from 1 to {cap} or a \"$param\"{more}, got {k!r}")
    return k


def _variant_symbols(ctx: _Ctx, kp: str, symbols: dict[str, int | str], env: dict[str, Any],
                     hw: dict[str, Any], wide: frozenset[str] = frozenset()) -> dict[str, int]:
    """The kernel's `symbols` divisibilities for one variant: a "$param" (a variant or
    derived parameter, e.g. 16 bytes in elements of the variant's dtype) substituted."""
    def one(n: str, k: int | str) -> int:
        if isinstance(k, int):
            return k
        where = f"{kp}.{n}.divisibility"
        return _check_divisibility(ctx, where, _subst(ctx, where, k, env, hw), n in wide)
    return {n: one(n, k) for n, k in symbols.items()}


def _with_divisibility(a: Arg, symbols: dict[str, int], wide: frozenset[str] = frozenset()) -> Arg:
    """`a` with the divisibility of each tensor dimension's array extent (the buffer's,
    when padded: a padded logical extent is bound, and checked, where it is unpadded)
    from the kernel's `symbols`."""
    if isinstance(a, TensorArg):
        div = tuple(expr.multiple_of(d, symbols) if expr.is_derived(d) else
                    symbols.get(d, 1) if isinstance(d, str) else 1 for d in a.extents)
        a = dataclasses.replace(a, divisibility=div if any(k > 1 for k in div) else None)
        w = tuple(i for i, d in enumerate(a.extents) if d in wide)
        if a.stride is not None:
            a = dataclasses.replace(a, stride=tuple(
                StrideSymbol(d.name, symbols.get(d.name, 1), 64 if d.name in wide else 32)
                if isinstance(d, StrideSymbol) else d for d in a.stride))
        return dataclasses.replace(a, wide=w or None)
    if isinstance(a, TupleArg):
        return dataclasses.replace(a, items=tuple(_with_divisibility(i, symbols, wide) for i in a.items))
    if isinstance(a, StructArg):
        return dataclasses.replace(a, fields=tuple((k, _with_divisibility(f, symbols, wide))
                                                   for k, f in a.fields))
    return a


def _arg(ctx: _Ctx, kp: str, a: Any, env: dict[str, _Value], hw: dict[str, Any],
         depth: int = 0) -> Arg:
    arg = _arg_kind(ctx, kp, a, env, hw, depth)
    param = a.get("param") if isinstance(a, dict) else None
    if param is not None:
        if not isinstance(param, str) or not NAME_RE.fullmatch(param) or keyword.iskeyword(param):
            raise ctx.fail(f"{kp}.param", f"{param!r} is not a valid keyword argument name")
        arg = dataclasses.replace(arg, param=param)
    return arg


def _arg_kind(ctx: _Ctx, kp: str, a: Any, env: dict[str, _Value], hw: dict[str, Any],
              depth: int = 0) -> Arg:
    if not isinstance(a, dict):
        raise ctx.fail(kp, f"an argument must be a table, got {_tname(a)}")
    kind = a.get("kind", "tensor")
    if kind == "stream":
        _no_unknown(ctx, a, {"kind", "param"}, kp)
        return StreamArg()
    if kind == "none":
        _no_unknown(ctx, a, {"kind", "param"}, kp)
        return NoneArg()
    if kind == "const":
        _no_unknown(ctx, a, {"kind", "value", "param"}, kp)
        if "value" not in a:
            raise ctx.fail(kp, 'missing "value" (a compile-time value)')
        return ConstArg(_value(ctx, f"{kp}.value", a["value"], env, hw))
    if kind == "struct":
        _no_unknown(ctx, a, {"kind", "type", "fields", "param"}, kp)
        t = _str(ctx, f"{kp}.type", a.get("type"))
        if not IMPORT_RE.fullmatch(t):
            raise ctx.fail(f"{kp}.type", 'must name a NamedTuple or dataclass as '
                           f'"package.module:Name", got "{t}"')
        fields = a.get("fields", {})
        if not isinstance(fields, dict):
            raise ctx.fail(f"{kp}.fields", "must be a table of field = argument")
        if depth >= MAX_TUPLE_DEPTH:
            raise ctx.fail(kp, f"structs nested more than {MAX_TUPLE_DEPTH} deep")
        for fk in fields:
            if not NAME_RE.fullmatch(fk) or keyword.iskeyword(fk):
                raise ctx.fail(f"{kp}.fields.{fk}", "a field name must be an identifier")
        return StructArg(t, tuple((fk, _arg(ctx, f"{kp}.fields.{fk}", fv, env, hw, depth + 1))
                                  for fk, fv in fields.items()))
    if kind == "tuple":
        _no_unknown(ctx, a, {"kind", "items", "param"}, kp)
        items = a.get("items")
        if not isinstance(items, list) or not items:
            raise ctx.fail(f"{kp}.items", "a tuple needs a non-empty array of items")
        if depth >= MAX_TUPLE_DEPTH:
            raise ctx.fail(kp, f"tuples nested more than {MAX_TUPLE_DEPTH} deep")
        return TupleArg(tuple(_arg(ctx, f"{kp}.items[{i}]", x, env, hw, depth + 1)
                              for i, x in enumerate(items)))
    if kind == "scalar":
        _no_unknown(ctx, a, _SCALAR_KEYS, kp)
        name = _name(ctx, kp, a)
        why = call_name_problem(name, "runtime scalar")  # a keyword of the kernel's call
        if why:
            raise ctx.fail(f"{kp}.name", why)
        dt = _dtype(ctx, f"{kp}.dtype", a, env, hw)
        if dt not in dtypes.SCALAR_DTYPES:
            allowed = ", ".join(dtypes.SCALAR_DTYPES)
            raise ctx.fail(f"{kp}.dtype", f'a runtime scalar must be one of {allowed}, got "{dt}"')
        default = a.get("default")
        if "value" in a:
            if default is not None:
                raise ctx.fail(f"{kp}.value", "a derived scalar (value) has no default: the "
                               "runtime computes it")
            return ScalarArg(name, dt, None, value=_scalar_expr(ctx, f"{kp}.value", a["value"], dt,
                                                                 env, hw))
        if default is not None:
            ok = isinstance(default, bool) if dt == "bool" else (
                isinstance(default, (int, float)) and not isinstance(default, bool)
                and (dt.startswith("float") or isinstance(default, int)))
            if not ok:
                raise ctx.fail(f"{kp}.default", f"{default!r} is not a {dt}")
            lo, hi = _INT_RANGE.get(dt, (None, None))
            if lo is not None and not lo <= default <= hi:
                raise ctx.fail(f"{kp}.default", f"{default} is out of the range of {dt} ({lo}..{hi})")
            if dt == "float32" and isinstance(default, float) and abs(default) > 3.4028234663852886e38:
                raise ctx.fail(f"{kp}.default", f"{default} is out of the range of float32")
        return ScalarArg(name, dt, default)
    if kind != "tensor":
        raise ctx.fail(f"{kp}.kind", f'unknown argument kind "{kind}" '
                       "(tensor, scalar, none, stream, tuple, const, struct)")
    _no_unknown(ctx, a, _TENSOR_KEYS, kp)
    name = _name(ctx, kp, a)
    role = a.get("role", "input")
    if role not in ROLES:
        raise ctx.fail(f"{kp}.role", f'unknown role "{role}" (input, output, inout, scratch)')
    saved, reduce = a.get("saved", False), a.get("reduce")
    if type(saved) is not bool or (saved and role != "output"):
        raise ctx.fail(f"{kp}.saved", "only an output may be saved for the backward (saved = true), "
                       f"got {saved!r}" + ("" if role == "output" else f" on an {role}"))
    if reduce is not None and (reduce != "sum" or role != "output"):
        raise ctx.fail(f"{kp}.reduce", 'only an output may be reduced, by "sum" (over its leading '
                       f"axis), got {reduce!r}" + ("" if role == "output" else f" on an {role}"))
    if saved and reduce is not None:
        raise ctx.fail(f"{kp}.reduce", "a saved output is handed to the backward as written: "
                       "it cannot be reduced")
    may_alias = a.get("may_alias")
    if may_alias is not None and (not isinstance(may_alias, str) or role != "output"):
        raise ctx.fail(f"{kp}.may_alias", 'only an output may be written in an input\'s memory: '
                       f'may_alias = "<input name>", got {may_alias!r}'
                       + ("" if role == "output" else f" on an {role}"))
    zero = a.get("zero", False)
    if type(zero) is not bool or (zero and role != "scratch"):
        raise ctx.fail(f"{kp}.zero", 'only a scratch tensor (role = "scratch") may be zeroed: '
                       f"zero = true, got {zero!r}" + ("" if role == "scratch" else f" on an {role}"))
    dt = _dtype(ctx, f"{kp}.dtype", a, env, hw)
    if "shape" not in a:
        raise ctx.fail(kp, 'missing "shape" (a list of ints and symbol names)')
    shape = a["shape"]
    if not isinstance(shape, list):
        raise ctx.fail(f"{kp}.shape", f"must be an array, got {_tname(shape)}")
    dims = _dims(ctx, f"{kp}.shape", shape, env, hw, derived=role in ("output", "scratch"))
    runtime = _runtime_dims(ctx, f"{kp}.runtime", a["runtime"], dims, role) if "runtime" in a else None
    if runtime is not None and ("buffer" in a or "broadcast" in a):
        raise ctx.fail(f"{kp}.runtime", "a padded or broadcast tensor's extents are read from its buffer")
    if role == "scratch" and "buffer" in a:
        raise ctx.fail(f"{kp}.buffer", "a scratch tensor cannot be padded (the runtime allocates it)")
    buffer = _buffer(ctx, kp, a, dims, role, env, hw) if "buffer" in a else None
    bcast = _broadcast(ctx, f"{kp}.broadcast", a["broadcast"], dims, role) if "broadcast" in a else None
    if bcast is not None:
        if "buffer" in a:
            raise ctx.fail(f"{kp}.broadcast", "a broadcast tensor cannot be padded too (buffer)")
        buffer = tuple(1 if i in bcast else d for i, d in enumerate(dims))
    if "mode" in a:
        if "layout" in a:
            raise ctx.fail(f"{kp}.mode", "give mode or layout, not both (mode = [m, ..] is the "
                           "stride order layout = [rank - 1 - m, ..] of the row-major array passed)")
        order = _mode(ctx, f"{kp}.mode", a["mode"], len(dims))
        if role == "scratch" or reduce is not None:
            raise ctx.fail(f"{kp}.mode", "a mode says how the caller holds an array it passes or gets "
                           "back: not for " + ("scratch" if role == "scratch" else "a reduced output"))
    else:
        order = _order(ctx, f"{kp}.layout", a.get("layout", "row-major"), len(dims))
    stride = _stride(ctx, f"{kp}.stride", a["stride"], dims, role, "buffer" in a or bcast is not None) \
        if "stride" in a else None
    align = _subst(ctx, f"{kp}.align", a.get("align", 16), env, hw)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ctx.fail(f"{kp}.align", f"must be a positive power of two (bytes), got {align!r}")
    if align > MAX_ALIGN:
        raise ctx.fail(f"{kp}.align", f"must be at most {MAX_ALIGN} (bytes), got {align}")
    label = ("row-major" if order is None else
             "column-major" if order == tuple(range(len(dims))) else "strided")
    if reduce is not None and not dims:
        raise ctx.fail(f"{kp}.reduce", "a scalar (rank 0) output has no leading axis to sum over")
    extents_only = _extents_only(ctx, kp, a, role, depth) if "extents_only" in a else False
    if "present" in a and not _present(ctx, f"{kp}.present", a["present"], role, env, hw):
        return NoneArg(slot=name)  # this variant is built with None in the tensor's slot
    return TensorArg(name, role, dt, dims, label, align, order=order, buffer=buffer, zero=zero,
                     saved=saved, reduce=reduce, broadcast=bcast, may_alias=may_alias,
                     mode="mode" in a and order is not None, stride=stride, runtime=runtime,
                     extents_only=extents_only)


def _extents_only(ctx: _Ctx, kp: str, a: dict[str, Any], role: str, depth: int) -> bool:
    """`extents_only = true`: an input the call passes only so that its extents bind an
    output's shape; the launcher never receives it (a composite hands a launch one of its
    own inputs this way: FA4's q sizes the dq its postprocess writes). Not a launcher
    argument, so nothing that says how the launcher takes it."""
    v = a["extents_only"]
    where = f"{kp}.extents_only"
    if type(v) is not bool:
        raise ctx.fail(where, f"must be true or false, got {v!r}")
    if not v:
        return False
    if role != "input":
        raise ctx.fail(where, f'only an input may be passed for its extents alone, not an {role}')
    if depth:
        raise ctx.fail(where, "a tensor in a tuple or struct is the launcher's own: declare an "
                       "input passed for its extents only among the top-level arguments")
    for key in ("param", "present", "buffer", "broadcast"):
        if key in a:
            raise ctx.fail(f"{kp}.{key}", f"an input passed for its extents only is not the "
                           f"launcher's: it takes no {key}")
    return True


def _check_extents_only(ctx: _Ctx, kp: str, t: TensorArg, tensors: list[TensorArg],
                        leaves: list[Arg]) -> None:
    """An input passed for its extents only must bind a symbol that something the call
    computes (an output's or scratch's shape, a derived scalar) needs and that no array the
    launcher takes binds: else it is an operand for nothing."""
    others = {d for u in tensors if u.role in ("input", "inout") and not u.extents_only
              for d in u.extents if isinstance(d, str)}
    needed = {s for u in tensors if u.role in ("output", "scratch") for s in u.symbols}
    needed |= {s for sc in leaves if isinstance(sc, ScalarArg) and isinstance(sc.value, str)
               for s in expr.names(sc.value)}
    if not (set(t.symbols) & needed) - others:
        raise ctx.fail(kp, f'"{t.name}" binds no extent that an output needs and the launcher\'s '
                       "own arrays do not: pass it to the launcher, or drop it")


def _present(ctx: _Ctx, kp: str, v: Any, role: str, env: dict[str, _Value], hw: dict[str, Any]) -> bool:
    """`present = "$varlen"`: whether this variant takes the (optional) input tensor, or is
    built with None in its slot, by a bool variant axis (or a bool)."""
    if role != "input":
        raise ctx.fail(kp, f"only an input may be optional (present = ...), not an {role}")
    got = _subst(ctx, kp, v, env, hw)
    if type(got) is not bool:
        raise ctx.fail(kp, f'must be true, false or a "$param" whose values are true and false, got {got!r}')
    return got


def _broadcast(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str) -> tuple[int, ...] | None:
    """`broadcast = [0]`: dimensions the kernel sees with stride 0; the array passed has
    extent 1 there (an input only: a broadcast output would be written by many threads)."""
    if role != "input":
        raise ctx.fail(kp, f"only an input may be broadcast (stride 0), not an {role}")
    if not isinstance(v, list) or not v or not all(type(i) is int for i in v):
        raise ctx.fail(kp, f"must be a non-empty array of dimension indices, got {v!r}")
    if len(set(v)) != len(v) or not all(0 <= i < len(dims) for i in v):
        raise ctx.fail(kp, f"dimensions must be distinct, from 0 to {len(dims) - 1}, got {v!r}")
    return tuple(sorted(v))


def _runtime_dims(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str) -> tuple[int, ...]:
    """`runtime = [3]`: dimensions whose extent is static (the call checks it, or computes it
    for an output) or derived (computed per call) but compiled as a runtime value of its own
    that promises no divisibility, as the kernel's own build compiles it (FA4's head
    dimension and rounded lengths, quack's dw partial rows)."""
    if role == "scratch":
        raise ctx.fail(kp, "a scratch tensor is the runtime's own: compile its extents as declared")
    if not isinstance(v, list) or not v or not all(type(i) is int for i in v) \
            or len(set(v)) != len(v) or not all(0 <= i < len(dims) for i in v):
        raise ctx.fail(kp, f"must be an array of distinct dimension indices from 0 to {len(dims) - 1}, "
                       f"got {v!r}")
    for i in v:
        if expr.is_symbol(dims[i]):
            raise ctx.fail(kp, f"dimension {i} ({dims[i]!r}) is a symbol, a runtime value already")
    return tuple(sorted(v))


def _dims(ctx: _Ctx, kp: str, shape: list[Any], env: dict[str, _Value],
          hw: dict[str, Any], derived: bool = False) -> tuple[Dim, ...]:
    """A `shape` or `buffer` array: positive ints (static), symbol names and, where
    `derived` (outputs and scratch), expressions over symbols."""
    dims: list[Dim] = []
    for i, d in enumerate(shape):
        dp = f"{kp}[{i}]"
        if isinstance(d, str) and not _REF_RE.fullmatch(d) and not NAME_RE.fullmatch(d):
            if not derived:
                raise ctx.fail(dp, f'"{d}" is not a valid symbol name (a derived extent, an '
                               "expression, may size only an output or a scratch tensor)")
            d = _expression(ctx, dp, d, env, hw)
            if isinstance(d, str):
                dims.append(d)
                continue
        d = _subst(ctx, dp, d, env, hw)
        if isinstance(d, (bool, float)):
            raise ctx.fail(dp, f"a dimension is an int or a symbol name, got {d!r}")
        if isinstance(d, int) and d <= 0:
            raise ctx.fail(dp, f"a static extent must be positive, got {d}")
        if isinstance(d, int) and d > MAX_STATIC_EXTENT:
            raise ctx.fail(dp, f"a static extent must be at most 2^31-1 (32-bit layouts), got {d}")
        if isinstance(d, str) and not NAME_RE.fullmatch(d):
            raise ctx.fail(dp, f'"{d}" is not a valid symbol name')
        dims.append(d)
    return tuple(dims)


def _buffer(ctx: _Ctx, kp: str, a: dict[str, Any], shape: tuple[Dim, ...], role: str,
            env: dict[str, _Value], hw: dict[str, Any]) -> tuple[Dim, ...] | None:
    """A padded tensor's `buffer`: the shape of the array passed (same rank, logical order),
    each extent at least the logical one where both are static; None when it is the shape."""
    raw = a["buffer"]
    if not isinstance(raw, list):
        raise ctx.fail(f"{kp}.buffer", f"must be an array of extents, got {_tname(raw)}")
    if role == "output":
        raise ctx.fail(f"{kp}.buffer", "an output cannot be padded: the kernel writes only its "
                       "logical part, so the padding handed back would be undefined; declare it "
                       'role = "inout" (the caller passes the buffer, its padding is kept)')
    buffer = _dims(ctx, f"{kp}.buffer", raw, env, hw)
    if len(buffer) != len(shape):
        raise ctx.fail(f"{kp}.buffer", f"has {len(buffer)} extents, the shape {len(shape)}: the "
                       "buffer has the tensor's rank, in the same (logical) dimension order")
    for i, (d, b) in enumerate(zip(shape, buffer)):
        if isinstance(d, int) and isinstance(b, int) and d > b:
            raise ctx.fail(f"{kp}.buffer[{i}]", f"the buffer's extent {b} is smaller than the "
                           f"logical extent {d} (shape[{i}])")
    return None if buffer == shape else buffer


def _order(ctx: _Ctx, kp: str, layout: Any, rank: int) -> tuple[int, ...] | None:
    """A tensor's stride order (0 = the stride-1 dimension), None for row-major."""
    if layout == "row-major":
        return None
    if layout == "column-major":
        order = tuple(range(rank))
    elif isinstance(layout, list):
        if sorted(x for x in layout if type(x) is int) != list(range(rank)) or len(layout) != rank:
            raise ctx.fail(kp, f"a stride order is a permutation of 0..{rank - 1} (one per "
                           f"dimension, 0 = the stride-1 one), got {layout!r}")
        order = tuple(layout)
    else:
        raise ctx.fail(kp, f'must be "row-major", "column-major" or a stride order such as '
                       f"[0, 1], got {layout!r}")
    return None if order == tuple(range(rank - 1, -1, -1)) else order


def _stride(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str,
            padded: bool) -> tuple[Stride, ...]:
    """`stride = ["ldx", 1]`: per dimension, the stride the kernel is compiled with, an int
    (static) or a symbol (a runtime value, as published kernels' own builds compile row
    strides; its facts come from `symbols`, see `_with_divisibility`). The array a call
    passes stays dense: the runtime checks its strides against these."""
    if padded or role == "scratch":
        raise ctx.fail(kp, "a padded, broadcast or scratch tensor takes its buffer's strides: "
                       "declare stride on a dense input or output")
    if not isinstance(v, list) or len(v) != len(dims):
        raise ctx.fail(kp, f"must be one stride per dimension ({len(dims)}): an int or a symbol name, "
                       f"got {v!r}")
    out: list[Stride] = []
    for i, d in enumerate(v):
        if type(d) is int and d >= 0:
            out.append(d)
        elif isinstance(d, str) and NAME_RE.fullmatch(d):
            if d in dims:
                raise ctx.fail(f"{kp}[{i}]", f'"{d}" is an extent of this tensor; a stride symbol names '
                               "a stride of its own")
            out.append(StrideSymbol(d))
        else:
            raise ctx.fail(f"{kp}[{i}]", f"must be an int (static) or a symbol name (a runtime "
                           f"stride), got {d!r}")
    return tuple(out)


def _mode(ctx: _Ctx, kp: str, mode: Any, rank: int) -> tuple[int, ...] | None:
    """cutlass_call's `mode`: the kernel's dimension i is dimension mode[i] of the (row-major)
    array passed, a view with no copy. As a stride order (what `layout` says): dimension i
    has stride rank `rank - 1 - mode[i]`; None for the identity (row-major). Unlike
    `layout`, the call passes that array as it holds it and gets results in its order
    (`TensorArg.mode`)."""
    if (not isinstance(mode, list) or len(mode) != rank or any(type(m) is not int for m in mode)
            or sorted(mode) != list(range(rank))):
        raise ctx.fail(kp, f"a mode is a permutation of 0..{rank - 1} (kernel dimension i is "
                       f"dimension mode[i] of the array passed), got {mode!r}")
    order = tuple(rank - 1 - m for m in mode)
    return None if order == tuple(range(rank - 1, -1, -1)) else order


def _check_args(ctx: _Ctx, kp: str, args: tuple[Arg, ...]) -> None:
    keywords: list[str] = []
    for i, a in enumerate(args):
        if isinstance(a, TensorArg) and a.extents_only:
            continue  # not the launcher's: no place in its order
        if a.param is not None:
            if a.param in keywords:
                raise ctx.fail(f"{kp}, args[{i}].param", f'keyword "{a.param}" is passed twice')
            keywords.append(a.param)
        elif keywords:
            raise ctx.fail(f"{kp}, args[{i}]", f'a positional argument after keyword "{keywords[-1]}" '
                           "(give it a param too, or move it before)")
    leaves = flat_leaves(args)
    seen: set[str] = set()
    for a in leaves:
        if isinstance(a, (TensorArg, ScalarArg)):
            if a.name in seen:
                raise ctx.fail(f"{kp}, args", f'argument name "{a.name}" is used twice')
            seen.add(a.name)
    if sum(isinstance(a, StreamArg) for a in leaves) > 1:
        raise ctx.fail(f"{kp}, args", "more than one stream argument")
    tensors = [a for a in leaves if isinstance(a, TensorArg)]
    if not any(t.role in ("output", "inout") for t in tensors):
        raise ctx.fail(f"{kp}, args", "no output: at least one tensor needs role "
                       '"output" or "inout"')
    # What a call's arrays bind: the extents of the arrays passed (a padded tensor's buffer).
    bound = {d for t in tensors if t.role in ("input", "inout") for d in t.extents if isinstance(d, str)}
    for t in tensors:
        if t.role in ("output", "scratch"):
            for s in t.symbols:
                if s not in bound:
                    raise ctx.fail(f"{kp}, args ({t.name})",
                                   f'{t.role} extent "{s}" is not the extent of any input, so '
                                   "the runtime cannot compute the output shape")
        for i in t.padded:
            d = t.shape[i]
            if isinstance(d, str) and d not in bound:
                raise ctx.fail(f"{kp}, args ({t.name}).shape[{i}]",
                               f'the logical extent "{d}" of a padded dimension is not the extent '
                               "of any array passed (an unpadded dimension of an input), so neither "
                               "the runtime nor the kernel can know it: make it static or bind it")
    for sc in leaves:
        if isinstance(sc, ScalarArg) and isinstance(sc.value, str):
            for s in expr.names(sc.value):
                if s not in bound:
                    raise ctx.fail(f"{kp}, args ({sc.name}).value",
                                   f'"{s}" is not the extent of any input, so the runtime cannot '
                                   "compute the scalar (known symbols: "
                                   f"{', '.join(sorted(bound)) or 'none'})")
    bad = may_alias_problem(args)
    if bad is not None:
        raise ctx.fail(f"{kp}, args ({bad[0]}).may_alias", bad[1])
    for i, a in enumerate(args):
        if isinstance(a, TensorArg) and a.extents_only:
            _check_extents_only(ctx, f"{kp}, args[{i}].extents_only", a, tensors, leaves)
    extents = {s for t in tensors for s in t.symbols}
    for t in tensors:
        both = sorted(set(t.stride_symbols) & extents)
        if both:
            raise ctx.fail(f"{kp}, args ({t.name}).stride", f'"{both[0]}" is an extent of the kernel; '
                           "a stride symbol names a stride of its own")
    names = {t.name for t in tensors}
    clash = names & {s for t in tensors for s in t.symbols}
    if clash:
        raise ctx.fail(f"{kp}, args", f'"{sorted(clash)[0]}" is both an argument and a symbol')
