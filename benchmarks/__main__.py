"""`python -m benchmarks`: run every group this machine can run, print a table, write JSON.

    python -m benchmarks [--quick] [--only cold_start,load_scaling,build,sizes,device,parity]
                         [--repeats N] [--json PATH] [--cache-dir DIR] [--variants N]

Groups: cold_start, load_scaling, build, sizes, device (GPU only; benchmarks/device.py), parity,
and distributed (benchmarks/distributed.py: ~20 minutes, so only when named in --only).
Every figure is a median over repeats with min/max (the JSON also has quartiles and the
raw samples); every ratio compares medians taken in the same run. The example cache
(kernels.toml built for sm_90a) is built once into a temporary directory, outside any
timing, unless --cache-dir names a prebuilt one.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, GroupResult, Row, dsl_available, machine, run_child, table

GROUPS = ("cold_start", "load_scaling", "build", "sizes", "device", "parity", "distributed")
DEFAULT_GROUPS = tuple(g for g in GROUPS if g != "distributed")


def build_example_cache(root: Path) -> Path:
    cache = root / "example-cache"
    _, rep = run_child(["-m", "cutecc.cli", "build", str(REPO / "kernels.toml"), "--cache-dir",
                        str(cache), "--arch", "sm_90a", "--no-lock", "--json"])
    assert rep["failed"] == 0, rep
    return cache


def run_device(cache: Path, quick: bool, root: Path) -> GroupResult:
    out = root / "device.json"
    args = ["benchmarks/device.py", str(cache), "--json", str(out)] + (["--quick"] if quick else [])
    _, _ = run_child(args)
    data = json.loads(out.read_text())
    res = GroupResult(data=data)
    if "skipped" in data:
        _, dry = run_child(["benchmarks/device.py", str(cache), "--dry-run", "--json", str(out)])
        data = json.loads(out.read_text())
        res.skipped = (f"skipped: no GPU visible to JAX (device.py --dry-run lowered "
                       f"{data['lowered']} functions for sm_90a)")
        return res
    for who, r in data["cold_start"].items():
        res.rows.append(Row("device", f"cold start to first correct result, {who}", "s",
                            stats=r["wall_s"]))
    for name, r in data["dispatch"].items():
        res.rows.append(Row("device", f"dispatch {name}", "us/call", value=r["us_per_call"]))
    for name, r in data["kernels"].items():
        if name != "copy_ceiling_GBs":
            res.rows.append(Row("device", f"{name}: cutecc / jnp time", "x",
                                value=r["cutecc_over_jnp_time"],
                                note=f"{r['cutecc']['GBs']:.0f} GB/s, "
                                     f"{r['cutecc']['of_ceiling']:.0%} of measured copy"))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    ap.add_argument("--only", default=",".join(DEFAULT_GROUPS), help="comma-separated groups")
    ap.add_argument("--repeats", type=int, default=None,
                    help="repeats per figure (default 5, --quick 2); cold builds use 1 unless set")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / f"results-{platform.node()}.json")
    ap.add_argument("--cache-dir", type=Path, default=None, help="a prebuilt example cache")
    ap.add_argument("--variants", type=int, default=None,
                    help="the sizes group's generated manifest (default 1000, --quick 100)")
    ns = ap.parse_args()
    only = [g.strip() for g in ns.only.split(",") if g.strip()]
    bad = [g for g in only if g not in GROUPS]
    if bad:
        ap.error(f"unknown group(s) {', '.join(bad)}; groups: {', '.join(GROUPS)}")
    repeats = ns.repeats or (2 if ns.quick else 5)
    cold_repeats = ns.repeats or 1
    results: dict[str, GroupResult] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cutecc-bench-") as d:
        root = Path(d)
        needs_cache = {"cold_start", "load_scaling", "sizes", "device", "parity"} & set(only)
        cache = ns.cache_dir
        if needs_cache and cache is None:
            if not dsl_available():
                print("no --cache-dir and no DSL to build one: only `build` could run", file=sys.stderr)
                return 2
            cache = build_example_cache(root)
        for g in only:
            print(f"== {g}", file=sys.stderr, flush=True)
            if g == "cold_start":
                from benchmarks import cold_start
                results[g] = cold_start.run(cache, repeats)
            elif g == "load_scaling":
                from benchmarks import load_scaling
                results[g] = load_scaling.run(cache, repeats)
            elif g == "build":
                from benchmarks import build
                results[g] = build.run(repeats, cold_repeats)
            elif g == "sizes":
                from benchmarks import sizes
                results[g] = sizes.run(cache, root, ns.variants or (100 if ns.quick else 1000))
            elif g == "device":
                results[g] = run_device(cache, ns.quick, root)
            elif g == "distributed":
                from benchmarks import distributed
                results[g] = distributed.run(variants=200 if ns.quick else 1000,
                                             noop_variants=1000 if ns.quick else 10000)
            elif g == "parity":
                from benchmarks import parity
                results[g] = parity.run(cache)
    rows = [r for g in only for r in results[g].rows]
    rows += [Row(g, results[g].skipped or "", "") for g in only if results[g].skipped]
    print(table(rows))
    doc = {"machine": machine(), "repeats": repeats, "cold_build_repeats": cold_repeats,
           "quick": ns.quick, "seconds": round(time.perf_counter() - t0, 1),
           "rows": [r.to_json() for r in rows],
           "groups": {g: {"skipped": results[g].skipped, "data": results[g].data} for g in only}}
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nwrote {ns.json} ({doc['seconds']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
