"""Concurrent calls of one kernel on 1, 2, 4 and 8 GPUs under `shard_map`, without a hang.

A user of jax-tvm-ffi 0.1.3 (the version cutecc pins) reported concurrent multi-device calls
of one TVM-FFI function hanging at 3 GPUs and passing at 2. Each device count that JAX can
see runs `multi_gpu_child.py` in its own process: forward, `jax.grad` of a grad-paired
kernel, an `inout` kernel and, with the examples cache, quack RMSNorm and FA4 sharded over
the batch, each in a loop of calls, against references. The child has a deadline: past it,
every thread's stack is printed and the test fails with them, instead of hanging the suite.
NVLink multicast stays off (these machines share their GPUs' fabric).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cutecc

from .conftest import rand

pytestmark = pytest.mark.gpu

CHILD = Path(__file__).with_name("multi_gpu_child.py")
ROUNDS = 50
DEADLINE_S = 240.0
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_concurrent_calls_on_every_gpu_finish_and_agree(n: int, example_cache: Path) -> None:
    visible = len(jax.devices("gpu"))
    if n > visible:
        pytest.skip(f"needs {n} GPUs, JAX sees {visible}")
    env = {**os.environ, **NO_MULTICAST, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    examples = os.environ.get("CUTECC_EXAMPLES_CACHE", "")
    try:
        r = subprocess.run([sys.executable, str(CHILD), str(n), str(example_cache), examples, str(ROUNDS),
                            str(DEADLINE_S)], capture_output=True, text=True, env=env,
                           timeout=DEADLINE_S + 60)
    except subprocess.TimeoutExpired as e:  # the deadline's stack dump did not end it either
        pytest.fail(f"{n} GPUs: no exit {DEADLINE_S + 60:.0f} s after the start; stderr:\n{e.stderr}")
    checks = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    for c in checks:
        print(json.dumps(c))
    assert r.returncode == 0, (f"{n} GPUs: exit {r.returncode} after {[c['check'] for c in checks]}; "
                               f"stderr (a hang shows every thread's stack):\n{r.stderr[-20000:]}")
    want = {"mul", "grad mul", "axpy (inout)"} | ({"quack_rmsnorm", "fa4_fwd causal"} if examples else set())
    assert {c["check"] for c in checks} == want, checks
    bad = [c for c in checks if not c["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_declared_shard_rule_runs_each_gpus_rows_under_jit(n: int, train_cache: Path, rng) -> None:
    """`expw_rows` declares `shard = ["m"]`: under `jax.jit` on a mesh of n GPUs (1 included:
    a one-device mesh), rows split over the mesh run per device, a split of the other axis is
    gathered first, and both equal the reference."""
    visible = len(jax.devices("gpu"))
    if n > visible:
        pytest.skip(f"needs {n} GPUs, JAX sees {visible}")
    ks = cutecc.load(train_cache)
    mesh = jax.sharding.Mesh(np.array(jax.devices("gpu")[:n]), ("x",))
    x, w = rand(rng, (n * 37, 264), "float32"), rand(rng, (264,), "float32")
    want = np.exp(np.asarray(x, dtype=np.float64)) * np.asarray(w, dtype=np.float64)
    f = jax.jit(lambda x, w: ks.expw_rows(x, w))
    for spec in (P("x"), P(None, "x")):
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        got = f(xs, jax.device_put(w, NamedSharding(mesh, P())))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6, err_msg=str(spec))
        if spec == P("x"):
            assert got.sharding.spec == P("x"), got.sharding
