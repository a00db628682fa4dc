"""A kernel's variant matrix (`variants`, `derive`): its axes and points, the parameters
derived from one axis, and the call keywords that tell variants apart."""

from __future__ import annotations

import dataclasses
import itertools
import json
import keyword
import re
from collections.abc import Iterator
from typing import Any

from cutecc.contract import expr
from cutecc.manifest.grammar import IMPORT_RE, MAX_VARIANTS_PER_KERNEL, NAME_RE, _Ctx, _tname
from cutecc.manifest.model import Value as _Value
from cutecc.manifest.model import Variant
from cutecc.names import call_name_problem


def _selects(v: Variant) -> str:
    """What a call's arrays select a variant by: the input tensors' contract as the arrays
    show it (and the optional slots the call passes None in, `present`): their extents (a
    padded tensor's buffer's) and the symbols padded views take, not the static logical
    extents of padded dimensions (variants differing in those are told apart by a call
    keyword, `ks.k(x, k=64)`)."""
    conv = v.convention
    return repr([(t.dtype, t.extents, tuple((i, t.shape[i]) for i in t.padded if isinstance(t.shape[i], str)),
                  t.order, t.divisibility, t.align) for t in conv.inputs] + [conv.absent])


def _call_value(x: _Value) -> tuple[bool, _Value]:
    """A keyword value as a call compares it: `True` and `1` differ, `1` and `1.0` do not."""
    return (isinstance(x, bool), x)


def _from_shapes(ctx: _Ctx, kp: str, v: Any, axes: Any) -> tuple[tuple[str, str], ...]:
    # `kp` names the kernel: its `from_shapes` and `variants` are named under it
    """`from_shapes = { vec = "gcd(n, 4)" }`: variant axes whose value a call's shapes choose,
    by an expression over symbolic extents (checked against the grammar; that its symbols
    are bound by every variant's inputs is checked per variant, `_check_from_shapes`)."""
    if not isinstance(v, dict):
        raise ctx.fail(f"{kp}, from_shapes", 'must be a table of axis = "expression over input extents"')
    values = {name: vals for name, vals in axes}
    out = []
    for name, text in v.items():
        if name not in values:
            raise ctx.fail(f"{kp}, from_shapes.{name}",
                           f'names no variant axis (axes: {", ".join(values) or "none"})')
        if not isinstance(text, str):
            raise ctx.fail(f"{kp}, from_shapes.{name}",
                           f'must be an expression string such as "gcd(n, 4)", got {_tname(text)}')
        try:
            canon = expr.canonical(text)
            if not expr.names(canon):
                raise expr.ExprError("reads no symbol: the axis would have one value")
        except expr.ExprError as e:
            raise ctx.fail(f"{kp}, from_shapes.{name}", f"{e} (an expression of ints, symbols, + - * // %, "
                           "ceil_div(a, b), round_up(a, b), min, max, gcd)") from None
        bad = [x for x in values[name] if type(x) is not int]
        if bad:
            raise ctx.fail(f"{kp}, variants.{name}", f"an axis chosen from shapes takes ints, got {bad[0]!r}")
        out.append((name, canon))
    return tuple(out)


def _check_from_shapes(ctx: _Ctx, kp: str, chosen: tuple[tuple[str, str], ...], v: Variant) -> None:
    """Each expression of `from_shapes` reads only extents the variant's input arrays bind."""
    bound = {d for t in v.convention.inputs for d in t.extents if isinstance(d, str) and expr.is_symbol(d)}
    for name, text in chosen:
        for s in expr.names(text):
            if s not in bound:
                raise ctx.fail(f"{kp}, from_shapes.{name}", f'"{s}" is not the extent of any input'
                               f"{' of variant ' + v.id if v.params else ''}, so a call cannot compute "
                               f"it (known: {', '.join(sorted(bound)) or 'none'})")


def _call_keywords(ctx: _Ctx, kp: str, axes: Any, variants: list[Variant],
                   chosen: frozenset[str] = frozenset()) -> tuple[Variant, ...]:
    """The variants with their call keywords set: a parameter is a call keyword when two
    variants that differ only in it take the same input tensors (FA4's `causal`), unless a
    call's shapes choose it (`chosen`, `from_shapes`). Two variants no call can tell apart
    (same inputs, same keyword values, same values chosen from shapes) are an error."""
    names = [n for n, _ in axes if n not in chosen]
    keywords = []
    for p in names:
        seen: set[tuple[str, str]] = set()
        for v in variants:
            g = (_selects(v), repr([x for x in v.params if x[0] != p]))
            if g in seen:
                keywords.append(p)
                break
            seen.add(g)
    scalars = {s.name for v in variants for s in v.convention.scalars}
    for p in keywords:
        why = call_name_problem(p)  # `ks.k(x, p=...)`: a keyword of KernelFn.__call__
        if why:
            raise ctx.fail(f"{kp}, variants.{p}", f"{why}; rename the parameter")
        if p in scalars:
            raise ctx.fail(f"{kp}, variants.{p}", f'call keyword "{p}" is also the name of a '
                           "runtime scalar; rename one")
    out = []
    first: dict[tuple[str, tuple[tuple[bool, _Value], ...], tuple[tuple[str, _Value], ...]], Variant] = {}
    for v in variants:
        call = tuple((p, x) for p, x in v.params if p in keywords)
        told = (_selects(v), tuple(_call_value(x) for _, x in call),
                tuple((p, x) for p, x in v.params if p in chosen))
        if told in first:
            raise ctx.fail(f"{kp}, variants", f'variants "{first[told].id}" and "{v.id}" cannot be '
                           "told apart by any call: same input tensors and the same call "
                           f"keywords ({', '.join(keywords) or 'none'})")
        first[told] = v
        out.append(dataclasses.replace(v, call=call))
    return tuple(out)


def _variant_axes(ctx: _Ctx, kp: str, v: Any
                  ) -> tuple[tuple[tuple[str, tuple[_Value, ...]], ...], frozenset[str]]:
    """The variant matrix's axes, and the names of those whose values are import references
    (`op = [{ import = "pkg.mod:Double" }, ..]`: Python objects such as operator classes or
    enum members). A reference's value is its text ("pkg.mod:Double"): it names the variant
    and is what a call keyword compares; "$op" stands for `{ import = "pkg.mod:Double" }`."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of parameter = [values]")
    axes = []
    refs = set()
    total = 1
    for k, vals in v.items():
        if not NAME_RE.fullmatch(k) or keyword.iskeyword(k):
            raise ctx.fail(f"{kp}.{k}", "a variant parameter must be an identifier, not a Python keyword")
        if not isinstance(vals, list) or not vals:
            raise ctx.fail(f"{kp}.{k}", "must be a non-empty array of values")
        is_ref = isinstance(vals[0], dict)
        for i, x in enumerate(vals):
            if isinstance(x, dict) and set(x) == {"import"}:
                if not isinstance(x["import"], str) or not IMPORT_RE.fullmatch(x["import"]):
                    raise ctx.fail(f"{kp}.{k}[{i}].import",
                                   f'must be "package.module:attr", got {x["import"]!r}')
                if not is_ref:
                    raise ctx.fail(f"{kp}.{k}[{i}]", "an axis of plain values cannot mix in an "
                                   "import reference: give it an axis of its own")
            elif isinstance(x, dict) or not isinstance(x, (int, float, str, bool)):
                raise ctx.fail(f"{kp}.{k}[{i}]", "must be a number, string, bool or "
                               f'{{ import = "pkg.mod:Name" }}, got {_tname(x)}')
            elif is_ref:
                raise ctx.fail(f"{kp}.{k}[{i}]", "an axis of import references takes only "
                               '{ import = ... } values')
        if is_ref:
            vals = [x["import"] for x in vals]
            refs.add(k)
        if len(set(map(repr, vals))) != len(vals):
            raise ctx.fail(f"{kp}.{k}", "repeats a value")
        total *= len(vals)
        axes.append((k, tuple(vals)))
    if total > MAX_VARIANTS_PER_KERNEL:
        raise ctx.fail(kp, f"expands to {total} variants, over the {MAX_VARIANTS_PER_KERNEL} limit")
    return tuple(axes), frozenset(refs)


def _value_key(v: _Value) -> str:
    """A variant value as a `derive` table writes it as a key: `true`, `64`, `bfloat16`."""
    return json.dumps(v) if isinstance(v, bool) else str(v)


def _derive(ctx: _Ctx, kp: str, v: Any, axes: Any) -> dict[str, tuple[str, dict[str, _Value]]]:
    """`derive = { tile_m = { causal = { false = 80, true = 64 } } }`: parameters whose value
    follows one variant axis's, by a table with a value for each of the axis's values (FA4's
    backward tile for causal and non-causal attention). They are no axis of their own: they
    name no variant and are no call keyword; "$tile_m" stands where "$param" may."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of parameter = { axis = { value = derived value } }")
    values = {name: vals for name, vals in axes}
    out = {}
    for name, spec in v.items():
        if not NAME_RE.fullmatch(name) or keyword.iskeyword(name):
            raise ctx.fail(f"{kp}.{name}", "a derived parameter must be an identifier, not a Python keyword")
        if name in values:
            raise ctx.fail(f"{kp}.{name}", "is a variant axis already")
        if not isinstance(spec, dict) or len(spec) != 1:
            raise ctx.fail(f"{kp}.{name}", "must be a table with one variant axis: "
                           "{ axis = { value = derived value, .. } }")
        (axis, table), = spec.items()
        if axis not in values:
            raise ctx.fail(f"{kp}.{name}.{axis}",
                           f'names no variant axis (axes: {", ".join(values) or "none"})')
        if not isinstance(table, dict):
            raise ctx.fail(f"{kp}.{name}.{axis}", f"must be a table of {axis} value = derived value")
        keys = [_value_key(x) for x in values[axis]]
        for k, x in table.items():
            if k not in keys:
                raise ctx.fail(f"{kp}.{name}.{axis}.{k}", f'is no value of "{axis}" ({", ".join(keys)})')
            if not isinstance(x, (int, float, str, bool)):
                raise ctx.fail(f"{kp}.{name}.{axis}.{k}",
                               f"must be a number, string or bool, got {_tname(x)}")
        missing = [k for k in keys if k not in table]
        if missing:
            raise ctx.fail(f"{kp}.{name}.{axis}", f'has no value for {axis} = {missing[0]}')
        out[name] = (axis, dict(table))
    return out


def _points(axes: tuple[tuple[str, tuple[_Value, ...]], ...]) -> Iterator[tuple[tuple[str, _Value], ...]]:
    names = [a[0] for a in axes]
    for combo in itertools.product(*(a[1] for a in axes)):
        yield tuple(zip(names, combo))


def _point_id(point: tuple[tuple[str, _Value], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in point)


def _check_used(ctx: _Ctx, kp: str, axes: Any, kdoc: dict[str, Any], table: str = "variants") -> None:
    text = repr((kdoc.get("args"), kdoc.get("constants"), kdoc.get("factory_args"), kdoc.get("symbols")))
    for name, _ in axes:  # "$name" alone, or in a derived extent's or scalar's expression
        if f"'${name}'" not in text and not re.search(rf"\${re.escape(name)}(?![A-Za-z0-9_])", text):
            raise ctx.fail(f"{kp}, {table}.{name}",
                           f'parameter "{name}" is never used (refer to it as "${name}")')
