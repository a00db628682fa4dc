"""The published-kernel examples (examples/kernels.toml) timed through cutecc next to the
same launcher compiled directly, called in one process, in the same run.

The device has no DSL, so the direct build is made here, on the build host:

    python -m benchmarks.examples_parity build EXAMPLES_CACHE OUT_DIR [--manifest examples/kernels.toml]

compiles every timed entry (`SIZES`) of EXAMPLES_CACHE's manifest again the way its
authors' library compiles it (`benchmarks.examples_authors`: quack's compile helpers and
their fake tensors, FA4's interface on torch fake tensors): no cutecc wrapper, the
launcher's own signature (None slots, FA4's 18 parameters). A kernel with no authors' build
known is compiled as `cute.compile(launcher, *fakes of its contract in the launcher's own
order, **keyword fakes)`. It exports and links each (cutecc's linker, symbol `direct`) into
OUT_DIR/<kernel>.<variant>.so, checks that its embedded cubin is byte-identical to the
cutecc entry's, and writes OUT_DIR/parity.json: per entry, how to call the direct library
(its parameters in order).
OUT_DIR is ~1.1 MiB per entry. Then, on the GPU machine (jax, tvm-ffi; no DSL, no torch):

    python benchmarks/examples_parity.py device EXAMPLES_CACHE OUT_DIR [--json PATH] [--dry-run]

(--dry-run, on the build host: lower every timed call of both sides' specs for sm_90a,
running nothing, to check SIZES, SCALARS and the direct call specs). A backward is timed
like a forward; its partial sums (`reduce = "sum"`, RMSNorm's dw) are summed by cutecc's
call and compared with the direct side's partials summed, to a float32 tolerance.

loads the cache with `cutecc.load` and each direct library with `tvm_ffi.load_module`,
checks that both give the same output on fresh random inputs, and times both, interleaved,
on the same arrays. Wall clock: per call, the marginal time of a call, (time of 2N calls -
time of N calls) / N, each between two whole-device synchronisations (`cuCtxSynchronize`),
N = 50 ms worth of calls, at most 100 (and fewer where 2N results would pass
RESULT_BYTES); medians over 15 rounds. The rest of the time of N
calls is reported apart as each side's fixed cost per batch. cutecc's side is one
`jax.jit` of N calls kept apart by optimization barriers (as a model runs kernels: a
Python dispatch per call costs about as much host time as these kernels run); the direct
side calls the tvm-ffi function N times (arrays via DLPack) on the default stream.

Device clock: the kernel's own time, from a profiler trace (CUPTI, through `jax.profiler`)
of PROFILED rounds of each side. The launcher's kernels are named by the direct side's
trace (everything it launches is the launcher's); per call, the sum of their durations;
on cutecc's side also the device time of anything else the program ran (XLA's own
kernels and copies), and each side's span (first kernel start to last end, gaps included).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cutecc.tuning.trace import Event, is_memory_op, split

SYMBOL = "direct"
ROUNDS = 15
PROFILED = 5  # rounds per side in the device-clock trace
RESULT_BYTES = 12 << 30  # results a chain may hold

# Per kernel: the sizes timed (symbol -> extent) and the runtime scalars passed.
SIZES: dict[str, dict[str, int]] = {
    "quack_rmsnorm": {"m": 16384},
    "quack_rmsnorm_bwd": {"m": 16384},
    "quack_cross_entropy": {"m": 4096},
    "quack_cross_entropy_bwd": {"m": 4096},
    "fa4_fwd": {"b": 4, "s_q": 4096, "s_k": 4096, "h": 16},
}
# (a derived scalar, RMSNorm backward's sm_count, is the contract's: the direct side passes
# the value the entry records, cutecc's call computes it)
SCALARS: dict[str, dict[str, float]] = {
    "quack_rmsnorm": {"eps": 1e-6},
    "quack_rmsnorm_bwd": {},
    "quack_cross_entropy": {"ignore_index": -100},
    "quack_cross_entropy_bwd": {"ignore_index": -100},
    "fa4_fwd": {"softmax_scale": 1 / math.sqrt(128)},
}


def label(kernel: str, variant: str) -> str:
    return f"{kernel}[{variant}]"


# --- build host (needs the DSL and the examples extra) -----------------------------------

def _spec(a: Any) -> Any:
    """How the device calls one launcher parameter: a tensor by name, a scalar by name,
    None, or a tuple (a struct: its fields in the type's order)."""
    from cutecc.build.compiler import import_path
    from cutecc.contract.args import NoneArg, ScalarArg, StructArg, TensorArg, TupleArg

    if isinstance(a, TensorArg):
        return {"tensor": a.name}
    if isinstance(a, ScalarArg):  # a derived one with the value the contract computes
        return {"scalar": a.name, "dtype": a.dtype, **({} if a.value is None else {"value": a.value})}
    if isinstance(a, NoneArg):
        return None
    if isinstance(a, TupleArg):
        return {"tuple": [_spec(i) for i in a.items]}
    if isinstance(a, StructArg):
        t = import_path(a.type)
        names = list(getattr(t, "_fields", None) or [f.name for f in __import__("dataclasses").fields(t)])
        given = dict(a.fields)
        return {"tuple": [_spec(given[n]) if n in given else None for n in names]}
    raise TypeError(f"no direct call form for {type(a).__name__}")


def _call_spec(launcher: Any, args: tuple[Any, ...]) -> list[Any]:
    """The direct library's parameters in order: the launcher's own, less the stream and
    compile-time values; parameters the manifest leaves out keep their default (None)."""
    import inspect

    from cutecc.contract.args import ConstArg, StreamArg

    params = [p for p in inspect.signature(launcher.__call__).parameters.values()]
    by_name = {a.param: a for a in args if a.param}
    positional = [a for a in args if not a.param]
    out: list[Any] = []
    for i, p in enumerate(params):
        a = positional[i] if i < len(positional) else by_name.get(p.name)
        if isinstance(a, (StreamArg, ConstArg)):
            continue
        if a is None:
            if p.default is not None:
                raise ValueError(f"{p.name}: default {p.default!r} has no direct call form")
            out.append(None)
        else:
            out.append(_spec(a))
    return out


def build(cache: Path, out_dir: Path, manifest_path: Path) -> dict[str, Any]:
    from benchmarks import examples_authors
    from cutecc.store import Store

    newest: dict[tuple[str, str], Any] = {}  # an older build of a variant is left out, as `cutecc.load` does
    for e in Store(cache).entries():
        at = (e.doc["kernel"], e.doc["variant"])
        if e.doc["arch"] == "sm_90a" and (at not in newest or
                                           e.doc.get("built_at", "") > newest[at].doc.get("built_at", "")):
            newest[at] = e
    entries = list(newest.values())
    manifest = examples_authors.setup(manifest_path)  # before the DSL or any library is imported
    import cutlass.cute as cute

    from benchmarks.common import launcher_fake, link_fat
    from cutecc.build.compiler import INNER_SYMBOL, resolve_entry, resolve_value
    from cutecc.contract.args import launched
    from cutecc.cubin import cubins

    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    for e in sorted(entries, key=lambda e: (e.doc["kernel"], e.doc["variant"])):
        kernel = manifest.kernel(e.doc["kernel"])
        v = next((x for x in kernel.variants if x.id == e.doc["variant"]), None)
        if v is None:  # a tuning candidate (`cutecc tune --compile-only`): not a declared variant
            continue
        if kernel.name not in SIZES:  # a backward launch: benchmarks/training_step.py times them
            continue
        launcher = resolve_entry(kernel.entry, v.factory_args)
        t0 = time.perf_counter()
        if kernel.name in examples_authors.AUTHORS:
            compiled, how = examples_authors.authors_compile(kernel.name, v), "authors"
        else:
            syms: dict[str, Any] = {}
            pos = [launcher_fake(a, syms) for a in launched(v.args) if not a.param]
            kw = {a.param: launcher_fake(a, syms) for a in launched(v.args) if a.param}
            kw.update({k: resolve_value(x) for k, x in v.constants})
            compiled, how = cute.compile(launcher, *pos, **kw, options="--enable-tvm-ffi"), "contract"
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{kernel.name}.{v.id}")  # no "," for ld's -Wl
        obj, lib = out_dir / f"{name}.o", out_dir / f"{name}.so"
        compiled.export_to_c(str(obj), function_name=INNER_SYMBOL)
        link_fat(obj, lib, SYMBOL, entry=kernel.entry, arch="sm_90a", key="direct" + "0" * 6)
        obj.unlink()
        ours = cubins((e.path / e.doc["library"]).read_bytes())
        direct = cubins(lib.read_bytes())
        report[label(kernel.name, v.id)] = {
            "kernel": kernel.name, "variant": v.id, "key": e.key, "library": lib.name,
            "compile_s": round(time.perf_counter() - t0, 2), "direct_build": how,
            "cubin_identical": len(ours) == len(direct) == 1 and ours[0] == direct[0],
            "params": _call_spec(launcher, launched(v.args)),
            "keywords": {k: x for k, x in v.params if k == "causal"},
        }
    (out_dir / "parity.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


# --- GPU machine (jax, tvm-ffi, cutecc's runtime; no DSL) --------------------------------

class _Cuda:
    """Whole-device synchronisation through the driver API (libcuda is on every GPU host)."""

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


def _inputs(build_: Any, kernel: str, rng: Any) -> tuple[list[Any], dict[str, Any]]:
    """Fresh random inputs for `kernel` at its timed size, and empty result arrays, by name."""
    import jax.numpy as jnp
    import numpy as np

    env = {**SIZES[kernel]}
    named: dict[str, Any] = {}
    ins = []
    # integer inputs are class indices into the first input's last (static) extent
    classes = next(t.shape[-1] for t in build_.conv.inputs)
    for t in build_.conv.inputs:
        shape = tuple(d if isinstance(d, int) else env[d] for d in t.shape)
        if t.dtype.startswith("int"):
            x = jnp.asarray(rng.integers(0, classes, size=shape), dtype=t.dtype)
        else:
            x = jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(t.dtype)
        named[t.name] = x
        ins.append(x)
    for t in build_.conv.results:
        named[t.name] = jnp.zeros(_shape(t, env), t.dtype)
    return ins, named


def _shape(t: Any, env: dict[str, int]) -> tuple[int, ...]:
    """A result's extents at the timed sizes (derived ones evaluated)."""
    from cutecc.contract import expr

    return tuple(d if isinstance(d, int) else env[d] if d in env else int(expr.evaluate(d, env))
                 for d in t.shape)


def _direct_args(spec: list[Any], named: dict[str, Any], scalars: dict[str, float],
                 tvm_ffi: Any) -> list[Any]:
    def one(s: Any) -> Any:
        if s is None:
            return None
        if "tensor" in s:
            return tvm_ffi.from_dlpack(named[s["tensor"]])
        if "scalar" in s:
            v = s["value"] if "value" in s else scalars[s["scalar"]]  # a derived one: the contract's
            return int(v) if s["dtype"].startswith("int") else float(v)
        return tuple(one(x) for x in s["tuple"])

    return [one(s) for s in spec]


def _per_call(issue: Any, n: int, cuda: _Cuda) -> float:
    cuda.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        issue()
    cuda.sync()
    return (time.perf_counter() - t0) / n


def _chain(kern: Any, kw: dict[str, Any], n: int, args: tuple[Any, ...]) -> Any:
    """`n` calls of `kern` on the same `args`, each kept and none merged with another: each
    call's inputs pass an optimization barrier with the previous call's results, and every
    result is returned (XLA drops a call whose result nothing uses: with only the last one
    returned, it ran one call in all). The kernel reads the same data as the direct side
    (attention's speed depends on the values: feeding each output back as the next query
    made FA4 3-7% faster or slower on the device clock)."""
    import jax

    outs: list[Any] = []
    for _ in range(n):
        if outs:
            args, _ = jax.lax.optimization_barrier((args, outs[-1]))
        outs.append(kern(*args, **kw))
    return outs


GAP_NS = 2_000_000  # runs in a trace are kept this far apart (a sleep after each)


def _trace(runs: list[Any], cuda: _Cuda) -> list[Event]:
    """GPU kernel events of `runs` called in turn, each followed by a whole-device
    synchronisation and a sleep of 2 GAP_NS, from one profiler trace."""
    import glob
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        try:
            for run in runs:
                run()
                cuda.sync()
                time.sleep(2 * GAP_NS / 1e9)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no trace")
        data = jax.profiler.ProfileData.from_file(files[0])
        return [Event(e.name, float(e.start_ns), float(e.duration_ns))
                for plane in data.planes if plane.name.startswith("/device:GPU")
                for line in plane.lines for e in line.events]


def _kernel_time(direct: Any, chain: Any, n: int, cuda: _Cuda) -> dict[str, float]:
    """Per call, on the device clock (medians over PROFILED runs of each side, in one
    trace, interleaved so that clock changes of a warm GPU fall on both): the launcher's
    kernels called directly, the same kernels inside cutecc's chain, the rest of cutecc's
    chain (XLA's own work), and each side's span (its kernels and the gaps between)."""
    def d_run() -> None:
        for _ in range(n):
            direct()

    names = {e.name for e in _trace([d_run], cuda) if not is_memory_op(e.name)}
    order = [("direct", "cutecc")[(r + r // 2) % 2] for r in range(2 * PROFILED)]  # d c c d d c ...
    runs = split(_trace([d_run if side == "direct" else chain for side in order], cuda), GAP_NS)
    if not names or len(runs) != len(order):
        raise RuntimeError(f"the trace has {len(runs)} runs, not {len(order)} (kernels {sorted(names)})")
    got: dict[str, dict[str, list[float]]] = {
        side: {"kernel": [], "other": [], "span": [], "count": []} for side in ("direct", "cutecc")}
    for side, evs in zip(order, runs):
        ours = [e for e in evs if e.name in names]
        g = got[side]
        g["kernel"].append(sum(e.duration_ns for e in ours) / n / 1e3)
        g["other"].append(sum(e.duration_ns for e in evs if e.name not in names) / n / 1e3)
        g["span"].append((max(e.end_ns for e in evs) - evs[0].start_ns) / n / 1e3)
        g["count"].append(len(ours) / n)
    counts = {c for side in got.values() for c in side["count"]}
    if len(counts) != 1:
        raise RuntimeError(f"kernels per call differ between runs: {sorted(counts)}")
    med = {side: {k: statistics.median(v) for k, v in g.items()} for side, g in got.items()}
    return {"kernel_direct_us": med["direct"]["kernel"], "kernel_cutecc_us": med["cutecc"]["kernel"],
            "xla_other_us": med["cutecc"]["other"], "kernels_per_call": counts.pop(),
            "span_direct_us": med["direct"]["span"], "span_cutecc_us": med["cutecc"]["span"]}


def device(cache: Path, out_dir: Path) -> dict[str, Any]:
    import jax
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cutecc's source, beside us
    import cutecc
    from cutecc.runtime.library import import_tvm_ffi

    tvm_ffi = import_tvm_ffi()
    cuda = _Cuda()
    ks = cutecc.load(cache)
    report = json.loads((out_dir / "parity.json").read_text())
    rng = np.random.default_rng(0)
    res: dict[str, Any] = {}
    for lab, info in report.items():
        kern = getattr(ks, info["kernel"])
        b = next(x for x in kern.builds if x.key == info["key"])
        ins, named = _inputs(b, info["kernel"], rng)
        scalars = SCALARS[info["kernel"]]
        kw = {**scalars, **info["keywords"]}
        f = jax.jit(lambda *a, _k=kern, _kw=kw: _k(*a, **_kw))
        fn = getattr(tvm_ffi.load_module(str(out_dir / info["library"])), SYMBOL)
        dargs = _direct_args(info["params"], named, scalars, tvm_ffi)
        fn(*dargs)
        cuda.sync()
        got = f(*ins)
        got = got if isinstance(got, tuple) else (got,)
        for t, g in zip(b.conv.visible, got):
            want = np.asarray(named[t.name])
            if t.reduce == "sum":  # partials: cutecc's call sums them (XLA's order), the direct side not
                np.testing.assert_allclose(np.asarray(g), want.sum(axis=0, dtype=np.float64), rtol=1e-4,
                                           atol=1e-3, err_msg=f"{lab}: {t.name} (summed) differs")
            else:
                np.testing.assert_array_equal(np.asarray(g), want,
                                              err_msg=f"{lab}: {t.name} differs between cutecc and direct")
        once = _per_call(lambda fn=fn, a=dargs: fn(*a), 3, cuda)
        # every result of the 2N-call chain stays in memory: at most RESULT_BYTES of them
        per_call = sum(math.prod(x.shape) * x.dtype.itemsize for t in b.conv.results
                       for x in (named[t.name],))
        n = min(100, max(5, int(0.05 / max(once, 1e-6))), max(2, RESULT_BYTES // (2 * per_call)))
        # cutecc's side as a model runs it: calls in one jit (a Python dispatch per call
        # would cost ~70 us of host time, as much as these kernels run). A call's cost is
        # the marginal one: (time of 2n calls - time of n calls) / n on each side, so the
        # fixed cost of one jit execution (dispatch, and XLA's recording of a command
        # buffer before the device starts) is measured apart, not spread over the calls.
        chains = {m: jax.jit(lambda *a, _k=kern, _kw=kw, _n=m: _chain(_k, _kw, _n, a)) for m in (n, 2 * n)}
        for c in chains.values():
            jax.block_until_ready(c(*ins))

        def direct_calls(m: int, fn: Any = fn, a: list[Any] = dargs) -> None:
            for _ in range(m):
                fn(*a)

        sides = {"cutecc": {m: (lambda c=c, ins=ins: c(*ins)) for m, c in chains.items()},
                 "direct": {m: (lambda m=m: direct_calls(m)) for m in (n, 2 * n)}}
        times: dict[str, list[float]] = {"cutecc": [], "direct": []}
        fixed: dict[str, list[float]] = {"cutecc": [], "direct": []}
        for r in range(ROUNDS):
            order = ("cutecc", "direct") if r % 2 == 0 else ("direct", "cutecc")
            for side in order:
                one = _per_call(sides[side][n], 1, cuda)
                two = _per_call(sides[side][2 * n], 1, cuda)
                times[side].append((two - one) / n)
                fixed[side].append(2 * one - two)
        c, d = statistics.median(times["cutecc"]), statistics.median(times["direct"])
        res[lab] = {"cutecc_us": c * 1e6, "direct_us": d * 1e6, "ratio": c / d, "calls_per_round": n,
                    "fixed_cutecc_us": statistics.median(fixed["cutecc"]) * 1e6,
                    "fixed_direct_us": statistics.median(fixed["direct"]) * 1e6,
                    "cubin_identical": info["cubin_identical"], "sizes": SIZES[info["kernel"]]}
        try:
            k = _kernel_time(lambda fn=fn, a=dargs: fn(*a), sides["cutecc"][n], n, cuda)
            res[lab].update(k, kernel_ratio=k["kernel_cutecc_us"] / k["kernel_direct_us"])
        except Exception as err:  # no CUPTI here: the wall-clock figures stand alone
            res[lab]["kernel_error"] = f"{type(err).__name__}: {err}"[:300]
    return res


def dry_run(cache: Path, out_dir: Path) -> dict[str, Any]:
    """On the build host, no GPU: per entry of parity.json, lower cutecc's timed call (one
    `jax.jit` at SIZES, SCALARS and its call keywords) for sm_90a and check that every
    parameter of the direct call resolves (a tensor cutecc's call takes or returns, a scalar
    of SCALARS or the contract's own value). What it found, per entry; raises on a gap."""
    import jax

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import cutecc

    ks = cutecc.load(cache, arch="sm_90a")
    report = json.loads((out_dir / "parity.json").read_text())
    res: dict[str, Any] = {}
    for lab, info in report.items():
        kern = getattr(ks, info["kernel"])
        b = next(x for x in kern.builds if x.key == info["key"])
        env = SIZES[info["kernel"]]
        specs = [jax.ShapeDtypeStruct(_shape(t, env), t.dtype) for t in b.conv.inputs]
        kw = {**SCALARS[info["kernel"]], **info["keywords"]}
        text = jax.jit(lambda *a, _k=kern, _kw=kw: _k(*a, **_kw)).trace(*specs).lower(
            lowering_platforms=("cuda",)).as_text()
        names = {t.name for t in (*b.conv.inputs, *b.conv.results)}

        def check(sp: Any, lab: str = lab, names: set[str] = names, sc: dict[str, float] = kw) -> int:
            if sp is None:
                return 0
            if "tensor" in sp:
                if sp["tensor"] not in names:
                    raise KeyError(f"{lab}: the direct call's tensor {sp['tensor']!r} is not the call's")
                return 1
            if "scalar" in sp:
                if "value" not in sp and sp["scalar"] not in sc:
                    raise KeyError(f"{lab}: no value for scalar {sp['scalar']!r} (add it to SCALARS)")
                return 1
            return sum(check(x) for x in sp["tuple"])

        res[lab] = {"lowered": "custom_call" in text, "direct_params": len(info["params"]),
                    "direct_values": sum(check(sp) for sp in info["params"]),
                    "cubin_identical": info["cubin_identical"]}
    return res


def table(res: dict[str, Any]) -> str:
    lines = [f"{'entry':58} {'cutecc us':>10} {'direct us':>10} {'ratio':>7}  not 2% slower  cubin same"
             f"  {'kernel: cutecc us':>17} {'direct us':>10} {'ratio':>7} {'XLA rest us':>11}"
             f"  {'span: cutecc us':>15} {'direct us':>10}"
             f"  {'fixed per batch: cutecc us':>26} {'direct us':>10}"]
    for lab, r in res.items():
        ok = "yes" if r["ratio"] <= 1.02 else "NO"
        kern = (f"  {r['kernel_cutecc_us']:17.2f} {r['kernel_direct_us']:10.2f} {r['kernel_ratio']:7.4f} "
                f"{r['xla_other_us']:11.2f}  {r['span_cutecc_us']:15.2f} {r['span_direct_us']:10.2f}"
                if "kernel_ratio" in r else f"  ({r.get('kernel_error')})")
        kern += f"  {r['fixed_cutecc_us']:26.1f} {r['fixed_direct_us']:10.1f}"
        lines.append(f"{lab:58} {r['cutecc_us']:10.1f} {r['direct_us']:10.1f} {r['ratio']:7.4f}  "
                     f"{ok:13}  {str(r['cubin_identical']):10}" + kern)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("build", "device"))
    ap.add_argument("cache", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--json", type=Path, help="device: also write the figures here")
    ap.add_argument("--dry-run", action="store_true",
                    help="device: lower every timed call for sm_90a on this host instead of running")
    ap.add_argument("--manifest", type=Path,
                    default=Path(__file__).resolve().parents[1] / "examples/kernels.toml",
                    help="build: the manifest the cache was built from")
    a = ap.parse_args()
    if a.mode == "build":
        rep = build(a.cache, a.out_dir, a.manifest)
        for lab, r in rep.items():
            print(f"{lab:58} compile {r['compile_s']:5.2f} s ({r['direct_build']} build)  "
                  f"cubin identical to cutecc's: {r['cubin_identical']}")
        return 0 if all(r["cubin_identical"] for r in rep.values()) else 1
    if a.dry_run:
        dry = dry_run(a.cache, a.out_dir)
        for lab, r in dry.items():
            print(f"{lab:58} lowered {r['lowered']}  direct parameters {r['direct_params']} "
                  f"({r['direct_values']} values)  cubin identical {r['cubin_identical']}")
        return 0 if all(r["lowered"] and r["cubin_identical"] for r in dry.values()) else 1
    res = device(a.cache, a.out_dir)
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    # cutecc must not be slower than the direct call by more than 2%, on either clock; a
    # device clock that could not be read is a failure too (the table says why)
    return 0 if all(r["ratio"] <= 1.02 and r.get("kernel_ratio", 2.0) <= 1.02 for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
