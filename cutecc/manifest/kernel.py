"""One `[kernel.NAME]` table: a kernel (its variants resolved, tuning candidates, grad,
fallbacks and sharding), or a composite (`launches = [..]`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from cutecc.contract import expr
from cutecc.contract.args import (
    RESHARD,
    TensorArg,
    flat_leaves,
    shard_problem,
)
from cutecc.contract.cotangents import STOP_GRADIENT
from cutecc.manifest import tune_space as space
from cutecc.manifest.arguments import _arg, _check_args, _symbols, _variant_symbols, _with_divisibility
from cutecc.manifest.grammar import (
    _KERNEL_KEYS,
    ENTRY_RE,
    IMPORT_RE,
    MAX_VARIANTS_PER_KERNEL,
    NAME_RE,
    _archs,
    _Ctx,
    _no_unknown,
    _str,
    _table,
)
from cutecc.manifest.model import Composite, Kernel, Variant
from cutecc.manifest.model import Value as _Value
from cutecc.manifest.values import _expression_text, _value
from cutecc.manifest.variants import (
    _call_keywords,
    _check_from_shapes,
    _check_used,
    _derive,
    _from_shapes,
    _point_id,
    _points,
    _value_key,
    _variant_axes,
)


def _composite(ctx: _Ctx, kp: str, name: str, kdoc: dict[str, Any]) -> Composite:
    """`[kernel.NAME] launches = [..], inputs = [..], outputs = [..]`."""
    _no_unknown(ctx, kdoc, {"launches", "inputs", "outputs", "description"}, kp)
    out = []
    for key in ("launches", "inputs", "outputs"):
        v = kdoc.get(key)
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and NAME_RE.fullmatch(x)
                                                       for x in v):
            raise ctx.fail(f"{kp}, {key}", "must be a non-empty array of names")
        if len(set(v)) != len(v):
            raise ctx.fail(f"{kp}, {key}", "names something twice")
        out.append(tuple(v))
    return Composite(name, *out)


def _kernel(ctx: _Ctx, kp: str, name: str, kdoc: dict[str, Any], archs: tuple[str, ...],
            profile: str, profiles: dict[str, dict[str, Any]], copts: str) -> Kernel:
    _no_unknown(ctx, kdoc, _KERNEL_KEYS, kp)
    if "entry" not in kdoc:
        raise ctx.fail(kp, 'missing "entry" ("package.module:attr")')
    entry = _str(ctx, f"{kp}, entry", kdoc["entry"])
    if not ENTRY_RE.fullmatch(entry):
        raise ctx.fail(f"{kp}, entry", f'"{entry}" is not of the form "package.module:attr" '
                       '(or "package.module:attr[i]", an index into what it names or returns)')
    k_archs = _archs(ctx, f"{kp}, archs", kdoc["archs"]) if "archs" in kdoc else archs
    k_profile = _str(ctx, f"{kp}, profile", kdoc.get("profile", profile))
    if k_profile not in profiles:
        raise ctx.fail(f"{kp}, profile", f'unknown hardware profile "{k_profile}"')
    k_copts = _str(ctx, f"{kp}, compile_options", kdoc.get("compile_options", copts))
    if "args" not in kdoc:
        raise ctx.fail(kp, 'missing "args" (the launcher\'s arguments in its own order)')
    if not isinstance(kdoc["args"], list):
        raise ctx.fail(f"{kp}, args", "must be an array of argument tables")
    constants = _table(ctx, f"{kp}, constants", kdoc.get("constants", {}))
    factory = kdoc.get("factory_args")
    if factory is not None:
        factory = _table(ctx, f"{kp}, factory_args", factory)
    axes, refs = _variant_axes(ctx, f"{kp}, variants", kdoc.get("variants", {}))
    hw = profiles[k_profile]
    grad = kdoc.get("grad")
    backward = None
    grad_args = grad_returns = None
    grad_nondiff: tuple[str, ...] = ()
    grad_stop: tuple[str, ...] = ()
    if grad is not None:
        if not isinstance(grad, dict) or "backward" not in grad or not set(grad) <= {
                "backward", "args", "returns", "nondiff", STOP_GRADIENT}:
            raise ctx.fail(f"{kp}, grad", 'must be a table { backward = "KERNEL" } (optionally '
                           "args = [names], returns = [input names], nondiff = [output names], "
                           "stop_gradient = [output names])")
        backward = _str(ctx, f"{kp}, grad.backward", grad["backward"])
        for key in ("returns", "nondiff", STOP_GRADIENT):
            if key in grad and "args" not in grad:
                raise ctx.fail(f"{kp}, grad.{key}", "needs grad.args (the backward's inputs by name)")
        for key in ("args", "returns", "nondiff", STOP_GRADIENT):
            if key in grad:
                v = grad[key]
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise ctx.fail(f"{kp}, grad.{key}", "must be an array of names")
        grad_args = tuple(grad["args"]) if "args" in grad else None
        grad_returns = tuple(grad["returns"]) if "returns" in grad else None
        grad_nondiff = tuple(grad.get("nondiff", ()))
        grad_stop = tuple(grad.get(STOP_GRADIENT, ()))

    derive = _derive(ctx, f"{kp}, derive", kdoc.get("derive", {}), axes)
    chosen = _from_shapes(ctx, kp, kdoc.get("from_shapes", {}), axes)
    followed = {axis for axis, _ in derive.values()}  # an axis a derived parameter follows is used
    _check_used(ctx, kp, tuple(a for a in axes if a[0] not in followed), kdoc)
    _check_used(ctx, kp, tuple((d, ()) for d in derive), kdoc, "derive")
    symbols, wide = _symbols(ctx, f"{kp}, symbols", kdoc.get("symbols", {}))
    tuning = None if "tune" not in kdoc else space.parse(ctx.fail, f"{kp}, tune", kdoc["tune"],
                                                          {a for a, _ in axes})
    if tuning is not None:
        _check_used(ctx, f"{kp}, tune", tuning.params, kdoc, "params")
        clash = sorted(set(derive) & {p for p, _ in tuning.params})
        if clash:
            raise ctx.fail(f"{kp}, derive.{clash[0]}", "is also a tuning parameter: tune it or derive it")

    def resolve(point: tuple[tuple[str, _Value], ...], env: dict[str, Any]) -> Variant:
        vctx = f"{kp}, variant {_point_id(point)}" if point else kp
        at = dict(point)
        env = {**{d: table[_value_key(at[axis])] for d, (axis, table) in derive.items()}, **env}
        env = {k: {"import": x} if k in refs else x for k, x in env.items()}
        vsymbols = _variant_symbols(ctx, f"{vctx}, symbols", symbols, env, hw, wide)
        args = tuple(_with_divisibility(_arg(ctx, f"{vctx}, args[{i}]", a, env, hw), vsymbols, wide)
                     for i, a in enumerate(kdoc["args"]))
        _check_args(ctx, vctx, args)
        unused = set(symbols) - {s for t in flat_leaves(args) if isinstance(t, TensorArg)
                                 for s in (*t.symbols, *t.stride_symbols)}
        if unused:
            raise ctx.fail(f"{kp}, symbols.{sorted(unused)[0]}", "names no symbolic extent of "
                           f"the arguments{' of variant ' + _point_id(point) if point else ''}")
        consts = tuple((k, _value(ctx, f"{vctx}, constants.{k}", v, env, hw))
                       for k, v in constants)
        fargs = None if factory is None else tuple(
            (k, _value(ctx, f"{vctx}, factory_args.{k}", v, env, hw)) for k, v in factory)
        rels = _relations(ctx, f"{vctx}, relations", kdoc.get("relations", []), env, hw, args)
        variant = Variant(name, point, args, consts, fargs, relations=rels, from_shapes=chosen)
        _check_from_shapes(ctx, kp, chosen, variant)
        return variant

    variants, pending, total = [], [], 0
    for point in _points(axes):
        if tuning is None:
            variants.append(resolve(point, dict(point)))
            continue
        # The default configuration is the variant itself: same id, same key as untuned.
        v = resolve(point, {**dict(point), **dict(tuning.default)})
        space.check(ctx.fail, f"{kp}, tune", tuning, dict(point), v.convention)
        variants.append(v)
        cands = tuple(resolve(point + p, {**dict(point), **dict(p)})
                      for p in space.iter_points(tuning, dict(point)))
        total += len(cands) + 1
        if total > MAX_VARIANTS_PER_KERNEL:
            raise ctx.fail(f"{kp}, tune", f"over {MAX_VARIANTS_PER_KERNEL} candidates")
        pending.append(cands)
    fallbacks = {}
    for fk in ("fallback", "fallback_torch"):
        if fk in kdoc:
            ref = _str(ctx, f"{kp}, {fk}", kdoc[fk])
            if not IMPORT_RE.fullmatch(ref):
                raise ctx.fail(f"{kp}, {fk}", f'"{ref}" is not of the form "package.module:function" '
                               "(a plain function with the kernel's calling convention)")
            fallbacks[fk] = ref
    shard = kdoc.get("shard", [])
    if not isinstance(shard, list) or not all(isinstance(x, str) for x in shard):
        raise ctx.fail(f"{kp}, shard", "must be an array of symbolic extents")
    for v in variants:
        why = shard_problem(v.convention, tuple(shard))
        if why:
            raise ctx.fail(f"{kp}, shard", why + (f" (variant {v.id})" if v.params else ""))
    reshard = kdoc.get("reshard", "error")
    if reshard not in RESHARD:
        raise ctx.fail(f"{kp}, reshard", f"must be one of {', '.join(map(repr, RESHARD))}, not {reshard!r}")
    keyed = _call_keywords(ctx, kp, axes, variants, frozenset(n for n, _ in chosen))
    # A candidate stands in for its default variant: it answers the same call keywords.
    candidates = tuple((v.id, tuple(dataclasses.replace(c, call=v.call) for c in cands))
                       for v, cands in zip(keyed, pending))
    return Kernel(name, entry, k_archs, k_profile, k_copts, keyed, backward, tuning, candidates,
                  hardware=tuple(sorted(hw.items())), grad_args=grad_args, grad_returns=grad_returns,
                  grad_nondiff=grad_nondiff, grad_stop=grad_stop, shard=tuple(shard), reshard=reshard,
                  fallback=fallbacks.get("fallback"), fallback_torch=fallbacks.get("fallback_torch"))


def _relations(ctx: Any, kp: str, doc: Any, env: dict[str, Any], hw: dict[str, Any],
               args: tuple[Any, ...]) -> tuple[str, ...]:
    """`relations = ["ls == l * $split_k", ..]`: equalities between the input arrays' extents
    that every call must hold (checked at the call, naming the relation and the arrays),
    each side an expression over symbols some input array binds, `$param`s and `$hw.fact`s
    resolved for the variant."""
    if not isinstance(doc, list) or not all(isinstance(r, str) for r in doc):
        raise ctx.fail(kp, 'must be an array of relations such as "ls == l * split_k"')
    if len(doc) > expr.MAX_RELATIONS:
        raise ctx.fail(kp, f"at most {expr.MAX_RELATIONS} relations")
    bound = {d for t in flat_leaves(args) if isinstance(t, TensorArg) and t.role in ("input", "inout")
             for d in t.extents if isinstance(d, str)}
    out = []
    for i, text in enumerate(doc):
        if text.count("==") != 1:
            raise ctx.fail(f"{kp}[{i}]", f'"{text}" is not two expressions joined by ==')
        sides = [_expression_text(ctx, f"{kp}[{i}]", side, env, hw) for side in text.split("==")]
        rel = f"{sides[0]} == {sides[1]}"
        unbound = [n for side in sides for n in expr.names(side) if n not in bound]
        if unbound:
            raise ctx.fail(f"{kp}[{i}]", f'"{unbound[0]}" is bound by no input array (a relation '
                           "is between the extents of the arrays a call passes)")
        if not any(expr.names(side) for side in sides):
            raise ctx.fail(f"{kp}[{i}]", f'"{text}" reads no extent')
        out.append(rel)
    return tuple(dict.fromkeys(out))
