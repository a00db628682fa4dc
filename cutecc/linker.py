"""Link CuTe DSL TVM-FFI objects: one runtime library per toolchain, one small library per kernel.

The runtime library (`libcutecc_rt_<key>.so`, `native/cutecc_rt.c`) holds what every
kernel needs and nothing of any kernel: the symbols of `libcute_dsl_runtime.so` the DSL's
objects call, the DSL's static CUDA-dialect runtime (whole archive) and the static CUDA
runtime, behind a version script that exports only what kernel libraries bind to. Its
key (`runtime_inputs`) names everything that decides its bytes, and its soname carries
the key. A kernel library is the DSL's object plus the small wrapper of
`native/kernel_wrap.c`, linked against the runtime library by soname; it exports only
its TVM-FFI entry symbol. Both depend on `libtvm_ffi.so` and glibc alone, so the deploy
host needs neither the DSL nor a CUDA toolkit.

The C compiler and linker are zig's (`zig cc`, PyPI `ziglang`, in the build extra),
targeting glibc 2.28: the output is a function of the inputs and the zig version alone,
never of the build host's gcc, binutils, glibc or crt files, and needs at most the glibc
symbol versions the manylinux tag of a pack names (`cutecc.elf`). Every flag that could
differ between hosts is explicit, and the link runs in a scrubbed environment.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
from pathlib import Path

from cutecc import platforms, targetlibs
from cutecc.compiler import INNER_SYMBOL
from cutecc.errors import CuteccError
from cutecc.platforms import BUILD_PLATFORM

NATIVE = Path(__file__).with_name("native")
RUNTIME_SOURCE = NATIVE / "cutecc_rt.c"
WRAPPER_SOURCE = NATIVE / "kernel_wrap.c"
ZIG_TARGET = "x86_64-linux-gnu.2.28"  # glibc 2.28 symbols at most; the CPU is baseline x86-64
CFLAGS = ("-O2", "-fPIC", "-std=gnu11", "-fno-ident", "-mcpu=baseline")
LDFLAGS = (
    "-Wl,--build-id=sha1",  # a hash of the output: deterministic, kept for debuggers
    "-Wl,--hash-style=gnu",
    "-Wl,-z,defs",  # an unresolved symbol fails here, not at dlopen on the GPU host
    "-Wl,--no-undefined-version",
    "-s",  # no symbol table: local names are a third of an unstripped library
)
# What the runtime library exports: the dialect runtime's entry points the DSL's objects
# call (`_cu*`, `cuda_dialect_*`), the DSL runtime's error hooks, and cutecc's own.
RUNTIME_EXPORTS = ("_cu*", "cuda_dialect_*", "CuteDSLRT_*", "cutecc_rt_*")
RUNTIME_ABI = 1  # what cutecc_rt_abi_version() returns (native/cutecc_rt.c)
RUNTIME_FORMAT = 1  # the runtime entry's layout and recipe; part of its key


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Part of every key: bump the number when the flags above change; the sources' own hashes
# are included so an edited source can never reuse an old artifact.
RECIPE_VERSION = (f"3+rt.{_sha(RUNTIME_SOURCE)[:16]}+wrap.{_sha(WRAPPER_SOURCE)[:16]}")
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


def toolchain_paths(cuda: str = "cu13", platform: str = BUILD_PLATFORM) -> dict[str, Path]:
    """Where the link inputs and zig live: in the build extra's wheels, and for another
    platform than the build's, in that platform's pinned wheels (`cutecc.targetlibs`)."""
    if platform != BUILD_PLATFORM:
        zig = toolchain_paths(cuda)["zig"]
        return {"zig": zig, **targetlibs.paths(platform)}
    hint = "install the build extra: pip install 'cutecc[build]'"
    dsl = _package_dirs("nvidia_cutlass_dsl")
    nv = _package_dirs("nvidia")
    tvm = _package_dirs("tvm_ffi")
    zig = _package_dirs("ziglang")
    return {
        "zig": _find("zig (PyPI ziglang)", [d / "zig" for d in zig], hint),
        "dialect_rt": _find("libcuda_dialect_runtime_static.a",
                            [d / cuda / "lib" / "libcuda_dialect_runtime_static.a" for d in dsl], hint),
        "cudart": _find("libcudart_static.a",
                        [d / cuda / "lib" / "libcudart_static.a" for d in nv], hint),
        "tvm_lib": _find("libtvm_ffi.so", [d / "lib" / "libtvm_ffi.so" for d in tvm], hint).parent,
        "tvm_include": _find("tvm-ffi headers", [d / "include" for d in tvm], hint),
    }


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def zig_target(platform: str) -> str:
    """`zig cc -target` for a platform."""
    return ZIG_TARGET if platform == BUILD_PLATFORM else platforms.get(platform).zig_target


@functools.lru_cache(maxsize=4)
def runtime_inputs(platform: str = BUILD_PLATFORM) -> dict[str, str]:
    """Everything that decides the runtime library's bytes (its key's inputs): the recipe
    and its source, zig and its target, the two static archives' SHA-256 and tvm-ffi's
    version (its headers and its library's soname). Empty values when the build extra is
    missing ("absent"): such a key is never built. For another platform, the pins of its
    wheels (`cutecc.targetlibs.pins`) name the archives, library and headers: known
    without fetching them, and checked against them before they are linked."""
    if platform != BUILD_PLATFORM:
        pins = targetlibs.pins(platform)
        return {"runtime_format": str(RUNTIME_FORMAT), "recipe": RECIPE_VERSION,
                "source": _sha(RUNTIME_SOURCE), "exports": ",".join(RUNTIME_EXPORTS),
                "zig": _version("ziglang"), "target": zig_target(platform), "platform": platform,
                "apache-tvm-ffi": pins["apache-tvm-ffi"].split()[0], **pins}
    out = {"runtime_format": str(RUNTIME_FORMAT), "recipe": RECIPE_VERSION,
           "source": _sha(RUNTIME_SOURCE), "exports": ",".join(RUNTIME_EXPORTS),
           "zig": _version("ziglang"), "target": ZIG_TARGET,
           "apache-tvm-ffi": _version("apache-tvm-ffi")}
    try:
        p = toolchain_paths()
    except CuteccError:
        return {**out, "dialect_rt": "absent", "cudart": "absent"}
    return {**out, "dialect_rt": _sha(p["dialect_rt"]), "cudart": _sha(p["cudart"])}


def runtime_soname(runtime_key: str) -> str:
    """The runtime library's file name and DT_SONAME: unique per key (glibc binds a kernel
    library's DT_NEEDED to an already loaded library of that soname)."""
    return f"libcutecc_rt_{runtime_key[:16]}.so"


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


def zig_cache_dir() -> Path:
    """zig's own cache (its libc stubs, built once per zig version and target, ~3-5 s):
    `$ZIG_GLOBAL_CACHE_DIR`, else `cutecc-zig` in the user's cache directory, shared by all
    cutecc caches of this user. It never decides an output byte."""
    env = os.environ.get("ZIG_GLOBAL_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("cutecc-zig", appauthor=False))


def _zig_cc(p: dict[str, Path], args: list[str], out: Path, platform: str = BUILD_PLATFORM) -> None:
    """Run `zig cc` for the pinned target of `platform` in a scrubbed environment (no
    CFLAGS, locale or user settings reach it), writing `out`."""
    cache = zig_cache_dir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
           "ZIG_GLOBAL_CACHE_DIR": str(cache), "ZIG_LOCAL_CACHE_DIR": str(cache)}
    # Retargeted IR names the generic triple, which zig refines (OS and glibc versions).
    quiet = () if platform == BUILD_PLATFORM else ("-Wno-override-module",)
    cmd = [str(p["zig"]), "cc", "-target", zig_target(platform), *CFLAGS, *quiet, *args, *LDFLAGS]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except OSError as e:
        raise CuteccError(f"cannot run zig cc ({p['zig']}): {e.strerror}", where="link",
                          exit_code=1) from None
    except subprocess.TimeoutExpired:
        raise CuteccError("zig cc did not finish in 600 s", where="link", exit_code=1) from None
    if r.returncode != 0:
        if _free_bytes(out.parent) < _MIN_FREE:  # LLD aborts on a full disk without a word
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))
        said = "\n".join(x.strip() for x in (r.stderr, r.stdout) if x.strip())
        raise CuteccError(f"link failed (zig cc exited {r.returncode}):\n{said[-2000:]}", where="link",
                          exit_code=1)


_MIN_FREE = 1 << 20  # below this, a failed link is put down to the full disk


def _free_bytes(d: Path) -> int:
    try:
        st = os.statvfs(d)
    except OSError:
        return _MIN_FREE
    return st.f_bavail * st.f_frsize


def link_runtime(out_dir: Path, runtime_key: str, platform: str = BUILD_PLATFORM) -> Path:
    """Link the runtime library for `runtime_key` (the key of `runtime_inputs(platform)`)
    into `out_dir`; returns its path (named by `runtime_soname`)."""
    p = toolchain_paths(platform=platform)
    name = runtime_soname(runtime_key)
    out = out_dir / name
    vs = out_dir / "runtime.map"  # its path is not recorded in the output
    globs = " ".join(f"{g};" for g in RUNTIME_EXPORTS)
    vs.write_text(f"{{ global: {globs} local: *; }};\n")
    try:
        _zig_cc(p, [
            "-shared", "-o", str(out), str(RUNTIME_SOURCE),
            f"-DCUTECC_RT_LABEL={c_string(runtime_key[:16])}", f"-I{p['tvm_include']}",
            f"-Wl,-soname,{name}",
            "-Wl,--whole-archive", str(p["dialect_rt"]), "-Wl,--no-whole-archive",
            str(p["cudart"]), f"-L{p['tvm_lib']}", "-ltvm_ffi", "-ldl", "-lpthread", "-lrt",
            f"-Wl,--version-script={vs}",
        ], out, platform)
    finally:
        vs.unlink(missing_ok=True)
    return out


def link(obj: Path, out: Path, symbol: str, *, entry: str, arch: str, key: str,
         runtime: Path, platform: str = BUILD_PLATFORM) -> None:
    """Link `obj` (which defines `__tvm_ffi_<INNER_SYMBOL>`; for another platform, the
    retargeted IR that does) into the kernel library `out` against the runtime library
    `runtime`, exporting only `__tvm_ffi_<symbol>`: the wrapper, whose errors name the
    kernel by `entry`, `arch` and the first 12 hex digits of `key`."""
    if not _C_SYMBOL.match(symbol):
        raise CuteccError(f"{symbol!r} is not a C identifier", where="link", exit_code=1)
    p = toolchain_paths(platform=platform)
    vs = out.with_name(out.name + ".map")
    vs.write_text(f"{{ global: __tvm_ffi_{symbol}; local: *; }};\n")
    try:
        _zig_cc(p, [
            "-shared", "-o", str(out), str(obj), str(WRAPPER_SOURCE),
            f"-DCUTECC_EXPORT=__tvm_ffi_{symbol}", f"-DCUTECC_INNER=__tvm_ffi_{INNER_SYMBOL}",
            f"-DCUTECC_ENTRY={c_string(entry)}", f"-DCUTECC_ARCH={c_string(arch)}",
            f"-DCUTECC_KEY={c_string(key[:12])}", f"-I{p['tvm_include']}",
            f"-L{runtime.parent}", f"-l:{runtime.name}", f"-L{p['tvm_lib']}", "-ltvm_ffi",
            f"-Wl,--version-script={vs}",
        ], out, platform)
    finally:
        vs.unlink(missing_ok=True)
