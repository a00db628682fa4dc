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
    return out


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
    and torch is installed; torch is restored after. Imports torch (the kernels given
    answers reach it anyway). `probe=False` asks torch nothing, not even whether it has a
    GPU (the compile service, which must not touch CUDA before it forks): the profile's
    answers are given as on a host without one."""
    if facts is None:
        yield
        return
    try:
        import torch.cuda as tc
    except ImportError:
        yield
        return
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
