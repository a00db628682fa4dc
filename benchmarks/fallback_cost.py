"""What a declared fallback costs a call it does not serve (issue 33): a call a build fits,
with `fallback = ...` declared and without, eagerly and under `jax.jit`.

    python -m benchmarks.fallback_cost CACHE [--json PATH] [--repeats N] [--cpu]

CACHE holds the root kernels.toml's build (tests/gpu/prepare.sh's `root/`); `mul` f32 is
loaded twice from it, once as built and once with a fallback attached as the loader attaches
a declared one (`cutecc.runtime.fallback.Fallback`, never imported: no call misses). The
two are measured interleaved, repeat by repeat (`common.summary`: median, min - max).

CPU part (always; `--cpu` runs only it, with `CUTECC_ARCH`, else sm_90a): the time to trace
and lower a fresh `jax.jit` of one call for the GPU (where the fallback check runs: once
per trace), and whether the two lowered programs are the same text. Device part (a GPU):
the host time per call of n = 256 floats (dispatch-bound), 1,000 calls back to back then
one wait, eagerly (`ks.mul(x, y)`: one cached jit per signature) and inside a `jax.jit`.
Goal: no measurable change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CALLS = 1000  # calls per timed sample of the device part


def mul_reference(x: Any, y: Any) -> Any:
    """`mul`'s calling convention in jnp (never called here: every call fits a build)."""
    return x * y


def kernel_sets(cache: Path, arch: str | None) -> dict[str, Any]:
    """{"plain": mul as built, "fallback": mul with a declared fallback attached}."""
    import cutecc
    from cutecc.contract.fallbacks import FallbackRef
    from cutecc.runtime.fallback import Fallback

    plain = cutecc.load(cache, arch=arch).mul
    declared = cutecc.load(cache, arch=arch).mul
    declared._fallback = Fallback("mul", FallbackRef("benchmarks.fallback_cost:mul_reference", "0" * 64),
                                  arch=declared.arch, check_digest=False, strict=False, misses_root=None)
    return {"plain": plain, "fallback": declared}


def lower_times(kernels: dict[str, Any], repeats: int) -> tuple[dict[str, list[float]], bool]:
    """Seconds to trace and lower a fresh jit of one call, per mode; and whether both modes
    lower to the same program."""
    import jax
    import jax.numpy as jnp

    spec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    out: dict[str, list[float]] = {m: [] for m in kernels}
    texts: dict[str, str] = {}
    for _ in range(repeats):
        for mode, k in kernels.items():
            t0 = time.perf_counter()
            text = jax.jit(lambda x, y, k=k: k(x, y)).trace(spec, spec).lower(
                lowering_platforms=("cuda",)).as_text()
            out[mode].append(time.perf_counter() - t0)
            texts[mode] = text
    return out, texts["plain"] == texts["fallback"]


def call_times(kernels: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Host seconds per call on the GPU, eager and under jit, per mode."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.asarray(np.random.default_rng(0).standard_normal(256, dtype=np.float32))
    y = jnp.asarray(np.random.default_rng(1).standard_normal(256, dtype=np.float32))
    fns = {}
    for mode, k in kernels.items():
        fns[f"eager {mode}"] = k

        def unrolled(x: Any, y: Any, k: Any = k) -> Any:
            for _ in range(10):
                x = k(x, y)
            return x

        fns[f"jit {mode}"] = jax.jit(unrolled)
    for f in fns.values():  # compile and warm
        np.testing.assert_allclose(np.asarray(f(x, y)), np.asarray(f(x, y)))
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            per = 10 if name.startswith("jit") else 1
            t0 = time.perf_counter()
            for _ in range(CALLS // per):
                r = f(x, y)
            r.block_until_ready()
            out[name].append((time.perf_counter() - t0) / CALLS)
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import machine, summary

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--cpu", action="store_true", help="the CPU part only (lowering for sm_90a)")
    a = ap.parse_args(argv)
    import jax

    gpu = not a.cpu and bool([d for d in jax.devices() if d.platform == "gpu"])
    arch = None if gpu else (os.environ.get("CUTECC_ARCH") or "sm_90a")
    kernels = kernel_sets(a.cache, arch)
    rows: dict[str, Any] = {}
    lowered, same = lower_times(kernels, a.repeats)
    for mode, xs in lowered.items():
        rows[f"trace+lower {mode}"] = {**summary(xs), "unit": "s"}
    if gpu:
        for name, xs in call_times(kernels, a.repeats).items():
            rows[f"call {name}"] = {**summary(xs), "unit": "s/call"}
    print(f"same lowered program with and without a fallback: {same}")
    for name, r in rows.items():
        scale = 1e6 if r["unit"] == "s/call" else 1e3
        unit = "us/call" if r["unit"] == "s/call" else "ms"
        lo, hi = r["min"] * scale, r["max"] * scale
        print(f"{name:32} {r['median'] * scale:9.3f} {unit}  ({lo:.3f} - {hi:.3f})")
    for what in ("trace+lower", "call eager", "call jit"):
        if f"{what} plain" in rows:
            ratio = rows[f"{what} fallback"]["median"] / rows[f"{what} plain"]["median"]
            print(f"{what}: with a fallback declared / without = {ratio:.3f}")
    if a.json:
        a.json.write_text(json.dumps({"machine": machine(), "gpu": gpu, "same_program": same,
                                      "rows": rows}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
