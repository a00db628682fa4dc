"""Open a cache entry's shared library, only after its bytes match the recorded SHA-256,
and register it as a JAX FFI target once per process.

The bytes are read once, hashed, and the very same bytes are what gets dlopened (from a
memfd), so a file swapped between the check and the load is never run.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from cutecc import environ, trust
from cutecc.entry import MAX_META_BYTES, META
from cutecc.errors import CuteccError
from cutecc.store import touch_used

ENV_ALLOW_SHARED = environ.ALLOW_SHARED_CACHE
# Check mode: each kernel's native wrapper waits for its kernel and reports a fault by name
# (cutecc/native reads the same variable).
ENV_SYNC_CHECK = environ.SYNC_CHECK
_lock = threading.Lock()
_registered: dict[str, Any] = {}  # target name -> tvm_ffi.Module (kept alive)


def target_name(key: str) -> str:
    """A stable FFI target name: the same in every process, so HLO (and JAX's
    persistent compilation cache) matches across processes."""
    return f"cutecc_{key[:40]}"


def untrusted(path: Path) -> str | None:
    """Why the library at `path` (`<root>/entries/ab/<key>/<file>`) may have been replaced
    by someone other than this user or root, or None; see `cutecc.trust`. The SHA-256 check
    cannot catch such a replacement: whoever can write the library can write the hash."""
    try:
        _read_library(path, 0)
    except trust.Untrusted as e:
        return e.why
    except OSError:
        return None  # a missing or oversized file is reported by the hash check
    return None


def _read_library(path: Path, max_bytes: int) -> bytes:
    """The library's bytes through checked directories; its meta.json is checked too (who
    can write it can change what the library is trusted to be)."""
    root, parts = path.parents[3], path.parts[-4:]
    trust.read_file(root, (*parts[:-1], META), MAX_META_BYTES)
    return trust.read_file(root, parts, max_bytes)


def sync_check_from_env() -> bool:
    """Whether `$CUTECC_SYNC_CHECK` turns check mode on (unset, 0, false, no, off: off)."""
    return environ.flag(ENV_SYNC_CHECK)


def verified_bytes(path: Path, sha256: str, size: int, label: str) -> bytes:
    """The library's bytes, read through checked directories without following links
    (`cutecc.trust`), and only if they match the recorded size and SHA-256."""
    try:
        data = _read_library(path, size)
    except trust.Untrusted as e:
        raise CuteccError(f"refusing to load the kernel library: {e.why}, so anyone could have "
                          "replaced it and its recorded SHA-256. Fix the permissions (chmod o-w, "
                          f"chown), or set {ENV_ALLOW_SHARED}=1 to trust this cache",
                          where=f"{label} ({path})", exit_code=1) from None
    except OSError as e:
        if e.errno == 27:  # EFBIG: larger than recorded
            data = b"\0" * (size + 1)
        else:
            raise CuteccError(f"cannot read the kernel library: {e.strerror}; rebuild it with "
                              "`cutecc build`", where=f"{label} ({path})", exit_code=1) from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise CuteccError("the kernel library does not match its recorded SHA-256 "
                          f"(size {len(data) if len(data) <= size else 'larger'}, expected {size}); "
                          "refusing to load it. Remove the entry and rebuild it",
                          where=f"{label} ({path})", exit_code=1)
    return data


# Optional interop apache-tvm-ffi imports when it can, and cutecc never uses (its kernels
# are called by XLA through jax-tvm-ffi, with XLA's stream): torch (seconds on a GPU host)
# and cuda-python's driver bindings (24 ms of the 147 ms `import tvm_ffi` took on an H100
# host, benchmarks/README.md).
TVM_FFI_OPTIONAL = ("torch", "cuda.bindings")


def import_tvm_ffi() -> Any:
    """`tvm_ffi`, imported without dragging in its optional torch and cuda-python interop.

    Each of `TVM_FFI_OPTIONAL` not imported yet (then it costs nothing) is hidden from
    that one import, unless `$CUTECC_TVM_FFI_TORCH=1` asks for tvm-ffi's interop;
    importing them later works as usual.
    """
    if "tvm_ffi" in sys.modules or os.environ.get(environ.TVM_FFI_TORCH) == "1":
        import tvm_ffi

        return tvm_ffi
    hidden = [m for m in TVM_FFI_OPTIONAL if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # `import m` raises ImportError
    try:
        import tvm_ffi
    finally:
        for m in hidden:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]
    return tvm_ffi


def _load_bytes(data: bytes, name: str) -> Any:
    tvm_ffi = import_tvm_ffi()

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
        # XLA replays a call it captured into a CUDA graph without running the call's
        # wrapper, whose check would then be skipped: in check mode, no graphs.
        jax_tvm_ffi.register_ffi_target(name, fn, arg_spec, platform="gpu",
                                        allow_cuda_graph=not sync_check_from_env())
        _registered[name] = module
        if record_use and not environ.read_only():
            touch_used(path.parent)  # once per process per entry, for `cutecc gc`
    return name
