"""Child of test_placement.py: four CPU devices (XLA_FLAGS set by the parent before JAX
starts), a call runs where its arrays are. One JSON line per check.

    python placement_child.py ROOT_CACHE ROUNDS DEADLINE_S

The custom call is lowered for CUDA as built (its text is checked), and for the CPU by a
stand-in computing what `mul` computes, registered behind the production placement check
(`primitive.placed`), so the whole dispatch runs: eagerly, under `jax.jit`, from one thread
per device whose first calls start together in this fresh process, and as a two-stage
pipeline. Past DEADLINE_S every thread's stack is printed and the process exits
(faulthandler): a hang fails with where it hung.
"""

from __future__ import annotations

import faulthandler
import json
import re
import sys
import threading
import time
from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cutecc
from cutecc.errors import CallError
from cutecc.runtime import library
from cutecc.runtime.primitive import cutecc_call_p, placed

N = 4
CUDA = ("cuda",)


def emit(check: str, ok: bool, **kw: Any) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), **kw}), flush=True)


def stand_in(x: Any, y: Any, **_: Any) -> list[Any]:
    """What `mul` computes, lowered for the CPU in place of its custom call."""
    return [x * y]


def counted_registration() -> Counter[str]:
    """Count each FFI target's registrations and library loads; each is slowed, so that
    threads arriving together overlap in it if nothing keeps them apart."""
    import jax_tvm_ffi

    counts: Counter[str] = Counter()
    register, load = jax_tvm_ffi.register_ffi_target, library._load_bytes

    def slow_register(name: str, *a: Any, **kw: Any) -> Any:
        counts["register " + name] += 1
        time.sleep(0.2)
        return register(name, *a, **kw)

    def slow_load(data: bytes, name: str) -> Any:
        counts["load " + name] += 1
        time.sleep(0.2)
        return load(data, name)

    jax_tvm_ffi.register_ffi_target = slow_register
    library._load_bytes = slow_load
    return counts


def on(k: int, *arrays: np.ndarray) -> list[jax.Array]:
    return [jax.device_put(a, jax.devices()[k]) for a in arrays]


def check_lowering(ks: Any, target: str) -> None:
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(64, dtype=np.float32) for _ in range(2))
    for k in range(N):
        text = jax.jit(ks.mul).trace(*on(k, x, y)).lower(lowering_platforms=("cuda",)).as_text()
        emit(f"lowers on device {k}", re.findall(r"custom_call @(\w+)", text) == [target])
    with jax.default_device(jax.devices()[3]):  # uncommitted, on the default device
        traced = jax.jit(ks.mul).trace(jnp.asarray(x), jnp.asarray(y))
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    emit("lowers on the default device", re.findall(r"custom_call @(\w+)", text) == [target])


def check_threads(ks: Any, rounds: int) -> None:
    """One thread per device, first calls released together: eager and jitted `mul`, each
    result on its own device and equal to the reference, every round."""
    start = threading.Barrier(N)
    report: dict[int, dict[str, Any]] = {}

    def worker(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        x, y = (rng.standard_normal(1000 + k, dtype=np.float32) for _ in range(2))
        xs, ys = on(k, x, y)
        jitted = jax.jit(lambda a, b: ks.mul(a, b) * 2)
        bad, devices = 0, set()
        start.wait()
        for _ in range(rounds):
            e, j = ks.mul(xs, ys), jitted(xs, ys)
            devices |= {d.id for d in e.devices()} | {d.id for d in j.devices()}
            bad += not np.allclose(np.asarray(e), x * y, rtol=1e-6)
            bad += not np.allclose(np.asarray(j), 2 * x * y, rtol=1e-6)
        report[k] = {"bad": bad, "devices": sorted(devices)}

    threads = [threading.Thread(target=worker, args=(k,), name=f"device-{k}") for k in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit("threads, one per device", all(report.get(k) == {"bad": 0, "devices": [k]} for k in range(N)),
         report={str(k): v for k, v in report.items()})


def check_pipeline(ks: Any) -> None:
    """Stage one on device 0, its result moved to device 3, stage two there."""
    rng = np.random.default_rng(2)
    x, y, w = (rng.standard_normal(256, dtype=np.float32) for _ in range(3))
    stage1 = jax.jit(lambda a, b: ks.mul(a, b) + 1)
    stage2 = jax.jit(lambda h, c: ks.mul(h, c))
    h = stage1(*on(0, x, y))
    out = stage2(jax.device_put(h, jax.devices()[3]), *on(3, w))  # a device-to-device transfer
    emit("two-stage pipeline", np.allclose(np.asarray(out), (x * y + 1) * w, rtol=1e-5)
         and {d.id for d in h.devices()} == {0} and {d.id for d in out.devices()} == {3})


def refused(f: Any) -> str:
    try:
        f()
    except CallError as e:
        return e.message
    return "ran"


def check_refusals(ks: Any) -> None:
    # Auto axes, whatever this JAX's default: under Explicit ones the refusal names the
    # sharding and the collective instead (cutecc.runtime.strict, tests/runtime/test_strict.py)
    from jax.sharding import AxisType

    mesh = jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,))
    x = np.arange(64, dtype=np.float32)
    for name, spec in (("sharded", P("d")), ("replicated", P())):
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        for how, f in (("eagerly", lambda a=xs: ks.mul(a, a)),
                       ("under jit", lambda a=xs: jax.jit(ks.mul)(a, a)),
                       ("lowered", lambda a=xs: jax.jit(ks.mul).trace(a, a).lower(lowering_platforms=CUDA))):
            msg = refused(f)
            says = ("computation over 4 devices", "jax.shard_map", "shard = [..]", "jax.device_put")
            emit(f"{name} over {N} devices {how}", all(s in msg for s in says), message=msg)
    msg = refused(lambda: ks.mul(*on(1, x), *on(2, x)))
    emit("committed to different devices", "committed to different devices (device 1, device 2)" in msg,
         message=msg)
    f = jax.jit(jax.shard_map(ks.mul, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d")))
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    got = f(xs, xs)
    emit("inside shard_map", np.allclose(np.asarray(got), x * x)
         and "custom_call @cutecc_" in f.trace(xs, xs).lower(lowering_platforms=("cuda",)).as_text())


def main() -> None:
    cache, rounds, deadline = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    faulthandler.dump_traceback_later(deadline, exit=True)
    assert jax.device_count() == N, jax.devices()
    counts = counted_registration()
    mlir.register_lowering(cutecc_call_p, placed(mlir.lower_fun(stand_in, multiple_results=True)),
                           platform="cpu")
    ks = cutecc.load(cache, arch="sm_90a")
    (build,) = [b for b in ks.mul.builds if b.variant == "dtype=float32"]
    target = library.target_name(build.key)
    check_threads(ks, rounds)  # first: every first call of this process at once
    emit("loaded and registered once", counts == Counter({f"register {target}": 1, f"load {target}": 1}),
         counts=dict(counts))
    check_lowering(ks, target)
    check_pipeline(ks)
    check_refusals(ks)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
