"""Open a cache entry's shared library, only after its bytes match the recorded SHA-256,
and register it as a JAX FFI target once per process (PyTorch calls the same loaded
function directly: `load_function`).

The bytes are read once, hashed, and the very same bytes are what gets dlopened (from a
memfd), so a file swapped between the check and the load is never run. A kernel library
needs its toolchain's runtime library (`libcutecc_rt_<key16>.so`, its DT_NEEDED): that is
verified the same way (its entry's trust, its SHA-256 as the kernel's metadata records
it) and loaded first, once per process and never unloaded, from its own memfd under a
fresh path; glibc then binds the kernel library's DT_NEEDED to it by its soname. Every
load goes through a new, unique path: glibc also matches an already loaded object by the
path string, so a reused `/proc/self/fd/N` name would return the previous library.

Threads (one per GPU, say, their first calls at once): a build's first use verifies, loads
and registers it under one process-wide lock, so a thread arriving meanwhile waits and then
finds it done (each library is loaded and registered once per process); later uses read the
registry without the lock. Nothing launches under it: XLA, or torch's eager call, launches
the kernel after its registration or load has returned.

A process holds kernel libraries by content: a key is loaded once, with the bytes it was
first loaded with, and a later load of that key with other bytes (another cache, a pack,
a lock pinning another SHA-256) is an error naming both sources, never served by the
library already loaded under the key's FFI target name.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import settings, trust
from cutecc.entry.meta import RuntimeMeta
from cutecc.entry.rules import MAX_LIBRARY_BYTES, MAX_META_BYTES, RUNTIME_ABI, parse_json
from cutecc.errors import CuteccError, WorkError
from cutecc.store.layout import entry_file_parts, meta_parts
from cutecc.store.view import touch_used

ENV_ALLOW_SHARED = settings.ALLOW_SHARED_CACHE.env
_lock = threading.Lock()
_registered: dict[str, Any] = {}  # target name -> tvm_ffi.Module registered with JAX
# target name -> (tvm_ffi.Module kept alive, function, SHA-256 of its bytes, where they came from)
_functions: dict[str, tuple[Any, Any, str, Path]] = {}
_runtimes: dict[str, tuple[str, Any]] = {}  # soname -> (SHA-256, ctypes handle), never unloaded


@dataclass(frozen=True)
class RuntimeRef:
    """The runtime library a kernel library links against, as the kernel's metadata
    records it: `path` is `<root>/runtimes/ab/<key>/<soname>`."""

    key: str
    path: Path
    sha256: str
    size: int


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
    root, parts = entry_file_parts(path)
    trust.read_file(root, meta_parts(parts[:-1]), MAX_META_BYTES)
    return trust.read_file(root, parts, max_bytes)


def verified_bytes(path: Path, sha256: str, size: int, label: str, what: str = "kernel library") -> bytes:
    """The library's bytes, read through checked directories without following links
    (`cutecc.trust`), and only if they match the recorded size and SHA-256."""
    if not 0 <= size <= MAX_LIBRARY_BYTES:
        raise WorkError(f"the {what}'s recorded size {size} is over the {MAX_LIBRARY_BYTES}-byte "
                        "limit of a library; refusing it", where=f"{label} ({path})")
    try:
        data = _read_library(path, size)  # reads what is there, up to `size`: never allocates it
    except trust.Untrusted as e:
        raise WorkError(f"refusing to load the {what}: {e.why}, so anyone could have "
                        "replaced it and its recorded SHA-256. Fix the permissions (chmod go-w, "
                        f"chown), or set {ENV_ALLOW_SHARED}=1 to trust this cache",
                        where=f"{label} ({path})") from None
    except OSError as e:
        if e.errno == 27:  # EFBIG: larger than recorded
            raise WorkError(f"the {what} does not match its recorded SHA-256 (larger than its "
                            f"recorded {size} bytes); refusing to load it. Remove the entry and "
                            "rebuild it", where=f"{label} ({path})") from None
        raise WorkError(f"cannot read the {what}: {e.strerror}; rebuild it with "
                        "`cutecc build`", where=f"{label} ({path})") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise WorkError(f"the {what} does not match its recorded SHA-256 "
                        f"(size {len(data)}, expected {size}); "
                        "refusing to load it. Remove the entry and rebuild it",
                        where=f"{label} ({path})")
    return data


# Optional interop apache-tvm-ffi imports when it can, and cutecc never uses (its kernels
# are called by XLA through jax-tvm-ffi, with XLA's stream): torch (seconds on a GPU host)
# and cuda-python's driver bindings (24 ms of the 147 ms `import tvm_ffi` took on an H100
# host, benchmarks/README.md).
TVM_FFI_OPTIONAL = ("torch", "cuda.bindings")


def import_tvm_ffi(interop: bool = False) -> Any:
    """`tvm_ffi`, imported without dragging in its optional torch and cuda-python interop.

    Each of `TVM_FFI_OPTIONAL` not imported yet (then it costs nothing) is hidden from
    that one import, unless `interop` (`$CUTECC_TVM_FFI_TORCH=1`, read by the load) asks
    for tvm-ffi's interop; importing them later works as usual.
    """
    if "tvm_ffi" in sys.modules or interop:
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


def _through_memfd(data: bytes, name: str, load: Any) -> Any:
    """`load(path)` of `data` written to a memfd, through a symlink of a fresh name."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            with tempfile.TemporaryDirectory(prefix="cutecc-") as d:
                link = Path(d) / name
                os.symlink(f"/proc/{os.getpid()}/fd/{fd}", link)
                return load(str(link))
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="cutecc-") as d:  # pragma: no cover
        p = Path(d) / name
        p.write_bytes(data)
        return load(str(p))


def _load_bytes(data: bytes, name: str) -> Any:
    return _through_memfd(data, f"{name}.so", import_tvm_ffi().load_module)


def ensure_runtime(ref: RuntimeRef, label: str, *, record_use: bool = True, interop: bool = False) -> None:
    """Verify and load the runtime library `ref` once per process (before any kernel
    library that needs it). Its entry's metadata must be sound and its bytes must match
    the SHA-256 the kernel's metadata records; a second runtime of the same soname but
    other bytes is refused. Call with `_lock` held."""
    import ctypes

    soname = ref.path.name
    held = _runtimes.get(soname)
    if held is not None:
        if held[0] != ref.sha256:
            raise WorkError(f"needs runtime library {soname} with SHA-256 {ref.sha256[:16]}..., but "
                            f"this process already loaded one with {held[0][:16]}... under that "
                            "name; load kernels of one build toolchain per process, or rebuild",
                            where=label)
        return
    where = f"{label}: runtime library ({ref.path})"
    import_tvm_ffi(interop)  # its libtvm_ffi.so is the runtime library's DT_NEEDED, found by soname
    data = verified_bytes(ref.path, ref.sha256, ref.size, f"{label}: runtime library",
                          what="runtime library")
    root, parts = entry_file_parts(ref.path)
    try:
        meta = parse_json(trust.read_file(root, meta_parts(parts[:-1]), MAX_META_BYTES))
    except (OSError, ValueError) as e:
        raise WorkError(f"unreadable runtime library metadata: {e}", where=where) from None
    try:
        RuntimeMeta.parse(meta, ref.key)
    except ValueError as e:
        raise WorkError(f"runtime library: {e}; run `cutecc verify --fix` and `cutecc build`",
                        where=where) from None
    try:
        handle = _through_memfd(data, soname, lambda p: ctypes.CDLL(p, mode=os.RTLD_LOCAL | os.RTLD_NOW))
        abi = int(handle.cutecc_rt_abi_version())
    except (OSError, AttributeError) as e:
        raise WorkError(f"cannot load the runtime library: {e}", where=where) from None
    if abi != RUNTIME_ABI:
        raise WorkError(f"runtime library ABI {abi}, this cutecc needs {RUNTIME_ABI}; rebuild with "
                        "`cutecc build`", where=where)
    _runtimes[soname] = (ref.sha256, handle)
    if record_use:
        touch_used(ref.path.parent)


def load_function(key: str, path: Path, sha256: str, size: int, symbol: str, label: str, *,
                  record_use: bool = True, runtime: RuntimeRef | None = None,
                  interop: bool = False) -> Any:
    """The entry's kernel as a `tvm_ffi.Function`: verified and loaded once per process (after
    its `runtime` library), the one copy that JAX registers and PyTorch calls directly.

    `record_use`: touch the entry's `used` file (for `cutecc gc`); off for installed packs
    and read-only caches. `interop`: `import_tvm_ffi`'s.
    """
    got = _functions.get(target_name(key))
    if got is not None and got[2] == sha256:
        return got[1]
    with _lock:
        return _load_locked(key, path, sha256, size, symbol, label, record_use, runtime, interop)[1]


def _other_bytes(held: tuple[Any, Any, str, Path], key: str, path: Path, sha256: str,
                 label: str) -> CuteccError:
    """The error of a key this process already runs from other bytes than `sha256`."""
    return WorkError(
        f"entry {key[:12]} is already loaded in this process from {held[3]} (SHA-256 "
        f"{held[2][:16]}...), and this call asks for other bytes under the same key: {path} "
        f"(SHA-256 {sha256[:16]}...); one key runs one library per process, so this is refused "
        "rather than run the first. Load one of the two caches (or packs) per process, or "
        "remove the entry that differs and rebuild it", where=label)


def _load_locked(key: str, path: Path, sha256: str, size: int, symbol: str, label: str,
                 record_use: bool, runtime: RuntimeRef | None, interop: bool = False) -> tuple[Any, Any]:
    """(module, function) of the entry, loaded on first use; call with `_lock` held."""
    name = target_name(key)
    got = _functions.get(name)
    if got is not None:
        if got[2] != sha256:
            raise _other_bytes(got, key, path, sha256, label)
        return got[0], got[1]
    data = verified_bytes(path, sha256, size, label)
    if runtime is not None:
        ensure_runtime(runtime, label, record_use=record_use, interop=interop)
    if interop:
        import_tvm_ffi(interop)  # with its interop, before `_load_bytes` imports it without
    try:
        module = _load_bytes(data, name)
        fn = getattr(module, symbol)
    except Exception as e:
        raise WorkError(f"cannot load the kernel library: {e}", where=f"{label} ({path})") from None
    _functions[name] = (module, fn, sha256, path)
    if record_use:
        touch_used(path.parent)  # once per process per entry, for `cutecc gc`
    return module, fn


def ensure_registered(key: str, path: Path, sha256: str, size: int, symbol: str,
                      scalar_names: tuple[str, ...], label: str, *, record_use: bool = True,
                      runtime: RuntimeRef | None = None, sync_check: bool = False,
                      interop: bool = False) -> str:
    """Verify, load and register the entry's kernel once (after its `runtime` library);
    returns its target name.

    `record_use`: touch the entry's `used` file (for `cutecc gc`); off for installed packs
    and read-only caches. `sync_check` (`$CUTECC_SYNC_CHECK`, read by the load): check
    mode, in which each kernel's native wrapper waits for its kernel and reports a fault by
    name (`cutecc/native` reads the same variable, once per process), so XLA may not capture
    it into a CUDA graph. `interop`: `import_tvm_ffi`'s.
    """
    name = target_name(key)
    got = _functions.get(name)
    if name in _registered and got is not None and got[2] == sha256:
        return name
    with _lock:
        if name in _registered:
            _load_locked(key, path, sha256, size, symbol, label, record_use, runtime, interop)  # same bytes?
            return name
        module, fn = _load_locked(key, path, sha256, size, symbol, label, record_use, runtime, interop)
        import jax_tvm_ffi

        arg_spec = ["args", "rets"] + [f"attrs.{s}" for s in scalar_names]
        # XLA replays a call it captured into a CUDA graph without running the call's
        # wrapper, whose check would then be skipped: in check mode, no graphs.
        jax_tvm_ffi.register_ffi_target(name, fn, arg_spec, platform="gpu",
                                        allow_cuda_graph=not sync_check)
        _registered[name] = module
    return name
