"""A kernel call under `jax.jit` with several devices: each device runs the kernel on its shard.

A kernel may declare symbolic extents along which it is independent (`shard = ["b", "h"]`:
each result element along such an axis depends only on the input elements at the same
index; `contract.shard_problem` says what the manifest and the runtime check of that
claim). Such a call is wrapped in `jax.experimental.custom_partitioning`: its Shardy
rule names one factor per declared symbol and marks every other dimension as one that
must be replicated, and its `partition` keeps, per declared symbol, the mesh axes its
first sharded operand dimension has (when they divide the extent and no other symbol
took them), every other dimension of every operand and result replicated. XLA then
gathers or reslices the operands to that, never the other way round: a call computes on
exactly what its contract says, so a sharding the rule does not allow costs a collective,
never a wrong answer (under an explicit mesh, never a silent one: `cutecc.runtime.strict`).
Each device's shard is then a call of `body` on local arrays: the ordinary single-device
call (its own variant choice, derived scalars and scratch from the local shapes). Inside
`jax.shard_map`, and with one device, JAX inlines `body`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Factors = tuple[str | None, ...]  # per dimension: the declared symbol it may be split on, or None


def spec_axes(entry: Any) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axis names."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def choose_axes(mesh: Any, shapes: Sequence[tuple[int, ...]], specs: Sequence[tuple[Any, ...] | None],
                factors: Sequence[Factors]) -> dict[str, tuple[str, ...]]:
    """Per declared symbol, the mesh axes its dimensions are split over: those of the first
    operand dimension of that symbol that is split, kept when their product divides the
    extent and no symbol chosen before uses one of them. `specs[i]` is operand i's
    PartitionSpec entries (None: not a mesh sharding; taken as replicated)."""
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes if hasattr(mesh, "axis_sizes")
                     else mesh.devices.shape))
    chosen: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for shape, spec, fs in zip(shapes, specs, factors):
        if spec is None:
            continue
        for i, f in enumerate(fs):
            if f is None or f in chosen or i >= len(spec):
                continue
            axes = spec_axes(spec[i])
            if not axes or used & set(axes) or any(a not in sizes for a in axes):
                continue
            if shape[i] % int(np.prod([sizes[a] for a in axes])):
                continue
            chosen[f] = axes
            used |= set(axes)
    return chosen


def spec_of(factors: Factors, axes: dict[str, tuple[str, ...]]) -> tuple[Any, ...]:
    """The PartitionSpec entries of a value whose dimensions are `factors`."""
    out: list[Any] = []
    for f in factors:
        a = axes.get(f) if f is not None else None
        out.append(None if not a else a[0] if len(a) == 1 else a)
    return tuple(out)


def sharding_rule(in_factors: Sequence[Factors],
                  out_factors: Sequence[Factors]) -> tuple[str, tuple[str, ...]]:
    """The Shardy rule (einsum-like string) and its need-replication factors: each
    declared symbol one factor, shared by every dimension of that symbol; every other
    dimension a factor of its own that must stay replicated."""
    names: dict[str, str] = {}
    fixed: list[str] = []

    def dims(fs: Factors) -> str:
        out = []
        for f in fs:
            if f is None:
                fixed.append(f"r{len(fixed)}")
                out.append(fixed[-1])
            else:
                out.append(names.setdefault(f, f"s{len(names)}"))
        return " ".join(out)

    ins = ", ".join(dims(fs) for fs in in_factors)
    outs = ", ".join(dims(fs) for fs in out_factors)
    return f"{ins} -> {outs}", tuple(fixed)


def _named_spec(sharding: Any) -> tuple[Any, ...] | None:
    spec = getattr(sharding, "spec", None)
    return None if spec is None else tuple(spec)


def call(body: Callable[..., Sequence[Any]], arrays: Sequence[Any], in_factors: Sequence[Factors],
         out_factors: Sequence[Factors]) -> list[Any]:
    """`body(*arrays)` (a tuple of results), partitioned by the declared factors (see the
    module doc): under a multi-device `jax.jit`, each device calls `body` on its shard."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    in_factors, out_factors = tuple(map(tuple, in_factors)), tuple(map(tuple, out_factors))

    def run(*xs: Any) -> tuple[Any, ...]:
        return tuple(body(*xs))

    fn = custom_partitioning(run)

    def shardings(mesh: Any, arg_shapes: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        axes = choose_axes(mesh, [tuple(a.shape) for a in arg_shapes],
                           [_named_spec(a.sharding) for a in arg_shapes], in_factors)
        args = tuple(NamedSharding(mesh, PartitionSpec(*spec_of(fs, axes))) for fs in in_factors)
        results = tuple(NamedSharding(mesh, PartitionSpec(*spec_of(fs, axes))) for fs in out_factors)
        return args, results

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        args, results = shardings(mesh, arg_shapes)
        return mesh, run, results, args

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        return shardings(mesh, arg_shapes)[1]

    rule, fixed = sharding_rule(in_factors, out_factors)
    fn.def_partition(partition=partition, infer_sharding_from_operands=infer,
                     propagate_user_sharding=None, sharding_rule=rule,
                     need_replication_factors=fixed)
    return list(fn(*arrays))
