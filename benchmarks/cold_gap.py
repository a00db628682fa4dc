"""Cold start of a cutecc program against a jnp program: what of the difference is cutecc's
own (GPU, or CPU with --cpu; issue 27).

    python -m benchmarks.cold_gap CACHE [--before SRC] [--repeats R] [--json PATH]

Fresh processes, interleaved repeat by repeat, each from nothing to a first correct result
of f32 `x * y` on 2^20 elements (the child of benchmarks/device.py): a jnp program; a
cutecc program (`import cutecc`, `cutecc.load`, `jax.jit(ks.mul)`) with this tree's cutecc
and, with --before, with the cutecc source tree SRC (the same cache); and each taken apart
into phases (load, `import tvm_ffi` + `jax_tvm_ffi`, trace with verify + dlopen + register,
lower, compile, first call). Both source trees are byte-compiled first, as pip does for an
installed cutecc: with $PYTHONDONTWRITEBYTECODE set (the GPU machines set it) a source tree
is otherwise compiled again in every process, ~85 ms of the runtime's import on the CPU host.
One `python -X importtime` child lists what importing the runtime and tvm-ffi costs, module
by module (the largest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

IMPORTS = ("import jax; import cutecc; from cutecc.runtime import loader, dispatch; "
           "from cutecc.runtime.library import import_tvm_ffi; import_tvm_ffi(); import jax_tvm_ffi")


def child(cache: Path, src: Path, mode: str) -> tuple[float, dict[str, Any]]:
    from benchmarks.device import COLD_CHILD

    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", COLD_CHILD, str(cache), str(src), mode],
                       capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"cold child ({mode}, {src}) failed:\n{r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["correct"], f"{mode}: wrong first result"
    return wall, got


def importtime(src: Path) -> list[tuple[str, float]]:
    """(module, cumulative ms) of the runtime's and tvm-ffi's imports after jax, largest first."""
    code = f"import sys; sys.path.insert(0, {str(src)!r}); " + IMPORTS
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                       timeout=300)
    rows, after = [], False
    for line in r.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3:
            continue
        name = parts[2].rstrip()
        if name.strip() == "jax":
            after = True
            continue
        if after and name.strip().split(".")[0] in ("cutecc", "tvm_ffi", "jax_tvm_ffi"):
            rows.append((name, int(parts[1]) / 1e3))
    return sorted(rows, key=lambda x: -x[1])[:20]


def measure(cache: Path, before: Path | None, before_cache: Path | None, repeats: int) -> dict[str, Any]:
    sides = [("jnp", REPO, "jnp", cache), ("cutecc", REPO, "cutecc", cache),
             ("cutecc phases", REPO, "cutecc_phases", cache)]
    if before is not None:
        bc = before_cache or cache
        sides += [("cutecc before", before, "cutecc", bc),
                  ("cutecc phases before", before, "cutecc_phases", bc)]
    import compileall

    for src in {REPO, before or REPO}:  # as an installed cutecc: its bytecode written (pip does)
        compileall.compile_dir(str(src / "cutecc"), quiet=1)
    got: dict[str, dict[str, Any]] = {label: {"wall_s": [], "children": []} for label, *_ in sides}
    for _, src, mode, c in sides:  # untimed: bytecode caches written, files in the page cache
        child(c, src, mode)
    for r in range(repeats):
        for label, src, mode, c in (sides if r % 2 == 0 else list(reversed(sides))):
            wall, kid = child(c, src, mode)
            got[label]["wall_s"].append(wall)
            got[label]["children"].append(kid)
    out: dict[str, Any] = {}
    for label, g in got.items():
        kids = g["children"]
        phases = {p: statistics.median(k[p] for k in kids) * 1e3 for p in kids[0]
                  if isinstance(kids[0][p], float)}
        out[label] = {"wall_s": {"median": statistics.median(g["wall_s"]), "min": min(g["wall_s"]),
                                 "max": max(g["wall_s"]), "n": len(g["wall_s"])},
                      "phases_ms_median": phases, "children": kids}
    w = {k: v["wall_s"]["median"] for k, v in out.items()}
    out["cutecc_minus_jnp_s"] = w["cutecc"] - w["jnp"]
    if before is not None:
        out["before_minus_jnp_s"] = w["cutecc before"] - w["jnp"]
    out["importtime_ms"] = {"this tree": importtime(REPO)}
    if before is not None:
        out["importtime_ms"]["before"] = importtime(before)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--before", type=Path, help="another cutecc source tree (its parent of cutecc/)")
    ap.add_argument("--before-cache", type=Path, help="the cache for --before (default: CACHE)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import jax

    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
           **measure(a.cache, a.before, a.before_cache, a.repeats)}
    for k, v in res.items():
        if isinstance(v, dict) and "wall_s" in v:
            print(f"{k:24} whole process {v['wall_s']['median']:.3f} s  phases (ms): "
                  + ", ".join(f"{p} {x:.1f}" for p, x in v["phases_ms_median"].items()))
    print(f"cutecc - jnp: {res['cutecc_minus_jnp_s'] * 1e3:.0f} ms"
          + (f"; before: {res['before_minus_jnp_s'] * 1e3:.0f} ms" if a.before else ""))
    for name, ms in res["importtime_ms"]["this tree"][:10]:
        print(f"  import {name.strip():40} {ms:7.1f} ms")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
