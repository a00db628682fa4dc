"""`cutecc_fallback`: the mark a fallback's JAX result passes through, so that its use is
recorded when the call really happens, not when it is traced.

A JAX call of a kernel is traced before anything runs, and some traces never run: one that
only computes shapes (`jax.eval_shape`, `jax.jit(f).trace`), or `custom_partitioning`'s
trace at the global shapes when each device then runs its shard's own trace. So the
fallback's result is passed through this identity primitive, whose parameter is the
`cutecc.runtime.fallback.Use` to record: lowering it into a program (a `jax.jit` call, its
`lower`, `jax.export`) or running it eagerly (op by op, as an eager `jax.grad` does)
warns and counts the miss; abstract evaluation does not. It lowers to nothing: the
program is the fallback's own. Differentiation passes the tangents by, batching the batch
dimensions, and inside `jax.shard_map` the results keep their inputs' types.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.interpreters import ad, batching, mlir

try:  # what jax.extend.core.Primitive is (as `cutecc.runtime.primitive` imports it)
    from jax._src.core import Primitive
except ImportError:  # pragma: no cover  (a JAX that moved it: the public path)
    from jax.extend.core import Primitive

cutecc_fallback_p = Primitive("cutecc_fallback")
cutecc_fallback_p.multiple_results = True


def marked(out: Any, use: Any) -> Any:
    """`out` (the fallback's result: an array or a tuple of them), each array passed through
    the mark that records `use` where the call is lowered or run."""
    leaves, tree = jax.tree.flatten(out)
    if not leaves:  # nothing a program could compute: recorded now
        use.record()
        return out
    return jax.tree.unflatten(tree, cutecc_fallback_p.bind(*leaves, use=use))


def _abstract_eval(*avals: Any, use: Any) -> list[Any]:
    return list(avals)  # the inputs' types, weak types and manual axes included


def _impl(*args: Any, use: Any) -> list[Any]:
    use.record()
    return list(args)


def _lower(ctx: Any, *args: Any, use: Any) -> list[Any]:
    use.record()
    return list(args)


def _jvp(primals: Any, tangents: Any, *, use: Any) -> Any:
    return cutecc_fallback_p.bind(*primals, use=use), list(tangents)


def _batch(args: Any, dims: Any, *, use: Any) -> Any:
    return cutecc_fallback_p.bind(*args, use=use), list(dims)


cutecc_fallback_p.def_abstract_eval(_abstract_eval)
cutecc_fallback_p.def_impl(_impl)
mlir.register_lowering(cutecc_fallback_p, _lower)
ad.primitive_jvps[cutecc_fallback_p] = _jvp
batching.primitive_batchers[cutecc_fallback_p] = _batch
