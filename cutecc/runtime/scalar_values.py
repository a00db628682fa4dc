"""A call's runtime scalars: each given value read as its declared dtype (refusing what
NumPy would silently change), each derived one computed from the call's symbol bindings,
in launcher order. Shared by the JAX and PyTorch front ends, like `cutecc.runtime.calls`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from cutecc.contract import expr
from cutecc.contract.args import ScalarArg
from cutecc.errors import CallError, CallTypeError
from cutecc.runtime.calls import PLAIN, Dims


def plain_scalar(kernel: str, s: ScalarArg, v: Any) -> Any:
    """A runtime scalar as given: a NumPy scalar (or 0-d array) becomes its Python number."""
    if isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0:
        return v.item()
    return v


def attrs(kernel: str, declared: Sequence[ScalarArg], given: Mapping[str, Any],
          keywords: Collection[str] = (), env: Mapping[str, Any] | None = None,
          dims: Dims = PLAIN, scalar: Any = plain_scalar) -> tuple:
    """The runtime scalars as (name, dtype, value), in launcher order; `keywords` (the
    kernel's call keywords, already taken out of `given`) only name the other keywords a
    call may pass. A derived scalar is computed from the call's symbol bindings `env`,
    never passed. `scalar(kernel, s, v)` is the front end's reading of a given value
    (a Python number, or an error for what it cannot take: a traced value)."""
    names = {s.name for s in declared if s.value is None}
    for k in given:
        if any(s.name == k and s.value is not None for s in declared):
            raise CallTypeError(f"runtime scalar {k!r} is derived ({_declared_value(declared, k)}): "
                                "the runtime computes and passes it, a call does not",
                                where=f'kernel "{kernel}"')
        if k not in names:
            also = f"; call keywords: {', '.join(sorted(keywords))}" if keywords else ""
            raise CallTypeError(f"unknown keyword argument {k!r}; runtime scalars: "
                                f"{', '.join(sorted(names)) or 'none'}{also}",
                                where=f'kernel "{kernel}"')
    out = []
    for s in declared:
        if s.value is not None:
            out.append((s.name, s.dtype, _derived_scalar(kernel, s, env or {}, dims)))
            continue
        v = given.get(s.name, s.default)
        if v is None:
            raise CallTypeError(f"missing runtime scalar {s.name!r} ({s.dtype})",
                                where=f'kernel "{kernel}"')
        out.append((s.name, s.dtype, _scalar_value(kernel, s, scalar(kernel, s, v))))
    return tuple(out)


def _declared_value(declared: Sequence[ScalarArg], name: str) -> str:
    """How a derived scalar is declared, for messages: `value = ...`."""
    return next(f"value = {s.value!r}" for s in declared if s.name == name)


def _derived_scalar(kernel: str, s: ScalarArg, env: Mapping[str, Any], dims: Dims) -> int:
    """A derived scalar's value for this call, as an int of its dtype's range."""
    if isinstance(s.value, int):
        return s.value
    assert s.value is not None
    try:
        v = expr.evaluate(s.value, env, minimum=dims.min, maximum=dims.max)
    except expr.ExprError as e:
        raise CallError(f"runtime scalar {s.name!r} ({s.value!r}): {e}",
                        where=f'kernel "{kernel}"') from None
    if not isinstance(v, int):  # a symbolic dimension (jax.export): no attribute can hold it
        raise CallError(f"runtime scalar {s.name!r} = {s.value!r} depends on a symbolic dimension "
                        f"({v}); it travels as an FFI attribute, which needs a number when the "
                        "call is traced: export with that dimension concrete",
                        where=f'kernel "{kernel}"')
    return _scalar_value(kernel, s, v)


def _scalar_value(kernel: str, s: ScalarArg, v: Any) -> Any:
    """`v` as the scalar's dtype, refusing what NumPy would silently change (a float for an
    int, anything for a bool, a value out of range) or cannot take (a string, a list)."""
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
    cls = CallError if ok else CallTypeError  # a value out of range, or a value of another type
    raise cls(f"runtime scalar {s.name!r} ({s.dtype}) must be {want}: {why}",
              where=f'kernel "{kernel}"')
