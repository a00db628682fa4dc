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

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutecc.runtime.primitive import devices_spanned

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
