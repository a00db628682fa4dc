"""Link CuTe DSL TVM-FFI objects: one runtime library per toolchain, one small library per kernel.

The runtime library (`libcutecc_rt_<key>.so`, `native/cutecc_rt.c`) holds what every
kernel needs and nothing of any kernel: the symbols of `libcute_dsl_runtime.so` the DSL's
objects call, the DSL's static CUDA-dialect runtime (whole archive) and the static CUDA
runtime, behind a version script that exports only what kernel libraries bind to. Its
key (`toolchain.runtime_inputs`) names everything that decides its bytes, and its soname carries
the key. A kernel library is the DSL's object plus the small wrapper of
`native/kernel_wrap.c`, linked against the runtime library by soname; it exports only
its TVM-FFI entry symbol. Both depend on `libtvm_ffi.so` and glibc alone, so the deploy
host needs neither the DSL nor a CUDA toolkit.

The C compiler and linker are zig's (`zig cc`, PyPI `ziglang`, in the build extra),
targeting glibc 2.28: the output is a function of the inputs and the zig version alone,
never of the build host's gcc, binutils, glibc or crt files, and needs at most the glibc
symbol versions the manylinux tag of a pack names (`cutecc.toolchain.elf`). Every flag that could
differ between hosts is explicit, and the link runs in a scrubbed environment. The
target, flags, sources and the runtime library's key inputs are `cutecc.toolchain.versions`'s;
its file name (`runtime_soname`) is `cutecc.entry.rules`'s, which the runtime checks on load.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

from cutecc.build.compiler import INNER_SYMBOL
from cutecc.entry.rules import runtime_soname
from cutecc.errors import WorkError
from cutecc.platforms import BUILD_PLATFORM
from cutecc.store import homes
from cutecc.toolchain.versions import (
    CFLAGS,
    LDFLAGS,
    RUNTIME_EXPORTS,
    RUNTIME_SOURCE,
    WRAPPER_SOURCE,
    toolchain_paths,
    zig_target,
)

_C_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def _zig_cc(p: dict[str, Path], args: list[str], out: Path, platform: str = BUILD_PLATFORM) -> None:
    """Run `zig cc` for the pinned target of `platform` in a scrubbed environment (no
    CFLAGS, locale or user settings reach it), writing `out`. zig keeps its own cache (its
    libc stubs, built once per zig version and target, ~3-5 s) in the `zig` home
    (`cutecc.store.homes.zig`), shared by all cutecc caches of this user; it never decides
    an output byte."""
    cache, why = homes.make(homes.ZIG)
    if cache is None or why is not None:
        raise WorkError(f"zig's cache: {why}", where=f"${homes.ZIG_VAR}")
    homes.mark_used(cache)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
           homes.ZIG_VAR: str(cache), "ZIG_LOCAL_CACHE_DIR": str(cache)}
    # Retargeted IR names the generic triple, which zig refines (OS and glibc versions).
    quiet = () if platform == BUILD_PLATFORM else ("-Wno-override-module",)
    cmd = [str(p["zig"]), "cc", "-target", zig_target(platform), *CFLAGS, *quiet, *args, *LDFLAGS]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except OSError as e:
        raise WorkError(f"cannot run zig cc ({p['zig']}): {e.strerror}", where="link") from None
    except subprocess.TimeoutExpired:
        raise WorkError("zig cc did not finish in 600 s", where="link") from None
    if r.returncode != 0:
        if _free_bytes(out.parent) < _MIN_FREE:  # LLD aborts on a full disk without a word
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))
        said = "\n".join(x.strip() for x in (r.stderr, r.stdout) if x.strip())
        raise WorkError(f"link failed (zig cc exited {r.returncode}):\n{said[-2000:]}", where="link")


_MIN_FREE = 1 << 20  # below this, a failed link is put down to the full disk


def _free_bytes(d: Path) -> int:
    try:
        st = os.statvfs(d)
    except OSError:
        return _MIN_FREE
    return st.f_bavail * st.f_frsize


def link_runtime(out_dir: Path, runtime_key: str, platform: str = BUILD_PLATFORM) -> Path:
    """Link the runtime library for `runtime_key` (the key of `toolchain.runtime_inputs(platform)`)
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
        raise WorkError(f"{symbol!r} is not a C identifier", where="link")
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
