"""Where a kernel call runs: on the one device its arrays are on, whichever it is.

A cutecc kernel computes on whole arrays on one device. So a call runs on the device its
arrays sit on, however many devices the process sees: from JAX, a `jax.jit` (or an eager
call, which is one) over one device lowers the kernel for that device; from PyTorch, the
launch is made on the tensors' CUDA device, with that device's current torch stream. Only
a computation over several devices with no per-device rule is refused, because each device
would need the whole arrays (never gathered silently); it is decided from the JAX
lowering's own device context, not from the number of visible devices.

Imports no framework: JAX's lowering contexts are read by duck typing (their classes are
private), and torch's device calls are passed in, so both rules are checked without either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from cutecc.errors import CallError


def devices_spanned(axis_context: Any) -> int:
    """How many devices one call lowered in `axis_context` (a JAX lowering's
    `ctx.module_context.axis_context`) would compute across: under `jax.jit`, the
    computation's device count (1 when its arrays are on one device, any of them); inside
    `jax.shard_map` or a shard rule's per-device body, the product of the mesh axes left to
    XLA (not in manual mode; 1 when every axis is manual: each device runs its own shard);
    1 for a `pmap` replica."""
    n = getattr(axis_context, "num_devices", None)
    if n is not None:
        return int(n)
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None:
        manual = set(getattr(axis_context, "manual_axes", ()))
        return math.prod(int(size) for name, size in dict(mesh.shape).items() if name not in manual)
    return 1


def check_lowering(axis_context: Any, kernel: str) -> None:
    """Refuse a call whose computation spans several devices with no per-device rule; the
    error says the three ways to place it."""
    n = devices_spanned(axis_context)
    if n > 1:
        raise CallError(
            f"this call is part of a computation over {n} devices, and the kernel has no rule "
            "for running on shards of its arrays. Put all of the call's arrays on one device "
            "(jax.device_put(x, jax.devices()[k]): the call then runs on device k, eagerly or "
            "under jax.jit), call it inside jax.shard_map (each device runs it on its shard), or "
            "declare the axes it is independent along (shard = [..] in the manifest)",
            where=f'kernel "{kernel}"')


def device_launcher(function: Callable[..., Any], index: int | None, device_count: int,
                    current_device: Callable[[], int], on_device: Callable[[int], Any]) -> Callable[..., Any]:
    """`function` launched on CUDA device `index` (the call's tensors' device): the function
    itself where nothing can differ (no index, or one device), else a launch that first makes
    `index` the current device when it is not (`on_device(index)`, a context manager:
    `torch.cuda.device`), so the kernel runs in that device's context on its current stream.
    The current device is per thread: one thread per GPU switches nothing after its first
    `torch.cuda.set_device`."""
    if index is None or device_count <= 1:
        return function

    def launch(*args: Any) -> Any:
        if current_device() == index:
            return function(*args)
        with on_device(index):
            return function(*args)

    return launch
