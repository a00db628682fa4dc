"""An op passed as the Python object (`k(x, y, op=operator.add)`, as NVIDIA's elementwise-apply
example passes it) against the same kernel reached by its import reference's text
(`op="operator:add"`, the only spelling that reached it on 1518079, where the object call
was served by the fallback), and against XLA's own `x + y` (what a jnp fallback runs), on
the device clock (issue 48, item 1).

    python benchmarks/object_call.py LAYOUT_CACHE [--json PATH] [--rounds 20]

LAYOUT_CACHE is `cutecc build tests/gpu/layout_kernels/kernels.toml` (tests/gpu/prepare.sh
CACHES makes CACHES/layouts). Fresh random inputs of each size; each side checked against
numpy, then every side, one `jax.jit` call per run, interleaved in one profiler trace (CUPTI
through `jax.profiler`), each run followed by a synchronisation and an idle gap. A run's time
is the sum of its GPU kernels' durations; each run's kernel names are kept, and the object
side must have run the cutecc kernel (`strict=True` load: a miss is an error, never the
fallback timed). Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAYOUTS = REPO / "tests" / "gpu"
for p in (REPO, LAYOUTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # cutecc's source and layout_kernels' fallback module

SIZES = (1 << 12, 1 << 20, 1 << 24)


def sides(ks: Any) -> dict[str, Any]:
    import jax

    return {"object": jax.jit(lambda x, y: ks.apply_op(x, y, op=operator.add)),
            "reference_text": jax.jit(lambda x, y: ks.apply_op(x, y, op="operator:add")),
            "xla": jax.jit(lambda x, y: x + y)}


Runs = dict[str, list[tuple[float, list[str]]]]


def device_runs(fns: dict[str, Any], args: tuple[Any, ...], rounds: int) -> Runs:
    """Per side, each run's device busy time (us) and the names of the kernels it ran."""
    from benchmarks.gputrace import device_chunks
    from cutecc.tuning.trace import is_memory_op

    keys = list(fns)
    order = [keys[(r + i) % len(keys)] for r in range(rounds) for i in range(len(keys))]
    chunks = device_chunks([lambda k=k: fns[k](*args) for k in order])
    out: Runs = {k: [] for k in keys}
    for k, evs in zip(order, chunks):
        kernels = [e for e in evs if not is_memory_op(e.name)]
        out[k].append((sum(e.duration_ns for e in kernels) / 1e3, sorted({e.name for e in evs})))
    return out


def run(cache: Path, rounds: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import cutecc

    ks = cutecc.load(cache, strict=True)
    fns = sides(ks)
    res: dict[str, Any] = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                           "rounds": rounds, "cases": [], "failed": []}
    for i, n in enumerate(SIZES):
        rng = np.random.default_rng(i)
        x, y = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
        want = np.asarray(x) + np.asarray(y)
        for name, f in fns.items():
            got = np.asarray(jax.block_until_ready(f(x, y)))
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                res["failed"].append(f"{name} n={n}: wrong result")
        runs = device_runs(fns, (x, y), rounds)
        case: dict[str, Any] = {"n": n}
        for name, rs in runs.items():
            case[name] = {"median_us": statistics.median(t for t, _ in rs),
                          "samples_us": [t for t, _ in rs],
                          "kernels": sorted({k for _, names in rs for k in names})}
        case["object_over_reference"] = case["object"]["median_us"] / case["reference_text"]["median_us"]
        case["xla_over_object"] = case["xla"]["median_us"] / case["object"]["median_us"]
        if case["object"]["kernels"] != case["reference_text"]["kernels"]:
            res["failed"].append(f"n={n}: the object call ran {case['object']['kernels']}, "
                                 f"the reference's text {case['reference_text']['kernels']}")
        res["cases"].append(case)
    return res


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['device']}, jax {res['jax']}, device clock, medians of {res['rounds']}",
             f"{'n':>10} {'object us':>10} {'text us':>9} {'xla us':>8} {'obj/text':>9} {'xla/obj':>8}"
             "  kernels (object)"]
    for c in res["cases"]:
        o, t, x = (c[k]["median_us"] for k in ("object", "reference_text", "xla"))
        lines.append(f"{c['n']:>10} {o:10.2f} {t:9.2f} {x:8.2f} {c['object_over_reference']:9.3f} "
                     f"{c['xla_over_object']:8.3f}  {', '.join(c['object']['kernels'])}")
    lines += [f"FAILED {f}" for f in res["failed"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=20)
    ns = ap.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        res: dict[str, Any] = {"skipped": "no GPU visible to JAX"}
        print(res["skipped"])
    else:
        res = run(ns.cache, ns.rounds)
        print(report(res))
    if ns.json:
        ns.json.write_text(json.dumps(res, indent=1))
    return 1 if res.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
