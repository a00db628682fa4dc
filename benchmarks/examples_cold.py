"""A fresh process to the first lowered call of every published example kernel: cutecc
against NVIDIA's `cutlass.jax.cutlass_call`, the DSL's file cache cold and warm.

    python -m benchmarks.examples_cold EXAMPLES_CACHE [--repeats 5] [--json PATH]

Needs the build and examples extras (the DSL, quack-kernels, flash-attn-4); no GPU: each
child lowers one `jax.jit` calling all five entries of examples/kernels.toml for CUDA
(`lowering_platforms=("cuda",)`), which is where `cutlass_call` compiles.
- cutecc: `import cutecc`, `cutecc.load(EXAMPLES_CACHE, arch="sm_90a")`, trace, lower. The
  calls are read off the loaded kernels (contracts, call keywords): the runtime only.
- cutlass_call: import the DSL and the kernel libraries, then per entry the launcher called
  in its own argument order by a `@cute.jit` adapter of cutlass_call's convention (stream,
  inputs, outputs) with the runtime scalars baked in as constants (cutlass_call has no
  runtime scalars): the adapter is the one cutecc generates from the manifest, so both
  sides compile the same launcher calls. quack's launchers need static shapes, so their
  tensors are static (`use_static_tensors`), FA4's dynamic. `cold`: the DSL's file cache
  off; `warm`: a private cache directory filled by one untimed run first.
Wall time is measured around each child; modes are interleaved repeat by repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "examples" / "kernels.toml"
# Symbolic extents at lowering (ragged on purpose); scalars as a caller would pass them.
SIZES = {"m": 1000, "b": 2, "s_q": 200, "s_k": 513, "h": 4}
SCALARS = {"eps": 1e-6, "ignore_index": -100, "softmax_scale": 0.08838834764831845}
# The forward kernels (five entries); the backward launches are not what a first call lowers.
KERNELS = ("fa4_fwd", "quack_cross_entropy", "quack_rmsnorm")


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else SIZES[d] for d in t.shape)


def _cutecc_fns(cache: str) -> tuple[list[Any], list[Any]]:
    import jax
    import jax.numpy as jnp

    import cutecc

    ks = cutecc.load(cache, arch="sm_90a")
    fns, specs = [], []
    for name in KERNELS:
        for b in ks[name].builds:
            kw = {s.name: SCALARS[s.name] for s in b.conv.scalars} | dict(b.call)
            fns.append(lambda *a, _k=ks[name], _kw=kw: _k(*a, **_kw))
            specs.append([jax.ShapeDtypeStruct(_shape(t), jnp.dtype(t.dtype)) for t in b.conv.inputs])
    return fns, specs


def _cutlass_call_fns() -> tuple[list[Any], list[Any]]:
    import dataclasses
    import importlib.util

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutecc.build.compiler import (
        _wrapper_file,
        closure_objects,
        resolve_entry,
        resolve_value,
        wrapper_source,
    )
    from cutecc.contract import dtypes
    from cutecc.contract.args import CallingConvention, ConstArg, ScalarArg, StructArg, TupleArg
    from cutecc.manifest import load_manifest

    m = load_manifest(MANIFEST)
    os.environ.update(m.env_for("sm_90a"))
    for p in reversed(m.python_path):
        sys.path.insert(0, str(p))
    import jax
    import jax.numpy as jnp
    from cutlass.jax import cutlass_call

    def bake(a: Any) -> Any:
        if isinstance(a, ScalarArg):
            return ConstArg({"dsl": f"cutlass.{dtypes.DTYPES[a.dtype].cutlass}", "value": SCALARS[a.name]},
                            a.param)
        if isinstance(a, TupleArg):
            return dataclasses.replace(a, items=tuple(bake(i) for i in a.items))
        if isinstance(a, StructArg):
            return dataclasses.replace(a, fields=tuple((k, bake(f)) for k, f in a.fields))
        return a

    fns, specs = [], []
    for k in (m.kernel(n) for n in KERNELS):
        for v in k.variants:
            args = tuple(bake(a) for a in v.args)
            conv = CallingConvention.of(args)
            src = _wrapper_file(wrapper_source(args))
            spec = importlib.util.spec_from_file_location(src.stem, src)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            values, types = closure_objects(args)
            adapter = mod.make(resolve_entry(k.entry, v.factory_args),
                               {n: resolve_value(x) for n, x in v.constants}, values, types)
            outs = [jax.ShapeDtypeStruct(_shape(t), jnp.dtype(t.dtype)) for t in conv.results]
            static = any(isinstance(d, int) for t in conv.inputs for d in t.shape) and "fa4" not in k.name
            fns.append(cutlass_call(adapter, output_shape_dtype=outs if len(outs) > 1 else outs[0],
                                    use_static_tensors=static))
            specs.append([jax.ShapeDtypeStruct(_shape(t), jnp.dtype(t.dtype)) for t in conv.inputs])
    return fns, specs


def child(mode: str, cache: str) -> dict[str, float]:
    t0 = time.perf_counter()
    import jax

    ph = {"import_jax": time.perf_counter() - t0}
    t = time.perf_counter()
    fns, specs = _cutecc_fns(cache) if mode == "cutecc" else _cutlass_call_fns()
    ph["load_or_import"] = time.perf_counter() - t

    def all_calls(*flat: Any) -> list[Any]:
        out, i = [], 0
        for f, s in zip(fns, specs):
            out.append(f(*flat[i:i + len(s)]))
            i += len(s)
        return out

    t = time.perf_counter()
    text = jax.jit(all_calls).trace(*[x for s in specs for x in s]).lower(
        lowering_platforms=("cuda",)).as_text()
    ph["trace_lower"] = time.perf_counter() - t
    ph["custom_calls"] = float(text.count("stablehlo.custom_call"))
    ph["after_import_jax"] = time.perf_counter() - t0 - ph["import_jax"]
    return ph


MODES = ("cutecc", "cutlass_call_cold", "cutlass_call_warm")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=("cutecc", "cutlass_call"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.cache)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-examples-cold-") as d:
        envs = {"cutecc": {},
                "cutlass_call_cold": {"CUTE_DSL_DISABLE_FILE_CACHING": "1", "CUTE_DSL_CACHE_DIR": f"{d}/off"},
                "cutlass_call_warm": {"CUTE_DSL_CACHE_DIR": f"{d}/warm"}}

        def run(mode: str) -> tuple[float, dict[str, float]]:
            kind = "cutecc" if mode == "cutecc" else "cutlass_call"
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "benchmarks.examples_cold", a.cache, "--child", kind],
                               capture_output=True, text=True, cwd=REPO, timeout=900,
                               env={**os.environ, **envs[mode]})
            wall = time.perf_counter() - t
            if r.returncode != 0:
                raise RuntimeError(f"{mode} child failed:\n{r.stderr[-3000:]}")
            return wall, json.loads(r.stdout.strip().splitlines()[-1])

        run("cutlass_call_warm")  # fill the warm mode's file cache, untimed
        res: dict[str, dict[str, list[float]]] = {m: {"wall": [], "after_import_jax": []} for m in MODES}
        for _ in range(a.repeats):
            for mode in MODES:
                wall, ph = run(mode)
                assert ph["custom_calls"] >= 5, (mode, ph)
                res[mode]["wall"].append(wall)
                res[mode]["after_import_jax"].append(ph["after_import_jax"])
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in res.items()}
    print("| mode | whole process (median) | after `import jax` (median) | / cutecc, after import jax |")
    print("| --- | --- | --- | --- |")
    for m in MODES:
        ratio = med[m]["after_import_jax"] / med["cutecc"]["after_import_jax"]
        print(f"| {m} | {med[m]['wall']:.2f} s | {med[m]['after_import_jax']:.2f} s | {ratio:.1f}x |")
    if a.json:
        a.json.write_text(json.dumps({"samples": res, "medians": med, "repeats": a.repeats}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
