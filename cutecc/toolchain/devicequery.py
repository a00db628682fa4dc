"""GPU queries answered from the hardware profile while a build worker constructs a launcher.

Some published libraries ask the GPU while they are built (FlashInfer reads
`torch.cuda.get_device_properties(...).shared_memory_per_block_optin` in its kernels'
constructors), which fails on a CPU build host (`Torch not compiled with CUDA enabled`). The
manifest's hardware profile (`profile = "h100"`) knows those facts, so a build worker answers
torch's device queries from it: `is_available`, `device_count`, `current_device`,
`get_device_name`, `get_device_capability` and `get_device_properties` (one device, index 0).
The capability is the build's target arch (`sm_90a` -> (9, 0)): the code compiled is for that
arch. The answers are a key input (`answers`) of every kernel whose code reaches torch, and
only those kernels get them, only inside the build worker, only while their launcher is
constructed and compiled.

On a build host that has a GPU, torch's own answers are used, but each property read (and
the capability) is checked against the profile's: an answer that differs from the key's
fails the build instead of building bytes the key does not describe.

The DSL's own queries (`cutlass.utils.HardwareInfo`: the SM count, the L2 size, the most
clusters of a size that can be resident at once), which a launcher may make while it is
traced, are answered from the same answers, on any host (the key's, never the build host's
GPU): the SM count and L2 size are torch's `multi_processor_count` and `L2_cache_size`;
`get_max_active_clusters(c)` is the profile's `max_active_clusters_<c>` (the SM count for
c = 1: the DSL's probe kernel fits one block per SM). They are keyed for code that reaches
torch (as above) or whose own modules import `HardwareInfo` by name (`HARDWARE_INFO`); a
launcher that asks without either fails naming what to do, rather than building bytes its
key does not describe. A profile without `max_active_clusters_<c>` facts adds nothing to the
answers, so keys planned before these queries were answered are unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from cutecc.archs import dsl_arch

# torch's device property -> the profile fact that answers it.
TORCH_FIELDS = {
    "name": "name",
    "multi_processor_count": "sm_count",
    "shared_memory_per_block_optin": "max_smem_per_block",
    "shared_memory_per_block": "smem_per_block",
    "shared_memory_per_multiprocessor": "smem_per_sm",
    "L2_cache_size": "l2_bytes",
    "total_memory": "memory_bytes",
    "max_threads_per_multi_processor": "max_threads_per_sm",
    "regs_per_multiprocessor": "regs_per_sm",
    "warp_size": "warp_size",
}
# What a kernel's own modules import (`cutecc.plan.key.SourceIndex.reached_modules`: each
# `from a import b` counts `a.b`) that names the DSL's device queries: their answers are keyed.
HARDWARE_INFO = frozenset({"cutlass.utils.HardwareInfo", "cutlass.utils.hardware_info",
                           "cutlass.utils.hardware_info.HardwareInfo"})
_CLUSTERS = re.compile(r"max_active_clusters_([1-9][0-9]?)")
_ARCH = re.compile(r"sm_(\d+?)(\d)[af]?")
_PATCHED = ("is_available", "device_count", "current_device", "get_device_name",
            "get_device_capability", "get_device_properties")


def answers(profile: dict[str, Any], arch: str, profile_name: str = "") -> dict[str, Any]:
    """The device answers for a build for `arch` under `profile`'s facts (a key input):
    torch's property names, `major`/`minor` from the arch, and the profile's name (for
    messages). Facts the profile lacks are left out; reading one fails the build."""
    m = _ARCH.fullmatch(dsl_arch(arch))  # `compute_80` is compiled as `sm_80`
    out: dict[str, Any] = {"profile": profile_name}
    if m:
        out["major"], out["minor"] = int(m.group(1)), int(m.group(2))
    for field, fact in TORCH_FIELDS.items():
        if fact in profile:
            out[field] = profile[fact]
    for fact in sorted(profile, key=lambda f: (len(f), f)):  # only where declared: keys unchanged
        if _CLUSTERS.fullmatch(fact):
            out[fact] = profile[fact]
    return out


def asks_hardware_info(modules: set[str] | frozenset[str]) -> bool:
    """Whether a kernel's own modules (their dotted imports) name `HardwareInfo`."""
    return not HARDWARE_INFO.isdisjoint(modules)


class DeviceProperties:
    """What `torch.cuda.get_device_properties` returns, from the profile's answers."""

    def __init__(self, facts: dict[str, Any], real: Any = None) -> None:
        self._facts = facts
        self._real = real  # the build host's own properties, when it has a GPU

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        if field not in self._facts or field == "profile":
            fact = TORCH_FIELDS.get(field)
            hint = (f'; add {fact} = ... to [hardware.{self._facts.get("profile")}]' if fact
                    else " (cutecc answers " + ", ".join(["major", "minor", *TORCH_FIELDS]) + ")")
            name = self._facts.get("profile")
            raise AttributeError(f"torch.cuda.get_device_properties().{field} was asked while the "
                                 f'launcher was built, and the hardware profile "{name}" cannot '
                                 f"answer it{hint}")
        value = self._facts[field]
        if self._real is not None:
            _check(field, getattr(self._real, field), value, self._facts)
        return value

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._facts.items() if k != "profile")
        return f"_CudaDeviceProperties({shown}) (cutecc: hardware profile {self._facts.get('profile')})"


def _check(field: str, real: Any, value: Any, facts: dict[str, Any]) -> None:
    if real != value:
        raise RuntimeError(f"the build host's GPU answers {field} = {real!r}, the hardware profile "
                           f'"{facts.get("profile")}" (a key input) says {value!r}: build with a profile '
                           "that describes this GPU, or on a host without one")


def _index(device: Any) -> int:
    """The device index a torch device argument names (None: the current one, 0)."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if not isinstance(device, str) and getattr(device, "type", None) == "cuda":  # torch.device
        return int(getattr(device, "index", None) or 0)
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"Expected a cuda device, but got: {device!r}")


@contextlib.contextmanager
def answering(facts: dict[str, Any] | None, probe: bool = True) -> Iterator[None]:
    """Within: torch's device queries answered from `facts` (`answers`), when `facts` is set
    and torch is installed; torch is restored after. The DSL's `HardwareInfo` is answered
    from `facts` too, or, when `facts` is None (the key holds no answers), refuses to
    answer. Imports torch (the kernels given answers reach it anyway). `probe=False` asks
    torch nothing, not even whether it has a GPU (the compile service, which must not touch
    CUDA before it forks): the profile's answers are given as on a host without one."""
    with _hardware_info(facts):
        if facts is None:
            yield
            return
        try:
            import torch.cuda as tc
        except ImportError:
            yield
            return
        with _torch(tc, facts, probe):
            yield


@contextlib.contextmanager
def _torch(tc: Any, facts: dict[str, Any], probe: bool) -> Iterator[None]:
    saved = {name: getattr(tc, name) for name in _PATCHED}
    try:
        has_gpu = probe and bool(saved["is_available"]())
    except Exception:
        has_gpu = False
    for name, fn in _functions(facts, saved, has_gpu).items():
        setattr(tc, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(tc, name, fn)


def _functions(facts: dict[str, Any], real: dict[str, Any], has_gpu: bool) -> dict[str, Any]:
    def one_device(device: Any) -> int:
        i = _index(device)
        if i != 0 and not has_gpu:
            raise AssertionError(f"Invalid device id {i}: the build answers for one device "
                                 f'(hardware profile "{facts.get("profile")}")')
        return i

    def get_device_properties(device: Any = None) -> DeviceProperties:
        i = one_device(device)
        return DeviceProperties(facts, real["get_device_properties"](i) if has_gpu else None)

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        props = get_device_properties(device)
        return props.major, props.minor

    def get_device_name(device: Any = None) -> str:
        return str(get_device_properties(device).name)

    out: dict[str, Any] = {"get_device_properties": get_device_properties,
                           "get_device_capability": get_device_capability,
                           "get_device_name": get_device_name}
    if not has_gpu:
        out.update(is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0)
    return out


_HW_METHODS = ("__init__", "get_max_active_clusters", "get_l2_cache_size_in_bytes",
               "get_device_multiprocessor_count")


@contextlib.contextmanager
def _hardware_info(facts: dict[str, Any] | None) -> Iterator[None]:
    """Within: `cutlass.utils.HardwareInfo`'s queries answered from `facts` (None: the key
    holds no answers, so asking fails saying so), its own methods restored after. Patched on
    the class, so a name bound before (`from cutlass.utils.hardware_info import HardwareInfo`)
    is answered too. Without the DSL installed, nothing is patched."""
    try:
        from cutlass.utils.hardware_info import HardwareInfo
    except ImportError:
        yield
        return
    saved = {m: HardwareInfo.__dict__[m] for m in _HW_METHODS}
    for m, fn in _hardware_info_methods(facts).items():
        setattr(HardwareInfo, m, fn)
    try:
        yield
    finally:
        for m, fn in saved.items():
            setattr(HardwareInfo, m, fn)


def _hardware_info_methods(facts: dict[str, Any] | None) -> dict[str, Any]:
    profile = None if facts is None else facts.get("profile")

    def fact(field: str, fact_name: str, query: str) -> Any:
        assert facts is not None
        if field not in facts:
            raise RuntimeError(f"cutlass.utils.HardwareInfo().{query} was asked while the launcher was "
                               f'built, and the hardware profile "{profile}" cannot answer it; add '
                               f"{fact_name} = ... to [hardware.{profile}]")
        return facts[field]

    def init(self: Any, device_id: int = 0) -> None:
        if facts is None:
            raise RuntimeError(
                "cutlass.utils.HardwareInfo() was asked while the launcher was built, and its key "
                "holds no device answers: cutecc answers it from the hardware profile (and keys the "
                "answers) for code that reaches torch or whose modules import HardwareInfo by name; "
                "write `from cutlass.utils import HardwareInfo` in the module that calls it")
        if device_id != 0:
            raise ValueError(f"Device ID {device_id} is out of range for device count 1 (the build "
                             f'answers for one device, hardware profile "{profile}")')
        self.device_id = 0

    def get_max_active_clusters(self: Any, cluster_size: int, stream: Any = None) -> int:
        if type(cluster_size) is not int or not 1 <= cluster_size <= 32:
            raise ValueError(f"Cluster size must be between 1 and 32, {cluster_size} is not supported")
        name = f"max_active_clusters_{cluster_size}"
        if cluster_size == 1 and facts is not None and name not in facts:
            return int(fact("multi_processor_count", "sm_count", "get_max_active_clusters(1)"))
        return int(fact(name, name, f"get_max_active_clusters({cluster_size})"))

    def get_l2_cache_size_in_bytes(self: Any) -> int:
        return int(fact("L2_cache_size", "l2_bytes", "get_l2_cache_size_in_bytes()"))

    def get_device_multiprocessor_count(self: Any) -> int:
        return int(fact("multi_processor_count", "sm_count", "get_device_multiprocessor_count()"))

    return {"__init__": init, "get_max_active_clusters": get_max_active_clusters,
            "get_l2_cache_size_in_bytes": get_l2_cache_size_in_bytes,
            "get_device_multiprocessor_count": get_device_multiprocessor_count}
