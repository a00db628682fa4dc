"""Device benchmarks of a prebuilt cutecc cache on a CUDA GPU (standalone).

    python benchmarks/device.py CACHE_DIR [--json PATH] [--quick] [--dry-run]

Needs only jax (with CUDA), numpy, apache-tvm-ffi, jax-tvm-ffi and cutecc's source (found
beside this file; no DSL, no click). Without a GPU it prints "skipped: no GPU" and exits 0;
--dry-run instead lowers every benchmarked function for sm_90a on the CPU, to check the
script. Figures (medians over >= 20 timed runs after warm-up, host clock around
block_until_ready, which METHOD.md accepts for a synchronised region):
  cold_start  fresh process: import, load, inputs, first call of mul f32 on 1M elements,
              block_until_ready, check against x*y; and the same with jnp's x*y
  dispatch    jitted chains of K=100 dependent calls on 256 floats, unrolled and in
              lax.fori_loop; us/call = (t(K calls) - t(1 call)) / (K - 1); against x*y
              (XLA fuses an unrolled x*y chain into one kernel; the `barrier` rows put an
              optimization_barrier between calls so each is its own kernel)
  kernels     every built variant at a large size against its jax.numpy reference under
              jit: time, GB/s (bytes each kernel must move at least), fraction of a
              measured copy ceiling (x * 1.0001 over 1 GiB f32: read + write)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source, when it is not installed

# (words the device_kind must contain, name, HBM datasheet TB/s); first match wins
NOMINAL = (("H100 PCIe", "H100 PCIe", 2.0), ("H100", "H100 SXM", 3.35), ("H200", "H200", 4.8))
K = 100
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

COLD_CHILD = r'''
import time; T0 = time.perf_counter()
import json, sys
sys.path.insert(0, sys.argv[2])
ph = {}
t = time.perf_counter(); import jax, jax.numpy as jnp, numpy as np; ph["import_jax"] = time.perf_counter() - t
n = 1 << 20
rng = np.random.default_rng(0)
xh, yh = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
t = time.perf_counter()
if sys.argv[3] == "cutecc":
    import cutecc
    ks = cutecc.load(sys.argv[1]); f = jax.jit(ks.mul)
elif sys.argv[3] == "cutecc_phases":  # the first call taken apart: what each step costs
    import cutecc
    ks = cutecc.load(sys.argv[1]); f = jax.jit(ks.mul)
    ph["load_only"] = time.perf_counter() - t
    t1 = time.perf_counter()
    from cutecc.runtime.library import import_tvm_ffi; import_tvm_ffi(); import jax_tvm_ffi
    ph["import_tvm_ffi"] = time.perf_counter() - t1
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    t1 = time.perf_counter(); traced = f.trace(spec, spec)  # verify, dlopen, register, trace
    ph["trace_load_register"] = time.perf_counter() - t1
    t1 = time.perf_counter(); lowered = traced.lower(); ph["lower"] = time.perf_counter() - t1
    t1 = time.perf_counter(); lowered.compile(); ph["compile"] = time.perf_counter() - t1
else:
    f = jax.jit(lambda a, b: a * b)
    if sys.argv[3] == "jnp_phases":
        spec = jax.ShapeDtypeStruct((n,), jnp.float32)
        t1 = time.perf_counter(); traced = f.trace(spec, spec); ph["trace"] = time.perf_counter() - t1
        t1 = time.perf_counter(); lowered = traced.lower(); ph["lower"] = time.perf_counter() - t1
        t1 = time.perf_counter(); lowered.compile(); ph["compile"] = time.perf_counter() - t1
ph["load"] = time.perf_counter() - t
t = time.perf_counter(); x, y = jnp.asarray(xh), jnp.asarray(yh)
jax.block_until_ready((x, y)); ph["inputs"] = time.perf_counter() - t
t = time.perf_counter(); out = f(x, y).block_until_ready(); ph["first_call"] = time.perf_counter() - t
ph["correct"] = bool(np.array_equal(np.asarray(out), xh * yh))
ph["total_in_child"] = time.perf_counter() - T0
print(json.dumps(ph))
'''


def timeit(f: Any, *args: Any, runs: int = 20, warmup: int = 3, inner: int = 1) -> list[float]:
    """Seconds per call: `inner` back-to-back calls, then block_until_ready; `runs` samples."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(inner):
            r = f(*args)
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t) / inner)
    return out


def stats(xs: list[float], scale: float = 1.0) -> dict[str, float]:
    s = sorted(x * scale for x in xs)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": len(s)}


# --- cold start -----------------------------------------------------------------------

def cold_start(cache: Path, repeats: int) -> dict[str, Any]:
    import compileall

    # As an installed cutecc (pip writes its bytecode): with $PYTHONDONTWRITEBYTECODE set, as
    # on the GPU machines, the source tree would be compiled again in every child.
    compileall.compile_dir(str(REPO / "cutecc"), quiet=1)
    out: dict[str, Any] = {}
    for which in ("cutecc", "jnp", "cutecc_phases", "jnp_phases"):
        walls, kids = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", COLD_CHILD, str(cache), str(REPO), which],
                               capture_output=True, text=True, timeout=300)
            walls.append(time.perf_counter() - t)
            if r.returncode != 0:
                raise RuntimeError(f"cold-start child ({which}) failed:\n{r.stderr[-3000:]}")
            kids.append(json.loads(r.stdout.strip().splitlines()[-1]))
        assert all(k["correct"] for k in kids), f"{which}: wrong result on first call"
        phases = {p: stats([k[p] for k in kids], 1e3) for p in kids[0]
                  if p not in ("correct",) and isinstance(kids[0][p], float)}
        out[which] = {"wall_s": stats(walls), "first_call_s": stats([k["first_call"] for k in kids]),
                      "after_import_jax_s": stats([k["total_in_child"] - k["import_jax"] for k in kids]),
                      "phases_ms": phases, "children": kids}
    return out


# --- dispatch ---------------------------------------------------------------------------

def chains(ks: Any, ffi: Any = None) -> dict[str, Any]:
    """name -> (f_1, f_K): jitted functions of (x, y) making 1 and K dependent calls; with
    `ffi` (the bare `ffi_call` of mul's library), its rows too."""
    import jax

    def unrolled(op: Any, k: int, barrier: bool = False) -> Any:
        def f(x: Any, y: Any) -> Any:
            for _ in range(k):
                x = op(x, y)
                if barrier:
                    x = jax.lax.optimization_barrier(x)
            return x
        return jax.jit(f)

    def looped(op: Any, k: int) -> Any:
        return jax.jit(lambda x, y: jax.lax.fori_loop(0, k, lambda i, a: op(a, y), x))

    mul, native = ks.mul, (lambda a, b: a * b)
    bare = {} if ffi is None else {"bare ffi_call, unrolled": (unrolled(ffi, 1), unrolled(ffi, K)),
                                   "bare ffi_call, fori_loop": (looped(ffi, 1), looped(ffi, K))}
    return {
        **bare,
        "cutecc, unrolled": (unrolled(mul, 1), unrolled(mul, K)),
        "jnp x*y, unrolled (fused by XLA)": (unrolled(native, 1), unrolled(native, K)),
        "jnp x*y, unrolled + barrier": (unrolled(native, 1, True), unrolled(native, K, True)),
        "cutecc, fori_loop": (looped(mul, 1), looped(mul, K)),
        "jnp x*y, fori_loop": (looped(native, 1), looped(native, K)),
    }


def dispatch(ks: Any, runs: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(256, dtype=np.float32))
    y = jnp.asarray(1 + 1e-3 * rng.standard_normal(256, dtype=np.float32))  # stays finite over K
    out = {}
    for name, (f1, fk) in chains(ks, bare_ffi(ks, "mul", x, y)).items():
        want = np.asarray(x) * np.asarray(y) ** K
        got = np.asarray(fk(x, y))
        assert np.allclose(got, want, rtol=1e-3), f"{name}: wrong result"
        t1, tk = timeit(f1, x, y, runs=runs), timeit(fk, x, y, runs=runs)
        m1, mk = statistics.median(t1), statistics.median(tk)
        out[name] = {"t1_us": stats(t1, 1e6), "tK_us": stats(tk, 1e6),
                     "us_per_call": (mk - m1) / (K - 1) * 1e6}
    # An in-place (inout) kernel writes into the loop's carry: no copy after the call.
    import jax

    def axpy_loop(op: Any, k: int) -> Any:
        return jax.jit(lambda a, b: jax.lax.fori_loop(0, k, lambda i, c: op(b, c), a))

    ours, native = (lambda b, c: ks.axpy(b, c, alpha=1e-3)), (lambda b, c: 1e-3 * b + c)
    for name, op in (("cutecc axpy (inout), fori_loop", ours), ("jnp 1e-3*x+y, fori_loop", native)):
        f1, fk = axpy_loop(op, 1), axpy_loop(op, K)
        got = np.asarray(fk(y, x))
        assert np.allclose(got, np.asarray(y) + K * 1e-3 * np.asarray(x), rtol=1e-3, atol=1e-4), name
        t1, tk = timeit(f1, y, x, runs=runs), timeit(fk, y, x, runs=runs)
        m1, mk = statistics.median(t1), statistics.median(tk)
        out[name] = {"t1_us": stats(t1, 1e6), "tK_us": stats(tk, 1e6),
                     "us_per_call": (mk - m1) / (K - 1) * 1e6}
    return out


# --- eager calls and the call path's floor -----------------------------------------------

def bare_ffi(ks: Any, name: str, *example: Any) -> Any:
    """The kernel's FFI target called through `jax.ffi.ffi_call` alone, no cutecc: the floor
    that JAX and jax-tvm-ffi set (registers the target through one cutecc call first)."""
    import jax

    from cutecc.runtime.library import target_name

    kfn = ks[name]
    build, env = kfn.select(*example)
    jax.block_until_ready(kfn(*example))  # registers the target
    results = [jax.ShapeDtypeStruct(tuple(d if isinstance(d, int) else env[d] for d in t.shape),
                                    t.dtype) for t in build.conv.results]
    call = jax.ffi.ffi_call(target_name(build.key), results[0] if len(results) == 1 else results)
    return call


def eager(ks: Any, runs: int) -> dict[str, Any]:
    """Host-timed latency of one call and its block_until_ready, outside any jit: cutecc's
    call, the per-call path it replaced (`_traced`, what every eager call ran before),
    XLA's own op, and the bare `ffi_call` of the same library; and `jax.jit` of one call."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(256, dtype=np.float32))
    y = jnp.asarray(rng.standard_normal(256, dtype=np.float32))
    r = jnp.asarray(rng.standard_normal((8, 1024), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal(1024, dtype=np.float32))
    mul_ffi = bare_ffi(ks, "mul", x, y)
    rms_ffi = bare_ffi(ks, "rmsnorm", r, w)
    rows = {
        "mul f32[256] (grad-paired): cutecc": lambda: ks.mul(x, y),
        "mul f32[256] (grad-paired): per-call path before": lambda: ks.mul._traced((x, y), {}),
        "mul f32[256]: jnp.multiply": lambda: jnp.multiply(x, y),
        "mul f32[256]: bare ffi_call": lambda: mul_ffi(x, y),
        "rmsnorm f32[8,1024] (plain): cutecc": lambda: ks.rmsnorm(r, w, eps=1e-6),
        "rmsnorm f32[8,1024] (plain): per-call path before":
            lambda: ks.rmsnorm._traced((r, w), {"eps": 1e-6}),
        "rmsnorm f32[8,1024]: one jnp op (r * w)": lambda: jnp.multiply(r, w),
        "rmsnorm f32[8,1024]: bare ffi_call": lambda: rms_ffi(r, w, eps=np.float32(1e-6)),
    }
    jm, jn = jax.jit(ks.mul), jax.jit(jnp.multiply)
    rows["jit(mul) from Python: cutecc"] = lambda: jm(x, y)
    rows["jit(mul) from Python: jnp.multiply"] = lambda: jn(x, y)
    want = {"mul": np.asarray(x) * np.asarray(y)}
    assert np.allclose(np.asarray(ks.mul(x, y)), want["mul"], rtol=1e-6), "eager mul: wrong result"
    assert np.allclose(np.asarray(mul_ffi(x, y)), want["mul"], rtol=1e-6), "bare ffi: wrong result"
    out = {}
    for _ in range(2):  # interleaved rounds: later ones see a warm process
        for name, f in rows.items():
            t = timeit(f, runs=max(runs, 200), warmup=20)
            out.setdefault(name, []).extend(t)
    return {k: stats(v, 1e6) for k, v in out.items()}


def loop_hlo(ks: Any) -> dict[str, str]:
    """Optimized HLO of one call in `lax.fori_loop`, cutecc and XLA's op: where the copies
    around a custom call in a loop show (written beside the results for reading)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(256, jnp.float32)
    out = {}
    for name, op in (("cutecc", ks.mul), ("jnp", lambda a, b: a * b),
                     ("cutecc_axpy", lambda c, b: ks.axpy(b, c, alpha=1e-3))):
        f = jax.jit(lambda a, b, op=op: jax.lax.fori_loop(0, K, lambda i, c: op(c, b), a))
        out[name] = f.lower(x, x).compile().as_text()
    return out


# --- kernels at size --------------------------------------------------------------------

def cases(ks: Any, big: bool) -> list[dict[str, Any]]:
    """One case per built variant: name, make-inputs, cutecc fn, reference fn, bytes, donate."""
    import jax
    import jax.numpy as jnp

    n = (64 << 20) if big else 4096
    m = 16384 if big else 8
    out = []

    def rms_ref(x: Any, w: Any) -> Any:
        xf = x.astype(jnp.float32)
        r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
        return (xf * r * w.astype(jnp.float32)).astype(x.dtype)

    for name in ks:
        for b in ks[name].builds:
            dt = b.conv.inputs[0].dtype
            size = jnp.dtype(dt).itemsize
            if name == "mul":
                out.append(dict(name=f"mul {dt}", shapes=[(n,)] * 2, dtype=dt, bytes=3 * n * size,
                                ours=ks.mul, ref=lambda x, y: x * y))
            elif name == "mul_bwd":
                out.append(dict(name=f"mul_bwd {dt}", shapes=[(n,)] * 3, dtype=dt,
                                bytes=5 * n * size, ours=ks.mul_bwd,
                                ref=lambda x, y, g: (g * y, g * x)))
            elif name == "rmsnorm":
                d = b.conv.inputs[1].shape[0]
                out.append(dict(name=f"rmsnorm {dt} d={d}", shapes=[(m, d), (d,)], dtype=dt,
                                bytes=(2 * m * d + d) * size,
                                ours=lambda x, w: ks.rmsnorm(x, w, eps=1e-6), ref=rms_ref))
            elif name == "axpy":
                out.append(dict(name=f"axpy {dt} (in place)", shapes=[(n,)] * 2, dtype=dt,
                                bytes=3 * n * size, donate=1,
                                ours=lambda x, y: ks.axpy(x, y, alpha=0.5),
                                ref=lambda x, y: 0.5 * x + y))
    return out


def _close(got: Any, want: Any, dtype: str) -> float:
    import numpy as np

    g = np.asarray(got, dtype=np.float32)
    w = np.asarray(want, dtype=np.float32)
    assert np.isfinite(g).all(), "non-finite output"
    return float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))


def kernels(ks: Any, runs: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    ceiling = copy_ceiling(runs)
    out: dict[str, Any] = {"copy_ceiling_GBs": ceiling}
    key = jax.random.key(0)
    for c in cases(ks, big=True):
        keys = jax.random.split(key, len(c["shapes"]) + 1)
        key = keys[0]
        args = [jax.random.normal(k, s, jnp.float32).astype(jnp.dtype(c["dtype"])) for k, s in
                zip(keys[1:], c["shapes"])]
        donate = c.get("donate")
        ours = jax.jit(c["ours"], donate_argnums=() if donate is None else donate)
        ref = jax.jit(c["ref"], donate_argnums=() if donate is None else donate)
        err = max(_close(g, w, c["dtype"]) for g, w in zip(
            jax.tree.leaves(jax.jit(c["ours"])(*args)), jax.tree.leaves(jax.jit(c["ref"])(*args))))
        assert err <= TOL[c["dtype"]], f"{c['name']}: relative error {err:.3g}"
        row: dict[str, Any] = {"bytes": c["bytes"], "rel_err": err}
        for label, f in (("cutecc", ours), ("jnp", ref)):
            if donate is None:
                t = timeit(f, *args, runs=runs, inner=5)
            else:  # in place: feed each result back as the donated operand
                t = timeit_inplace(f, args, donate, runs)
            med = statistics.median(t)
            row[label] = {"ms": stats(t, 1e3), "GBs": c["bytes"] / med / 1e9,
                          "of_ceiling": c["bytes"] / med / 1e9 / ceiling}
        row["cutecc_over_jnp_time"] = row["cutecc"]["ms"]["median"] / row["jnp"]["ms"]["median"]
        out[c["name"]] = row
        del args
    return out


def timeit_inplace(f: Any, args: list[Any], donate: int, runs: int) -> list[float]:
    import jax

    args = [a.copy() for a in args]
    for _ in range(3):
        args[donate] = f(*args)
    jax.block_until_ready(args[donate])
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(5):
            args[donate] = f(*args)
        jax.block_until_ready(args[donate])
        out.append((time.perf_counter() - t) / 5)
    return out


def copy_ceiling(runs: int) -> float:
    """GB/s of a jitted elementwise pass over 1 GiB of f32 (1 GiB read + 1 GiB written)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1 << 28,), jnp.float32)
    f = jax.jit(lambda a: a * 1.0001)
    t = statistics.median(timeit(f, x, runs=runs, inner=3))
    del x
    return 2 * (1 << 30) / t / 1e9


# --- driver ------------------------------------------------------------------------------

def dry_run(cache: Path) -> dict[str, Any]:
    """Lower every function this script would time, for sm_90a, without a GPU."""
    import jax
    import jax.numpy as jnp

    import cutecc

    ks = cutecc.load(cache, arch="sm_90a")
    lowered = 0
    for f1, fk in chains(ks).values():
        for f in (f1, fk):
            spec = jax.ShapeDtypeStruct((256,), jnp.float32)
            f.trace(spec, spec).lower(lowering_platforms=("cuda",))
            lowered += 1
    for c in cases(ks, big=False):
        specs = [jax.ShapeDtypeStruct(s, jnp.dtype(c["dtype"])) for s in c["shapes"]]
        for fn in (c["ours"], c["ref"]):
            jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
            lowered += 1
    compile(COLD_CHILD, "cold_child", "exec")
    return {"dry_run": True, "lowered": lowered, "kernels": sorted(ks)}


def nominal(kind: str) -> tuple[str, float | None]:
    for words, name, tbs in NOMINAL:
        if all(w in kind for w in words.split()):
            return name, tbs
    return "unknown", None


def report(res: dict[str, Any]) -> str:
    lines = [f"device: {res['device']}  (nominal HBM {res['nominal'][0]}: "
             f"{res['nominal'][1]} TB/s)", "",
             "| measurement | median | min - max | note |", "| --- | --- | --- | --- |"]
    for who, r in res["cold_start"].items():
        w, f = r["wall_s"], r["first_call_s"]
        lines.append(f"| cold start to first correct result, {who} (whole process) | "
                     f"{w['median']:.3f} s | {w['min']:.3f} - {w['max']:.3f} s | "
                     f"first call {f['median'] * 1e3:.1f} ms, n={w['n']}; phases (ms): "
                     + ", ".join(f"{p} {v['median']:.1f}" for p, v in r["phases_ms"].items())
                     + " |")
    for name, r in res.get("eager", {}).items():
        lines.append(f"| eager {name} | {r['median']:.1f} us | {r['min']:.1f} - {r['max']:.1f} us | "
                     f"n={r['n']} |")
    for name, r in res["dispatch"].items():
        lines.append(f"| dispatch {name} | {r['us_per_call']:.2f} us/call | | "
                     f"t(1) {r['t1_us']['median']:.1f} us, t({K}) {r['tK_us']['median']:.1f} us |")
    kern = res["kernels"]
    lines.append(f"| copy ceiling (x*1.0001, 1 GiB f32) | {kern['copy_ceiling_GBs']:.0f} GB/s | | "
                 "measured |")
    for name, r in kern.items():
        if name == "copy_ceiling_GBs":
            continue
        c, j = r["cutecc"], r["jnp"]
        lines.append(f"| {name}: cutecc | {c['ms']['median']:.3f} ms | {c['ms']['min']:.3f} - "
                     f"{c['ms']['max']:.3f} ms | {c['GBs']:.0f} GB/s, {c['of_ceiling']:.0%} of "
                     f"ceiling; jnp {j['ms']['median']:.3f} ms ({j['GBs']:.0f} GB/s); "
                     f"cutecc/jnp time {r['cutecc_over_jnp_time']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    ap.add_argument("--dry-run", action="store_true", help="lower for sm_90a instead of running")
    ns = ap.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if ns.dry_run:
        res: dict[str, Any] = dry_run(ns.cache)
        print(f"dry run: lowered {res['lowered']} functions for sm_90a; kernels {res['kernels']}")
    elif not gpus:
        res = {"skipped": "no GPU visible to JAX"}
        print("skipped: no GPU")
    else:
        import cutecc

        runs = 20 if ns.quick else 30
        kind = gpus[0].device_kind
        ks = cutecc.load(ns.cache)
        res = {"device": kind, "nominal": nominal(kind), "jax": jax.__version__,
               "cold_start": cold_start(ns.cache, 3 if ns.quick else 5),
               "eager": eager(ks, runs), "dispatch": dispatch(ks, runs),
               "kernels": kernels(ks, runs)}
        print(report(res))
        if ns.json:
            for name, text in loop_hlo(ks).items():
                (ns.json.parent / f"fori_loop_hlo_{name}.txt").write_text(text)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.exit(main())
