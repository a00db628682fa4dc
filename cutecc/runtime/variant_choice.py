"""What picks a variant besides its contract and call keywords: the optional slots a call
passes None in (`present = "$p"`: `NoneArg.slot`), and the variant axes its extents choose
(`from_shapes = { vec = "gcd(n, 4)" }`). Shared by the JAX and PyTorch front ends through
`cutecc.runtime.calls.KernelBase.select`; imports neither JAX nor torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cutecc.contract import expr
from cutecc.errors import CallTypeError

# The internal call keyword a call's Nones become (`without_none`): the optional slots it
# passed None in, which only variants built with None there take. No name a manifest can
# give a keyword (`cutecc.names`).
ABSENT = "__absent__"
MAX_AXES = 64  # axes chosen from shapes read from an entry (a variant has a few)

Slots = tuple[tuple[str, bool], ...]  # a build's positional slots: (name, present)


def without_none(kernel: str, slots_of_builds: Sequence[Slots],
                 arrays: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[str, ...] | None]:
    """A call's arrays with the Nones it passed in optional slots left out, and the names of
    those slots (None when it passed none): only a variant built with None in exactly
    those slots takes the call (`select`, keyword `ABSENT`). A call may also leave an
    optional slot out (its arrays then fit the variant without it by count). A None
    where no variant takes one is a wrong call."""
    nones = [i for i, a in enumerate(arrays) if a is None]
    if not nones:
        return tuple(arrays), None
    optional = {n for slots in slots_of_builds for n, here in slots if not here}
    for slots in slots_of_builds:
        if len(slots) == len(arrays) and all(slots[i][0] in optional for i in nones):
            return tuple(a for a in arrays if a is not None), tuple(slots[i][0] for i in nones)
    where = f"argument {nones[0]} is None"
    if optional:
        raise CallTypeError(f"{where}: its optional slots ({', '.join(sorted(optional))}) take None, "
                            "in their positions among all the arrays", where=f'kernel "{kernel}"')
    raise CallTypeError(f"{where}, not an array: no variant of it was built with None in a slot "
                        '(declare the input optional: present = "$param")', where=f'kernel "{kernel}"')


def slots_problem(built: tuple[str, ...], absent: tuple[str, ...]) -> str:
    """Why a build with None in slots `built` does not take a call passing None in `absent`."""
    why = [f"{n}: None, but it takes an array" for n in absent if n not in built]
    why += [f"{n}: built with None there" for n in built if n not in absent]
    return "; ".join(why) or "other None slots"


def from_shapes_of(key_inputs: Mapping[str, Any] | None,
                   params: Mapping[str, Any]) -> tuple[tuple[str, str, int], ...]:
    """The variant axes a call's shapes choose (`from_shapes`), each with its expression and
    this build's value, from an entry's key inputs and parameters; checked (read from disk)."""
    table = key_inputs.get("from_shapes") if isinstance(key_inputs, Mapping) else None
    if table is None:
        return ()
    if not isinstance(table, dict) or len(table) > MAX_AXES:
        raise ValueError(f"from_shapes {table!r} is not a table of axis = expression")
    out = []
    for name, text in table.items():
        value = params.get(name)
        if not isinstance(text, str) or type(value) is not int:
            raise ValueError(f"from_shapes.{name}: {text!r} is not an expression of an int axis")
        try:
            expr.parse(text)
        except expr.ExprError as e:
            raise ValueError(f"from_shapes.{name}: {e}") from None
        out.append((name, text, value))
    return tuple(out)


def chosen_problem(from_shapes: Sequence[tuple[str, str, int]], env: Mapping[str, Any]) -> str:
    """Why a call binding `env` does not reach a build by the axes its shapes choose
    (`from_shapes`: axis, expression, the build's value), or ""."""
    for name, text, value in from_shapes:
        try:
            got = expr.evaluate(text, env)
        except expr.ExprError as e:
            return f"{name} = {text}: {e}"
        if got != value:
            return f"{name} = {text} is {got} for these arrays, built for {name} = {value}"
    return ""
