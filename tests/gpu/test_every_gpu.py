"""Every GPU of a many-GPU host, without `shard_map`: single-device programs on each GPU at
once, one Python thread per GPU, and pipeline stages on different GPUs.

Each device count from 2 to what JAX sees runs `every_gpu_child.py` in a fresh process (so
every kernel's first call on every device comes at the same moment, from the threads):
100 rounds of `mul` and, with `$CUTECC_EXAMPLES_CACHE`, quack RMSNorm and FA4's causal
forward, eagerly and under `jax.jit`, each result on its thread's device and within
tolerance of a reference computed there; then a two-stage `jax.jit` pipeline, GPU 0 to
GPU 1. The same threads through `cutecc.torch` (tensors on cuda:k, the thread's current
device left at 0), and a call on cuda:1 under a side stream that must see the work queued
before it on that stream. A deadline prints every thread's stack and fails the test
instead of hanging the suite. NVLink multicast stays off (these machines share a fabric).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

pytestmark = pytest.mark.gpu

CHILD = Path(__file__).with_name("every_gpu_child.py")
ROUNDS = 100
DEADLINE_S = 400.0
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COUNTS = [2, 3, 4, 8]


def _child(mode: str, n: int, cache: Path) -> tuple[dict[str, dict], bool]:
    """The child's checks by name, and whether the examples cache was given."""
    visible = len(jax.devices("gpu"))
    if n > visible:
        pytest.skip(f"needs {n} GPUs, JAX sees {visible}")
    examples = os.environ.get("CUTECC_EXAMPLES_CACHE", "")
    examples = examples if examples and Path(examples).is_dir() else ""
    env = {**os.environ, **NO_MULTICAST, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        r = subprocess.run([sys.executable, str(CHILD), mode, str(n), str(cache), examples, str(ROUNDS),
                            str(DEADLINE_S)], capture_output=True, text=True, env=env,
                           timeout=DEADLINE_S + 60)
    except subprocess.TimeoutExpired as e:  # the deadline's stack dump did not end it either
        pytest.fail(f"{mode}, {n} GPUs: no exit {DEADLINE_S + 60:.0f} s after the start; stderr:\n{e.stderr}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    checks = {c["check"]: c for c in map(json.loads, lines)}
    for c in checks.values():
        print(json.dumps(c))
    assert r.returncode == 0, (f"{mode}, {n} GPUs: exit {r.returncode} after {list(checks)}; stderr (a hang "
                               f"shows every thread's stack):\n{r.stderr[-20000:]}")
    return checks, bool(examples)


@pytest.mark.parametrize("n", COUNTS)
def test_one_thread_per_gpu_runs_its_own_calls_and_a_pipeline_crosses_two(n: int,
                                                                          example_cache: Path) -> None:
    checks, examples = _child("jax", n, example_cache)
    assert set(checks) == {f"jax thread {k}" for k in range(n)} | {"jax two-stage pipeline"}
    for k in range(n):
        c = checks[f"jax thread {k}"]
        kernels = {"mul"} | ({"quack_rmsnorm", "fa4_fwd causal"} if examples else set())
        assert set(c.get("max_rel_err", {})) == {f"{m} {how}" for m in kernels for how in ("eager", "jit")}, c
        assert c["devices"] == [c["device"]], c
    bad = [c for c in checks.values() if not c["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("n", COUNTS)
def test_cutecc_torch_runs_each_threads_tensors_on_their_gpu(n: int, example_cache: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    checks, _ = _child("torch", n, example_cache)
    assert set(checks) == {f"torch thread {k}" for k in range(n)} | {"torch cuda:1 on the current stream"}
    bad = [c for c in checks.values() if not c["ok"]]
    assert not bad, bad
