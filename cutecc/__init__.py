"""cutecc: build CuTe DSL kernels ahead of time, cache them, and call them from JAX.

Importing this package imports neither the DSL nor JAX; `cutecc.load` pulls in the
thin runtime (JAX + tvm-ffi) on first use. This package fronts the runtime and the build
side alike: the runtime imports nothing of the build side, and `load` registers the build
side's just-in-time builder with the runtime's miss hook (`cutecc.runtime.jit_hook`), a
factory that imports it (`cutecc.build.jit`) only at the first miss of a `load(jit=True)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cutecc.errors import CopyWarning, CuteccError, FallbackWarning, JitBuildWarning

__all__ = ["CopyWarning", "CuteccError", "FallbackWarning", "JitBuildWarning", "__version__", "load"]

if TYPE_CHECKING:
    from pathlib import Path

    from cutecc.runtime.jit_hook import MissBuilder
    from cutecc.runtime.loader import KernelSet

    __version__: str


def load(*args: Any, **kwargs: Any) -> KernelSet:
    """Load prebuilt kernels from a cache; see `cutecc.runtime.loader.load`."""
    from cutecc.runtime.jit_hook import register_builder
    from cutecc.runtime.loader import load as _load

    register_builder(_jit_builder)  # used only under jit=True ($CUTECC_JIT), at a miss
    return _load(*args, **kwargs)


def _jit_builder(cache_dir: Path, manifest: Path | None) -> MissBuilder:
    """The build side's just-in-time builder for one cache, imported here at the first miss
    only (the runtime never imports it)."""
    from cutecc.build.jit import builder_for

    return builder_for(cache_dir, manifest)


def __getattr__(name: str) -> Any:
    """`__version__`, looked up on first use: `importlib.metadata` and its search of every
    installed distribution cost 45 ms of a bare `import cutecc` that a program calling
    kernels never needs."""
    if name == "__version__":
        import importlib.metadata

        try:
            version = importlib.metadata.version("cutecc")  # written once, in pyproject.toml
        except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
