"""GPU architectures: what a valid name is, which built code runs on which GPU, and the
GPU this process sees.

One pattern for every place an arch enters (manifest, `--arch`, `cutecc.load(arch=)`,
`$CUTECC_ARCH`), matched in full so that a trailing newline or space is refused.
"""

from __future__ import annotations

import json
import os
import re

from cutecc import environ
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
    """`$CUTECC_ARCH`, else the first GPU's arch (`sm_90` for compute capability 9.0):
    asked of the CUDA driver where JAX would use that same GPU (`driver_arch`), else of
    JAX, else None. Imports JAX only when the variable is unset."""
    env = os.environ.get(environ.ARCH)
    if env:
        return check_device_arch(env, f"${environ.ARCH}")
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
