"""The training step of benchmarks/training_step.py on N GPUs of one host, data-parallel and
FSDP-style, cutecc against plain JAX with cuDNN attention in the same run, for N = 1, 2, 4
(as many as JAX sees), each checked against the same side's step on one GPU.

    python benchmarks/training_step_multi.py EXAMPLES_CACHE [--json PATH] [--batch 2] [--seq 2048]
                                             [--rounds 10] [--counts 1,2,4] [--dry-run]

Modes, each one `jax.jit` of a `jax.shard_map` over a one-axis mesh ("data") of N devices:

  dp    batch sharded (x and targets split along the batch), weights replicated: each
        device computes the loss of its rows, the loss is `pmean`ed, and JAX's own transpose
        of the replicated weights sums their gradients over the devices (one all-reduce each)
  fsdp  weights sharded too (each along its first dimension), gathered at each use
        (`all_gather` when the block reads the weight, so per layer), whose transpose is a
        reduce-scatter: each device ends with its shard of every gradient

A cutecc kernel inside `shard_map` runs on each device's shard (every mesh axis manual, see
cutecc/runtime/placement.py); the examples declare no shard rule (quack's RMSNorm backward
sums per-SM partials into dw, which no per-shard rule can express), so `shard_map` is the
declared way to split them (under `jax.jit` with shardings alone they are refused, which
--dry-run shows). Sides: `cutecc` (loss_cutecc) and `jax_cudnn` (loss_jax with cuDNN's
fused attention) by that shard_map, and `jax_cudnn_jit`, the plain-JAX step by `jax.jit`
with the same in/out shardings alone (XLA's SPMD partitioner picks the collectives, and
cuDNN attention's own partitioning rule). Per N the global batch is --batch x N (weak scaling).

Checks, per N, mode and side: loss and every gradient (each weight and dx) against the same
side's unsharded step on one GPU on the same global batch (relative L2 error, in float64;
loss within LOSS_TOL, gradients within GRAD_TOL). Timing, per N and mode: wall clock (median
over --rounds, sides interleaved) and the device clock (one CUPTI trace through
`jax.profiler`, benchmarks/gputrace.py: PROFILED steps per side interleaved; per step the
span from the first GPU activity on any device to the last one's end, the busy time per
GPU, and the collectives' share). Raw JSON to --json. Without a GPU it says so and exits 0;
--dry-run instead uses the CPU's devices (XLA_FLAGS=--xla_force_host_platform_device_count=4):
lowers the cutecc side for sm_90a on each N and mode and says which kernels each device's
program calls inside the shard_map (and that jax.jit with shardings alone refuses them), and
runs the plain-JAX block (XLA attention) at a small size both ways, its loss and gradients
against the one-device step, to check the sharding itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source and examples/, when not installed

AXIS = "data"
MODES = ("dp", "fsdp")
SIDES = ("cutecc", "jax_cudnn", "jax_cudnn_jit")
PROFILED = 5
LOSS_TOL = 2e-3  # relative, against the one-GPU step of the same side
GRAD_TOL = 3e-2  # relative L2 per gradient (bf16; the block's own floor in tests/gpu)


class Gathered(Mapping[str, Any]):
    """A block's weights read inside `shard_map`: each sharded one all-gathered along its
    first dimension where the block reads it (so per layer, and each gather's transpose
    reduce-scatters that weight's gradient)."""

    def __init__(self, shards: Mapping[str, Any], sharded: frozenset[str]) -> None:
        self._shards, self._sharded = shards, sharded

    def __getitem__(self, name: str) -> Any:
        import jax

        w = self._shards[name]
        return jax.lax.all_gather(w, AXIS, axis=0, tiled=True) if name in self._sharded else w

    def __iter__(self) -> Iterator[str]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)


def param_specs(params: Mapping[str, Any], mode: str, n: int) -> dict[str, Any]:
    """Per weight, its PartitionSpec: replicated in dp; in fsdp split along its first
    dimension when N divides it (every weight of the default block), else replicated."""
    from jax.sharding import PartitionSpec as P

    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    return {k: P(AXIS) if mode == "fsdp" and v.shape[0] % n == 0 else P() for k, v in params.items()}


def sharded_step(loss: Callable[..., Any], mesh: Any, specs: Mapping[str, Any]) -> Any:
    """`jax.jit` of (loss, (dparams, dx)) for `loss(params, x, target)`, under `shard_map` on
    `mesh`: x and targets split along the batch, weights as `specs` say; the loss is the mean
    over the devices' rows (each device's mean of equally many rows, `pmean`ed)."""
    import jax
    from jax.sharding import PartitionSpec as P

    sharded = frozenset(k for k, s in specs.items() if tuple(s))

    def local(p: Any, x: Any, t: Any) -> Any:
        def f(p: Any, x: Any) -> Any:
            return jax.lax.pmean(loss(Gathered(p, sharded), x, t), AXIS)
        return jax.value_and_grad(f, argnums=(0, 1))(p, x)

    specs = dict(specs)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(specs, P(AXIS), P(AXIS)),
                                 out_specs=(P(), (specs, P(AXIS)))))


def jit_step(loss: Callable[..., Any], mesh: Any, specs: Mapping[str, Any]) -> Any:
    """The same step as `sharded_step` by `jax.jit` with shardings alone (XLA's SPMD
    partitioner decides the collectives): x and targets split along the batch, weights and
    their gradients as `specs` say."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    ws = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    rows = NamedSharding(mesh, P(AXIS))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=(ws, rows, rows),
                   out_shardings=(NamedSharding(mesh, P()), (ws, rows)))


def step_of(side: str, fns_of: Mapping[str, Callable[..., Any]], mesh: Any, specs: Mapping[str, Any]) -> Any:
    """A side's sharded step: `NAME_jit` is loss NAME by `jit_step`, any other by `sharded_step`."""
    if side.endswith("_jit"):
        return jit_step(fns_of[side[:-len("_jit")]], mesh, specs)
    return sharded_step(fns_of[side], mesh, specs)


def base(side: str) -> str:
    """The loss a side computes (its one-GPU reference)."""
    return side[:-len("_jit")] if side.endswith("_jit") else side


def single_step(loss: Callable[..., Any]) -> Any:
    """The same step unsharded, on whichever one device its arguments are on."""
    import jax

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def losses(ks: Any, cfg: Any) -> dict[str, Callable[..., Any]]:
    """The sides' losses; `ks` None leaves cutecc out. `jax_xla` (attention as XLA ops) is
    for the CPU check."""
    from examples import llama_block as lb

    out: dict[str, Callable[..., Any]] = {
        "jax_cudnn": lambda p, x, t: lb.loss_jax(p, x, t, cfg, attention="cudnn"),
        "jax_xla": lambda p, x, t: lb.loss_jax(p, x, t, cfg, attention="xla")}
    if ks is not None:
        out["cutecc"] = lambda p, x, t: lb.loss_cutecc(p, x, t, ks, cfg)
    return out


def mesh_of(n: int) -> Any:
    import jax

    return jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n],
                         axis_types=(jax.sharding.AxisType.Auto,))


def place(mesh: Any, specs: Mapping[str, Any], params: Any, x: Any, t: Any) -> tuple[Any, Any, Any]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    p = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
    return p, jax.device_put(x, NamedSharding(mesh, P(AXIS))), jax.device_put(t, NamedSharding(mesh, P(AXIS)))


def rel(got: Any, ref: Any) -> float:
    """||got - ref|| / ||ref|| in float64 (inf when got is not finite or ref is all zeros)."""
    import numpy as np

    g, r = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    norm = float(np.linalg.norm(r))
    if g.shape != r.shape or not np.isfinite(g).all() or norm == 0:
        return float("inf")
    return float(np.linalg.norm(g - r) / norm)


def compare(got: Any, ref: Any) -> dict[str, Any]:
    """Loss and every gradient of a sharded step's result against the one-device step's:
    relative errors and whether each is within tolerance."""
    import jax.numpy as jnp

    (loss, (gp, gx)), (rloss, (rgp, rgx)) = got, ref
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731  (bf16 is no numpy dtype)
    errs = {"loss": abs(float(loss) - float(rloss)) / abs(float(rloss)),
            **{f"d{k}": rel(f32(gp[k]), f32(rgp[k])) for k in rgp}, "dx": rel(f32(gx), f32(rgx))}
    ok = errs["loss"] <= LOSS_TOL and all(v <= GRAD_TOL for k, v in errs.items() if k != "loss")
    return {"ok": ok, "loss": float(loss), "loss_1gpu": float(rloss), "rel_err": errs}


def custom_calls(text: str) -> dict[str, Any]:
    """The cutecc custom calls of a lowered program, how many lie inside its shard_map
    (Shardy's manual computation: each device runs them on its shard), each one's first
    operand type, and how many of each collective the program holds."""
    calls = re.findall(r"custom_call @(cutecc_\w+)", text)
    start = text.find("sdy.manual_computation")
    inside = len(re.findall(r"custom_call @cutecc_", text[start:])) if start >= 0 else 0
    # outlined shard_map bodies are functions called from the manual computation
    bodies = set(re.findall(r"call @(\w*shmap_body\w*)", text))
    for b in bodies:
        m = re.search(rf"func\.func private @{b}\b(.*?)\n  }}", text, re.S)
        inside += len(re.findall(r"custom_call @cutecc_", m.group(1))) if m else 0
    first = re.findall(r"custom_call @cutecc_\w+\(.*?:\s*\((tensor<[^>]*>)", text)
    kinds = Counter(re.findall(r"stablehlo\.(all_gather|all_reduce|reduce_scatter|all_to_all|"
                               r"collective_permute)", text))
    return {"calls": len(calls), "inside_shard_map": min(inside, len(calls)), "first_operands": first,
            "collectives": dict(sorted(kinds.items()))}


def dry_run(cache: Path, batch: int, seq: int, counts: list[int]) -> dict[str, Any]:
    """On the CPU's devices: the cutecc side lowered for sm_90a per N and mode, and the
    plain-JAX side run at a small size against its one-device step."""
    import jax
    import jax.numpy as jnp

    import cutecc
    from examples import llama_block as lb

    cfg = lb.Config()
    ks = cutecc.load(cache, arch="sm_90a")
    res: dict[str, Any] = {"devices": jax.device_count(), "lowered": {}, "checked": {}}
    small = lb.Config(d_model=64, n_heads=2, d_ff=128, vocab=256)
    kp, kx = jax.random.split(jax.random.key(0))
    sp = lb.init_params(kp, small, jnp.float32)
    for n in counts:
        mesh = mesh_of(n)
        p = jax.eval_shape(lambda: lb.init_params(jax.random.key(0), cfg))
        x, t = jax.eval_shape(lambda rows=batch * n: lb.init_batch(jax.random.key(1), rows, seq, cfg))
        sx, st = lb.init_batch(kx, 2 * n, 16, small, jnp.float32)
        ref = single_step(losses(None, small)["jax_xla"])(sp, sx, st)
        for mode in MODES:
            specs = param_specs(p, mode, n)
            text = sharded_step(losses(ks, cfg)["cutecc"], mesh, specs).trace(p, x, t).lower(
                lowering_platforms=("cuda",)).as_text()
            res["lowered"][f"{n} {mode}"] = custom_calls(text)
            try:  # without a shard rule, under jax.jit with shardings alone: refused, never gathered
                jit_step(losses(ks, cfg)["cutecc"], mesh, specs).trace(p, x, t).lower(
                    lowering_platforms=("cuda",))
                res["lowered"][f"{n} {mode}"]["under_jit"] = "lowered"
            except Exception as e:
                res["lowered"][f"{n} {mode}"]["under_jit"] = f"{type(e).__name__}: {e}"[:300]
            sspecs = param_specs(sp, mode, n)
            for side in ("jax_xla", "jax_xla_jit"):
                got = step_of(side, losses(None, small), mesh, sspecs)(*place(mesh, sspecs, sp, sx, st))
                res["checked"][f"{n} {mode}" + (" jit" if side.endswith("_jit") else "")] = {
                    **compare(got, ref),
                    "grad_specs": {k: str(v.sharding.spec) for k, v in got[1][0].items()}}
    return res


def step_time(fns: dict[str, Any], args: dict[str, tuple[Any, ...]], rounds: int, n: int) -> dict[str, Any]:
    """Wall clock (median over `rounds`, sides interleaved) and the device clock (PROFILED
    traced steps per side, interleaved) of each side's step."""
    import jax

    from benchmarks import gputrace

    wall: dict[str, list[float]] = {s: [] for s in fns}
    for r in range(rounds):
        for i in range(len(fns)):
            side = list(fns)[(r + i) % len(fns)]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[side](*args[side]))
            wall[side].append((time.perf_counter() - t0) * 1e6)
    out: dict[str, Any] = {s: {"wall_us": statistics.median(v), "wall_samples_us": v}
                           for s, v in wall.items()}
    order = [list(fns)[(r + i) % len(fns)] for r in range(PROFILED) for i in range(len(fns))]
    try:
        runs = gputrace.trace([(s, lambda s=s: jax.block_until_ready(fns[s](*args[s]))) for s in order],
                              sync=lambda: None)
    except Exception as e:  # no CUPTI here: the wall-clock figures stand alone
        out["device_clock_error"] = f"{type(e).__name__}: {e}"[:300]
        return out
    for side in fns:
        mine = [r for r in runs if r.label == side]
        coll = [sum(d for name, _, d in r.gpu if "nccl" in name.lower()) for r in mine]
        out[side].update({
            "span_us": statistics.median(r.span_ns for r in mine) / 1e3,
            "busy_per_gpu_us": statistics.median(r.busy_ns for r in mine) / 1e3 / n,
            "collectives_per_gpu_us": statistics.median(coll) / 1e3 / n,
            "span_samples_us": [r.span_ns / 1e3 for r in mine]})
    return out


def run(cache: Path, batch: int, seq: int, rounds: int, counts: list[int]) -> dict[str, Any]:
    import jax

    import cutecc
    from examples import llama_block as lb

    cfg = lb.Config()
    ks = cutecc.load(cache)
    fns_of = losses(ks, cfg)
    res: dict[str, Any] = {
        "device": jax.devices()[0].device_kind, "gpus": jax.device_count(), "jax": jax.__version__,
        "sizes": {"batch_per_gpu": batch, "seq": seq, "d_model": cfg.d_model, "heads": cfg.n_heads,
                  "d_ff": cfg.d_ff, "vocab": cfg.vocab, "dtype": "bfloat16"},
        "tolerance": {"loss": LOSS_TOL, "grad": GRAD_TOL}, "runs": {}}
    kp, kx = jax.random.split(jax.random.key(0))
    params = lb.init_params(kp, cfg)
    for n in counts:
        x, t = lb.init_batch(jax.random.fold_in(kx, n), batch * n, seq, cfg)
        refs: dict[str, Any] = {}
        for side in {base(s) for s in SIDES}:
            try:  # the one-GPU step of the same global batch, on device 0
                refs[side] = jax.device_get(single_step(fns_of[side])(params, x, t))
            except Exception as e:
                refs[side] = f"{type(e).__name__}: {e}"[:300]
        mesh = mesh_of(n)
        for mode in MODES:
            entry: dict[str, Any] = {"checks": {}, "errors": {}}
            specs = param_specs(params, mode, n)
            fns, args = {}, {}
            placed = place(mesh, specs, params, x, t)
            for side in SIDES:
                try:
                    f = step_of(side, fns_of, mesh, specs)
                    got = jax.block_until_ready(f(*placed))  # compiles; the first call
                    jax.block_until_ready(f(*placed))
                except Exception as e:  # reported, not timed
                    entry["errors"][side] = f"{type(e).__name__}: {e}"[:500]
                    continue
                ref = refs[base(side)]
                entry["checks"][side] = (compare(got, ref) if not isinstance(ref, str)
                                         else {"ok": False, "one_gpu_error": ref})
                fns[side], args[side] = f, placed
                del got
            entry["timing"] = step_time(fns, args, rounds, n) if fns else {}
            res["runs"][f"{n} {mode}"] = entry
            print(report_line(n, mode, entry), flush=True)
    return res


def report_line(n: int, mode: str, e: dict[str, Any]) -> str:
    t = e.get("timing", {})
    cols = []
    for s in SIDES:
        if s in e["errors"]:
            cols.append(f"{s}: {e['errors'][s][:120]}")
            continue
        d = t.get(s, {})
        c = e["checks"].get(s, {})
        worst = max(c.get("rel_err", {"?": float("nan")}).values())
        nan = float("nan")
        cols.append(f"{s}: wall {d.get('wall_us', nan):8.0f} us, span {d.get('span_us', nan):8.0f} us, "
                    f"busy/gpu {d.get('busy_per_gpu_us', nan):8.0f} us, "
                    f"{'ok' if c.get('ok') else 'MISMATCH'} (worst rel err {worst:.2e})")
    ratio = "".join(f" | cutecc/{s} span {t['cutecc']['span_us'] / t[s]['span_us']:.3f}"
                    for s in SIDES[1:] if "span_us" in t.get("cutecc", {}) and "span_us" in t.get(s, {}))
    return f"{n} GPU {mode:4}  " + "\n    ".join(["", *cols]) + ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=2, help="sequences per GPU")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--counts", default="1,2,4", help="device counts (those over what JAX sees are skipped)")
    ap.add_argument("--dry-run", action="store_true", help="lower and check on the CPU's devices instead")
    ns = ap.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    visible = len(jax.devices()) if ns.dry_run else len(gpus)
    counts = [n for n in map(int, ns.counts.split(",")) if n <= visible]
    if ns.dry_run:
        res: dict[str, Any] = {"dry_run": dry_run(ns.cache, ns.batch, ns.seq, counts)}
        print(json.dumps(res, indent=1))
    elif not gpus:
        res = {"skipped": "no GPU visible to JAX"}
        print("skipped: no GPU")
    else:
        res = run(ns.cache, ns.batch, ns.seq, ns.rounds, counts)
    if ns.json:
        from cutecc.atomic import atomic_write

        ns.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(ns.json, (json.dumps(res, indent=1) + "\n").encode())
    bad = [k for k, e in res.get("runs", {}).items() for c in e["checks"].values() if not c["ok"]]
    if bad:
        print(f"loss or gradients differ from the one-GPU step: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off: these hosts share a fabric
    sys.exit(main())
