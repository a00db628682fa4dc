"""A kernel's argument contract: the launcher's own argument list, resolved for one variant.

Shared by the compiler (which builds fake arguments and a wrapper from it) and the
runtime (which checks calls against it); imports neither the DSL nor JAX. The contract
is stored as JSON in each cache entry, so the runtime never imports a kernel's Python.

The JAX-side calling convention derived from it is fixed, whatever the launcher's order:
`kernel(*inputs, **scalars) -> results`, where inputs are the tensors of role
"input" or "inout" and results those of role "output" or "inout", each in launcher
order (tuples flattened); "inout" tensors alias their input buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Dim = int | str  # an int is a static extent, a str names a symbolic one

ROLES = ("input", "output", "inout")
LAYOUTS = ("row-major",)


@dataclass(frozen=True)
class TensorArg:
    name: str
    role: str
    dtype: str
    shape: tuple[Dim, ...]
    layout: str = "row-major"
    align: int = 16  # bytes the data pointer is assumed aligned to

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str
    default: float | int | bool | None = None


@dataclass(frozen=True)
class NoneArg:
    """An optional tensor slot compiled as `None` (and passed as `None`)."""


@dataclass(frozen=True)
class StreamArg:
    """Where the launcher takes its CUDA stream; the caller's (XLA's) stream is used."""


@dataclass(frozen=True)
class TupleArg:
    items: tuple[Arg, ...]


Arg = TensorArg | ScalarArg | NoneArg | StreamArg | TupleArg


def flat_leaves(args: tuple[Arg, ...]) -> list[Arg]:
    """All arguments in launcher order with tuples flattened."""
    out: list[Arg] = []
    for a in args:
        if isinstance(a, TupleArg):
            out.extend(flat_leaves(a.items))
        else:
            out.append(a)
    return out


@dataclass(frozen=True)
class CallingConvention:
    """The canonical JAX-side order derived from a launcher's arguments."""

    inputs: tuple[TensorArg, ...]
    results: tuple[TensorArg, ...]
    scalars: tuple[ScalarArg, ...]
    # (input index, result index) for every "inout" tensor
    aliases: tuple[tuple[int, int], ...]

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
        return cls(inputs, results, scalars, aliases)


# JSON form, stored in cache metadata ------------------------------------------------


def arg_to_json(a: Arg) -> dict[str, Any]:
    if isinstance(a, TensorArg):
        return {"kind": "tensor", "name": a.name, "role": a.role, "dtype": a.dtype,
                "shape": list(a.shape), "layout": a.layout, "align": a.align}
    if isinstance(a, ScalarArg):
        return {"kind": "scalar", "name": a.name, "dtype": a.dtype, "default": a.default}
    if isinstance(a, NoneArg):
        return {"kind": "none"}
    if isinstance(a, StreamArg):
        return {"kind": "stream"}
    return {"kind": "tuple", "items": [arg_to_json(i) for i in a.items]}


def arg_from_json(d: dict[str, Any]) -> Arg:
    kind = d["kind"]
    if kind == "tensor":
        return TensorArg(d["name"], d["role"], d["dtype"], tuple(d["shape"]),
                         d.get("layout", "row-major"), int(d.get("align", 16)))
    if kind == "scalar":
        return ScalarArg(d["name"], d["dtype"], d.get("default"))
    if kind == "none":
        return NoneArg()
    if kind == "stream":
        return StreamArg()
    if kind == "tuple":
        return TupleArg(tuple(arg_from_json(i) for i in d["items"]))
    raise ValueError(f"unknown argument kind {kind!r}")


def args_to_json(args: tuple[Arg, ...]) -> list[dict[str, Any]]:
    return [arg_to_json(a) for a in args]


def args_from_json(items: list[dict[str, Any]]) -> tuple[Arg, ...]:
    return tuple(arg_from_json(d) for d in items)
