"""Open a cache entry's shared library, only after its bytes match the recorded SHA-256,
and register it as a JAX FFI target once per process.

The bytes are read once, hashed, and the very same bytes are what gets dlopened (from a
memfd), so a file swapped between the check and the load is never run.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.store import read_only_from_env, touch_used

_lock = threading.Lock()
_registered: dict[str, Any] = {}  # target name -> tvm_ffi.Module (kept alive)


def target_name(key: str) -> str:
    """A stable FFI target name: the same in every process, so HLO (and JAX's
    persistent compilation cache) matches across processes."""
    return f"cutecc_{key[:40]}"


def verified_bytes(path: Path, sha256: str, size: int, label: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CuteccError(f"cannot read the kernel library: {e.strerror}; rebuild it with "
                          "`cutecc build`", where=f"{label} ({path})", exit_code=1) from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise CuteccError("the kernel library does not match its recorded SHA-256 "
                          f"(size {len(data)}, expected {size}); refusing to load it. "
                          "Remove the entry and rebuild it", where=f"{label} ({path})",
                          exit_code=1)
    return data


def _load_bytes(data: bytes, name: str) -> Any:
    import tvm_ffi

    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
        try:
            os.write(fd, data)
            with tempfile.TemporaryDirectory(prefix="cutecc-") as d:
                link = Path(d) / f"{name}.so"
                os.symlink(f"/proc/{os.getpid()}/fd/{fd}", link)
                return tvm_ffi.load_module(str(link))
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="cutecc-") as d:  # pragma: no cover
        p = Path(d) / f"{name}.so"
        p.write_bytes(data)
        return tvm_ffi.load_module(str(p))


def ensure_registered(key: str, path: Path, sha256: str, size: int, symbol: str,
                      scalar_names: tuple[str, ...], label: str, *, record_use: bool = True) -> str:
    """Verify, load and register the entry's kernel once; returns its target name.

    `record_use`: touch the entry's `used` file (for `cutecc gc`); off for installed packs.
    """
    name = target_name(key)
    if name in _registered:
        return name
    with _lock:
        if name in _registered:
            return name
        data = verified_bytes(path, sha256, size, label)
        try:
            module = _load_bytes(data, name)
            fn = getattr(module, symbol)
        except Exception as e:
            raise CuteccError(f"cannot load the kernel library: {e}", where=f"{label} ({path})",
                              exit_code=1) from None
        import jax_tvm_ffi

        arg_spec = ["args", "rets"] + [f"attrs.{s}" for s in scalar_names]
        jax_tvm_ffi.register_ffi_target(name, fn, arg_spec, platform="gpu",
                                        allow_cuda_graph=True)
        _registered[name] = module
        if record_use and not read_only_from_env():
            touch_used(path.parent)  # once per process per entry, for `cutecc gc`
    return name
