"""FA4's three-launch backward composite called with a live `dout`: the current form (the
postprocess writes a fresh dq, sized by q passed `extents_only`) against the old one (dq
written over dout, `role = "inout"`, as examples/kernels.toml declared it up to 1518079),
on the device clock (GPU; issue 48, item 8).

    python -m benchmarks.composite_copy build OLD_CACHE            # build host, with the DSL
    python -m benchmarks.composite_copy device NEW_CACHE OLD_CACHE [--json PATH] [--quick]
    python -m benchmarks.composite_copy dry-run NEW_CACHE OLD_CACHE  # no GPU: lowered only

`build` derives the old form from examples/kernels.toml (the postprocess's dout inout and
the composite's outputs ["dout", "dk", "dv"], nothing else changed) and builds its
backward kernels into OLD_CACHE (the preprocess and main launches are the same entries as
the examples'). `device` calls each form under one `jax.jit` whose arguments are not
donated (so dout stays the caller's: live), B4 S4096 H16 D128 bf16, causal and not;
checks that both give the same dq, dk, dv (up to the order of dq's fp32 atomic sums: REL;
bit for bit, reported) and leave dout as it was; lists the optimized HLO's copies and, in
one CUPTI trace (`jax.profiler`, runs interleaved), every device activity of a call with
its median time. It fails when the current form has a copy
(in its HLO or among its device activities) or its results differ from the old form's.
`dry-run` lowers both forms for the GPU on any host and fails when the current form's
postprocess writes over an input (an `output_operand_aliases` XLA would copy for).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXAMPLES = REPO / "examples" / "kernels.toml"
SHAPE = (4, 4096, 16, 128)  # b, s, h, d
ROUNDS = 20
# What a copy looks like among the device's activities: XLA's copy kernels (copy_fusion,
# wrapped_copy, input_copy_fusion) or a driver memcpy (MemcpyD2D); not a kernel that merely
# mentions a copy deep in its mangled name.
COPY = re.compile(r"^(?:[a-z]+_){0,2}copy|memcpy", re.IGNORECASE)
# dq is accumulated with fp32 atomics (FA4's non-deterministic mode), so two runs may round
# a few of its bf16 elements differently: the forms must agree to this relative error
# (||a - b|| / ||b||, per result; a wrong one is off by O(1)); whether they agree bit for bit
# is reported.
REL = 1e-2

# The current form's postprocess arguments and composite outputs, and the old form's.
NEW_POST = ('  { name = "q", extents_only = true, dtype = "$dtype", shape = ["b", "s_q", "h", "$d"], '
            'runtime = [3], stride = ["ob", "os", "oh", 1] },\n'
            '  { name = "dq", role = "output", dtype = "$dtype", shape = ["b", "s_q", "h", "$d"], '
            'runtime = [3], stride = ["ob", "os", "oh", 1] },\n')
OLD_POST = ('  { name = "dout", role = "inout", dtype = "$dtype", shape = ["b", "s_q", "h", "$d"], '
            'runtime = [3], stride = ["ob", "os", "oh", 1] },\n')
NEW_OUT, OLD_OUT = 'outputs = ["dq", "dk", "dv"]\n', 'outputs = ["dout", "dk", "dv"]\n'


def old_manifest_text(text: str) -> str:
    """examples/kernels.toml with FA4's backward in its old form (an error if the current
    form is not there word for word: then this benchmark must follow the manifest)."""
    for new in (NEW_POST, NEW_OUT):
        if text.count(new) != 1:
            raise SystemExit(f"examples/kernels.toml no longer declares {new.strip()[:60]!r} once: "
                             "update benchmarks/composite_copy.py")
    return text.replace(NEW_POST, OLD_POST).replace(NEW_OUT, OLD_OUT)


def build(cache: Path) -> dict[str, Any]:
    """The old form's backward built into `cache`, from a manifest written beside the
    examples' (its relative paths hold) and removed after."""
    tmp = EXAMPLES.with_name(".kernels-fa4-bwd-inout.toml")
    tmp.write_text(old_manifest_text(EXAMPLES.read_text()))
    try:
        cmd = [sys.executable, "-m", "cutecc.cli", "build", str(tmp), "--cache-dir", str(cache), "--no-lock",
               "--kernel", "fa4_bwd"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout + r.stderr)
        if r.returncode:
            raise SystemExit(r.returncode)
    finally:
        tmp.unlink()
    return {"cache": str(cache)}


def hlo_copies(hlo: str) -> list[str]:
    """The optimized HLO's instructions that copy (a `copy`, `copy-start`, or a fusion XLA
    named after one), metadata left out."""
    return [ln.strip()[:160] for ln in hlo.splitlines()
            if " = " in ln and "copy" in ln.split("metadata=")[0].lower()]


def device(new_cache: Path, old_cache: Path, rounds: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import cutecc
    from benchmarks import gputrace

    forms = {"extents_only (current)": cutecc.load(new_cache, arch="sm_90a"),
             "inout (1518079)": cutecc.load(old_cache, arch="sm_90a")}
    b, s, h, d = SHAPE
    scale = 1 / d ** 0.5
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v, out, dout = (jax.random.normal(kk, SHAPE, jnp.float32).astype(jnp.bfloat16) for kk in keys)
    lse = jax.random.normal(jax.random.PRNGKey(1), (b, h, s), jnp.float32) + 8.0
    dout_before = np.asarray(dout.astype(jnp.float32))
    res: dict[str, Any] = {"shape": {"b": b, "s": s, "h": h, "d": d}, "cases": {}}
    failures: list[str] = []
    for causal in (False, True):
        fns = {name: jax.jit(lambda *a, ks=ks, c=causal: ks.fa4_bwd(*a, softmax_scale=scale, causal=c))
               for name, ks in forms.items()}
        args = (q, k, v, out, lse, dout)
        rows: dict[str, Any] = {}
        got = {}
        for name, fn in fns.items():
            got[name] = [np.asarray(x.astype(jnp.float32)) for x in jax.block_until_ready(fn(*args))]
            rows[name] = {"hlo_copies": hlo_copies(fn.lower(*args).compile().as_text() or "")}
        ref, new = got["inout (1518079)"], got["extents_only (current)"]
        rel = [float(np.linalg.norm(a - r) / np.linalg.norm(r)) for a, r in zip(new, ref)]
        bitwise = [bool(np.array_equal(a, r)) for a, r in zip(new, ref)]
        same = all(x <= REL for x in rel)
        kept = bool(np.array_equal(np.asarray(dout.astype(jnp.float32)), dout_before))
        runs = [(name, (lambda f=fn, a=args: jax.block_until_ready(f(*a))))
                for _ in range(rounds) for name, fn in fns.items()]
        traced = gputrace.trace(runs, lambda: None)
        for name, row in rows.items():
            mine = [t for t in traced if t.label == name]
            per: dict[str, list[float]] = {}
            for t in mine:
                tot: dict[str, float] = {}
                for ev, _, dur in t.gpu:
                    tot[ev[:100]] = tot.get(ev[:100], 0.0) + dur
                for ev, v_ in tot.items():
                    per.setdefault(ev, []).append(v_)
            row["device_busy_us"] = gputrace.stats([t.busy_ns / 1e3 for t in mine])
            row["device_span_us"] = gputrace.stats([t.span_ns / 1e3 for t in mine])
            row["activities"] = {
                ev: {"median_us": statistics.median(xs) / 1e3, "per_call": len(xs) / len(mine)}
                for ev, xs in sorted(per.items(), key=lambda kv: -statistics.median(kv[1]))}
            row["copy_activities"] = [ev for ev in per if COPY.search(ev)]
        cur = rows["extents_only (current)"]
        case = f"causal={causal}"
        if cur["hlo_copies"] or cur["copy_activities"]:
            failures.append(f"{case}: the current form copies: {cur['hlo_copies']} {cur['copy_activities']}")
        if not same:
            failures.append(f"{case}: results differ from the old form's (dq, dk, dv bit for bit: "
                            f"{bitwise}; relative errors {rel})")
        if not kept:
            failures.append(f"{case}: dout changed")
        res["cases"][case] = {"same_results": same, "bitwise_dq_dk_dv": bitwise, "rel_diff_dq_dk_dv": rel,
                              "dout_unchanged": kept, "forms": rows,
                              "busy_saved_us": rows["inout (1518079)"]["device_busy_us"]["median"]
                              - cur["device_busy_us"]["median"]}
    res["failures"] = failures
    return res


def dry_run(new_cache: Path, old_cache: Path) -> dict[str, Any]:
    """Each form's custom calls lowered for the GPU (no device): which alias an operand."""
    import warnings

    import jax
    import jax.numpy as jnp

    import cutecc

    b, s, h, d = SHAPE
    S = jax.ShapeDtypeStruct
    specs = (*(S(SHAPE, jnp.bfloat16) for _ in range(4)), S((b, h, s), jnp.float32), S(SHAPE, jnp.bfloat16))
    res: dict[str, Any] = {"forms": {}, "failures": []}
    for name, cache in (("extents_only (current)", new_cache), ("inout (1518079)", old_cache)):
        ks = cutecc.load(cache, arch="sm_90a")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            text = jax.jit(lambda *a, ks=ks: ks.fa4_bwd(*a, softmax_scale=0.088, causal=True)).trace(
                *specs).lower(lowering_platforms=("cuda",)).as_text()
        calls = [ln for ln in text.splitlines() if "stablehlo.custom_call" in ln]
        res["forms"][name] = {"custom_calls": len(calls),
                              "aliased": ["output_operand_aliases" in c for c in calls],
                              "copy_warnings": [str(w.message)[:200] for w in seen
                                                if issubclass(w.category, cutecc.CopyWarning)]}
    cur = res["forms"]["extents_only (current)"]
    if cur["custom_calls"] != 3 or cur["aliased"][2] or cur["copy_warnings"]:
        res["failures"].append(f"the current form's postprocess writes over an input: {cur}")
    return res


def table(res: dict[str, Any]) -> str:
    lines = []
    for case, c in res["cases"].items():
        lines.append(f"{case}: same results {c['same_results']} (bitwise dq, dk, dv "
                     f"{c['bitwise_dq_dk_dv']}, relative differences {c['rel_diff_dq_dk_dv']}), "
                     f"dout unchanged "
                     f"{c['dout_unchanged']}, device busy saved {c['busy_saved_us']:.1f} us")
        for name, row in c["forms"].items():
            lines.append(f"  {name}: busy {row['device_busy_us']['median']:.1f} us, span "
                         f"{row['device_span_us']['median']:.1f} us, HLO copies {row['hlo_copies']}")
            for ev, a in row["activities"].items():
                lines.append(f"    {a['median_us']:9.1f} us  x{a['per_call']:.0f}  {ev}")
    lines += [f"FAIL: {f}" for f in res["failures"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    bp = sub.add_parser("build")
    bp.add_argument("old_cache", type=Path)
    dp = sub.add_parser("device")
    dp.add_argument("new_cache", type=Path)
    dp.add_argument("old_cache", type=Path)
    dp.add_argument("--json", type=Path)
    dp.add_argument("--quick", action="store_true")
    rp = sub.add_parser("dry-run")
    rp.add_argument("new_cache", type=Path)
    rp.add_argument("old_cache", type=Path)
    a = ap.parse_args()
    if a.cmd == "build":
        print(build(a.old_cache))
        return 0
    if a.cmd == "dry-run":
        out = dry_run(a.new_cache, a.old_cache)
        print(json.dumps(out, indent=1))
        return 1 if out["failures"] else 0
    import jax

    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
           **device(a.new_cache, a.old_cache, 5 if a.quick else ROUNDS)}
    print(table(res))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1))
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
