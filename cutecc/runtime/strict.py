"""Strict sharding: under an explicit mesh, a kernel call never costs a collective silently.

With `jax.sharding.AxisType.Explicit` mesh axes, an array's sharding is part of its type, and
JAX promises no surprising communication. A cutecc kernel computes on what its shard rule
allows (`shard = [..]`: split along those symbols, every other dimension whole; no rule:
every dimension whole, see `cutecc.runtime.sharding` and `cutecc.runtime.placement`). An
input split along any other dimension would have XLA insert a collective before the call
(an all-gather, or an all-to-all where the split moves to another dimension), as it does
before a plain `ffi_call` (jax-ml/jax#38551). This module finds those inputs from the
types at trace time and, by the kernel's `reshard` choice in the manifest, refuses the
call ("error", the default), warns once per kernel and sharding ("warn") and lets XLA
gather, or lets it gather silently ("allow").

Imports no framework: a caller passes each input's PartitionSpec entries (over the
explicit axes) and the mesh's axis names and sizes.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutecc.errors import CallError
from cutecc.runtime.sharding import Factors, choose_axes, spec_axes, spec_of


@dataclass(frozen=True)
class Reshard:
    """One input a call would have resharded: its spec, the one the rule computes on, and
    the collective that takes the first to the second."""

    operand: str
    spec: tuple[Any, ...]
    needed: tuple[Any, ...]
    collective: str  # "all-gather" or "all-to-all"
    axes: tuple[str, ...]  # the mesh axes it runs over

    def describe(self) -> str:
        return (f'input "{self.operand}" is sharded {_p(self.spec)}, the kernel computes on '
                f'{_p(self.needed)}: XLA would insert an {self.collective} over mesh axes '
                f'{", ".join(map(repr, self.axes))}')


def _p(spec: Sequence[Any]) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


class _Mesh:
    """The axis names and sizes `choose_axes` reads."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.axis_names, self.axis_sizes = tuple(sizes), tuple(sizes.values())


def reshards(names: Sequence[str], shapes: Sequence[tuple[int, ...]], specs: Sequence[tuple[Any, ...] | None],
             factors: Sequence[Factors], sizes: Mapping[str, int]) -> list[Reshard]:
    """The inputs (named `names`, of `shapes`, split as `specs` over mesh axes of `sizes`)
    that a call partitioned by `factors` would have resharded by a collective. An axis of
    size 1 moves nothing; a dimension the rule splits further than the input is sliced
    locally, no collective."""
    mesh = _Mesh(sizes)
    axes = choose_axes(mesh, shapes, specs, factors)
    out = []
    for name, spec, fs in zip(names, specs, factors):
        if spec is None:
            continue
        need = spec_of(fs, axes)
        lost: list[str] = []
        for i, entry in enumerate(spec):
            have = tuple(a for a in spec_axes(entry) if sizes.get(a, 1) > 1)
            want = tuple(a for a in spec_axes(need[i] if i < len(need) else None) if sizes.get(a, 1) > 1)
            if have != want[:len(have)]:
                lost += [a for a in have if a not in want] or list(have)
        if lost:
            moved = {a for e in need for a in spec_axes(e)} & set(lost)
            out.append(Reshard(name, tuple(spec), need, "all-to-all" if moved else "all-gather",
                               tuple(dict.fromkeys(lost))))
    return out


_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def check(kernel: str, policy: str, shard: Sequence[str], found: Sequence[Reshard]) -> None:
    """Act on `found` by the kernel's `reshard` policy: raise (error), warn once per kernel
    and sharding (warn), or nothing (allow)."""
    if not found or policy == "allow":
        return
    what = "; ".join(r.describe() for r in found)
    rule = f"shard = {list(shard)}" if shard else "no shard rule"
    splits = (f"splits its arrays only along {', '.join(shard)}" if shard
              else "computes on whole arrays")
    if policy == "warn":
        with _lock:
            if (kernel, what) in _warned:
                return
            _warned.add((kernel, what))
        warnings.warn(f'kernel "{kernel}" ({rule}, reshard = "warn"): {what}', stacklevel=4)
        return
    raise CallError(
        f"under an explicit mesh, {what}. The kernel ({rule}) {splits}: shard its inputs so, "
        "call it inside jax.shard_map (each device on its shard), or let the manifest allow "
        "the collective (reshard = \"warn\" or \"allow\")",
        where=f'kernel "{kernel}"')
