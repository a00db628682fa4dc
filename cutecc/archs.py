"""GPU architectures: what a valid name is, which built code runs on which GPU, and the
GPU this process sees.

One pattern for every place an arch enters (manifest, `--arch`, `cutecc.load(arch=)`,
`$CUTECC_ARCH`), matched in full so that a trailing newline or space is refused.
"""

from __future__ import annotations

import json
import os
import re

from cutecc import settings
from cutecc.errors import CuteccError

# sm_<major><minor>[a|f]: sm_80, sm_90a, sm_100a, sm_100f, sm_120 (machine code, SASS);
# compute_<major><minor>: compute_80, portable PTX the driver compiles for the GPU it runs on
ARCH_RE = re.compile(r"(?:sm|compute)_([1-9]\d?)(\d)([af]?)")
PTX_RE = re.compile(r"compute_([1-9]\d?)(\d)")
PATTERN = r"sm_[1-9]\d?\d[af]?|compute_[1-9]\d?\d"  # exactly the names `is_arch` accepts
KNOWN = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_103a",
         "sm_120a", "compute_80", "compute_90")  # offered by shell completion


def is_arch(text: object) -> bool:
    """`sm_90a`-style machine code, or portable PTX (`compute_80`: no `a`/`f` suffix)."""
    return isinstance(text, str) and (text.startswith("sm_") and ARCH_RE.fullmatch(text) is not None
                                      or PTX_RE.fullmatch(text) is not None)


def is_ptx(arch: str) -> bool:
    """Whether `arch` names portable PTX (`compute_80`) rather than machine code."""
    return PTX_RE.fullmatch(arch) is not None


def dsl_arch(arch: str) -> str:
    """The arch the DSL compiles for a target: `compute_80`'s PTX is the DSL's `sm_80` build's."""
    m = PTX_RE.fullmatch(arch)
    return f"sm_{m.group(1)}{m.group(2)}" if m else arch


def check_arch(text: object, where: str) -> str:
    """`text` if it is an arch name, else a CuteccError (exit 2) naming `where`."""
    if not is_arch(text):
        shown = json.dumps(text) if isinstance(text, str) else repr(text)
        raise CuteccError(f'{shown} is not a GPU architecture such as "sm_90a"', where=where)
    return text  # type: ignore[return-value]


def check_device_arch(text: object, where: str) -> str:
    """`text` if it names a GPU (`sm_90`, not portable PTX), else a CuteccError naming `where`."""
    arch = check_arch(text, where)
    if is_ptx(arch):
        raise CuteccError(f'"{arch}" names portable PTX, not a GPU: give the GPU\'s arch, e.g. "sm_90"',
                          where=where)
    return arch


def parse_archs(values: tuple[str, ...] | list[str], where: str = "--arch") -> tuple[str, ...]:
    """Arch names from the command line (comma-separated allowed), checked, deduplicated."""
    flat = [a.strip() for v in values for a in v.split(",") if a.strip()]
    return tuple(dict.fromkeys(check_arch(a, where) for a in flat))


def runs_on(built: str, device: str) -> int:
    """0 if code for `built` cannot run on `device`; higher is a better match: exact
    arch-specific machine code (4), exact plain or family code (3), plain or family code of
    an older minor (2), portable PTX (1), which the driver compiles at load.

    `sm_90a`-style arch-specific code runs only on that exact chip; `sm_100f` on its
    family (same major, minor at least); plain `sm_80` on the same major, minor at least;
    `compute_80` PTX on any GPU of compute capability 8.0 or newer.
    """
    b, d = ARCH_RE.fullmatch(built), ARCH_RE.fullmatch(device)
    if not b or not d or not is_arch(built) or not device.startswith("sm_"):
        return 0
    bmaj, bmin, suffix = int(b.group(1)), int(b.group(2)), b.group(3)
    dmaj, dmin = int(d.group(1)), int(d.group(2))
    if is_ptx(built):
        return 1 if (dmaj, dmin) >= (bmaj, bmin) else 0
    if bmaj != dmaj or bmin > dmin:
        return 0
    exact = bmin == dmin
    if suffix == "a":
        return 4 if exact else 0
    return 3 if exact else 2


RUNS = {4: "yes: arch-specific code, exact chip", 3: "yes: machine code, exact",
        2: "yes: machine code of an older minor", 1: "yes: PTX, compiled by the driver at load",
        0: "no"}


def how_runs(built: str, device: str) -> str:
    """What a GPU of arch `device` does with code built for `built`, in words (`runs_on`)."""
    return RUNS[runs_on(built, device)]


def to_build(device: str) -> str:
    """The arch to build for a device: Hopper and newer get the arch-specific target
    (sm_90 -> sm_90a), which their fastest instructions (wgmma, TMA) need."""
    m = ARCH_RE.fullmatch(device)
    return f"{device}a" if m and not m.group(3) and int(m.group(1)) >= 9 else device


def device_arch() -> str | None:
    """`$CUTECC_ARCH`, else the first GPU's arch (`gpu_arch`). Imports JAX only when the
    variable is unset. (A load reads the variable once, into its `RuntimeSettings`.)"""
    env = settings.ARCH.read()
    if env:
        return check_device_arch(env, settings.ARCH.where)
    return gpu_arch()


def gpu_arch() -> str | None:
    """The first GPU's arch (`sm_90` for compute capability 9.0): asked of the CUDA driver
    where JAX would use that same GPU (`driver_arch`), else of JAX, else None."""
    import jax

    if jax_uses_driver_order(jax.config):
        arch = driver_arch()
        if arch is not None:
            return arch
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return None
    cc = str(getattr(gpus[0], "compute_capability", ""))
    m = re.fullmatch(r"(\d+)\.(\d+)", cc)
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def jax_uses_driver_order(config: object) -> bool:
    """Whether JAX would run on the CUDA driver's device 0: a CUDA plugin installed, no
    `jax_platforms` that leaves CUDA out, no `jax_cuda_visible_devices` subset (a flag,
    read where JAX keeps it, else from its environment variable)."""
    platforms = str(getattr(config, "jax_platforms", None) or "")
    if platforms and not {"cuda", "gpu"} & {p.strip() for p in platforms.split(",")}:
        return False
    try:
        from jax._src import xla_bridge

        visible = str(xla_bridge.CUDA_VISIBLE_DEVICES.value)
    except (ImportError, AttributeError):
        visible = os.environ.get("JAX_CUDA_VISIBLE_DEVICES", "all")
    return visible == "all" and _has_cuda_plugin()


def _has_cuda_plugin() -> bool:
    """Whether a JAX CUDA plugin (`jax_plugins.xla_cuda12`, `xla_cuda13`, ...) is installed."""
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec("jax_plugins")
    if spec is None or spec.submodule_search_locations is None:
        return False
    return any(m.name.startswith("xla_cuda") for m in pkgutil.iter_modules(spec.submodule_search_locations))


# CUdevice_attribute values of the CUDA driver API (stable since CUDA 2)
_CC_MAJOR, _CC_MINOR = 75, 76


def driver_arch(library: str = "libcuda.so.1") -> str | None:
    """The arch of the CUDA driver's device 0 (its compute capability), or None where
    there is no driver or no device. Asked of the driver (cuInit, which JAX's GPU backend
    then runs at no extra cost) instead of `jax.devices("gpu")`, `cutecc.load` starts no
    JAX backend: on an H100 it took 142 ms instead of 427 ms, the backend starting at the
    program's first transfer as in a jnp program (benchmarks/backend_start.py)."""
    import ctypes

    try:
        cuda = ctypes.CDLL(library)
        if cuda.cuInit(0) != 0:
            return None
        count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return None
        if (cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0
                or cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev) != 0
                or cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev) != 0):
            return None
    except (OSError, AttributeError):
        return None
    if not (0 < major.value < 100 and 0 <= minor.value < 10):
        return None
    return f"sm_{major.value}{minor.value}"


# The newest PTX ISA each CUDA driver JIT-compiles, (driver major, minor) -> (ISA major,
# minor): NVIDIA's PTX ISA release history (docs.nvidia.com/cuda/parallel-thread-execution,
# "PTX Release History"; the same table as cuda-python's `cuda.bindings.utils`), each PTX
# ISA first shipped with that CUDA release. No CUDA 12.6 PTX ISA: 12.6 takes 8.5, 12.7 8.6.
# 13.2 and 13.3 follow the release-for-release rule of 13.0 and 13.1; 13.4 (PTX ISA 9.4, what
# nvidia-cutlass-dsl 4.8.1 writes) and 13.5 as their release notes name them. A driver
# between rows takes its lower row's; one newer than the last row is taken to know any PTX.
PTX_ISA_OF_DRIVER: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    ((11, 0), (7, 0)), ((11, 1), (7, 1)), ((11, 2), (7, 2)), ((11, 3), (7, 3)),
    ((11, 4), (7, 4)), ((11, 5), (7, 5)), ((11, 6), (7, 6)), ((11, 7), (7, 7)),
    ((11, 8), (7, 8)), ((12, 0), (8, 0)), ((12, 1), (8, 1)), ((12, 2), (8, 2)),
    ((12, 3), (8, 3)), ((12, 4), (8, 4)), ((12, 5), (8, 5)), ((12, 7), (8, 6)),
    ((12, 8), (8, 7)), ((12, 9), (8, 8)), ((13, 0), (9, 0)), ((13, 1), (9, 1)),
    ((13, 2), (9, 2)), ((13, 3), (9, 3)), ((13, 4), (9, 4)), ((13, 5), (9, 5)),
)
_VERSION_RE = re.compile(r"([1-9]\d?)\.(\d{1,2})", re.ASCII)  # ASCII digits only: int() takes others


def parse_version(text: object) -> tuple[int, int] | None:
    """("9.4" ->) (9, 4); None for anything that is not `major.minor`."""
    m = _VERSION_RE.fullmatch(text) if isinstance(text, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def show_version(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def max_ptx_isa(driver: tuple[int, int]) -> tuple[int, int] | None:
    """The newest PTX ISA a CUDA driver of version `driver` (13, 0) JIT-compiles; None for
    a driver newer than the table's last row (taken to know any PTX) or older than its first."""
    if driver > PTX_ISA_OF_DRIVER[-1][0]:
        return None
    rows = [isa for d, isa in PTX_ISA_OF_DRIVER if d <= driver]
    return rows[-1] if rows else (0, 0)


def driver_for_ptx_isa(isa: tuple[int, int]) -> tuple[int, int] | None:
    """The oldest CUDA driver that JIT-compiles PTX ISA `isa`; None past the table."""
    return next((d for d, known in PTX_ISA_OF_DRIVER if known >= isa), None)


def ptx_driver_problem(arch: str, isa: str | None, driver: tuple[int, int] | None) -> str | None:
    """Why this process's CUDA driver (`driver`, (13, 0)) cannot JIT-compile the PTX of an
    entry built for `arch` whose PTX ISA is `isa` ("9.4"); None when it can, when `arch` is
    machine code, when the ISA is unknown (an old entry whose library holds none: the
    driver decides) or when there is no driver (lowering on a CPU host)."""
    want = parse_version(isa)
    if not is_ptx(arch) or want is None or driver is None:
        return None
    most = max_ptx_isa(driver)
    if most is None or want <= most:
        return None
    needs = driver_for_ptx_isa(want)
    needed = f"CUDA {show_version(needs)} driver or newer" if needs else "newer CUDA driver"
    return (f"PTX ISA {show_version(want)} needs a {needed} to JIT-compile it; this driver "
            f"({show_version(driver)}) takes PTX ISA up to {show_version(most)}")


_DRIVER: list[tuple[int, int] | None] = []  # libcuda's answer, asked once per process
# cuDriverGetVersion's integer (13000): ASCII digits, which `str.isdigit` and `int` are not
# limited to (superscripts, fullwidth and Arabic-Indic digits pass one or both)
_DRIVER_INT_RE = re.compile(r"[0-9]{4,9}", re.ASCII)


NO_DRIVER = (-1, -1)  # a driver version given as "none": no driver, PTX is not judged


def parse_driver_version(text: str, where: str) -> tuple[int, int]:
    """A CUDA driver version as given (`$CUTECC_DRIVER_VERSION`): "13.0", cuDriverGetVersion's
    13000, or "none" (`NO_DRIVER`); else a CuteccError naming `where`."""
    text = text.strip()
    if text.lower() == "none":
        return NO_DRIVER
    v = parse_version(text)
    if v is None and _DRIVER_INT_RE.fullmatch(text) and int(text) >= 1000:
        v = (int(text) // 1000, int(text) % 1000 // 10)  # cuDriverGetVersion's form
    if v is None:
        raise CuteccError(f"{ascii(text[:40])} is not a CUDA driver version such as 13.0 or 13000 "
                          "(ASCII digits)", where=where)
    return v


def driver_version(given: tuple[int, int] | None = None,
                   library: str = "libcuda.so.1") -> tuple[int, int] | None:
    """The CUDA driver version of this process, (13, 0): the one `given` (a load's
    `$CUTECC_DRIVER_VERSION`, `parse_driver_version`; `NO_DRIVER`: none), else libcuda's
    `cuDriverGetVersion` (asked once); None where there is no driver (a CPU host: PTX is
    then not judged)."""
    if given is not None:
        return None if given == NO_DRIVER else given
    if not _DRIVER:
        _DRIVER.append(_libcuda_version(library))
    return _DRIVER[0]


def _libcuda_version(library: str) -> tuple[int, int] | None:
    import ctypes

    try:
        cuda = ctypes.CDLL(library)
        version = ctypes.c_int()
        if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value < 1000:
            return None
    except (OSError, AttributeError):
        return None
    return version.value // 1000, version.value % 1000 // 10
