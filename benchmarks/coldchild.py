"""Child of the cold_start group: one fresh process, from nothing to a CUDA lowering.

    python -m benchmarks.coldchild MODE SET CACHE_DIR

MODE: cutecc | cutlass_call | inprocess; SET: one | all (benchmarks/calls.py).
Prints one JSON object of phase times (seconds, measured here); the parent measures
the whole process's wall time.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


def main() -> None:
    mode, which, cache = sys.argv[1:4]
    ph: dict[str, Any] = {}
    t = time.perf_counter()
    import jax
    import jax.numpy  # noqa: F401

    ph["import_jax"] = time.perf_counter() - t
    from benchmarks.calls import SETS, chain, specs

    calls = SETS[which]
    t = time.perf_counter()
    if mode == "cutecc":
        import cutecc

        ks = cutecc.load(cache, arch="sm_90a")
        ph["import_and_load"] = time.perf_counter() - t

        def bind(c: Any) -> Any:
            scal = dict(c.scalars)
            return lambda *a: ks[c.kernel](*a, **scal)

        fns = [bind(c) for c in calls]
    else:
        from benchmarks import peers

        ph["import_dsl"] = time.perf_counter() - t
        t = time.perf_counter()
        make = peers.cutlass_call_fn if mode == "cutlass_call" else peers.inprocess_fn
        fns = [make(c) for c in calls]
        ph["prepare"] = time.perf_counter() - t  # inprocess: compile + register happen here
    t = time.perf_counter()
    traced = jax.jit(chain(calls, fns)).trace(*specs(calls))
    ph["trace"] = time.perf_counter() - t
    t = time.perf_counter()
    lowered = traced.lower(lowering_platforms=("cuda",))
    ph["lower"] = time.perf_counter() - t
    ph["custom_calls"] = lowered.as_text().count("stablehlo.custom_call")
    ph["total_in_child"] = time.perf_counter() - T0
    ph["after_import_jax"] = ph["total_in_child"] - ph["import_jax"]
    print(json.dumps(ph))


if __name__ == "__main__":
    main()
