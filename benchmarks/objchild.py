"""Child of the sizes group: the DSL's objects of some variants, and the link of each.

    python -m benchmarks.objchild MANIFEST OUT_JSON [--keep DIR] [VARIANT_ID ...]

Compiles each named variant (all when none is named) for sm_90a exactly as a build
worker does (`compiler.compile_to_object`), then links it exactly as a build does
(`linker.link`, against this toolchain's runtime library, linked once first). Writes
{variant: {"object": bytes, "library": bytes, "link_s": seconds}} and the runtime
library's bytes and link seconds (zig's cache warm) as JSON. `--keep DIR` keeps each
object as DIR/<kernel>[<variant>].o (for benchmarks/layout_ab.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    manifest, out = sys.argv[1], Path(sys.argv[2])
    rest = sys.argv[3:]
    keep = None
    if rest[:1] == ["--keep"]:
        keep, rest = Path(rest[1]), rest[2:]
        keep.mkdir(parents=True, exist_ok=True)
    wanted = set(rest)
    from cutecc.build.compiler import SYMBOL, CompileJob, compile_to_object, set_target

    set_target("sm_90a")
    from cutecc.build import linker
    from cutecc.manifest import load_manifest
    from cutecc.plan.key import toolchain

    m = load_manifest(manifest)
    py_path = tuple(str(p) for p in m.python_path)
    result: dict = {"variants": {}}
    with tempfile.TemporaryDirectory(prefix="bench-obj-") as d:
        root = Path(d)
        linker.link_runtime(root, toolchain()["runtime"])  # zig's own cache warmed
        t = time.perf_counter()
        rt = linker.link_runtime(root, toolchain()["runtime"])
        result["runtime"] = {"library": rt.stat().st_size, "link_s": time.perf_counter() - t}
        for k in m.kernels:
            for v in k.variants:
                label = f"{k.name}[{v.id}]"
                if wanted and v.id not in wanted and label not in wanted:
                    continue
                work = root / f"v{len(result['variants'])}"
                work.mkdir()
                obj = compile_to_object(CompileJob(k.entry, v, k.compile_options, py_path), work)
                if keep is not None:
                    (keep / f"{label}.o").write_bytes(obj.read_bytes())
                t = time.perf_counter()
                linker.link(obj, work / "kernel.so", SYMBOL, entry=k.entry, arch="sm_90a",
                            key="0" * 64, runtime=rt)
                result["variants"][label] = {"object": obj.stat().st_size,
                                             "library": (work / "kernel.so").stat().st_size,
                                             "link_s": time.perf_counter() - t}
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
