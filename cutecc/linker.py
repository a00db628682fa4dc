"""Link a CuTe DSL TVM-FFI object into a self-contained shared library.

The thin recipe (see shared/CUTE-AOT-FACTS.md): the exported object, the C shim in
`native/`, the DSL's static CUDA-dialect runtime and the static CUDA runtime, all hidden
behind a version script that exports only the TVM-FFI entry symbol. The result depends
on `libtvm_ffi.so` alone, so the deploy side needs neither the DSL nor a CUDA toolkit.

The shim supplies the symbols of `libcute_dsl_runtime.so` the object calls, and is the
exported entry itself: it calls the DSL's function (exported by the compiler under
`INNER_SYMBOL`) and makes each failure name the kernel, from a label compiled into this
artifact (entry point, arch and short key: all inputs of the key, so an artifact's bytes
stay a function of its key). With `CUTECC_SYNC_CHECK=1` it also waits for the kernel, so
a fault on the GPU is reported by the call that caused it (see the README).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
from pathlib import Path

from cutecc.compiler import INNER_SYMBOL
from cutecc.errors import CuteccError

SHIM = Path(__file__).with_name("native") / "cute_dsl_rt_shim.c"
# Part of the cache key: bump the number when the recipe below changes; the shim's own
# hash is included so an edited shim can never reuse an old artifact.
RECIPE_VERSION = f"2+shim.{hashlib.sha256(SHIM.read_bytes()).hexdigest()[:16]}"
_C_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _package_dirs(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _find(what: str, candidates: list[Path], hint: str) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise CuteccError(f"cannot find {what}; {hint}", where="link", exit_code=1)


def toolchain_paths(cuda: str = "cu13") -> dict[str, Path]:
    """Where the link inputs live in the build extra's wheels."""
    dsl = _package_dirs("nvidia_cutlass_dsl")
    nv = _package_dirs("nvidia")
    tvm = _package_dirs("tvm_ffi")
    hint = "install the build extra: pip install 'cutecc[build]'"
    return {
        "dialect_rt": _find("libcuda_dialect_runtime_static.a",
                            [d / cuda / "lib" / "libcuda_dialect_runtime_static.a" for d in dsl], hint),
        "cudart": _find("libcudart_static.a",
                        [d / cuda / "lib" / "libcudart_static.a" for d in nv], hint),
        "tvm_lib": _find("libtvm_ffi.so", [d / "lib" / "libtvm_ffi.so" for d in tvm], hint).parent,
        "tvm_include": _find("tvm-ffi headers", [d / "include" for d in tvm], hint),
    }


def c_string(text: str) -> str:
    """`text` as a C string literal (printable ASCII kept, everything else escaped)."""
    out = []
    for ch in text:
        if ch in '"\\?':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode())
    return '"' + "".join(out) + '"'


def link(obj: Path, out: Path, symbol: str, *, entry: str, arch: str, key: str) -> None:
    """Link `obj` (which defines `__tvm_ffi_<INNER_SYMBOL>`) into the shared library `out`,
    exporting only `__tvm_ffi_<symbol>`: the shim's wrapper, whose errors name the kernel
    by `entry`, `arch` and the first 12 hex digits of `key`."""
    if not _C_SYMBOL.match(symbol):
        raise CuteccError(f"{symbol!r} is not a C identifier", where="link", exit_code=1)
    p = toolchain_paths()
    vs = out.with_name(out.name + ".map")
    vs.write_text(f"{{ global: __tvm_ffi_{symbol}; local: *; }};\n")
    cmd = [
        "cc", "-shared", "-fPIC", "-O2", "-std=gnu11", "-o", str(out), str(obj), str(SHIM),
        f"-DCUTECC_EXPORT=__tvm_ffi_{symbol}", f"-DCUTECC_INNER=__tvm_ffi_{INNER_SYMBOL}",
        f"-DCUTECC_ENTRY={c_string(entry)}", f"-DCUTECC_ARCH={c_string(arch)}",
        f"-DCUTECC_KEY={c_string(key[:12])}",
        f"-I{p['tvm_include']}",
        "-Wl,--whole-archive", str(p["dialect_rt"]), "-Wl,--no-whole-archive",
        str(p["cudart"]), f"-L{p['tvm_lib']}", "-ltvm_ffi", "-ldl", "-lpthread", "-lrt",
        "-Wl,--exclude-libs,ALL", f"-Wl,--version-script={vs}",
        "-Wl,-z,defs",  # an unresolved symbol fails here, not at dlopen on the GPU host
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except OSError as e:
        raise CuteccError(f"cannot run the C compiler (cc): {e.strerror}", where="link",
                          exit_code=1) from None
    finally:
        vs.unlink(missing_ok=True)
    if r.returncode != 0:
        raise CuteccError(f"link failed:\n{r.stderr.strip()[-2000:]}", where="link", exit_code=1)
