"""The toolchain: what shapes an artifact besides its source, and the runtime library's identity.

- versions: of the DSL, tvm-ffi, the CUDA runtime and zig (`tool_versions`);
- targets: zig's target of every link (glibc 2.28, baseline x86-64) and the CPU the kernels'
  host-side code is pinned to whatever the build machine is (`HOST_TARGET`); per host
  platform (`cutecc.platforms`), `zig_target` and `host_target` (aarch64's host code is the
  DSL's IR retargeted, `cutecc.build.retarget`, and linked against pinned wheels,
  `cutecc.toolchain.targetlibs`);
- the recipe: the native sources, the flags and the runtime library's exports, named in
  every key by `RECIPE_VERSION` (with the sources' hashes) and `RUNTIME_RECIPE_VERSION`;
- where the link inputs live (`toolchain_paths`), and the runtime library's key inputs
  (`runtime_inputs`) and key (`runtime_key`).

The runtime library's file name and the ABI its loader expects (`runtime_soname`,
`RUNTIME_ABI`) are defined once, in `cutecc.entry.rules`: the runtime checks them on load and
imports nothing of the build side, this module included. `cutecc.plan.key` puts these facts
into every key; `cutecc.build.compiler` and `cutecc.build.linker` apply them. Importing this reads the
two small native sources (to hash them) and imports neither the DSL nor JAX.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from cutecc import platforms
from cutecc.entry.rules import compute_key
from cutecc.errors import CuteccError, WorkError
from cutecc.platforms import BUILD_PLATFORM
from cutecc.toolchain import targetlibs

NATIVE = Path(__file__).resolve().parent.parent / "native"  # package data
RUNTIME_SOURCE = NATIVE / "cutecc_rt.c"
WRAPPER_SOURCE = NATIVE / "kernel_wrap.c"
TOOL_PACKAGES = ("nvidia-cutlass-dsl", "apache-tvm-ffi", "nvidia-cuda-runtime", "ziglang")

# Targets ------------------------------------------------------------------------------
ZIG_TARGET = "x86_64-linux-gnu.2.28"  # glibc 2.28 symbols at most; the CPU is baseline x86-64
# The kernel's host-side code is compiled for this CPU and feature set whatever the build
# machine is (part of every key; see `cutecc.build.compiler.pin_host_target`).
HOST_CPU = "x86-64"
HOST_FEATURES = ("+sse2",)
HOST_TARGET = f"x86_64-unknown-linux-gnu;cpu={HOST_CPU};features={','.join(HOST_FEATURES)};pin=1"
# Host code for another platform: the DSL's host IR, retargeted (`cutecc.build.retarget`) and
# compiled by zig for that platform's baseline CPU (part of every key of that platform).
RETARGET_VERSION = 2  # bump when `cutecc.build.retarget` or what is exported for it changes


def zig_target(platform: str) -> str:
    """`zig cc -target` for a platform."""
    return ZIG_TARGET if platform == BUILD_PLATFORM else platforms.get(platform).zig_target


def host_target(platform: str) -> str:
    """The host-code target string of a platform's keys (the x86-64 one as it always was)."""
    if platform == BUILD_PLATFORM:
        return HOST_TARGET
    return f"{platforms.get(platform).triple};cpu=baseline;from=ll;retarget={RETARGET_VERSION}"

# The recipe ---------------------------------------------------------------------------
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
# Bump when the runtime library's recipe changes in a way its other key inputs do not show;
# keyed as "runtime_format" (the name its key inputs have always used).
RUNTIME_RECIPE_VERSION = 1


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Part of every key: bump the number when the flags above change; the sources' own hashes
# are included so an edited source can never reuse an old artifact.
RECIPE_VERSION = (f"3+rt.{_sha(RUNTIME_SOURCE)[:16]}+wrap.{_sha(WRAPPER_SOURCE)[:16]}")


# Versions -----------------------------------------------------------------------------


def version(pkg: str) -> str:
    """An installed distribution's version, "absent" when it is not installed."""
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def tool_versions() -> dict[str, str]:
    """The version of each of `TOOL_PACKAGES`, in that order."""
    return {pkg: version(pkg) for pkg in TOOL_PACKAGES}


# Where the link inputs live -------------------------------------------------------------


def _package_dirs(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _find(what: str, candidates: list[Path], hint: str) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise WorkError(f"cannot find {what}; {hint}", where="link")


def toolchain_paths(cuda: str = "cu13", platform: str = BUILD_PLATFORM) -> dict[str, Path]:
    """Where the link inputs and zig live: in the build extra's wheels, and for another
    platform than the build's, in that platform's pinned wheels (`cutecc.toolchain.targetlibs`)."""
    if platform != BUILD_PLATFORM:
        return {"zig": toolchain_paths(cuda)["zig"], **targetlibs.paths(platform)}
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


# The runtime library's identity ------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def runtime_inputs(platform: str = BUILD_PLATFORM) -> dict[str, str]:
    """Everything that decides the runtime library's bytes (its key's inputs): the recipe
    and its source, zig and its target, the two static archives' SHA-256 and tvm-ffi's
    version (its headers and its library's soname). Empty values when the build extra is
    missing ("absent"): such a key is never built. For another platform, the pins of its
    wheels (`cutecc.toolchain.targetlibs.pins`) name the archives, library and headers: known
    without fetching them, and checked against them before they are linked."""
    if platform != BUILD_PLATFORM:
        pins = targetlibs.pins(platform)
        return {"runtime_format": str(RUNTIME_RECIPE_VERSION), "recipe": RECIPE_VERSION,
                "source": _sha(RUNTIME_SOURCE), "exports": ",".join(RUNTIME_EXPORTS),
                "zig": version("ziglang"), "target": zig_target(platform), "platform": platform,
                "apache-tvm-ffi": pins["apache-tvm-ffi"].split()[0], **pins}
    out = {"runtime_format": str(RUNTIME_RECIPE_VERSION), "recipe": RECIPE_VERSION,
           "source": _sha(RUNTIME_SOURCE), "exports": ",".join(RUNTIME_EXPORTS),
           "zig": version("ziglang"), "target": ZIG_TARGET,
           "apache-tvm-ffi": version("apache-tvm-ffi")}
    try:
        p = toolchain_paths()
    except CuteccError:
        return {**out, "dialect_rt": "absent", "cudart": "absent"}
    return {**out, "dialect_rt": _sha(p["dialect_rt"]), "cudart": _sha(p["cudart"])}


def runtime_key(platform: str = BUILD_PLATFORM) -> str:
    """The key of the runtime library this toolchain links kernels of `platform` against."""
    return compute_key(runtime_inputs(platform))
