"""Time a no-op `cutecc build` (every entry cached) of a generated manifest with N variants.

    python benchmarks/noop_rebuild.py --variants 200            # builds them all first, for real
    python benchmarks/noop_rebuild.py --variants 1000 --seed-from-one

--seed-from-one compiles one variant and puts copies of it under the other keys
(`common.plant`), so a 10,000-variant cache exists without 10,000 compiles; the no-op path
never opens an artifact (it reads each key's meta.json), so it is timed the same either way.
Each figure is the median of --repeats fresh `cutecc build` processes, wall clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = '''\
import cutlass
import cutlass.cute as cute


@cute.kernel
def _k(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32, bias: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] + cutlass.Float32(bias)


@cute.jit
def add_const(x: cute.Tensor, out: cute.Tensor, stream, threads: cutlass.Constexpr = 128,
              bias: cutlass.Constexpr = 0):
    n = x.shape[0]
    _k(x, out, n, bias).launch(grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1],
                               stream=stream)
'''


def manifest(n: int) -> str:
    threads = [64, 128, 256, 512][:max(1, min(4, n))]
    biases = list(range((n + len(threads) - 1) // len(threads)))
    return f'''archs = ["sm_90a"]
[kernel.add_const]
entry = "bench_kernels.ops:add_const"
args = [
  {{ name = "x", dtype = "float32", shape = ["n"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
  {{ kind = "stream" }},
]
constants = {{ threads = "$threads", bias = "$bias" }}
variants = {{ threads = {threads}, bias = {biases} }}
'''


def cutecc(*args: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", *args, "--json"],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return dt, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed-from-one", action="store_true")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "bench_kernels").mkdir()
        (root / "bench_kernels" / "__init__.py").write_text("")
        (root / "bench_kernels" / "ops.py").write_text(KERNEL)
        m = root / "kernels.toml"
        m.write_text(manifest(ns.variants))
        cache = root / "cache"
        jobs = ["-j", str(ns.jobs)] if ns.jobs else []
        if ns.seed_from_one:
            _seed(m, cache)
            cold = None
        else:
            cold, rep = cutecc(str(m), "--cache-dir", str(cache), *jobs)
            assert rep["failed"] == 0, rep
        times = []
        for _ in range(ns.repeats):
            dt, rep = cutecc(str(m), "--cache-dir", str(cache))
            assert rep["built"] == 0 and rep["cached"] >= ns.variants, rep
            times.append(dt)
        out = {"variants": rep["cached"], "cold_build_s": cold,
               "noop_rebuild_median_s": statistics.median(times),
               "noop_rebuild_min_s": min(times), "noop_rebuild_max_s": max(times),
               "noop_in_process_s": rep["seconds"], "seeded": ns.seed_from_one}
        print(json.dumps(out, indent=1))


def _seed(m: Path, cache: Path) -> None:
    """Compile the first variant, then put copies of it under every other planned key
    (`common.plant`)."""
    from benchmarks.common import plant
    from cutecc.build.executors.local import compile_all
    from cutecc.build.workers import BuildJob
    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan
    from cutecc.store import Store

    manifest = load_manifest(m)
    planned = plan(manifest)
    first = planned[0]
    store = Store(cache)
    store.ensure()
    # Build just one real artifact to copy (its worker links the runtime library too).
    compile_all([BuildJob.of(first, manifest)], store.root, 1, lambda job, r: None)
    src = store.get(first.key)
    assert src is not None
    base = {k: v for k, v in src.doc.items() if k not in ("files", "key", "format")}
    plant(store, src, [(p.key, {**base, "variant": p.variant.id, "params": dict(p.variant.params),
                                "key_inputs": p.inputs}) for p in planned[1:]])


if __name__ == "__main__":
    main()
