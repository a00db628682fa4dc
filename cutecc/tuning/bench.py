"""The measuring child of `cutecc tune` (`python -m cutecc.tuning.bench`), run on a GPU.

Reads one job (a plan item, its buckets, the candidates to leave out) as JSON on stdin and
writes JSON lines: the device, `start` before each candidate is first run (so the parent
knows which one a crash killed), one `bucket` result per bucket, or `fault` and exit 3 when
a candidate raised (a faulted CUDA context is dead: the parent starts a fresh child without
it). Uses the cache and the runtime only: no DSL, no CUDA toolkit, nothing of the build side.

Per bucket: fresh random inputs (seeded per bucket), the default configuration's outputs as
the reference, each candidate checked against them (disagreeing ones are dropped), then the
survivors timed in interleaved, shuffled rounds after warm-up rounds. A sample is the time of
2K calls minus the time of K calls inside one jitted loop (each call's inputs pass through an
optimization barrier with the previous outputs, so XLA neither merges nor hoists the calls),
divided by K: the fixed cost of a dispatch and a synchronisation cancels out.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cutecc.runtime.dispatch import Build, KernelFn
from cutecc.store import Store

TARGET_SECONDS = 2e-3  # a K-call loop lasts about this long
MAX_K = 4096
_TOL = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2),
        "bfloat16": (2e-2, 2e-2)}


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _inputs(build: Build, extents: dict[str, int], ranges: dict[str, list[float]], seed: int) -> list[Any]:
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
        elif lo is not None:
            a = rng.uniform(lo, hi, shape).astype(np.float32)
        else:
            a = rng.standard_normal(shape, dtype=np.float32)
        out.append(jnp.asarray(a, dtype=t.dtype))
    return out


def _agree(ref: tuple[Any, ...], got: tuple[Any, ...], dtypes: list[str], rtol: float | None,
           atol: float | None) -> str | None:
    for i, (r, g, dt) in enumerate(zip(ref, got, dtypes)):
        r64, g64 = np.asarray(r).astype(np.float64), np.asarray(g).astype(np.float64)
        rt, at = _TOL.get(dt, (0.0, 0.0))
        rt, at = rtol if rtol is not None else rt, atol if atol is not None else at
        if not np.allclose(g64, r64, rtol=rt, atol=at, equal_nan=True):
            err = float(np.nanmax(np.abs(g64 - r64)))
            return f"disagrees with the default configuration: result {i} max |diff| {err:.3g} " \
                   f"(rtol {rt}, atol {at})"
    return None


def _looped(fn: KernelFn, k: int, results: list[tuple[tuple[int, ...], str]]) -> Any:
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


def main() -> None:
    job = json.loads(sys.stdin.read())
    item, exclude = job["item"], set(job.get("exclude", ()))
    store = Store(job["cache"])
    dev = jax.devices("gpu")[0]
    _emit(event="device", device=dev.device_kind, driver=str(getattr(dev.client, "platform_version", "")))
    fns: dict[str, KernelFn] = {}
    builds: dict[str, Build] = {}
    for c in item["candidates"]:
        if c["key"] in exclude:
            continue
        e = store.get(c["key"])
        if e is None:
            raise SystemExit(f"entry {c['key'][:12]} ({item['kernel']}[{c['variant']}]) is not in the cache")
        b = Build.from_meta(c["key"], e.path, e.meta)
        builds[c["key"]] = b
        fns[c["key"]] = KernelFn(item["kernel"], [b], arch=item["arch"])
    base = item["base"]
    default = builds[base]
    names = [b["extent"] for b in item["buckets"]]
    sizes = dict(item.get("sizes") or {})
    ranges = dict(item.get("inputs") or {})
    repeats, warmup, seed = int(job["repeats"]), int(job["warmup"]), int(job["seed"])
    rng = np.random.default_rng(seed)
    for bucket in job["buckets"]:
        text = ",".join(f"{n}={bucket[n]}" for n in names)
        extents = {**sizes, **bucket}
        xs = _inputs(default, extents, ranges, seed + zlib.crc32(text.encode()))
        results = [(tuple(d if isinstance(d, int) else extents[d] for d in t.extents), t.dtype)
                   for t in default.conv.results]
        dtypes = [t.dtype for t in default.conv.results]
        outs: dict[str, tuple[Any, ...]] = {}
        dropped: dict[str, str] = {}
        for key, fn in fns.items():
            _emit(event="start", key=key, bucket=text)
            try:
                o = fn(*xs)
                o = o if isinstance(o, tuple) else (o,)
                jax.block_until_ready(o)
            except Exception as err:  # a fault: this process's CUDA context may be dead
                _emit(event="fault", key=key, bucket=text, error=f"{type(err).__name__}: {err}"[:500])
                sys.stdout.flush()
                os._exit(3)
            outs[key] = o
        for key in fns:
            if key != base:
                why = _agree(outs[base], outs[key], dtypes, item.get("rtol"), item.get("atol"))
                if why:
                    dropped[key] = why
        _emit(event="checked", bucket=text)  # a crash from here on is no candidate's fault
        alive = [k for k in fns if k not in dropped]
        # K from the default configuration: a K-call loop lasts about TARGET_SECONDS.
        one = _looped(fns[base], 1, results)
        for _ in range(3):
            _time(one, xs)
        t1 = float(np.median([_time(one, xs) for _ in range(5)]))
        k = int(min(MAX_K, max(1, round(TARGET_SECONDS / max(t1, 1e-7)))))
        loops = {key: (_looped(fns[key], k, results), _looped(fns[key], 2 * k, results)) for key in alive}
        samples: dict[str, list[float]] = {key: [] for key in alive}
        for r in range(warmup + repeats):
            for key in rng.permutation(alive):
                f1, f2 = loops[key]
                if r % 2:
                    a, b = _time(f2, xs), _time(f1, xs)
                else:
                    b, a = _time(f1, xs), _time(f2, xs)
                if r >= warmup:
                    samples[key].append((a - b) / k)
        times = {key: [float(np.percentile(s, q)) * 1e6 for q in (25, 50, 75)] for key, s in samples.items()}
        _emit(event="bucket", bucket=text, k=k, times=times, dropped=dropped)


if __name__ == "__main__":
    main()
