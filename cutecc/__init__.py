"""cutecc: build CuTe DSL kernels ahead of time, cache them, and call them from JAX.

Importing this package imports neither the DSL nor JAX; `cutecc.load` pulls in the
thin runtime (JAX + tvm-ffi) on first use.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Any

from cutecc.errors import CuteccError

try:
    __version__ = importlib.metadata.version("cutecc")  # written once, in pyproject.toml
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
__all__ = ["CuteccError", "__version__", "load"]

if TYPE_CHECKING:
    from cutecc.runtime.loader import KernelSet


def load(*args: Any, **kwargs: Any) -> KernelSet:
    """Load prebuilt kernels from a cache; see `cutecc.runtime.loader.load`."""
    from cutecc.runtime.loader import load as _load

    return _load(*args, **kwargs)
