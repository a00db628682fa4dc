"""The thin runtime: load prebuilt kernels from a cache and call them from JAX.

Needs jax, apache-tvm-ffi and jax-tvm-ffi only; never imports the DSL or a kernel's
Python. Entry metadata says everything a call needs.
"""

from cutecc.runtime.loader import KernelSet, load

__all__ = ["KernelSet", "load"]
