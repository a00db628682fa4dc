"""A training step of the Llama-style block of examples/llama_block.py (forward and backward:
the loss's value and its gradients with respect to every weight and the input) through
cutecc's published kernels, against the same block in plain JAX, under `jax.jit`, timed in
the same run on the same device.

    python benchmarks/training_step.py EXAMPLES_CACHE [--json PATH] [--batch 4] [--seq 2048]
                                       [--rounds 15] [--dry-run]

EXAMPLES_CACHE is `cutecc build examples/kernels.toml` (tests/gpu/prepare.sh CACHES
--examples makes CACHES/examples); the GPU host needs no DSL and no torch. Sides, each
`jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))` on the same bf16 weights and inputs:

  cutecc     loss_cutecc: quack RMSNorm and cross-entropy, flash-attn-4's Hopper attention,
             forward and backward through the declared pairings; matmuls by XLA
  jax_cudnn  loss_jax with jax.nn.dot_product_attention(implementation="cudnn"): XLA's own
             path with cuDNN's fused attention (the one to beat)
  jax_xla    loss_jax with implementation="xla" (attention as XLA ops), for reference

Wall clock: per round, one step of each side (order rotated every round) between
`block_until_ready`s; medians over --rounds. Device clock: one profiler trace (CUPTI,
through `jax.profiler`) of PROFILED steps per side, interleaved, each followed by a
whole-device synchronisation and an idle gap; per step, the sum of the GPU kernels'
durations (busy), the span from the first kernel's start to the last one's end, and the
busy time per kind of kernel (attention, norm, cross-entropy, matmul, other, by kernel name;
copies and fills apart). Medians over the PROFILED steps. Without a GPU the script says so
and exits 0; --dry-run lowers every side for sm_90a on the CPU instead, to check it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source and examples/, when not installed

SIDES = ("cutecc", "jax_cudnn", "jax_xla")
PROFILED = 5  # steps per side in the device-clock trace
# Kinds of GPU kernels, by words their (mangled) names contain; first match wins.
KINDS = (("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
         ("norm", ("rmsnorm",)),
         ("cross_entropy", ("crossentropy", "cross_entropy")),
         ("matmul", ("gemm", "xmma", "nvjet", "wgmma", "cublas", "cutlass")),)


def kind(name: str) -> str:
    low = name.lower()
    for k, words in KINDS:
        if any(w in low for w in words):
            return k
    return "other"


def steps(ks: Any, cfg: Any) -> dict[str, Any]:
    """The three sides' jitted steps."""
    import jax

    from examples import llama_block as lb

    def step(loss: Any) -> Any:
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    out = {"cutecc": step(lambda p, x, t: lb.loss_cutecc(p, x, t, ks, cfg))}
    for side, impl in (("jax_cudnn", "cudnn"), ("jax_xla", "xla")):
        out[side] = step(lambda p, x, t, impl=impl: lb.loss_jax(p, x, t, cfg, attention=impl))
    return out


def dry_run(cache: Path, batch: int, seq: int) -> dict[str, Any]:
    """Each side traced and lowered for sm_90a on this machine (no GPU needed)."""
    import jax

    import cutecc
    from examples import llama_block as lb

    cfg = lb.Config()
    ks = cutecc.load(cache, arch="sm_90a")
    p = jax.eval_shape(lambda: lb.init_params(jax.random.key(0), cfg))
    x, t = jax.eval_shape(lambda: lb.init_batch(jax.random.key(1), batch, seq, cfg))
    res: dict[str, Any] = {}
    for side, f in steps(ks, cfg).items():
        try:
            text = f.trace(p, x, t).lower(lowering_platforms=("cuda",)).as_text()
            res[side] = {"custom_calls": text.count("stablehlo.custom_call")}
        except Exception as e:  # cuDNN attention may need a GPU backend to lower
            res[side] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return res


def device_clock(fns: dict[str, Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """Per side, medians over PROFILED traced steps: busy and span (us), busy per kind of
    kernel, and its ten longest kernels (us per step)."""
    from cutecc.tuning.trace import is_memory_op

    order = [SIDES[(r + i) % len(SIDES)] for r in range(PROFILED) for i in range(len(SIDES))]
    from benchmarks.gputrace import device_chunks

    chunks = device_chunks([lambda s=s: fns[s](*args) for s in order])
    got: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
    names: dict[str, Counter[str]] = {s: Counter() for s in SIDES}
    for side, evs in zip(order, chunks):
        g = got[side]
        kernels = [e for e in evs if not is_memory_op(e.name)]
        memory = [e for e in evs if is_memory_op(e.name)]
        g.setdefault("busy_us", []).append(sum(e.duration_ns for e in kernels) / 1e3)
        g.setdefault("copies_fills_us", []).append(sum(e.duration_ns for e in memory) / 1e3)
        g.setdefault("span_us", []).append((max(e.end_ns for e in evs) - min(e.start_ns for e in evs)) / 1e3)
        g.setdefault("kernels", []).append(len(kernels))
        per_kind = Counter()
        for e in kernels:
            per_kind[kind(e.name)] += e.duration_ns / 1e3
            names[side][e.name] += e.duration_ns / 1e3 / PROFILED
        for k in (*(k for k, _ in KINDS), "other"):
            g.setdefault(f"{k}_us", []).append(per_kind[k])
    return {s: {**{k: statistics.median(v) for k, v in got[s].items()},
                "top_kernels_us": {n[:160]: round(t, 1) for n, t in names[s].most_common(10)}}
            for s in SIDES}


def run(cache: Path, batch: int, seq: int, rounds: int) -> dict[str, Any]:
    import jax

    import cutecc
    from examples import llama_block as lb

    cfg = lb.Config()
    ks = cutecc.load(cache)
    kp, kx = jax.random.split(jax.random.key(0))
    args = (lb.init_params(kp, cfg), *lb.init_batch(kx, batch, seq, cfg))
    fns = steps(ks, cfg)
    losses, errors = {}, {}
    for side, f in list(fns.items()):
        try:
            losses[side] = float(jax.block_until_ready(f(*args))[0])  # compile and warm up
            jax.block_until_ready(f(*args))
        except Exception as e:  # cuDNN attention unavailable: the side is reported, not timed
            errors[side] = f"{type(e).__name__}: {e}"[:300]
            del fns[side]
    wall: dict[str, list[float]] = {s: [] for s in fns}
    for r in range(rounds):
        for i in range(len(fns)):
            side = list(fns)[(r + i) % len(fns)]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[side](*args))
            wall[side].append((time.perf_counter() - t0) * 1e6)
    res: dict[str, Any] = {
        "device": jax.devices()[0].device_kind, "jax": jax.__version__,
        "sizes": {"batch": batch, "seq": seq, "d_model": cfg.d_model, "heads": cfg.n_heads,
                  "d_ff": cfg.d_ff, "vocab": cfg.vocab, "dtype": "bfloat16"},
        "loss": losses, "errors": errors,
        "wall_us": {s: statistics.median(v) for s, v in wall.items()},
        "wall_samples_us": wall,
    }
    if set(fns) == set(SIDES):
        try:
            res["device_clock"] = device_clock(fns, args)
        except Exception as e:  # no CUPTI here: the wall-clock figures stand alone
            res["device_clock_error"] = f"{type(e).__name__}: {e}"[:300]
    return res


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['device']}, jax {res['jax']}, sizes {res['sizes']}",
             f"{'side':10} {'loss':>9} {'wall us':>10} {'busy us':>10} {'span us':>10} "
             f"{'attention':>10} {'norm':>8} {'x-ent':>8} {'matmul':>9} {'other':>8}"]
    dc = res.get("device_clock", {})
    for s in SIDES:
        if s in res["errors"]:
            lines.append(f"{s:10} {res['errors'][s]}")
            continue
        d = dc.get(s, {})
        cols = " ".join(f"{d.get(k, float('nan')):{w}.0f}" for k, w in (
            ("busy_us", 10), ("span_us", 10), ("attention_us", 10), ("norm_us", 8),
            ("cross_entropy_us", 8), ("matmul_us", 9), ("other_us", 8)))
        lines.append(f"{s:10} {res['loss'][s]:9.4f} {res['wall_us'][s]:10.0f} {cols}")
    if "jax_cudnn" in dc:
        c, x = dc["cutecc"], dc["jax_cudnn"]
        lines.append(f"cutecc / jax_cudnn, device clock: busy {c['busy_us'] / x['busy_us']:.3f}, "
                     f"span {c['span_us'] / x['span_us']:.3f}, "
                     f"attention {c['attention_us'] / max(x['attention_us'], 1e-9):.3f}")
    if "device_clock_error" in res:
        lines.append(f"device clock: {res['device_clock_error']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true", help="lower for sm_90a instead of running")
    ns = ap.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if ns.dry_run:
        res: dict[str, Any] = {"dry_run": dry_run(ns.cache, ns.batch, ns.seq)}
        print(json.dumps(res, indent=1))
    elif not gpus:
        res = {"skipped": "no GPU visible to JAX"}
        print("skipped: no GPU")
    else:
        res = run(ns.cache, ns.batch, ns.seq, ns.rounds)
        print(report(res))
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.exit(main())
