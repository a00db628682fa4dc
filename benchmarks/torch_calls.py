"""What a cutecc kernel costs when called from PyTorch, on a CUDA GPU (issue 24).

    python benchmarks/torch_calls.py CACHE_DIR [--json PATH] [--quick] [--dry-run]

Needs torch with CUDA, apache-tvm-ffi and cutecc's source (found beside this file); jax with
CUDA and jax-tvm-ffi for the JAX comparison (left out, with a note, without them). No DSL.
Without a GPU it prints "skipped: no GPU" and exits 0; --dry-run instead runs the per-call
rows on the CPU, a Python function standing in for the kernel (to check the script; the
figures are the host's Python costs, not a GPU's). Figures:
  per_call   host time per call of f32 mul on n elements, K calls back to back then one
             synchronize, median of R rounds after warm-up (the rows take turns in each
             round): cutecc eager (the direct tvm-ffi call), cutecc through its custom op
             (what autograd takes), torch.compile(fullgraph=True) of the cutecc call, and
             torch.mul / torch.add of the same tensors (the same work, torch's own
             kernels). At small n this is the dispatch cost (the GPU waits on the host);
             the goal is eager within 2 us of torch's op (eager_minus_torch_mul, and
             _paired: the difference within each round, median over rounds). Its parts: the build's tvm_ffi
             function called on a preallocated result (ffi_function_out), torch.empty_like,
             torch.mul(out=) (torch's launch alone); eager_python is what cutecc's Python
             adds to the first two.
  kernel     device time of the cutecc kernel (torch.profiler's CUDA kernel events, the
             device clock) called from torch and the same library called from JAX under
             jax.jit, and torch's own op, at large sizes: the goal is equal times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source, when it is not installed
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX and torch share the GPU


def per_call(rows: dict[str, Any], k: int, repeats: int, sync: Any,
             rounds: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Microseconds per call of each row: k calls then one synchronize, median of `repeats`
    rounds. The rows take turns within each round, so a drift of the host's speed during the
    run (seen on the device machines: one row's figure moving by 5 us between sizes) reaches
    every row alike and their differences stay meaningful. `rounds`, when given, receives
    each row's per-round figures (for differences taken round by round)."""
    for fn in rows.values():
        for _ in range(max(k // 10, 20)):
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, fn in rows.items():
            t = time.perf_counter()
            for _ in range(k):
                fn()
            sync()
            times[name].append((time.perf_counter() - t) / k * 1e6)
    if rounds is not None:
        rounds.update(times)
    return {name: round(statistics.median(v), 3) for name, v in times.items()}


def kernel_times(fn: Any, calls: int, sync: Any) -> dict[str, float]:
    """Median device time (us) of each CUDA kernel `fn` launches, by kernel name, from
    torch.profiler's kernel events (CUPTI: every kernel of the process, whichever
    framework launched it)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync()
    by: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by.setdefault(e.name, []).append(e.time_range.elapsed_us())
    return {name: statistics.median(v) for name, v in by.items() if len(v) >= calls}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cache")
    p.add_argument("--json", type=Path)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=9, help="rounds per size (default 9)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available() and not a.dry_run:
        print("skipped: no GPU")
        return 0
    import cutecc.torch as ct

    device, sync, held = "cuda", torch.cuda.synchronize, []
    if a.dry_run:
        device, sync, held = "cpu", (lambda: None), _stand_in(ct)
    ks = ct.load(a.cache, arch="sm_90a" if a.dry_run else None)
    if a.dry_run:
        held += _cpu_ops(ct, ks)
    k, repeats = (200, 5) if a.quick or a.dry_run else (2000, a.repeats)
    doc: dict[str, Any] = {"device": "dry run (CPU)" if a.dry_run else torch.cuda.get_device_name(),
                           "torch": torch.__version__, "k": k, "repeats": repeats, "per_call_us": {},
                           "kernel_us": {}, "notes": []}
    try:
        if a.dry_run:
            raise ImportError("dry run")
        import triton  # noqa: F401

        backend = "inductor"
    except ImportError:
        backend = "aot_eager"
        doc["notes"].append("no triton (or a dry run): torch.compile rows use backend aot_eager")
    doc["compile_backend"] = backend
    mul = ks.mul
    compiled = torch.compile(lambda x, y: mul(x, y), backend=backend, fullgraph=True, dynamic=False)
    tmul = torch.compile(lambda x, y: torch.mul(x, y), backend=backend, fullgraph=True, dynamic=False)
    for n in (256, 4096, 1 << 20) if not a.quick else (256, 1 << 20):
        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        assert torch.equal(mul(x, y), x * y) and torch.equal(mul._through_op((x, y), {}), x * y)
        assert torch.equal(compiled(x, y), x * y)
        out = torch.empty_like(x)
        function = mul._plan_of((x, y), {}).function  # the build's tvm_ffi.Function itself
        rows = {
            "cutecc_eager": lambda x=x, y=y: mul(x, y),
            "cutecc_custom_op": lambda x=x, y=y: mul._through_op((x, y), {}),
            "cutecc_compiled": lambda x=x, y=y: compiled(x, y),
            "torch_mul": lambda x=x, y=y: torch.mul(x, y),
            "torch_add": lambda x=x, y=y: torch.add(x, y),
            "torch_mul_compiled": lambda x=x, y=y: tmul(x, y),
            # the parts of an eager call: the kernel's function on a preallocated result
            # (tvm-ffi's conversion, the DSL wrapper's checks, the launch), an allocation,
            # and torch's own launch into a preallocated result
            "ffi_function_out": lambda x=x, y=y, out=out, f=function: f(x, y, out),
            "torch_empty_like": lambda x=x: torch.empty_like(x),
            "torch_mul_out": lambda x=x, y=y, out=out: torch.mul(x, y, out=out),
        }
        per_round: dict[str, list[float]] = {}
        got = per_call(rows, k, repeats, sync, per_round)
        got["eager_minus_torch_mul"] = round(got["cutecc_eager"] - got["torch_mul"], 3)
        # the same difference taken within each round (the rows ran back to back), then the
        # median over rounds: less moved by the host's drift between rounds
        got["eager_minus_torch_mul_paired"] = round(statistics.median(
            e - t for e, t in zip(per_round["cutecc_eager"], per_round["torch_mul"])), 3)
        # what cutecc's Python adds to the function call and the allocation
        got["eager_python"] = round(got["cutecc_eager"] - got["ffi_function_out"]
                                    - got["torch_empty_like"], 3)
        doc["per_call_us"][str(n)] = got
        print(f"n={n:>8}: " + "  ".join(f"{name} {v:.2f}" for name, v in got.items()), flush=True)

    if a.dry_run:
        _write(a.json, doc)
        return 0
    jax_ok = True
    try:
        import jax
        import jax.numpy as jnp

        import cutecc

        if not jax.devices("gpu"):
            raise RuntimeError("no GPU visible to JAX")
        jks = cutecc.load(a.cache)
        doc["jax"] = jax.__version__
    except Exception as e:  # the torch figures stand on their own
        jax_ok = False
        doc["notes"].append(f"no JAX comparison: {type(e).__name__}: {e}")
    cases = [("mul_f32_16M", "mul", [(1 << 24,), (1 << 24,)], torch.float32, {}),
             ("mul_f32_64M", "mul", [(1 << 26,), (1 << 26,)], torch.float32, {}),
             ("rmsnorm_bf16_16384x4096", "rmsnorm", [(16384, 4096), (4096,)], torch.bfloat16, {"eps": 1e-6})]
    for label, kernel, shapes, dtype, kw in cases[:2] if a.quick else cases:
        args = [torch.randn(s, device="cuda").to(dtype) for s in shapes]
        fn = ks[kernel]
        mine = kernel_times(lambda fn=fn, args=args, kw=kw: fn(*args, **kw), 20, torch.cuda.synchronize)
        row: dict[str, Any] = {"torch_path": mine}
        names = set(mine)
        if jax_ok:
            jargs = [jnp.asarray(t.float().cpu().numpy()).astype(str(dtype).removeprefix("torch."))
                     for t in args]
            jf = jax.jit(lambda *xs, f=jks[kernel], kw=kw: f(*xs, **kw))
            jax.block_until_ready(jf(*jargs))
            theirs = kernel_times(lambda jf=jf, jargs=jargs: jf(*jargs), 20,
                                  lambda: (jax.effects_barrier(), torch.cuda.synchronize()))
            row["jax_path"] = {name: v for name, v in theirs.items() if name in names}
            for name in names & set(theirs):
                row.setdefault("torch_over_jax", {})[name] = round(mine[name] / theirs[name], 4)
        if kernel == "mul":
            row["torch_mul"] = kernel_times(lambda args=args: torch.mul(*args), 20, torch.cuda.synchronize)
        doc["kernel_us"][label] = row
        print(f"{label}: {json.dumps(row)}", flush=True)
    _write(a.json, doc)
    return 0


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")


def _stand_in(ct: Any) -> list[Any]:
    """--dry-run: CPU tensors allowed, and mul's function a Python one (out = x * y)."""
    from cutecc.runtime.torch import eager as torch_eager
    from cutecc.runtime.torch import kernel as torch_kernel

    torch_kernel.DEVICE_TYPES = (*torch_kernel.DEVICE_TYPES, "cpu")
    torch_eager.build_function = lambda kernel, build: (lambda x, y, out: out.copy_(x * y))
    return []


def _cpu_ops(ct: Any, ks: Any) -> list[Any]:
    """--dry-run: each op's implementation registered for the CPU too (kept alive by the caller)."""
    import torch

    from cutecc.runtime.torch import op

    libs = []
    for name in ks.register_all():
        lib = torch.library.Library("cutecc", "IMPL")
        lib.impl(name.split("::")[1], op._op_impl, "CPU")
        libs.append(lib)
    return libs


if __name__ == "__main__":
    sys.exit(main())
