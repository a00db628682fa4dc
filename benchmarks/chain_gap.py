"""A chain of N calls of one kernel through cutecc against the same library called through
tvm-ffi directly, on the wall clock and the device clock, with a trace of where the time
between launches goes (GPU; issue 27).

    python -m benchmarks.chain_gap CACHE [--json PATH] [--quick] [--dry-run]

Kernels of the root cache: mul f32 on 2^24 elements (~70 us a call), rmsnorm bf16 16384 x
4096 (~90 us) and mul f32 on 256 elements (launch-bound). Sides, interleaved round by round:
- direct: the entry's own `tvm_ffi.Function` (the one JAX registers) called N times from
  Python on DLPack views of the same arrays (what the issue's "tvm-ffi directly" is);
- cutecc jit: one `jax.jit` of N calls kept apart by optimization barriers, every result
  returned (as examples_parity.py: XLA drops calls whose results nothing uses);
- bare ffi_call jit: the same chain through `jax.ffi.ffi_call` of the registered target,
  no cutecc code at all (what XLA and jax-tvm-ffi cost by themselves);
- cutecc eager: N calls from Python, each its own dispatch.
Wall clock per call, between whole-device synchronisations (`cuCtxSynchronize`): whole
(t(N) / N, the fixed cost of a batch spread over its calls) and marginal ((t(2N) - t(N)) / N).
Device clock (CUPTI through `jax.profiler`, 3 runs of each side in one trace): the kernel's
time per call, the GPU's idle time between consecutive activities, the time from the host's
start of the run to the first kernel, and the host events (XLA's, jax's) under each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CASES = {"mul f32 2^24": ("mul", [(1 << 24,), (1 << 24,)], "float32", {}),
         "rmsnorm bf16 16384x4096": ("rmsnorm", [(16384, 4096), (4096,)], "bfloat16", {"eps": 1e-6}),
         "mul f32 256": ("mul", [(256,), (256,)], "float32", {})}
ROUNDS = 9


class Cuda:
    """Whole-device synchronisation through the driver API."""

    def __init__(self) -> None:
        import ctypes

        self.lib = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        for call, args in (("cuInit", (0,)), ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), 0)),
                           ("cuCtxSetCurrent", (ctx,))):
            rc = getattr(self.lib, call)(*args)
            if rc != 0:
                raise RuntimeError(f"{call} failed: CUresult {rc}")

    def sync(self) -> None:
        rc = self.lib.cuCtxSynchronize()
        if rc != 0:
            raise RuntimeError(f"cuCtxSynchronize failed: CUresult {rc}")


def chain(kern: Any, kw: dict[str, Any], n: int, args: tuple[Any, ...]) -> Any:
    import jax

    outs: list[Any] = []
    for _ in range(n):
        if outs:
            args, _ = jax.lax.optimization_barrier((args, outs[-1]))
        outs.append(kern(*args, **kw))
    return outs


def sides(ks: Any, case: str, n: int, cuda: Cuda) -> tuple[dict[str, Any], Any]:
    """side -> {calls: fn running that many calls}, and a check of equal results."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cutecc.runtime import library
    from cutecc.runtime.dispatch import _attrs

    name, shapes, dtype, scalars = CASES[case]
    kern = ks[name]
    rng = np.random.default_rng(0)
    ins = [jnp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(dtype) for s in shapes]
    build, env = kern.select(*ins)
    jax.block_until_ready(kern(*ins, **scalars))  # registers the target
    fn = library.load_function(build.key, build.library, build.sha256, build.size, build.symbol,
                               "bench", runtime=build.runtime)
    tvm_ffi = library.import_tvm_ffi()
    outs = [jnp.zeros(tuple(d if isinstance(d, int) else env[d] for d in t.shape), t.dtype)
            for t in build.conv.results]
    attrs = _attrs(name, build.conv.scalars, scalars, (), env)
    dargs = [tvm_ffi.from_dlpack(a) for a in (*ins, *outs)] + [np.dtype(dt).type(v).item()
                                                               for _, dt, v in attrs]
    target = library.target_name(build.key)
    results = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
    bare = jax.ffi.ffi_call(target, results[0] if len(results) == 1 else results)
    battrs = {k: np.dtype(dt).type(v) for k, dt, v in attrs}

    def direct(m: int) -> None:
        for _ in range(m):
            fn(*dargs)

    jits = {m: jax.jit(lambda *a, _m=m: chain(kern, scalars, _m, a)) for m in (n, 2 * n)}
    bares = {m: jax.jit(lambda *a, _m=m: chain(lambda *x: bare(*x, **battrs), {}, _m, a)) for m in (n, 2 * n)}

    def eager(m: int) -> Any:
        for _ in range(m):
            r = kern(*ins, **scalars)
        return r

    # The JAX sides wait for their results: JAX may enqueue on a thread of its own, so a
    # device synchronisation alone could run before the work is there.
    fns = {"direct": direct, "cutecc jit": lambda m: jax.block_until_ready(jits[m](*ins)),
           "bare ffi_call jit": lambda m: jax.block_until_ready(bares[m](*ins)),
           "cutecc eager": lambda m: jax.block_until_ready(eager(m))}

    def check() -> float:
        direct(1)
        cuda.sync()  # XLA's streams may not wait for the default stream the direct call used
        want = np.asarray(outs[0], dtype=np.float32)
        got = [np.asarray(jits[n](*ins)[-1], dtype=np.float32),
               np.asarray(bares[n](*ins)[-1], dtype=np.float32),
               np.asarray(kern(*ins, **scalars), dtype=np.float32)]
        return max(float(np.max(np.abs(g - want))) for g in got)

    return fns, check


def per_call(fn: Any, m: int, cuda: Cuda) -> float:
    cuda.sync()
    t = time.perf_counter()
    fn(m)
    cuda.sync()
    return time.perf_counter() - t


def measure(ks: Any, n: int, cuda: Cuda) -> dict[str, Any]:
    from benchmarks import gputrace

    res: dict[str, Any] = {}
    for case in CASES:
        fns, check = sides(ks, case, n, cuda)
        err = check()  # the same kernel on the same arrays: equal results expected
        for f in fns.values():  # warm: compile both chain lengths
            f(n), f(2 * n)
        cuda.sync()
        whole: dict[str, list[float]] = {s: [] for s in fns}
        marginal: dict[str, list[float]] = {s: [] for s in fns}
        for r in range(ROUNDS):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for s in order:
                one, two = per_call(fns[s], n, cuda), per_call(fns[s], 2 * n, cuda)
                whole[s].append(one / n * 1e6)
                marginal[s].append((two - one) / n * 1e6)
        runs = gputrace.trace([(s, (lambda f=fns[s]: f(n))) for _ in range(3) for s in fns], cuda.sync)
        row: dict[str, Any] = {"calls": n, "max_abs_diff_between_sides": err,
                               "clocks_agree": gputrace.clocks_agree(runs)}
        for s in fns:
            mine = [t for t in runs if t.label == s]
            gaps = [g for t in mine for g in t.idle_gaps_ns()]
            kernels = [sum(d for nm, _, d in t.gpu if not nm.lower().startswith(("memcpy", "memset")))
                       for t in mine]
            row[s] = {
                "wall_whole_us_per_call": gputrace.stats(whole[s]),
                "wall_marginal_us_per_call": gputrace.stats(marginal[s]),
                "device_kernel_us_per_call": statistics.median(kernels) / n / 1e3,
                "device_span_us_per_call": statistics.median(t.span_ns for t in mine) / n / 1e3,
                "device_idle_between_us": gputrace.stats([g / 1e3 for g in gaps]) if gaps else None,
                "device_idle_total_us_per_call":
                    statistics.median(sum(t.idle_gaps_ns()) for t in mine) / n / 1e3,
                "host_to_first_kernel_us": statistics.median(t.first_launch_ns() or 0 for t in mine) / 1e3,
                "host_run_us": statistics.median(t.host_end_ns - t.host_start_ns for t in mine) / 1e3,
                "activities_per_call": statistics.median(len(t.gpu) for t in mine) / n,
                "host_events_us_per_run": gputrace.host_summary(mine),
            }
        d = row["direct"]
        for s in fns:
            row[s]["whole_over_direct"] = (row[s]["wall_whole_us_per_call"]["median"]
                                           / d["wall_whole_us_per_call"]["median"])
            row[s]["marginal_over_direct"] = (row[s]["wall_marginal_us_per_call"]["median"]
                                              / d["wall_marginal_us_per_call"]["median"])
            row[s]["device_kernel_over_direct"] = (row[s]["device_kernel_us_per_call"]
                                                   / d["device_kernel_us_per_call"])
        res[case] = row
    return res


def table(res: dict[str, Any]) -> str:
    lines = ["| case | side | wall whole us/call | / direct | wall marginal us/call | / direct "
             "| kernel us/call | / direct | idle between launches us/call | host start -> 1st kernel us |",
             "|" + " --- |" * 10]
    for case in CASES:
        for s, r in res[case].items():
            if not isinstance(r, dict):
                continue
            lines.append(f"| {case} | {s} | {r['wall_whole_us_per_call']['median']:.2f} "
                         f"| {r['whole_over_direct']:.3f} "
                         f"| {r['wall_marginal_us_per_call']['median']:.2f} "
                         f"| {r['marginal_over_direct']:.3f} "
                         f"| {r['device_kernel_us_per_call']:.2f} | {r['device_kernel_over_direct']:.4f} "
                         f"| {r['device_idle_total_us_per_call']:.2f} | {r['host_to_first_kernel_us']:.0f} |")
    return "\n".join(lines)


def dry_run(cache: Path) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import cutecc

    ks = cutecc.load(cache, arch="sm_90a")
    for name, shapes, dtype, scalars in CASES.values():
        specs = [jax.ShapeDtypeStruct(s, jnp.dtype(dtype)) for s in shapes]
        jax.jit(lambda *a, k=ks[name], kw=scalars: chain(k, kw, 4, a)).trace(*specs).lower(
            lowering_platforms=("cuda",))
    return {"dry_run": True, "cases": list(CASES)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    import jax

    if a.dry_run:
        res: dict[str, Any] = dry_run(a.cache)
        print(res)
    else:
        import cutecc

        ks = cutecc.load(a.cache)
        res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
               **measure(ks, a.calls, Cuda())}
        print(table(res))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
