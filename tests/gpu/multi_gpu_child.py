"""One process of tests/gpu/test_multi_gpu.py: concurrent calls of cutecc kernels on N GPUs
under `jax.shard_map`, each repeated in a loop, checked against references.

    python multi_gpu_child.py N ROOT_CACHE [EXAMPLES_CACHE] ROUNDS DEADLINE_S

Prints one JSON line per check. Past DEADLINE_S every thread's stack is written to stderr
and the process exits (faulthandler): a hang becomes a failure that shows where it hung.
"""

from __future__ import annotations

import faulthandler
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cutecc


def main() -> None:
    n, root, examples, rounds, deadline = (int(sys.argv[1]), sys.argv[2], sys.argv[3] or None,
                                           int(sys.argv[4]), float(sys.argv[5]))
    faulthandler.dump_traceback_later(deadline, exit=True)
    gpus = jax.devices("gpu")[:n]
    assert len(gpus) == n, f"asked for {n} GPUs, JAX sees {len(jax.devices('gpu'))}"
    mesh = jax.make_mesh((n,), ("d",), devices=gpus)
    rng = np.random.default_rng(n)

    def put(a: Any, spec: P) -> jax.Array:
        return jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))

    def run(name: str, f: Callable[..., Any], args: tuple[Any, ...], want: Any, tol: float) -> None:
        g = jax.jit(f)
        t0 = time.perf_counter()
        out = None
        for _ in range(rounds):  # concurrent launches on every device, again and again
            out = g(*args)
        jax.block_until_ready(out)
        seconds = time.perf_counter() - t0
        got, ref = jax.tree.leaves(out), jax.tree.leaves(want)
        err = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))
                                / (np.abs(np.asarray(b, np.float32)) + 1.0))) for a, b in zip(got, ref))
        print(json.dumps({"check": name, "devices": n, "rounds": rounds, "seconds": round(seconds, 3),
                          "max_rel_err": err, "ok": err <= tol}), flush=True)

    ks = cutecc.load(root)
    size = n << 18
    x, y = (put(rng.standard_normal(size, dtype=np.float32), P("d")) for _ in range(2))
    sm = lambda f, i, o: jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o)  # noqa: E731
    run("mul", sm(ks.mul, (P("d"), P("d")), P("d")), (x, y), np.asarray(x) * np.asarray(y), 1e-6)

    def loss(f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda a, b: (f(a, b) * jnp.arange(a.shape[0], dtype=a.dtype)).sum()

    grad = sm(jax.grad(loss(ks.mul), argnums=(0, 1)), (P("d"), P("d")), (P("d"), P("d")))
    want = jax.jit(sm(jax.grad(loss(jnp.multiply), argnums=(0, 1)), (P("d"), P("d")), (P("d"), P("d"))))(x, y)
    run("grad mul", grad, (x, y), want, 1e-5)
    run("axpy (inout)", sm(lambda a, b: ks.axpy(a, b, alpha=0.5), (P("d"), P("d")), P("d")), (x, y),
        0.5 * np.asarray(x) + np.asarray(y), 1e-6)
    if examples:
        ex = cutecc.load(examples)
        m, d = 256 * n, 4096
        xr = put(rng.standard_normal((m, d), dtype=np.float32).astype(jnp.bfloat16), P("d", None))
        w = put(rng.standard_normal(d, dtype=np.float32).astype(jnp.bfloat16), P())
        xf, wf = np.asarray(xr, np.float32), np.asarray(w, np.float32)
        rstd = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1) + 1e-6)
        run("quack_rmsnorm", sm(lambda a, b: ex.quack_rmsnorm(a, b, eps=1e-6), (P("d", None), P()),
                                P("d", None)), (xr, w), xf * rstd[:, None] * wf, 2e-2)
        b, s, h, hd = 2 * n, 512, 4, 128
        q, k, v = (put(rng.standard_normal((b, s, h, hd), dtype=np.float32).astype(jnp.bfloat16), P("d"))
                   for _ in range(3))
        scale = 1.0 / math.sqrt(hd)
        ref = jax.nn.dot_product_attention(*(jnp.asarray(np.asarray(a, np.float32)) for a in (q, k, v)),
                                           scale=scale, is_causal=True, implementation="xla")
        run("fa4_fwd causal", sm(lambda a, b_, c: ex.fa4_fwd(a, b_, c, softmax_scale=scale, causal=True),
                                 (P("d"), P("d"), P("d")), P("d")), (q, k, v), ref, 2e-2)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
