"""Group parity: kernel-time parity with the DSL's own JIT path, shown by construction.

The DSL does not install on the GPU machine, so instead of timing both there, this
group shows (benchmarks/paritychild.py) that the GPU code cutecc ships is the GPU code
the DSL's JIT paths produce for the same launcher: the same machine code runs, so it
takes the same time. Per example variant:
  vs dsl_direct:   the whole embedded cubin, byte for byte
  vs cutlass_call: the kernel's code (.text), its launch info (.nv.info) and constant
                   bank layout (.nv.constant0), by content; kernel names differ, since
                   they spell out the compile-time alignment/shape assumptions
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import GroupResult, Row, dsl_available, run_child

G = "parity"


def run(cache: Path) -> GroupResult:
    res = GroupResult()
    if not dsl_available():
        res.skipped = "skipped: needs the DSL"
        return res
    _, out = run_child(["-m", "benchmarks.paritychild", str(cache)])
    res.data = out
    n = len(out)
    direct = sum(v["dsl_direct"]["identical"] for v in out.values())
    code = [k for k, v in out.items() if v["cutlass_call"]["code_identical"]]
    other = [k for k in out if k not in code]
    res.rows.append(Row(G, "cubin byte-identical to cute.compile of the launcher (TVM-FFI)",
                        f"/ {n}", value=direct, note="variants"))
    res.rows.append(Row(G, "kernel code identical to cutlass_call's compile", f"/ {n}",
                        value=len(code), note="variants"
                             + (f"; differs: {', '.join(other)} (cutlass_call needs "
                                "use_static_tensors for a static d, so m is static too: a "
                                "different specialisation)" if other else "")))
    return res
