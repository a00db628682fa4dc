"""Where a cutecc program's extra cold-start time goes: JAX's GPU backend started by
`cutecc.load` (to learn the device's arch) against started by the first transfer, as a
jnp program does (GPU; issue 27).

    python -m benchmarks.backend_start CACHE [--repeats R] [--json PATH]

Fresh processes, alternating, after `import jax` and host inputs made (2^20 f32 twice):
  inputs_first     the first transfer (starts the backend), then `jax.devices("gpu")`
  devices_first    `jax.devices("gpu")`, then the first transfer
  load             `cutecc.load(CACHE)` (which asks JAX for the arch), then the transfer
  load_arch        `cutecc.load(CACHE, arch=...)` (no device query), then the transfer
each with the first call of `x * y` (jnp, or cutecc's mul for the load rows) checked
against numpy. If `load`'s extra time is only the backend start moved earlier, the
rows' totals agree; what they do not share is cutecc's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CHILD = r'''
import time, json, sys
sys.path.insert(0, sys.argv[2])
import jax, jax.numpy as jnp, numpy as np
mode, ph = sys.argv[3], {}
n = 1 << 20
rng = np.random.default_rng(0)
xh, yh = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
T = time.perf_counter()
def step(name, fn):
    t = time.perf_counter(); r = fn(); ph[name] = time.perf_counter() - t; return r
def inputs():
    x, y = jnp.asarray(xh), jnp.asarray(yh); jax.block_until_ready((x, y)); return x, y
f = jax.jit(lambda a, b: a * b)
if mode == "inputs_first":
    x, y = step("inputs", inputs); step("devices", lambda: jax.devices("gpu"))
elif mode == "devices_first":
    step("devices", lambda: jax.devices("gpu")); x, y = step("inputs", inputs)
else:
    import cutecc
    kw = {"arch": sys.argv[4]} if mode == "load_arch" else {}
    ks = step("load", lambda: cutecc.load(sys.argv[1], **kw)); f = jax.jit(ks.mul)
    x, y = step("inputs", inputs)
out = step("first_call", lambda: f(x, y).block_until_ready())
ph["correct"] = bool(np.array_equal(np.asarray(out), xh * yh))
ph["after_inputs_made"] = time.perf_counter() - T
print(json.dumps(ph))
'''

MODES = ("inputs_first", "devices_first", "load", "load_arch")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import compileall

    compileall.compile_dir(str(REPO / "cutecc"), quiet=1)
    kids: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(a.repeats + 1):  # the first round untimed (page cache, bytecode)
        for mode in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
            p = subprocess.run([sys.executable, "-c", CHILD, str(a.cache), str(REPO), mode, a.arch],
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"{mode} child failed:\n{p.stderr[-3000:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            assert got["correct"], f"{mode}: wrong first result"
            if r:
                kids[mode].append(got)
    out: dict[str, Any] = {"command": " ".join(sys.argv), "repeats": a.repeats, "modes": {}}
    for mode, ks in kids.items():
        med = {k: round(statistics.median(c[k] for c in ks) * 1e3, 1) for k in ks[0] if k != "correct"}
        out["modes"][mode] = {"median_ms": med, "children": ks}
        print(f"{mode:14s} " + "  ".join(f"{k} {v:.1f}" for k, v in med.items()), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
