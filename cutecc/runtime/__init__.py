"""The thin runtime: load prebuilt kernels from a cache and call them from JAX.

Needs jax, apache-tvm-ffi and jax-tvm-ffi only; never imports the DSL, a kernel's Python
or any build-side module of cutecc. Entry metadata says everything a call needs.
Importing this package imports nothing yet: `load` and `KernelSet` come from
`cutecc.runtime.loader` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KernelSet", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from cutecc.runtime import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
