"""docs/first-kernel.md's kernel (examples/first_kernel: out = silu(a) * b, and its backward)
against XLA's own formulation of the same function (examples/first_kernel/reference.py, one
fused loop in XLA), checked and timed in the same run on the same device.

    python benchmarks/first_kernel.py FIRST_KERNEL_CACHE [--json PATH] [--rounds 20] [--dry-run]

FIRST_KERNEL_CACHE is `cutecc build examples/first_kernel/kernels.toml` (tests/gpu/prepare.sh
CACHES makes CACHES/first_kernel); the GPU host needs no DSL. Per case (dtype, rows, cols):
fresh random inputs; the kernel's result and gradients (`jax.vjp`, so the declared backward
runs) against the reference's in float32, within the dtype's tolerance (a failure exits 1);
then both sides, each one `jax.jit` call per run, `forward` (out) and `forward_backward`
(out, da, db), interleaved in one profiler trace (CUPTI through `jax.profiler`), each run
followed by a synchronisation and an idle gap: a run's time is the sum of its GPU kernels'
durations on the device clock (copies and fills apart). Medians over --rounds runs; `ratio`
is XLA's median over the kernel's (above 1: the kernel is faster); `gb_per_s` is the bytes any
implementation must move over the median: forward reads a and b and writes out,
forward_backward reads a, b and dout and writes out, da and db (as XLA's one fusion does; the
kernel's two launches read a and b twice). Without a GPU it says so and exits 0; --dry-run
lowers every case for sm_90a on the CPU instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "examples" / "first_kernel"
for p in (REPO, PROJECT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # cutecc's source and the example's reference

# (dtype, rows, cols): an MLP's gate at Llama-7B's width, float32 too, more rows than a
# grid's y dimension takes (65,535), and a ragged size whose last chunk is partial
CASES = (("bfloat16", 4096, 11008), ("float32", 4096, 11008), ("bfloat16", 70_000, 1024),
         ("bfloat16", 333, 1001))
TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def sides(ks: Any) -> dict[str, Any]:
    """(side, pass) -> a jitted function of (a, b, dout)."""
    import jax
    from reference import silu_mul

    def fwd(f: Any) -> Any:
        return jax.jit(lambda a, b, g: f(a, b))

    def fwd_bwd(f: Any) -> Any:
        def run(a: Any, b: Any, g: Any) -> Any:
            out, vjp = jax.vjp(f, a, b)
            return (out, *vjp(g))
        return jax.jit(run)

    return {("cutecc", "forward"): fwd(ks.silu_mul), ("xla", "forward"): fwd(silu_mul),
            ("cutecc", "forward_backward"): fwd_bwd(ks.silu_mul),
            ("xla", "forward_backward"): fwd_bwd(silu_mul)}


def inputs(dtype: str, rows: int, cols: int, seed: int) -> tuple[Any, ...]:
    import jax
    import jax.numpy as jnp

    ka, kb, kg = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(k, (rows, cols), jnp.float32).astype(dtype) for k in (ka, kb, kg))


def check(fns: dict[Any, Any], args: tuple[Any, ...], dtype: str) -> dict[str, float]:
    """Largest error of the kernel's out, da, db against the reference's, relative to
    1 + |reference| (float32 arithmetic on both sides)."""
    import numpy as np

    got = fns[("cutecc", "forward_backward")](*args)
    want = fns[("xla", "forward_backward")](*args)
    err = {}
    for name, g, w in zip(("out", "da", "db"), got, want):
        g32, w32 = np.asarray(g, np.float32), np.asarray(w, np.float32)
        err[name] = float(np.max(np.abs(g32 - w32) / (1.0 + np.abs(w32))))
    return err


def device_times(fns: dict[Any, Any], args: tuple[Any, ...], rounds: int) -> dict[Any, list[float]]:
    """Per side and pass, the device-clock busy time (us) of each of `rounds` traced runs."""
    from benchmarks.gputrace import device_chunks
    from cutecc.tuning.trace import is_memory_op

    keys = list(fns)
    order = [keys[(r + i) % len(keys)] for r in range(rounds) for i in range(len(keys))]
    chunks = device_chunks([lambda k=k: fns[k](*args) for k in order])
    out: dict[Any, list[float]] = {k: [] for k in keys}
    for k, evs in zip(order, chunks):
        out[k].append(sum(e.duration_ns for e in evs if not is_memory_op(e.name)) / 1e3)
    return out


def run(cache: Path, rounds: int) -> dict[str, Any]:
    import jax

    import cutecc

    ks = cutecc.load(cache, strict=True)  # a miss is an error here, never the fallback timed
    fns = sides(ks)
    res: dict[str, Any] = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                           "rounds": rounds, "cases": [], "failed": []}
    for i, (dtype, rows, cols) in enumerate(CASES):
        args = inputs(dtype, rows, cols, seed=i)
        err = check(fns, args, dtype)
        ok = all(v <= TOL[dtype] for v in err.values())
        if not ok:
            res["failed"].append(f"{dtype} {rows}x{cols}: {err}")
        for f in fns.values():  # compiled and warm before the trace
            jax.block_until_ready(f(*args))
        times = device_times(fns, args, rounds)
        size = rows * cols * jax.numpy.dtype(dtype).itemsize
        case: dict[str, Any] = {"dtype": dtype, "rows": rows, "cols": cols, "max_error": err, "correct": ok}
        for p, moved in (("forward", 3 * size), ("forward_backward", 6 * size)):
            k, x = statistics.median(times[("cutecc", p)]), statistics.median(times[("xla", p)])
            case[p] = {"cutecc_us": k, "xla_us": x, "ratio": x / k,
                       "cutecc_gb_per_s": moved / k / 1e3, "xla_gb_per_s": moved / x / 1e3,
                       "cutecc_samples_us": times[("cutecc", p)], "xla_samples_us": times[("xla", p)]}
        res["cases"].append(case)
    return res


def dry_run(cache: Path) -> dict[str, Any]:
    """Every case's four functions lowered for sm_90a on this (CPU) host."""
    import jax

    import cutecc

    fns = sides(cutecc.load(cache, arch="sm_90a", strict=True))
    out = {}
    for dtype, rows, cols in CASES:
        spec = jax.ShapeDtypeStruct((rows, cols), dtype)
        for (side, p), f in fns.items():
            text = f.trace(spec, spec, spec).lower(lowering_platforms=("cuda",)).as_text()
            out[f"{side} {p} {dtype} {rows}x{cols}"] = text.count("custom_call @cutecc_")
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['device']}, jax {res['jax']}, device clock, medians of {res['rounds']}",
             f"{'case':26} {'pass':17} {'cutecc us':>10} {'xla us':>9} {'xla/cutecc':>10} {'GB/s':>7}"]
    for c in res["cases"]:
        name = f"{c['dtype']} {c['rows']}x{c['cols']}"
        for p in ("forward", "forward_backward"):
            d = c[p]
            lines.append(f"{name:26} {p:17} {d['cutecc_us']:10.1f} {d['xla_us']:9.1f} {d['ratio']:10.3f} "
                         f"{d['cutecc_gb_per_s']:7.0f}")
    lines += [f"FAILED {f}" for f in res["failed"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true", help="lower for sm_90a instead of running")
    ns = ap.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    rc = 0
    if ns.dry_run:
        res: dict[str, Any] = {"dry_run": dry_run(ns.cache)}
        print(json.dumps(res, indent=1))
    elif not gpus:
        res = {"skipped": "no GPU visible to JAX"}
        print("skipped: no GPU")
    else:
        res = run(ns.cache, ns.rounds)
        print(report(res))
        rc = 1 if res["failed"] else 0
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(res, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.exit(main())
