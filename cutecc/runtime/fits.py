"""What a call's arrays must hold beyond each one's shape, and which contract is the more
specific: the relations between extents a kernel declares (`relations = ["ls == l * 4"]`,
checked at each call, naming the relation and where each extent was read), and whether
every call fitting one calling convention fits another (`implies`: how the runtime picks
the most specific of several fits). Framework-free, as `cutecc.runtime.calls`, which uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cutecc.contract import expr
from cutecc.contract.args import CallingConvention


def implies(a: CallingConvention, b: CallingConvention) -> bool:
    """Whether every call whose arrays fit `a`'s inputs fits `b`'s too: `a` is at least as
    specific. Sound, not complete: False wherever it is not shown. Per array and dimension,
    a static extent of `b` must be `a`'s; a symbol of `b` is implied by a static extent of
    `a` that is a multiple of its divisibility, or by a symbol whose divisibility is a
    multiple of it (and no wider, `bits = 64`, than `b`'s); extents `b` names by one symbol
    must be one symbol or one static extent in `a`; dtypes, ranks, orders as passed,
    padded views, broadcasts and declared strides must be the same."""
    if len(a.inputs) != len(b.inputs) or [t.stride for t in a.results] != [t.stride for t in b.results]:
        return False
    bound_a: dict[str, set[tuple[int, int]]] = {}
    bound_b: dict[str, set[tuple[int, int]]] = {}
    same: dict[str, set[Any]] = {}  # per symbol of `b`, what `a` has where `b` names it
    for k, (ta, tb) in enumerate(zip(a.inputs, b.inputs)):
        if (ta.dtype != tb.dtype or len(ta.shape) != len(tb.shape) or ta.held != tb.held
                or ta.stride != tb.stride or ta.padded != tb.padded
                or (ta.broadcast or ()) != (tb.broadcast or ())):
            return False
        for i, (ea, eb) in enumerate(zip(ta.extents, tb.extents)):
            if isinstance(ea, str):
                bound_a.setdefault(ea, set()).add((k, i))
            if isinstance(eb, int):
                if ea != eb:
                    return False
                continue
            bound_b.setdefault(eb, set()).add((k, i))
            same.setdefault(eb, set()).add(ea)
            if isinstance(ea, int):
                if ea % tb.multiple(i):
                    return False
            elif ta.multiple(i) % tb.multiple(i) or (i in (ta.wide or ()) and i not in (tb.wide or ())):
                return False
    if any(len(v) > 1 for v in same.values()):
        return False
    for ta, tb in zip(a.inputs, b.inputs):  # a padded view: the same logical extent, bound alike
        for i in tb.padded:
            d = tb.shape[i]
            if ta.shape[i] != d or (isinstance(d, str) and bound_a.get(d) != bound_b.get(d)):
                return False
    return True


def relations_of(conv: CallingConvention, key_inputs: Any) -> tuple[tuple[str, str], ...]:
    """The relations an entry's key inputs record (none: not declared), checked again (read
    from disk): a list of at most `expr.MAX_RELATIONS` "lhs == rhs" texts whose symbols the
    input arrays bind."""
    doc = key_inputs.get("relations", []) if isinstance(key_inputs, Mapping) else []
    if not isinstance(doc, list) or len(doc) > expr.MAX_RELATIONS:
        raise ValueError(f"relations {doc!r} is not a list of at most {expr.MAX_RELATIONS}")
    bound = {d for t in conv.inputs for d in t.extents if isinstance(d, str)}
    out = []
    for text in doc:
        try:
            lhs, rhs = expr.relation(text)
        except expr.ExprError as e:
            raise ValueError(f"relations: {e}") from None
        unbound = [n for side in (lhs, rhs) for n in expr.names(side) if n not in bound]
        if unbound:
            raise ValueError(f'relations: "{unbound[0]}" is bound by no input array')
        out.append((lhs, rhs))
    return tuple(out)


def relation_problem(conv: CallingConvention, relations: Sequence[tuple[str, str]],
                      env: Mapping[str, Any], dims: Any) -> str:
    """Why the call's extents (`env`) break one of `relations`, naming the relation and where
    each of its symbols was read (`ls (b: dimension 0) is 7, l * split_k is 8 (l = 2, from
    a: dimension 0; split_k = 4, from c: dimension 1)`), or ""."""
    undecided: tuple[type[BaseException], ...] = (expr.ExprError, *dims.inconclusive)
    for lhs, rhs in relations:
        try:
            a = expr.evaluate(lhs, env, minimum=dims.min, maximum=dims.max)
            b = expr.evaluate(rhs, env, minimum=dims.min, maximum=dims.max)
            if bool(a == b):
                continue
        except undecided:
            continue  # symbolic shapes that no comparison decides: not refused here
        where: dict[str, str] = {}
        for t in conv.inputs:
            at = tuple(t.held.index(i) for i in range(len(t.shape)))  # the caller's dimensions
            for i, d in enumerate(t.extents):
                if isinstance(d, str):
                    where.setdefault(d, f"{t.name}: dimension {at[i]}")
        return (f"relation {lhs} == {rhs} does not hold: {_side(lhs, a, env, where)}, "
                f"{_side(rhs, b, env, where)} (relations)")
    return ""


def _side(side: str, value: Any, env: Mapping[str, Any], where: Mapping[str, str]) -> str:
    """One side of a broken relation as its error shows it, with where its extents were read."""
    if expr.is_symbol(side):
        return f"{side} ({where.get(side, '?')}) is {value}"
    parts = "; ".join(f"{n} = {env[n]}, from {where.get(n, '?')}" for n in expr.names(side))
    return f"{side} is {value}" + (f" ({parts})" if parts else "")
