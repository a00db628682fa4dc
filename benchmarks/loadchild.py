"""Child of the load_scaling group: load a cache of N entries and lower one kernel call.

    python -m benchmarks.loadchild CACHE_DIR

Prints one JSON object: phase times (s) and peak RSS (MiB, ru_maxrss) after each phase.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    cache = sys.argv[1]
    out = {"rss_start": _rss_mib()}
    t = time.perf_counter()
    import jax
    import jax.numpy as jnp

    out["import_jax"] = time.perf_counter() - t
    out["rss_after_jax"] = _rss_mib()
    t = time.perf_counter()
    import cutecc

    ks = cutecc.load(cache, arch="sm_90a")
    out["load"] = time.perf_counter() - t
    out["kernels"] = len(ks)
    out["rss_after_load"] = _rss_mib()
    t = time.perf_counter()
    spec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    jax.jit(lambda x, y: ks.mul(x, y)).trace(spec, spec).lower(lowering_platforms=("cuda",))
    out["first_lower"] = time.perf_counter() - t
    out["rss_end"] = _rss_mib()
    out["load_plus_lower"] = out["load"] + out["first_lower"]
    out["total_in_child"] = time.perf_counter() - T0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
