"""The measuring child of `cutecc tune` (`python -m cutecc.tuning.bench`), run on a GPU.

Reads one job (a plan item, its buckets, the candidates to leave out) as JSON on stdin and
writes JSON lines: the device, `start` before each candidate is first run (so the parent
knows which one a crash killed), one `bucket` result per bucket, or `fault` and exit 3 when
a candidate raised (a faulted CUDA context is dead: the parent starts a fresh child without
it). Uses the cache and the runtime only: no DSL, no CUDA toolkit, nothing of the build side.

Per bucket: fresh random inputs (seeded per bucket), the default configuration's outputs as
the reference, each candidate checked against them (disagreeing ones are dropped), then the
survivors timed in interleaved, shuffled rounds after warm-up rounds (at least `repeats`,
then more until every median's spread has settled, `cutecc.tuning.decide`, at most
`max_rounds`), on one of two clocks (the bucket's result says which, `clock`, with each
candidate's quartiles, median spread and sample count, and the SM clock read before and after
where nvidia-smi can read it):

- `device` (preferred): inside a profiler trace (CUPTI), each candidate's chain of K calls
  runs, then the GPU idles for GAP_SECONDS before the next chain; a sample is the sum of the
  durations of the candidate's own kernels in its chain over K (`cutecc.tuning.trace`: the
  kernel functions its library's cubin defines, counted per call from a trace of one call
  per candidate). Host dispatch, launch gaps and XLA's own work never count, so 10 us
  kernels time as steadily as 10 ms ones.
- `host` (the fallback where the profiler or CUPTI is unavailable, with a note saying why):
  a sample is the time of 2K calls minus the time of K calls inside one jitted loop (each
  call's inputs pass through an optimization barrier with the previous outputs, so XLA
  neither merges nor hoists the calls), divided by K.
"""

from __future__ import annotations

import functools
import gc
import glob
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cutecc import cubin
from cutecc.contract import expr
from cutecc.contract.buckets import bucket_text
from cutecc.manifest.tune_space import benchmark_extents
from cutecc.plan.tuning_plan import PlanItem
from cutecc.runtime.dispatch import Build, KernelFn
from cutecc.store.view import StoreView
from cutecc.tuning import decide, trace

TARGET_SECONDS = 2e-3  # host clock: a K-call loop lasts about this long
MAX_K = 4096
TARGET_DEVICE_NS = 2e5  # device clock: a chain's kernels run about this long
MAX_DEVICE_K = 64
MAX_LIBRARY_BYTES = 256 << 20  # read for its kernels' names
GAP_SECONDS = 3e-3  # the GPU idles this long between chains
GAP_NS = 1.5e6  # an idle gap longer than this separates two chains
TRACE_TRIES = 3  # traces without kernels in a row before the device clock is taken as missing
ROUNDS_PER_TRACE = 12  # a trace holds this many rounds (a mismatched trace loses only these)
_TOL = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2),
        "bfloat16": (2e-2, 2e-2)}


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _inputs(build: Build, extents: dict[str, int], ranges: Mapping[str, Sequence[float]], seed: int
            ) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for t in build.conv.inputs:
        shape = tuple(d if isinstance(d, int) else extents[d] for d in t.extents)
        lo, hi = ranges.get(t.name, (None, None))
        dt = np.dtype(jnp.dtype(t.dtype))
        if t.dtype == "bool":
            a = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            a = rng.integers(max(info.min, -100) if lo is None else int(lo),
                             min(info.max, 100) if hi is None else int(hi), shape).astype(dt)
        elif lo is not None and hi is not None:  # a range gives both ends
            a = rng.uniform(lo, hi, shape).astype(np.float32)
        else:
            a = rng.standard_normal(shape, dtype=np.float32)
        out.append(jnp.asarray(a, dtype=t.dtype))
    return out


def _extents(bucket: dict[str, int], sizes: dict[str, int | str]) -> dict[str, int]:
    """Every symbolic extent's benchmark size (`tune_space.benchmark_extents`)."""
    return benchmark_extents(bucket, sizes.items())


def _agree(ref: tuple[Any, ...], got: tuple[Any, ...], dtypes: list[str], rtol: float | None,
           atol: float | None) -> str | None:
    """Why `got` disagrees with `ref` (None: it agrees); compared where the arrays are, so a
    large output (FA4's) never travels to the host whole."""
    for i, (r, g, dt) in enumerate(zip(ref, got, dtypes)):
        rt, at = _TOL.get(dt, (0.0, 0.0))
        rt, at = rtol if rtol is not None else rt, atol if atol is not None else at
        # Floats of 32 bits or fewer on the device; float64 and integers exactly on the host
        # (JAX computes in 32 bits unless x64 is on).
        xp: Any = jnp if dt in ("float32", "float16", "bfloat16") or dt.startswith("float8") else np
        wide = xp.float32 if xp is jnp else np.float64
        r32, g32 = xp.asarray(r).astype(wide), xp.asarray(g).astype(wide)
        with np.errstate(invalid="ignore"):  # inf - inf: nan, handled below
            diff = xp.abs(g32 - r32)
        # Equal values agree (infinities too: inf - inf is nan), as do nans in the same places;
        # otherwise within tolerance, which an infinity never is (inf <= rtol * inf).
        close = xp.isfinite(r32) & xp.isfinite(g32) & (diff <= at + rt * xp.abs(r32))
        ok = xp.all((r32 == g32) | (xp.isnan(r32) & xp.isnan(g32)) | close)
        if not bool(ok):
            err = float(xp.nanmax(diff))
            return f"disagrees with the default configuration: result {i} max |diff| {err:.3g} " \
                   f"(rtol {rt}, atol {at})"
    return None


def returned(build: Build, extents: dict[str, int]) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each array a call of `build` returns at `extents`: its visible
    results (a saved residual, FA4's lse, stays inside the call), a derived extent evaluated."""
    def extent(d: int | str) -> int:
        return d if isinstance(d, int) else extents[d] if expr.is_symbol(d) else expr.evaluate(d, extents)

    return [(tuple(extent(d) for d in t.extents), t.dtype) for t in build.conv.visible]


def _looped(fn: Callable[..., Any], k: int, results: list[tuple[tuple[int, ...], str]]) -> Any:
    def run(*xs: Any) -> Any:
        outs0 = tuple(jnp.zeros(s, d) for s, d in results)

        def body(_: Any, carry: Any) -> Any:
            ins, outs = jax.lax.optimization_barrier(carry)
            o = fn(*ins)
            return (ins, o if isinstance(o, tuple) else (o,))

        return jax.lax.fori_loop(0, k, body, (tuple(xs), outs0))[1]

    return jax.jit(run)


def _time(f: Any, xs: list[Any]) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(f(*xs))
    return time.perf_counter() - t0


class NoDeviceClock(RuntimeError):
    """The profiler, CUPTI or the trace's GPU plane is not there (`lasting`), or one
    bucket's trace could not be read: time on the host clock."""

    def __init__(self, why: str, lasting: bool = True) -> None:
        super().__init__(why)
        self.lasting = lasting


def _traced(work: Callable[[], None]) -> list[trace.Event]:
    """The GPU events of one profiler trace around `work()` (kernels and copies, every stream)."""
    d = tempfile.mkdtemp(prefix="cutecc-trace-")
    try:
        try:
            opts = jax.profiler.ProfileOptions()
            opts.python_tracer_level = 0  # tracing every Python call would slow the dispatch
            opts.host_tracer_level = 0
            jax.profiler.start_trace(d, profiler_options=opts)
        except Exception as err:
            raise NoDeviceClock(f"the profiler did not start: {type(err).__name__}: {err}") from None
        try:
            work()
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not files:
            raise NoDeviceClock("the profiler wrote no trace")
        return _gpu_events(jax.profiler.ProfileData.from_file(files[0]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _gpu_events(data: Any) -> list[trace.Event]:
    """The events of the first GPU's plane, on its stream lines (derived lines, where a
    profiler adds them, repeat the same work under other names)."""
    planes = [p for p in data.planes if p.name.startswith("/device:GPU:")]
    if not planes:
        raise NoDeviceClock("the trace has no GPU plane (is CUPTI installed?)")
    plane = min(planes, key=lambda p: p.name)
    lines = list(plane.lines)
    streams = [ln for ln in lines if ln.name.startswith("Stream")] or lines
    return [trace.Event(e.name, float(e.start_ns), float(e.duration_ns)) for ln in streams for e in ln.events]


def _chains(calls: dict[str, Any], xs: list[Any], order: list[str], k: int) -> Callable[[], None]:
    def work() -> None:
        for key in order:
            f = calls[key]
            jax.block_until_ready([f(*xs) for _ in range(k)])
            time.sleep(GAP_SECONDS)
    return work


def _first_trace(work: Callable[[], None]) -> list[trace.Event]:
    """The GPU events of a trace of `work()` that holds kernels. A trace without a GPU plane
    or without kernels is tried again: seen on an H100, one process's first trace in some
    runs held no GPU plane while its later ones did, and taking that as "no CUPTI" timed
    the whole process on the host clock. Only TRACE_TRIES such traces in a row mean it."""
    last = NoDeviceClock("no trace")
    for _ in range(TRACE_TRIES):
        try:
            events = _traced(work)
        except NoDeviceClock as err:
            last = err
            continue
        if not all(trace.is_memory_op(e.name) for e in events):
            return events
        last = NoDeviceClock("the trace's GPU plane holds no kernel (is CUPTI installed?)")
    raise NoDeviceClock(f"{last} ({TRACE_TRIES} traces in a row)", last.lasting)


def _kernel_names(b: Build) -> frozenset[str]:
    """The kernel functions `b`'s library defines (read, not loaded: only names are taken,
    so the bytes need no check here; the call that runs them checks them)."""
    try:
        with open(b.library, "rb") as f:
            return cubin.kernel_names(f.read(MAX_LIBRARY_BYTES))
    except OSError:
        return frozenset()


def _device_times(calls: dict[str, Any], xs: list[Any], alive: list[str], rng: np.random.Generator,
                  warmup: int, repeats: int, names: dict[str, frozenset[str]], max_rounds: int = 0
                  ) -> tuple[int, dict[str, list[float]], list[str]]:
    """(K, samples in seconds per candidate, notes) on the device clock; `names`: each
    candidate's kernel functions (its cubin's). At least `repeats` rounds after warm-up, then
    more, a trace at a time, until every median's spread has settled (`decide.settled`) or
    `max_rounds` rounds were run (0: `repeats`)."""
    for f in calls.values():  # compiled and warm before anything is traced
        jax.block_until_ready(f(*xs))
    events = _first_trace(_chains(calls, xs, alive, 1))
    try:
        own = trace.learn(events, alive, GAP_NS, names)
        one, _, _ = trace.chain_times(events, alive, own, 1, GAP_NS)
    except trace.TraceMismatch as err:
        raise NoDeviceClock(f"one call per candidate: {err}", lasting=False) from None
    # K from the first (the default) configuration: its chain's kernels last about TARGET_DEVICE_NS.
    k = int(min(MAX_DEVICE_K, max(1, round(TARGET_DEVICE_NS / max(one[0] or 1.0, 1.0)))))
    samples: dict[str, list[float]] = {key: [] for key in alive}
    notes: list[str] = []  # lost samples and why
    joined = 0  # chains split by a host stall and joined again (no sample lost)
    at, last = 0, warmup + max(repeats, max_rounds)
    gc.disable()  # a collection inside a chain could open a gap that splits it
    try:
        while at < last and not (at >= warmup + repeats and _settled(samples)):
            group = list(range(at, min(at + ROUNDS_PER_TRACE, last)))
            at += len(group)
            orders = [[str(x) for x in rng.permutation(alive)] for _ in group]
            order = [key for o in orders for key in o]
            try:
                traced = _traced(_chains(calls, xs, order, k))
                times, bad, n = trace.chain_times(traced, order, own, k, GAP_NS)
            except (trace.TraceMismatch, NoDeviceClock) as err:  # these rounds alone are lost
                notes.append(f"rounds {group[0]}-{group[-1]} dropped: {err}")
                continue
            notes += bad
            joined += n
            each = iter(times)
            for r, o in zip(group, orders):
                for key in o:
                    t = next(each)
                    if r >= warmup and t is not None:
                        samples[key].append(t * 1e-9)
    finally:
        gc.enable()
    short = [key for key, s in samples.items() if len(s) < max(1, repeats // 2)]
    if short:
        raise NoDeviceClock(f"too few device-clock samples for {len(short)} candidate(s): "
                            + "; ".join(notes[:3]), lasting=False)
    if joined:
        notes = notes[:9] + [f"{joined} chain(s) split by a host stall were joined again"]
    return k, samples, notes[:10]


def _settled(samples: Mapping[str, Sequence[float]]) -> bool:
    """Whether every candidate has samples and its median's spread has settled."""
    return all(samples.values()) and decide.settled({k: decide.timing(s) for k, s in samples.items()})


def sm_clock_mhz() -> float | None:
    """The SM clock of this process's GPU now (MHz), from nvidia-smi; None where it cannot
    be read (no nvidia-smi, a GPU it does not name by the visible index, a MIG slice). The
    index is nvidia-smi's (PCI order): on a host of mixed GPUs it may name another card than
    CUDA's ordering does; the record keeps the value as a reading, never a decision's input."""
    import subprocess

    idx = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                              "-i", idx], capture_output=True, text=True, timeout=10, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _host_times(fns: Mapping[str, Callable[..., Any]], xs: list[Any], alive: list[str], base: str,
                results: list[tuple[tuple[int, ...], str]], rng: np.random.Generator, warmup: int,
                repeats: int, max_rounds: int = 0) -> tuple[int, dict[str, list[float]]]:
    """(K, samples in seconds per candidate) on the host clock: 2K minus K calls in a loop;
    rounds as on the device clock (at least `repeats`, until settled, at most `max_rounds`)."""
    # K from the default configuration: a K-call loop lasts about TARGET_SECONDS.
    one = _looped(fns[base], 1, results)
    for _ in range(3):
        _time(one, xs)
    t1 = float(np.median([_time(one, xs) for _ in range(5)]))
    k = int(min(MAX_K, max(1, round(TARGET_SECONDS / max(t1, 1e-7)))))
    loops = {key: (_looped(fns[key], k, results), _looped(fns[key], 2 * k, results)) for key in alive}
    samples: dict[str, list[float]] = {key: [] for key in alive}
    r, last = 0, warmup + max(repeats, max_rounds)
    while r < last and not (r >= warmup + repeats and _settled(samples)):
        r += 1
        for key in rng.permutation(alive):
            f1, f2 = loops[key]
            if r % 2:
                a, b = _time(f2, xs), _time(f1, xs)
            else:
                b, a = _time(f1, xs), _time(f2, xs)
            if r > warmup:
                samples[key].append((a - b) / k)
    return k, samples


def main() -> None:
    job = json.loads(sys.stdin.read())
    item, exclude = PlanItem.parse(job["item"], "the measuring job", "item"), set(job.get("exclude", ()))
    store = StoreView(job["cache"])
    dev = jax.devices("gpu")[0]
    _emit(event="device", device=dev.device_kind, driver=str(getattr(dev.client, "platform_version", "")))
    fns: dict[str, KernelFn] = {}
    builds: dict[str, Build] = {}
    names: dict[str, frozenset[str]] = {}
    for c in item.candidates:
        if c.key in exclude:
            continue
        e = store.get(c.key)
        if e is None:
            raise SystemExit(f"entry {c.key[:12]} ({item.kernel}[{c.variant}]) is not in the cache")
        b = Build.of(e.meta, e.path)
        builds[c.key] = b
        names[c.key] = _kernel_names(b)
        fns[c.key] = KernelFn(item.kernel, [b], arch=item.arch)
    base = item.base
    default = builds[base]
    extent_names = [b.extent for b in item.buckets]
    sizes = dict(item.sizes)
    ranges = dict(item.inputs)
    repeats, warmup, seed = int(job["repeats"]), int(job["warmup"]), int(job["seed"])
    max_rounds = int(job.get("max_rounds", repeats))
    scalars = dict(item.scalars)
    rng = np.random.default_rng(seed)
    clock_off: str | None = None  # why the device clock is out for this process's buckets
    for bucket in job["buckets"]:
        text = bucket_text({n: bucket[n] for n in extent_names})
        extents = _extents(bucket, sizes)
        xs = _inputs(default, extents, ranges, seed + zlib.crc32(text.encode()))
        results = returned(default, extents)
        dtypes = [d for _, d in results]
        outs: dict[str, tuple[Any, ...]] = {}
        dropped: dict[str, str] = {}
        for key, fn in fns.items():
            _emit(event="start", key=key, bucket=text)
            try:
                o = fn(*xs, **scalars)
                o = o if isinstance(o, tuple) else (o,)
                jax.block_until_ready(o)
            except Exception as err:  # a fault: this process's CUDA context may be dead
                _emit(event="fault", key=key, bucket=text, error=f"{type(err).__name__}: {err}"[:500])
                sys.stdout.flush()
                os._exit(3)
            outs[key] = o
        for key in fns:
            if key != base:
                why = _agree(outs[base], outs[key], dtypes, item.rtol, item.atol)
                if why:
                    dropped[key] = why
        del outs  # the reference and the candidates' outputs (FA4's: tens of MB each) go
        _emit(event="checked", bucket=text)  # a crash from here on is no candidate's fault
        alive = [k for k in fns if k not in dropped]
        calls = {key: functools.partial(fns[key], **scalars) for key in alive}
        note = None
        clocks = [c for c in (sm_clock_mhz(),) if c is not None]
        if clock_off is None:
            try:
                k, samples, notes = _device_times({key: jax.jit(f) for key, f in calls.items()}, xs, alive,
                                                  rng, warmup, repeats, names, max_rounds)
                clock = "device"
            except NoDeviceClock as err:
                note = str(err)
                clock_off = note if err.lasting else None
        else:
            note = clock_off
        if note is not None:
            k, samples = _host_times(calls, xs, alive, base, results, rng, warmup, repeats, max_rounds)
            clock, notes = "host", []
        clocks += [c for c in (sm_clock_mhz(),) if c is not None]
        stats = {key: decide.timing([x * 1e6 for x in s]) for key, s in samples.items() if s}
        times = {key: [t.q1, t.median, t.q3] for key, t in stats.items()}
        _emit(event="bucket", bucket=text, k=k, times=times, dropped=dropped, clock=clock,
              spread={key: t.spread for key, t in stats.items()},
              samples={key: t.n for key, t in stats.items()},
              warmup=warmup, rounds=repeats, max_rounds=max_rounds, sm_clock_mhz=clocks,
              **({"clock_note": note} if note else {}), **({"notes": notes} if notes else {}))


if __name__ == "__main__":
    main()
