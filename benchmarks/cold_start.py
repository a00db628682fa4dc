"""Group cold_start: a fresh process, from nothing to a CUDA lowering of the kernel call(s).

Compared, on the same @cute.jit launchers (kernels/*.py), each in its own process:
  cutecc        import cutecc, cutecc.load(prebuilt cache), trace + lower
  cutlass_call  NVIDIA's cutlass.jax.cutlass_call: import the DSL, trace + lower (it
                compiles while lowering), DSL file cache disabled ("cold") and enabled
                after a warm-up run in a private cache directory ("warm")
  inprocess     the seeds' path: cute.compile(--enable-tvm-ffi) + jax_tvm_ffi registration
                in the process, then trace + lower
Wall time is measured here around the whole child; the child reports its phases.
Ratios are of medians taken in this run, with modes interleaved repeat by repeat.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import GroupResult, Row, dsl_available, run_child, sample_row, summary

G = "cold_start"
TARGETS = {"cutlass_call_cold": 50.0, "cutlass_call_warm": 10.0}


def _modes(tmp: Path) -> dict[str, tuple[str, dict[str, str]]]:
    warm = tmp / "dsl-cache-warm"
    return {
        "cutecc": ("cutecc", {}),
        "cutlass_call_cold": ("cutlass_call", {"CUTE_DSL_DISABLE_FILE_CACHING": "1",
                                               "CUTE_DSL_CACHE_DIR": str(tmp / "dsl-cache-off")}),
        "cutlass_call_warm": ("cutlass_call", {"CUTE_DSL_CACHE_DIR": str(warm)}),
        "inprocess": ("inprocess", {"CUTE_DSL_DISABLE_FILE_CACHING": "1"}),
    }


def run(cache: Path, repeats: int) -> GroupResult:
    res = GroupResult()
    peers = dsl_available()
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as d:
        modes = _modes(Path(d))
        if not peers:
            modes = {"cutecc": modes["cutecc"]}
        for which in ("one", "all"):
            label = "mul f32" if which == "one" else "all 11 example variants"
            if peers:  # warm the DSL's file cache (if it has anything to keep) outside timing
                mode, env = modes["cutlass_call_warm"]
                run_child(["-m", "benchmarks.coldchild", mode, which, str(cache)], env)
            walls: dict[str, list[float]] = {m: [] for m in modes}
            phases: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            for _ in range(repeats):
                for m, (mode, env) in modes.items():
                    wall, ph = run_child(["-m", "benchmarks.coldchild", mode, which, str(cache)], env)
                    walls[m].append(wall)
                    phases[m].append(ph)
            res.data[which] = {"walls": walls, "phases": phases}
            med = {m: summary(w)["median"] for m, w in walls.items()}
            after = {m: summary([p["after_import_jax"] for p in phases[m]])["median"] for m in modes}
            for m in modes:
                res.rows.append(sample_row(G, f"{label}: {m}, whole process", walls[m]))
                res.rows.append(sample_row(G, f"{label}: {m}, after `import jax`",
                                           [p["after_import_jax"] for p in phases[m]],
                                           note="in-child: import tool, load/compile, trace, lower"))
            for m in modes:
                if m == "cutecc":
                    continue
                for base, what in ((med, "whole process"), (after, "after `import jax`")):
                    ratio = base[m] / base["cutecc"]
                    note = ""
                    if m in TARGETS:
                        hit = "met" if ratio >= TARGETS[m] else "missed"
                        note = f"target >= {TARGETS[m]:.0f}x: {hit}"
                    res.rows.append(Row(G, f"{label}: {m} / cutecc, {what}", "x", value=ratio,
                                        note=note))
            if not peers:
                res.rows.append(Row(G, "cutlass_call, in-process", "x",
                                    note="skipped: the DSL is not installed here"))
    return res
