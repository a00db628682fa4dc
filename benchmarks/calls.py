"""The kernel calls the cold-start and parity groups lower: one per built example variant.

Each `Call` names a kernel of the root kernels.toml, its variant parameters, and the
shapes of its JAX inputs. Nothing heavy is imported here (children import it first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

N = 4096  # elements of a 1-D call (symbolic in every contract; any size lowers the same)
M = 8  # rows of an rmsnorm call


@dataclass(frozen=True)
class Call:
    kernel: str
    params: tuple[tuple[str, Any], ...]  # variant parameters, as in the manifest
    shapes: tuple[tuple[int, ...], ...]  # the JAX inputs
    dtype: str
    scalars: tuple[tuple[str, float], ...] = ()

    @property
    def label(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.kernel}[{p}]" if p else self.kernel


def _elementwise(kernel: str, dtype: str, arity: int) -> Call:
    return Call(kernel, (("dtype", dtype),), ((N,),) * arity, dtype)


def _rmsnorm(dtype: str, d: int) -> Call:
    return Call("rmsnorm", (("dtype", dtype), ("d", d)), ((M, d), (d,)), dtype,
                (("eps", 1e-6),))


DTYPES = ("float32", "float16", "bfloat16")
ONE = (_elementwise("mul", "float32", 2),)
ALL = (
    *(_elementwise("mul", dt, 2) for dt in DTYPES),
    *(_elementwise("mul_bwd", dt, 3) for dt in DTYPES),
    *(_rmsnorm(dt, d) for dt in ("float32", "bfloat16") for d in (1024, 4096)),
    Call("axpy", (), ((N,), (N,)), "float32", (("alpha", 2.0),)),
)
SETS = {"one": ONE, "all": ALL}


def specs(calls: tuple[Call, ...]) -> list[Any]:
    """The flat list of jax.ShapeDtypeStruct inputs of `calls`, in order."""
    import jax
    import jax.numpy as jnp

    return [jax.ShapeDtypeStruct(s, jnp.dtype(c.dtype)) for c in calls for s in c.shapes]


def chain(calls: tuple[Call, ...], fns: list[Any]) -> Any:
    """One function of all inputs that calls `fns[i]` on the inputs of `calls[i]`."""

    def f(*arrays: Any) -> list[Any]:
        out, i = [], 0
        for c, fn in zip(calls, fns):
            out.append(fn(*arrays[i:i + len(c.shapes)]))
            i += len(c.shapes)
        return out

    return f
