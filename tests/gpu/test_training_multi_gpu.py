"""The Llama-style block's training step on several GPUs (benchmarks/training_step_multi.py):
data-parallel and FSDP-style under `jax.shard_map`, its loss and every gradient against the
same step on one GPU; in fresh processes, the first call of every kernel of the step on
every GPU at once, then 100 rounds, under a deadline that prints every thread's stack; the
benchmark itself end to end on 2 GPUs; and strict sharding under an Explicit mesh.

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


def test_the_benchmark_runs_every_side_and_mode_on_two_gpus(tmp_path: Path) -> None:
    """benchmarks/training_step_multi.py end to end at a small size on 2 GPUs: every side and
    mode compiles, matches the one-GPU step and is timed on both clocks."""
    _gpus(2)
    cache = os.environ.get("CUTECC_EXAMPLES_CACHE", "")
    if not cache or not Path(cache).is_dir():
        pytest.skip("CUTECC_EXAMPLES_CACHE is not set to a built examples cache")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "training_step_multi.py"
    out = tmp_path / "multi.json"
    r = subprocess.run([sys.executable, str(script), cache, "--json", str(out), "--batch", "1",
                        "--seq", "256", "--rounds", "2", "--counts", "2"], capture_output=True, text=True,
                       env={**os.environ, **NO_MULTICAST}, timeout=900)
    print(r.stdout[-5000:])
    assert r.returncode == 0, r.stderr[-5000:]
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"2 dp", "2 fsdp"}
    for name, e in doc["runs"].items():
        assert e["errors"] == {}, (name, e["errors"])
        assert set(e["checks"]) == set(tsm.SIDES) and all(c["ok"] for c in e["checks"].values()), (name, e)
        assert all(e["timing"][s]["wall_us"] > 0 for s in tsm.SIDES), (name, e["timing"])
        clock = e["timing"].get("device_clock_error") or all(e["timing"][s]["span_us"] > 0 for s in tsm.SIDES)
        assert clock is True, (name, clock)


def test_an_explicit_mesh_refuses_a_kernel_call_it_would_gather(examples_ks, rng) -> None:
    """Strict sharding on GPUs: under an Explicit mesh, quack RMSNorm (no shard rule) on rows
    split over the GPUs is a CallError naming the all-gather, never a silent gather; the same
    call inside shard_map runs on each GPU's rows."""
    _gpus(2)
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from cutecc.errors import CallError

    from .conftest import rand

    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2], axis_types=(AxisType.Explicit,))
    x, w = rand(rng, (512, 4096), "bfloat16"), rand(rng, (4096,), "bfloat16")
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        ws = jax.device_put(w, NamedSharding(mesh, P()))
        with pytest.raises(CallError) as err:
            jax.jit(lambda a, b: examples_ks.quack_rmsnorm(a, b))(xs, ws)
        assert err.value.where == 'kernel "quack_rmsnorm"'
        assert "P('data', None)" in err.value.message and "all-gather" in err.value.message
        f = jax.jit(jax.shard_map(lambda a, b: examples_ks.quack_rmsnorm(a, b), in_specs=(P("data"), P()),
                                  out_specs=P("data")))
        got = f(xs, ws)
    ref = jax.jit(lambda a, b: examples_ks.quack_rmsnorm(a, b))(x, w)  # one GPU
    assert np.allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)
    assert len(got.sharding.device_set) == 2
