"""One process of tests/gpu/test_every_gpu.py: single-device programs on every GPU at once,
no `shard_map`, from a fresh process. One JSON line per check.

    python every_gpu_child.py jax N ROOT_CACHE EXAMPLES_CACHE ROUNDS DEADLINE_S
    python every_gpu_child.py torch N ROOT_CACHE EXAMPLES_CACHE ROUNDS DEADLINE_S

jax: one thread per GPU (N of them), each on arrays committed to its GPU; released together
by a barrier, so every kernel's first call on every device comes at the same moment; each
round calls `mul` (and, with the examples cache, quack RMSNorm and FA4's forward) eagerly
and under `jax.jit`, and its error against a reference computed on the same device is kept
on the device (one transfer at the end). Then a two-stage `jax.jit` pipeline: stage one on
GPU 0, its result moved to GPU 1, stage two there, for several micro-batches in flight.
torch: the same threads through `cutecc.torch` (tensors on cuda:k from a thread whose current
device is 0), and on cuda:1 a call ordered after work queued on a side stream of that device.
An empty EXAMPLES_CACHE skips the published kernels. Past DEADLINE_S every thread's stack is
written to stderr and the process exits (faulthandler): a hang fails with where it hung.
"""

from __future__ import annotations

import faulthandler
import json
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


def emit(check: str, ok: bool, **kw: Any) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), **kw}), flush=True)


def in_threads(n: int, work: Callable[[int, threading.Barrier], dict[str, Any]]) -> dict[int, Any]:
    """`work(k, barrier)` in one thread per device; an exception is its thread's result."""
    barrier = threading.Barrier(n)
    out: dict[int, Any] = {}

    def run(k: int) -> None:
        try:
            out[k] = work(k, barrier)
        except BaseException:  # noqa: BLE001  (reported, with its traceback, as the thread's result)
            barrier.abort()
            out[k] = {"error": traceback.format_exc()[-4000:]}

    threads = [threading.Thread(target=run, args=(k,), name=f"gpu-{k}") for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# -- JAX ---------------------------------------------------------------------------------


def jax_cases(k: int, dev: Any, ks: Any, ex: Any) -> list[tuple[str, Callable[..., Any], tuple, Any, float]]:
    """(name, call, arrays on `dev`, reference on `dev`, tolerance) per kernel."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(10 + k)

    def put(a: Any, dtype: Any = None) -> Any:
        return jax.device_put(jnp.asarray(a, dtype), dev)

    n = (1 << 20) + 17 * k  # a size of its own per device
    x, y = put(rng.standard_normal(n, dtype=np.float32)), put(rng.standard_normal(n, dtype=np.float32))
    cases = [("mul", ks.mul, (x, y), x * y, 1e-6)]
    if ex is not None:
        m, d, eps = 256 + k, 4096, 1e-6
        xr = put(rng.standard_normal((m, d), dtype=np.float32), jnp.bfloat16)
        w = put(rng.standard_normal(d, dtype=np.float32), jnp.bfloat16)
        xf = xr.astype(jnp.float32)
        want = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1) + eps)[:, None] * w.astype(jnp.float32)
        cases.append(("quack_rmsnorm", lambda a, b: ex.quack_rmsnorm(a, b, eps=eps), (xr, w), want, 2e-2))
        b, s, h, hd = 2, 512, 4, 128
        q, kk, v = (put(rng.standard_normal((b, s, h, hd), dtype=np.float32), jnp.bfloat16) for _ in range(3))
        scale = 1.0 / math.sqrt(hd)
        ref = jax.nn.dot_product_attention(*(a.astype(jnp.float32) for a in (q, kk, v)), scale=scale,
                                           is_causal=True, implementation="xla")
        def fa4(a: Any, b_: Any, c: Any) -> Any:
            return ex.fa4_fwd(a, b_, c, softmax_scale=scale, causal=True)

        cases.append(("fa4_fwd causal", fa4, (q, kk, v), ref, 2e-2))
    return cases


def run_jax(n: int, root: str, examples: str | None, rounds: int) -> None:
    import jax
    import jax.numpy as jnp

    import cutecc

    gpus = jax.devices("gpu")
    assert len(gpus) >= n, f"asked for {n} GPUs, JAX sees {len(gpus)}"
    ks = cutecc.load(root)
    ex = cutecc.load(examples) if examples else None

    def rel_err(got: Any, want: Any) -> Any:
        g, w = got.astype(jnp.float32), want.astype(jnp.float32)
        return jnp.max(jnp.abs(g - w) / (jnp.abs(w) + 1.0))

    def work(k: int, barrier: threading.Barrier) -> dict[str, Any]:
        dev = gpus[k]
        cases = jax_cases(k, dev, ks, ex)
        jitted = [jax.jit(f) for _, f, _, _, _ in cases]
        errs: dict[str, list[Any]] = {f"{c[0]} {how}": [] for c in cases for how in ("eager", "jit")}
        devices: set[int] = set()
        barrier.wait()  # every first call at once
        t0 = time.perf_counter()
        for _ in range(rounds):
            for (name, f, args, want, _), g in zip(cases, jitted):
                for how, out in (("eager", f(*args)), ("jit", g(*args))):
                    devices |= {d.id for d in out.devices()}
                    errs[f"{name} {how}"].append(rel_err(out, want))
        worst = {name: float(jnp.max(jnp.stack(e))) for name, e in errs.items()}
        tol = {f"{c[0]} {how}": c[4] for c in cases for how in ("eager", "jit")}
        return {"device": dev.id, "devices": sorted(devices), "seconds": round(time.perf_counter() - t0, 3),
                "max_rel_err": worst, "ok": devices == {dev.id} and all(worst[c] <= tol[c] for c in worst)}

    report = in_threads(n, work)
    for k in range(n):
        r = dict(report.get(k, {"error": "no result"}))
        emit(f"jax thread {k}", r.pop("ok", False), rounds=rounds, **r)
    pipeline(gpus, ks, ex)


def pipeline(gpus: list[Any], ks: Any, ex: Any) -> None:
    """Stage one on GPU 0, stage two on GPU 1, each a `jax.jit` calling cutecc kernels;
    micro-batches dispatched back to back, so both GPUs work at once."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if len(gpus) < 2:
        return
    rng = np.random.default_rng(99)
    d = 4096
    w = rng.standard_normal(d, dtype=np.float32)
    stage1 = jax.jit(lambda x, y: ks.mul(x, y) + 1.0)
    if ex is not None:
        w1 = jax.device_put(jnp.asarray(w, jnp.bfloat16), gpus[1])
        stage2 = jax.jit(lambda h: ex.quack_rmsnorm(h.astype(jnp.bfloat16), w1, eps=1e-6))
    else:
        w1 = jax.device_put(jnp.asarray(w), gpus[1])
        stage2 = jax.jit(lambda h: ks.mul(h.reshape(-1), jnp.broadcast_to(w1, h.shape).reshape(-1))
                         .reshape(h.shape))
    batches = [tuple(rng.standard_normal((64, d), dtype=np.float32) for _ in range(2)) for _ in range(8)]
    outs = []
    for x, y in batches:
        h = stage1(*(jax.device_put(a.reshape(-1), gpus[0]) for a in (x, y))).reshape(64, d)
        outs.append((h, stage2(jax.device_put(h, gpus[1]))))
    worst, placed = 0.0, True
    for (x, y), (h, out) in zip(batches, outs):
        hf = x * y + 1.0
        if ex is not None:
            hb = np.asarray(jnp.asarray(hf, jnp.bfloat16), np.float32)
            wb = np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32)
            want = hb / np.sqrt(np.mean(hb * hb, axis=-1, keepdims=True) + 1e-6) * wb
        else:
            want = hf * w
        got = np.asarray(out, np.float32)
        worst = max(worst, float(np.max(np.abs(got - want) / (np.abs(want) + 1.0))))
        placed &= h.devices() == {gpus[0]} and out.devices() == {gpus[1]}
    emit("jax two-stage pipeline", placed and worst <= (2e-2 if ex is not None else 1e-5), max_rel_err=worst,
         placed=placed, stage2="quack_rmsnorm" if ex is not None else "mul")


# -- torch -------------------------------------------------------------------------------


def run_torch(n: int, root: str, examples: str | None, rounds: int) -> None:
    import torch

    import cutecc.torch as ct

    assert torch.cuda.device_count() >= n, f"asked for {n} GPUs, torch sees {torch.cuda.device_count()}"
    ks = ct.load(root)
    ex = ct.load(examples) if examples else None

    def work(k: int, barrier: threading.Barrier) -> dict[str, Any]:
        # This thread's current device stays 0: each launch is made on its tensors' device.
        dev = torch.device("cuda", k)
        g = torch.Generator(device=dev).manual_seed(20 + k)
        x, y = (torch.randn((1 << 20) + 17 * k, device=dev, generator=g) for _ in range(2))
        cases: list[tuple[str, Callable[[], Any], Any, float]] = [("mul", lambda: ks.mul(x, y), x * y, 1e-6)]
        if ex is not None:
            xr = torch.randn(256 + k, 4096, device=dev, generator=g).to(torch.bfloat16)
            w = torch.randn(4096, device=dev, generator=g).to(torch.bfloat16)
            xf = xr.float()
            want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            cases.append(("quack_rmsnorm", lambda: ex.quack_rmsnorm(xr, w, eps=1e-6), want, 2e-2))
        errs: dict[str, list[Any]] = {c[0]: [] for c in cases}
        devices: set[int] = set()
        barrier.wait()
        for _ in range(rounds):
            for name, f, want, _ in cases:
                out = f()
                devices.add(out.device.index)
                errs[name].append(((out.float() - want).abs() / (want.abs() + 1)).max())
        torch.cuda.synchronize(dev)
        worst = {name: float(torch.stack(e).max()) for name, e in errs.items()}
        return {"device": k, "devices": sorted(devices), "current_device": torch.cuda.current_device(),
                "max_rel_err": worst, "ok": devices == {k} and all(worst[c[0]] <= c[3] for c in cases)}

    report = in_threads(n, work)
    for k in range(n):
        r = dict(report.get(k, {"error": "no result"}))
        emit(f"torch thread {k}", r.pop("ok", False), rounds=rounds, **r)
    side_stream(ks)


def side_stream(ks: Any) -> None:
    """On cuda:1, under `torch.cuda.stream(s)`: the input is written on s after a delay, then
    the kernel is called; it reads the written values only if it launched on s (torch's
    current stream of that device), not on a default stream."""
    import torch

    dev = torch.device("cuda", 1)
    x = torch.full((1 << 20,), float("nan"), device=dev)
    src = torch.randn(1 << 20, device=dev)
    y = torch.randn(1 << 20, device=dev)
    torch.cuda.synchronize(dev)
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles queued before the copy
        x.copy_(src)
        out = ks.mul(x, y)
    s.synchronize()
    got, want = out.cpu(), (src * y).cpu()
    emit("torch cuda:1 on the current stream", out.device == dev and bool(torch.equal(got, want)),
         nan=int(torch.isnan(got).sum()))


def main() -> None:
    mode, n, root, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] or None
    rounds, deadline = int(sys.argv[5]), float(sys.argv[6])
    faulthandler.dump_traceback_later(deadline, exit=True)
    (run_jax if mode == "jax" else run_torch)(n, root, examples, rounds)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
