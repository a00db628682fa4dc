"""cutecc.torch's own Python per eager call, on the CPU (no GPU needed).

    python benchmarks/torch_eager_python.py CACHE_DIR [--against OLD_TORCH_PY] [--rounds R]

CACHE_DIR holds the repository's kernels.toml built for sm_90a (no library is opened). A
do-nothing function stands in for each kernel's tvm-ffi function and CPU tensors for CUDA
ones, so what a call costs beyond that function and torch.empty_like is cutecc's Python:
the signature key, the plan lookup, the closure (`python` below). Rows: mul(x, y) on 256
floats and rmsnorm(x, w, eps=1e-6) on (8, 1024). With --against, another copy of
cutecc/torch.py (e.g. `git show main:cutecc/torch.py > /tmp/old_torch.py`) is loaded beside
this tree's as a second module and timed in the same rounds, so a shared host's drift
reaches both alike. Each round is 2000 calls per row, rows taking turns; the figure is the
minimum over the rounds (the run least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source, when it is not installed


def _nothing(*args: Any) -> None:
    return None


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _seams(ct: Any) -> tuple[Any, Any]:
    """The modules holding DEVICE_TYPES and build_function: an older single-file
    cutecc/torch.py (--against) holds both; this tree's are in cutecc.runtime.torch."""
    if hasattr(ct, "build_function"):
        return ct, ct
    from cutecc.runtime.torch import eager, kernel

    return kernel, eager


def _rows(tag: str, ct: Any, cache: str) -> dict[str, Any]:
    import torch

    kernels, eager = _seams(ct)
    kernels.DEVICE_TYPES = (*kernels.DEVICE_TYPES, "cpu")
    eager.build_function = lambda kernel, build: _nothing
    ks = ct.load(cache, arch="sm_90a")
    x, y = torch.randn(256), torch.randn(256)
    z, w = torch.randn(8, 1024), torch.randn(1024)
    mul, rms = ks.mul, ks.rmsnorm
    assert mul(x, y).shape == x.shape and rms(z, w, eps=1e-6).shape == z.shape
    assert mul._plan_of((x, y), {}) is not None  # the eager path, not the op
    return {f"{tag} mul": lambda: mul(x, y), f"{tag} rmsnorm": lambda: rms(z, w, eps=1e-6)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cache")
    p.add_argument("--against", type=Path, help="another cutecc/torch.py to time beside this tree's")
    p.add_argument("--rounds", type=int, default=101)
    a = p.parse_args()
    import torch

    import cutecc.torch as ct

    rows = _rows("this", ct, a.cache)
    if a.against:
        rows.update(_rows("against", _module(a.against, "cutecc_torch_against"), a.cache))
    x = torch.randn(256)
    rows["empty_like"] = lambda: torch.empty_like(x)
    rows["function"] = lambda: _nothing(x, x, x)
    k = 2000
    for fn in rows.values():
        for _ in range(k):
            fn()
    best = {name: float("inf") for name in rows}
    for _ in range(a.rounds):
        for name, fn in rows.items():
            t = time.perf_counter()
            for _ in range(k):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t) / k * 1e9)
    base = best["empty_like"] + best["function"]
    for name, v in best.items():
        extra = f"  python {v - base:6.0f} ns" if " " in name else ""
        print(f"{name:16s} {v:7.0f} ns{extra}")
    if a.against:
        for kernel in ("mul", "rmsnorm"):
            print(f"this - against, {kernel}: {best['this ' + kernel] - best['against ' + kernel]:+.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
