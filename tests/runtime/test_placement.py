"""A call runs where its arrays are, whatever the number of devices: on four CPU devices (a
child process: JAX must see them from its start), arrays on device k, committed there or
by default, lower to the kernel's custom call and run on device k, eagerly and under
`jax.jit`; one thread per device, their first calls released together, each gets its own
results, and the library is loaded and registered once; a two-stage pipeline runs one
stage per device. A computation that spans several devices with no shard rule (sharded or
replicated arrays, arrays committed to different devices) is refused with an error that
says how to place it; inside `jax.shard_map` it runs. The 2..N GPU run of the same is
tests/gpu/test_every_gpu.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutecc.runtime.placement import device_launcher, devices_spanned

CHILD = Path(__file__).with_name("placement_child.py")
REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


def test_four_devices_each_run_their_own_calls_and_spanning_ones_are_refused(example_cache: Path) -> None:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(CHILD), str(example_cache), "100", str(DEADLINE_S)],
                       capture_output=True, text=True, env=env, timeout=DEADLINE_S + 60)
    checks = {c["check"]: c for c in map(json.loads, (ln for ln in r.stdout.splitlines()
                                                       if ln.startswith("{")))}
    assert r.returncode == 0, f"after {list(checks)}:\n{r.stderr[-8000:]}"
    want = {"threads, one per device", "loaded and registered once", "two-stage pipeline",
            "lowers on the default device", "committed to different devices", "inside shard_map",
            *(f"lowers on device {k}" for k in range(4)),
            *(f"{n} over 4 devices {how}" for n in ("sharded", "replicated")
              for how in ("eagerly", "under jit", "lowered"))}
    assert set(checks) == want
    bad = [c for c in checks.values() if not c["ok"]]
    assert not bad, bad


class _Mesh:
    def __init__(self, **axes: int) -> None:
        self.shape = axes


@pytest.mark.parametrize(("context", "n"), [
    (SimpleNamespace(num_devices=1, device_assignment=None), 1),  # jit on one device, any of them
    (SimpleNamespace(num_devices=4, device_assignment=None), 4),  # jit over four
    (SimpleNamespace(mesh=_Mesh(d=4), manual_axes=frozenset({"d"})), 1),  # shard_map: each its shard
    (SimpleNamespace(mesh=_Mesh(a=2, b=4), manual_axes=frozenset({"a"})), 4),  # b left to XLA
    (SimpleNamespace(mesh=_Mesh(a=2, b=1), manual_axes=frozenset({"a"})), 1),
    (SimpleNamespace(axis_env=None), 1),  # a pmap replica
])
def test_devices_a_call_spans_come_from_the_lowering_context(context: object, n: int) -> None:
    assert devices_spanned(context) == n


class _Cuda:
    """torch.cuda's current device as it behaves: one per thread, 0 until set, restored on
    leaving `device(k)`."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.switches = 0

    def current_device(self) -> int:
        return getattr(self._local, "device", 0)

    @contextlib.contextmanager
    def device(self, k: int) -> Iterator[None]:
        before, self._local.device = self.current_device(), k
        self.switches += 1
        try:
            yield
        finally:
            self._local.device = before


def test_a_launch_runs_on_its_tensors_device_in_every_thread() -> None:
    cuda = _Cuda()
    seen: list[tuple[int, int]] = []  # (the tensors' device, the current device at the launch)

    def kernel(k: int) -> None:
        seen.append((k, cuda.current_device()))

    launches = {k: device_launcher(kernel, k, 4, cuda.current_device, cuda.device) for k in range(4)}
    barrier = threading.Barrier(4)

    def worker(k: int) -> None:
        barrier.wait()
        for _ in range(50):
            launches[k](k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 200 and all(k == current for k, current in seen)
    assert cuda.switches == 150  # device 0 is every thread's current one: no switch there
    assert cuda.current_device() == 0  # restored after each launch


def test_with_one_device_or_no_index_the_launch_is_the_function_itself() -> None:
    cuda = _Cuda()
    assert device_launcher(print, 0, 1, cuda.current_device, cuda.device) is print
    assert device_launcher(print, None, 4, cuda.current_device, cuda.device) is print
