"""Build-time tuning on the device (issue 13): per bucket, the default against the winner,
the tuning cost split into compile seconds (CPU) and benchmark seconds (GPU), and a second,
separate measurement checking each recorded winner is within 2% of the best candidate.

On a CPU host with the build extra (the cache travels to the GPU host):
    cutecc build --cache-dir C && cutecc tune --compile-only --cache-dir C
On the GPU host (runtime only):
    python -m benchmarks.tune --cache-dir C [--manifest M] [--kernel K ...] --json OUT.json

Compile seconds are the candidates' recorded `build_seconds` (each entry's metadata says
how long its compile took on the CPU host); benchmark seconds are each measuring run's
wall time on the GPU. Neither run writes the lock (`--no-lock`): record the first run's
results with `cutecc tune --record` where the lock is committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import REPO


def compile_seconds(cache: Path, plan: list[dict[str, Any]]) -> dict[str, float]:
    """Per kernel, the CPU seconds its candidates took to compile (from entry metadata)."""
    from cutecc.store import Store

    store, out = Store(cache), {}
    for it in plan:
        for c in it["candidates"]:
            e = store.get(c["key"])
            secs = float((e.meta if e else {}).get("build_seconds", 0))
            out[it["kernel"]] = out.get(it["kernel"], 0.0) + secs
    return {k: round(v, 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tune")
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--manifest", type=Path, default=REPO / "kernels.toml")
    ap.add_argument("--kernel", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    from cutecc.commands.tune import tune

    kw = {"kernels": tuple(a.kernel), "cache_dir": a.cache_dir, "lock": False, "repeats": a.repeats}
    first = tune(a.manifest, measure=True, seed=1, **kw)
    second = tune(a.manifest, measure=True, seed=2, **kw)
    again = {(r["kernel"], r["variant"], r["arch"], r["bucket"]): r for r in second.records}
    rows = []
    for r in first.records:
        s = again.get((r["kernel"], r["variant"], r["arch"], r["bucket"]))
        best = min(t[1] for t in s["times_us"].values()) if s else None
        w2 = s["times_us"].get(r["winner_variant"], [None, None])[1] if s else None
        rows.append({"kernel": r["kernel"], "variant": r["variant"], "bucket": r["bucket"],
                     "default_us": r["default_us"], "winner": r["winner_variant"],
                     "winner_us": r["winner_us"],
                     "gain": round(r["default_us"] / r["winner_us"], 3) if r["winner_us"] else None,
                     "dropped": r["dropped"], "rerun_winner_us": w2, "rerun_best_us": best,
                     "within_2pct": bool(w2 is not None and best is not None and w2 <= best * 1.02)})
    out = {"device": first.info.get("device"), "driver": first.info.get("driver"),
           "compile_seconds_cpu": compile_seconds(a.cache_dir, first.plan),
           "bench_seconds_gpu": [first.info.get("bench_seconds"), second.info.get("bench_seconds")],
           "failed": first.failed + second.failed, "rows": rows}
    print(f"{'kernel':8} {'variant':22} {'bucket':12} {'default us':>10} {'winner':30} {'us':>8} "
          f"{'gain':>6} {'rerun ok':>8}")
    for x in rows:
        print(f"{x['kernel']:8} {x['variant']:22} {x['bucket']:12} {x['default_us']:10.2f} {x['winner']:30} "
              f"{x['winner_us']:8.2f} {x['gain'] or 0:6.2f} {str(x['within_2pct']):>8}")
    print(f"compile seconds (CPU): {out['compile_seconds_cpu']}; benchmark seconds (GPU): "
          f"{out['bench_seconds_gpu']} on {out['device']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
