"""Child of test_training_multi_gpu.py: in a fresh process, the first call of every kernel
of the Llama-style block's training step (quack RMSNorm and cross-entropy, FA4, forward and
backward) comes on every GPU at the same moment, then ROUNDS more. One JSON line per check.

    python training_multi_child.py MODE N EXAMPLES_CACHE ROUNDS DEADLINE_S

MODE `shard_map`: the data-parallel step of benchmarks/training_step_multi.py over N GPUs
(XLA launches each device's program from its own thread); `threads`: one Python thread per
GPU, released together by a barrier, each running the one-GPU step on its own device. Every
round's loss equals the first round's (to 1e-4) and its gradients are finite; in `threads` every
device's step on the same inputs agrees with device 0's. Past DEADLINE_S every thread's
stack is printed and the process exits (faulthandler): a hang fails with where it hung.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import cutecc  # noqa: E402
from benchmarks import training_step_multi as tsm  # noqa: E402
from examples import llama_block as lb  # noqa: E402

SEQ = 256


def emit(check: str, ok: bool, **kw: Any) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), **kw}), flush=True)


def finite(tree: Any) -> bool:
    return all(bool(jnp.isfinite(v.astype(jnp.float32)).all()) for v in jax.tree.leaves(tree))


def rounds_of(step: Any, args: tuple[Any, ...], rounds: int) -> dict[str, Any]:
    """`rounds` calls: how many gave a loss off the first round's (beyond float32 noise from
    reordered sums) or a non-finite gradient."""
    first = jax.block_until_ready(step(*args))
    loss0, bad = float(first[0]), 0
    for _ in range(rounds - 1):
        got = jax.block_until_ready(step(*args))
        bad += abs(float(got[0]) - loss0) > 1e-4 * abs(loss0) or not finite(got[1])
    return {"first": first, "loss": loss0, "bad_rounds": bad + (not finite(first[1]))}


def shard_map_mode(ks: Any, n: int, rounds: int) -> None:
    cfg = lb.Config()
    kp, kx = jax.random.split(jax.random.key(3))
    params = lb.init_params(kp, cfg)
    x, t = lb.init_batch(kx, n, SEQ, cfg)
    mesh = tsm.mesh_of(n)
    specs = tsm.param_specs(params, "dp", n)
    step = tsm.sharded_step(lambda p, x, t: lb.loss_cutecc(p, x, t, ks, cfg), mesh, specs)
    r = rounds_of(step, tsm.place(mesh, specs, params, x, t), rounds)
    emit(f"shard_map over {n} GPUs", r["bad_rounds"] == 0 and 5 < r["loss"] < 20,
         loss=r["loss"], bad_rounds=r["bad_rounds"])


def threads_mode(ks: Any, n: int, rounds: int) -> None:
    cfg = lb.Config()
    kp, kx = jax.random.split(jax.random.key(4))
    params = lb.init_params(kp, cfg)
    x, t = lb.init_batch(kx, 1, SEQ, cfg)
    host = jax.device_get((params, x, t))
    step = tsm.single_step(lambda p, x, t: lb.loss_cutecc(p, x, t, ks, cfg))
    start = threading.Barrier(n)
    report: dict[int, dict[str, Any]] = {}

    def worker(k: int) -> None:
        args = jax.device_put(host, jax.devices()[k])
        start.wait()
        try:
            r = rounds_of(step, args, rounds)
            r["devices"] = sorted({d.id for v in jax.tree.leaves(r["first"]) for d in v.devices()})
            report[k] = r
        except Exception as e:  # reported as this device's failure
            report[k] = {"error": f"{type(e).__name__}: {e}"[:500]}

    threads = [threading.Thread(target=worker, args=(k,), name=f"gpu-{k}") for k in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ref = report.get(0, {}).get("first")
    for k in range(n):
        r = report.get(k, {"error": "no report"})
        if "error" in r:
            emit(f"thread on GPU {k}", False, error=r["error"])
            continue
        agree = ref is not None and tsm.compare(r["first"], jax.device_get(ref))
        ok = r["bad_rounds"] == 0 and r["devices"] == [k] and bool(agree and agree["ok"])
        emit(f"thread on GPU {k}", ok,
             loss=r["loss"], bad_rounds=r["bad_rounds"], devices=r["devices"],
             against_gpu0=agree and agree["rel_err"])


def main() -> None:
    mode, n, cache, rounds, deadline = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
        float(sys.argv[5])
    faulthandler.dump_traceback_later(deadline, exit=True)
    np.random.seed(0)
    ks = cutecc.load(cache)
    {"shard_map": shard_map_mode, "threads": threads_mode}[mode](ks, n, rounds)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
