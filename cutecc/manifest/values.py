"""Values in the manifest: "$param" and "$hw.fact" substitution, typed values
(factory_args, constants, const arguments), expressions and dtypes."""

from __future__ import annotations

import re
from typing import Any

from cutecc.contract import dtypes, expr
from cutecc.manifest.grammar import _IDENT, _INT_RANGE, IMPORT_RE, MAX_TUPLE_DEPTH, _Ctx, _no_unknown, _tname
from cutecc.manifest.model import Value as _Value


def _subst(ctx: _Ctx, kp: str, v: Any, env: dict[str, Any], hw: dict[str, Any],
           typed: bool = False) -> Any:
    """Resolve "$param" (a variant parameter) and "$hw.key" (a hardware fact). A parameter
    whose values are import references gives its `{"import": ..}` table, only where a typed
    value may stand (`typed`: factory_args, constants, const arguments)."""
    if isinstance(v, str) and v.startswith("$"):
        ref = v[1:]
        if ref.startswith("hw."):
            fact = ref[3:]
            if fact not in hw:
                raise ctx.fail(kp, f'unknown hardware fact "{fact}" (known: {", ".join(sorted(hw))})')
            return hw[fact]
        if ref not in env:
            known = ", ".join(env) or "none"
            raise ctx.fail(kp, f'"{v}" names no variant parameter (parameters: {known})')
        if isinstance(env[ref], dict) and not typed:
            raise ctx.fail(kp, f'"{v}" is an import reference ({env[ref]["import"]}): it can be a '
                           "value of factory_args, constants or a const argument, not stand here")
        return env[ref]
    if not isinstance(v, (int, float, str, bool)):
        raise ctx.fail(kp, f"must be a number, string or bool, got {_tname(v)}")
    return v


_MARKERS = {"dtype": set(), "dsl": {"value"}, "import": set(), "call": {"args", "kwargs"},
            "none": set()}
DSL_NAME_RE = re.compile(rf"(cutlass\.)?{_IDENT}")


def _value(ctx: _Ctx, kp: str, v: Any, env: dict[str, _Value], hw: dict[str, Any], depth: int = 0) -> Any:
    """A typed manifest value (factory_args, constants, `const` args), "$param"s substituted:
    a number, string or bool as is; an array (a tuple); or a table with one marker:
    `{dtype = "bfloat16"}` (the DSL's numeric class), `{dsl = "cutlass.Int32", value = 5}`
    (a DSL class, or an instance of it), `{import = "pkg.mod:Name"}` (any importable
    object: a class, an enum member), `{call = "pkg.mod:f", args = [..], kwargs = {..}}`
    (its result), `{none = true}` (None)."""
    if depth > MAX_TUPLE_DEPTH:
        raise ctx.fail(kp, f"values nested more than {MAX_TUPLE_DEPTH} deep")
    if isinstance(v, list):
        return [_value(ctx, f"{kp}[{i}]", x, env, hw, depth + 1) for i, x in enumerate(v)]
    if not isinstance(v, dict):
        return _subst(ctx, kp, v, env, hw, typed=True)  # "$op" may be an import reference
    markers = [k for k in v if k in _MARKERS]
    if len(markers) != 1:
        raise ctx.fail(kp, "a typed value is a table with exactly one of "
                       f"{', '.join(sorted(_MARKERS))} (got {', '.join(sorted(v)) or 'an empty table'})")
    m = markers[0]
    _no_unknown(ctx, v, {m, *_MARKERS[m]}, kp)
    out: dict[str, Any] = {}
    if m == "dtype":
        raw = _subst(ctx, f"{kp}.dtype", v["dtype"], env, hw)
        dt = dtypes.canonical(raw) if isinstance(raw, str) else None
        if dt is None:
            raise ctx.fail(f"{kp}.dtype", f'unknown dtype {raw!r} (known: {", ".join(dtypes.DTYPES)})')
        out["dtype"] = dt
    elif m == "dsl":
        name = _subst(ctx, f"{kp}.dsl", v["dsl"], env, hw)
        if not isinstance(name, str) or not DSL_NAME_RE.fullmatch(name):
            raise ctx.fail(f"{kp}.dsl",
                           f'must name a cutlass attribute such as "cutlass.Int32", got {name!r}')
        out["dsl"] = name if name.startswith("cutlass.") else f"cutlass.{name}"
        if "value" in v:
            out["value"] = _value(ctx, f"{kp}.value", v["value"], env, hw, depth + 1)
    elif m in ("import", "call"):
        target = _subst(ctx, f"{kp}.{m}", v[m], env, hw, typed=True)
        if isinstance(target, dict):  # { import = "$op" }, op an axis of import references
            target = target["import"]
        if not isinstance(target, str) or not IMPORT_RE.fullmatch(target):
            raise ctx.fail(f"{kp}.{m}", f'must be "package.module:attr", got {target!r}')
        out[m] = target
        if m == "call":
            args = v.get("args", [])
            kwargs = v.get("kwargs", {})
            if not isinstance(args, list):
                raise ctx.fail(f"{kp}.args", "must be an array")
            if not isinstance(kwargs, dict):
                raise ctx.fail(f"{kp}.kwargs", "must be a table")
            out["args"] = [_value(ctx, f"{kp}.args[{i}]", x, env, hw, depth + 1) for i, x in enumerate(args)]
            out["kwargs"] = {k: _value(ctx, f"{kp}.kwargs.{k}", x, env, hw, depth + 1)
                             for k, x in kwargs.items()}
    else:
        if v["none"] is not True:
            raise ctx.fail(f"{kp}.none", "must be true")
        out["none"] = True
    return out


_REF_RE = re.compile(r"\$(hw\.)?[A-Za-z_][A-Za-z0-9_]*")


def _expression(ctx: _Ctx, kp: str, text: str, env: dict[str, _Value], hw: dict[str, Any]) -> int | str:
    """A derived extent or scalar: `$param`s and `$hw.fact`s substituted (build-time numbers),
    checked against the grammar (`cutecc.contract.expr`), folded to an int when it reads no symbol,
    else its canonical text."""
    def ref(name: str) -> Any:
        return _subst(ctx, kp, f"${name}", env, hw)
    try:
        text = expr.canonical(expr.substitute(text, ref))
        if not expr.names(text):
            return int(expr.evaluate(text, {}))
    except expr.ExprError as e:
        raise ctx.fail(kp, f"{e} (an expression of ints, symbols, + - * // %, ceil_div(a, b), "
                       "round_up(a, b), min, max, gcd, $param and $hw.fact)") from None
    return text


def _expression_text(ctx: _Ctx, kp: str, text: str, env: dict[str, _Value], hw: dict[str, Any]) -> str:
    """One side of a relation: `_expression`'s, its canonical text also where it folds to an int."""
    v = _expression(ctx, kp, text, env, hw)
    return str(v) if isinstance(v, int) else v


def _scalar_expr(ctx: _Ctx, kp: str, v: Any, dt: str, env: dict[str, _Value],
                 hw: dict[str, Any]) -> int | str:
    """A derived scalar's `value`: an int, "$hw.fact" / "$param", or an expression."""
    if dt not in _INT_RANGE:
        raise ctx.fail(kp, f"a derived scalar must be int32 or int64, not {dt}")
    if isinstance(v, str):
        v = _subst(ctx, kp, v, env, hw) if _REF_RE.fullmatch(v) else _expression(ctx, kp, v, env, hw)
    if type(v) is not int and not isinstance(v, str):
        raise ctx.fail(kp, f"must be an int or an expression string, got {v!r}")
    lo, hi = _INT_RANGE[dt]
    if type(v) is int and not lo <= v <= hi:
        raise ctx.fail(kp, f"{v} is out of the range of {dt} ({lo}..{hi})")
    return v


def _dtype(ctx: _Ctx, kp: str, a: dict[str, Any], env: dict[str, _Value], hw: dict[str, Any]) -> str:
    if "dtype" not in a:
        raise ctx.fail(kp.rsplit(".", 1)[0], 'missing "dtype"')
    raw = _subst(ctx, kp, a["dtype"], env, hw)
    if not isinstance(raw, str):
        raise ctx.fail(kp, f"must be a dtype name, got {raw!r}")
    dt = dtypes.canonical(raw)
    if dt is None:
        raise ctx.fail(kp, f'unknown dtype "{raw}" (known: {", ".join(dtypes.DTYPES)})')
    return dt
