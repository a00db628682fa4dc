"""The Llama-style block's training step on several GPUs (benchmarks/training_step_multi.py):
data-parallel and FSDP-style under `jax.shard_map`, its loss and every gradient against the
same step on one GPU; and, in fresh processes, the first call of every kernel of the step
on every GPU at once, then 100 rounds, under a deadline that prints every thread's stack.

Needs CUTECC_EXAMPLES_CACHE and at least 2 GPUs; skips otherwise. Tolerances are the
benchmark's (LOSS_TOL relative, GRAD_TOL relative L2 per gradient: both sides are bf16, and
the sharded step sums its partial gradients in another order than the one-GPU step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from benchmarks import training_step_multi as tsm
from examples import llama_block as lb

pytestmark = pytest.mark.gpu

CHILD = Path(__file__).with_name("training_multi_child.py")
ROUNDS = 100
DEADLINE_S = 400.0
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COUNTS = [2, 4]


def _gpus(n: int) -> None:
    visible = len(jax.devices("gpu"))
    if n > visible:
        pytest.skip(f"needs {n} GPUs, JAX sees {visible}")


@pytest.mark.parametrize("mode", tsm.MODES)
@pytest.mark.parametrize("n", COUNTS)
def test_the_sharded_step_gives_the_one_gpu_loss_and_every_gradient(examples_ks, rng, n: int,
                                                                    mode: str) -> None:
    _gpus(n)
    cfg = lb.Config()
    kp, kx = jax.random.split(jax.random.key(int(rng.integers(2**31))))  # fresh random weights and rows
    params = lb.init_params(kp, cfg)
    x, t = lb.init_batch(kx, n, 256, cfg)
    loss = lambda p, x, t: lb.loss_cutecc(p, x, t, examples_ks, cfg)  # noqa: E731
    ref = jax.device_get(tsm.single_step(loss)(params, x, t))
    mesh = tsm.mesh_of(n)
    specs = tsm.param_specs(params, mode, n)
    got = tsm.sharded_step(loss, mesh, specs)(*tsm.place(mesh, specs, params, x, t))
    res = tsm.compare(got, ref)
    assert len(res["rel_err"]) == 12 and 5 < res["loss_1gpu"] < 20, res  # loss, ten weights, dx
    assert res["ok"], res
    want = "P('data',)" if mode == "fsdp" else "P()"
    assert {str(g.sharding.spec) for g in got[1][0].values()} == {want}
    assert len(got[1][1].sharding.device_set) == n  # dx stays split along the batch


def _child(mode: str, n: int) -> dict[str, dict]:
    _gpus(n)
    cache = os.environ.get("CUTECC_EXAMPLES_CACHE", "")
    if not cache or not Path(cache).is_dir():
        pytest.skip("CUTECC_EXAMPLES_CACHE is not set to a built examples cache")
    env = {**os.environ, **NO_MULTICAST, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    try:
        r = subprocess.run([sys.executable, str(CHILD), mode, str(n), cache, str(ROUNDS), str(DEADLINE_S)],
                           capture_output=True, text=True, env=env, timeout=DEADLINE_S + 60)
    except subprocess.TimeoutExpired as e:  # the deadline's stack dump did not end it either
        pytest.fail(f"{mode}, {n} GPUs: no exit {DEADLINE_S + 60:.0f} s after the start; stderr:\n{e.stderr}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    checks = {c["check"]: c for c in map(json.loads, lines)}
    for c in checks.values():
        print(json.dumps(c))
    assert r.returncode == 0, (f"{mode}, {n} GPUs: exit {r.returncode} after {list(checks)}; stderr (a hang "
                               f"shows every thread's stack):\n{r.stderr[-20000:]}")
    return checks


@pytest.mark.parametrize("n", COUNTS)
def test_first_calls_of_every_kernel_on_every_gpu_at_once_under_shard_map(n: int) -> None:
    checks = _child("shard_map", n)
    assert list(checks) == [f"shard_map over {n} GPUs"]
    assert all(c["ok"] for c in checks.values()), checks


@pytest.mark.parametrize("n", COUNTS)
def test_first_calls_of_every_kernel_from_one_thread_per_gpu(n: int) -> None:
    checks = _child("threads", n)
    assert set(checks) == {f"thread on GPU {k}" for k in range(n)}
    bad = [c for c in checks.values() if not c["ok"]]
    assert not bad, bad
