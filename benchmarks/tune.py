"""Build-time tuning on the device (issue 13): per bucket, the default against the winner,
the tuning cost split into compile seconds (CPU) and benchmark seconds (GPU), and a second,
separate measurement checking each recorded winner is within 2% of the best candidate, and
whether both runs recorded the same winner per bucket or named the bucket within the noise
(`cutecc.tuning.decide`; issue 37).

On a CPU host with the build extra (the caches travel to the GPU host):
    bash tests/gpu/prepare.sh CACHES --examples    # CACHES/tune and CACHES/examples
On the GPU host (runtime only: no DSL, no kernel libraries):
    python -m benchmarks.tune --cache-dir CACHES/tune --examples-cache CACHES/examples \
        --json OUT/tune.json --markdown OUT/tune.md

`--cache-dir` measures the root kernels.toml's spaces (mul, rmsnorm), `--examples-cache`
examples/kernels.toml's (FA4's Hopper forward); either may be left out. Compile seconds
are the candidates' recorded `build_seconds` (each entry's metadata says how long its
compile took on the CPU host, in the prepare step); benchmark seconds are each measuring
run's wall time on the GPU. Neither run writes a lock (`lock=False`): record the first
run's results with `cutecc tune --record` where the lock is committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import REPO


def compile_seconds(cache: Path, plan: list[Any]) -> dict[str, float]:
    """Per kernel, the CPU seconds its candidates took to compile (from entry metadata);
    `plan` is the tuning plan's items (`cutecc.plan.tuning_plan.PlanItem`)."""
    from cutecc.store import Store

    store, out = Store(cache), {}
    for it in plan:
        for c in it.candidates:
            e = store.get(c.key)
            secs = float((e.doc if e else {}).get("build_seconds", 0))
            out[it.kernel] = out.get(it.kernel, 0.0) + secs
    return {k: round(v, 2) for k, v in out.items()}


def _bucket_order(text: str) -> tuple[int, ...]:
    from cutecc.contract.buckets import parse_bucket

    return tuple(parse_bucket(text).values())


def rows_of(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per bucket: the first run's default and winner, and the winner's and the best
    candidate's medians in the second run (within 2%: the winner is at most 2% slower)."""
    again = {(r["kernel"], r["variant"], r["arch"], r["bucket"]): r for r in second}
    rows = []
    for r in first:
        s = again.get((r["kernel"], r["variant"], r["arch"], r["bucket"]))
        best = min(t[1] for t in s["times_us"].values()) if s else None
        w2 = s["times_us"].get(r["winner_variant"], [None, None])[1] if s else None
        rows.append({"kernel": r["kernel"], "variant": r["variant"], "bucket": r["bucket"],
                     "clock": r.get("clock", "host"), "candidates": len(r["times_us"]),
                     "default_us": r["default_us"], "winner": r["winner_variant"],
                     "winner_us": r["winner_us"],
                     "gain": round(r["default_us"] / r["winner_us"], 3) if r["winner_us"] else None,
                     "dropped": r["dropped"], "rerun_winner_us": w2, "rerun_best_us": best,
                     "rerun_clock": s.get("clock", "host") if s else None,
                     "within_2pct": bool(w2 is not None and best is not None and w2 <= best * 1.02),
                     # Stable (issue 37): both runs recorded the same winner, or one named the
                     # bucket's decision within the noise.
                     "same_winner": bool(s and s["winner_variant"] == r["winner_variant"]),
                     "within_noise": sorted({*r.get("within_noise", []),
                                             *(s or {}).get("within_noise", [])})})
    rows.sort(key=lambda x: (x["kernel"], x["variant"], _bucket_order(x["bucket"])))
    return rows


def markdown(out: dict[str, Any]) -> str:
    """The table for benchmarks/README.md, with the costs and the 2% count under it."""
    lines = ["| kernel | variant | bucket | default us | winner | winner us | gain | "
             "2nd run: winner / best us | within 2% |", "| --- " * 9 + "|"]
    for x in out["rows"]:
        base = x["variant"]
        win = "default" if x["winner"] == base else x["winner"].removeprefix(base + ",")
        again = (f"{x['rerun_winner_us']:.2f} / {x['rerun_best_us']:.2f}"
                 if x["rerun_winner_us"] is not None else "-")
        lines.append(f"| {x['kernel']} | {base} | {x['bucket']} | {x['default_us']:.2f} | {win} | "
                     f"{x['winner_us']:.2f} | {x['gain'] or 0:.2f}x | {again} | "
                     f"{'yes' if x['within_2pct'] else 'no'} |")
    n, ok = len(out["rows"]), sum(x["within_2pct"] for x in out["rows"])
    clocks = sorted({x["clock"] for x in out["rows"]} | {x["rerun_clock"] or "-" for x in out["rows"]})
    lines.append("")
    same = sum(x.get("same_winner", False) for x in out["rows"])
    named = [f"{x['kernel']}[{x['variant']}] {x['bucket']}" for x in out["rows"]
             if not x.get("same_winner") and x.get("within_noise")]
    unexplained = [f"{x['kernel']}[{x['variant']}] {x['bucket']}" for x in out["rows"]
                   if not x.get("same_winner") and not x.get("within_noise")]
    lines.append(f"{same} of {n} buckets recorded the same winner in both runs; differing within the noise: "
                 f"{', '.join(named) or 'none'}; differing beyond it: {', '.join(unexplained) or 'none'}")
    lines.append(f"{ok} of {n} winners within 2% of the second run's best; clock: {', '.join(clocks)}; "
                 f"on {out['device']} ({out['driver']}).")
    for run in out["runs"]:
        b1, b2 = run["bench_seconds_gpu"]
        lines.append(f"- {run['manifest']}: compile {run['compile_seconds_cpu']} s of CPU (prepare step, "
                     f"per kernel); benchmark {b1} s and {b2} s of GPU wall time for the two runs")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tune")
    ap.add_argument("--cache-dir", type=Path, default=None, help="the root kernels.toml's tune cache")
    ap.add_argument("--manifest", type=Path, default=REPO / "kernels.toml")
    ap.add_argument("--examples-cache", type=Path, default=None,
                    help="a cache with examples/kernels.toml built and its candidates compiled")
    ap.add_argument("--kernel", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    a = ap.parse_args(argv)
    examples = REPO / "examples" / "kernels.toml"
    # The examples first: the smaller run (8 buckets), so a run cut short still has FA4's.
    targets = [(m, c) for m, c in ((examples, a.examples_cache), (a.manifest, a.cache_dir)) if c is not None]
    if not targets:
        ap.error("give --cache-dir, --examples-cache or both")
    from cutecc.commands.tune import tune
    from cutecc.settings import BuildOptions

    out: dict[str, Any] = {"device": None, "driver": None, "repeats": a.repeats, "runs": [], "rows": [],
                           "failed": []}
    for manifest, cache in targets:
        names = tuple(a.kernel) if manifest == a.manifest else ()
        kw = {"kernels": names, "lock": False, "repeats": a.repeats}
        told = BuildOptions.from_environment(cache_dir=cache)
        first = tune(manifest, told, measure=True, seed=1, **kw)
        second = tune(manifest, told, measure=True, seed=2, **kw)
        out["device"], out["driver"] = first.info.get("device"), first.info.get("driver")
        out["runs"].append({"manifest": str(manifest.relative_to(REPO)) if manifest.is_relative_to(REPO)
                            else str(manifest),
                            "compile_seconds_cpu": compile_seconds(cache, first.plan),
                            "bench_seconds_gpu": [first.info.get("bench_seconds"),
                                                  second.info.get("bench_seconds")]})
        out["rows"] += rows_of([r.to_json() for r in first.records], [r.to_json() for r in second.records])
        out["failed"] += first.failed + second.failed
        _write(a.json, a.markdown, out)  # after each manifest: a run cut short keeps what it measured
    print(markdown(out))
    return 1 if out["failed"] else 0


def _write(json_path: Path | None, md_path: Path | None, out: dict[str, Any]) -> None:
    for path, text in ((json_path, json.dumps(out, indent=1)), (md_path, markdown(out))):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
