"""Link a CuTe DSL TVM-FFI object into a self-contained shared library.

The thin recipe (see shared/CUTE-AOT-FACTS.md): the exported object, a C shim for the
one symbol of `libcute_dsl_runtime.so` it needs, the DSL's static CUDA-dialect runtime
and the static CUDA runtime, all hidden behind a version script that exports only the
TVM-FFI entry symbol. The result depends on `libtvm_ffi.so` alone, so the deploy side
needs neither the DSL nor a CUDA toolkit.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from cutecc.errors import CuteccError

# Part of the cache key: bump when the recipe below changes.
RECIPE_VERSION = 1
SHIM = Path(__file__).with_name("native") / "cute_dsl_rt_shim.c"


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


def link(obj: Path, out: Path, symbol: str) -> None:
    """Link `obj` into the shared library `out`, exporting only `__tvm_ffi_<symbol>`."""
    p = toolchain_paths()
    vs = out.with_name(out.name + ".map")
    vs.write_text(f"{{ global: __tvm_ffi_{symbol}; local: *; }};\n")
    cmd = [
        "cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(obj), str(SHIM),
        f"-I{p['tvm_include']}",
        "-Wl,--whole-archive", str(p["dialect_rt"]), "-Wl,--no-whole-archive",
        str(p["cudart"]), f"-L{p['tvm_lib']}", "-ltvm_ffi", "-ldl", "-lpthread", "-lrt",
        "-Wl,--exclude-libs,ALL", f"-Wl,--version-script={vs}",
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
