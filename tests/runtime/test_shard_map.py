"""Inside `jax.shard_map`, a cutecc call's results carry the manual axes its inputs vary
over, so `jax.grad` of a grad-paired kernel type-checks (seen: "the bwd rule produced
an output of type float32[...] corresponding to an input of type float32[...]{V:d}").
Traced and lowered for CUDA on two host devices; the 2-GPU run is tests/gpu/test_two_gpus.py."""

from __future__ import annotations

from pathlib import Path

from helpers import script_json

SCRIPT = r'''
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import cutecc
ks = cutecc.load(sys.argv[1], arch="sm_90a")
mesh = jax.make_mesh((2,), ("d",))
out = {}
for name, specs in {"both-sharded": (P("d"), P("d")), "y-replicated": (P("d"), P())}.items():
    f = jax.shard_map(jax.grad(lambda x, y: ks.mul(x, y).sum(), argnums=(0, 1)), mesh=mesh,
                      in_specs=specs, out_specs=specs)
    args = [jax.ShapeDtypeStruct((1024 if s == P("d") else 512,), jnp.float32,
                                 sharding=NamedSharding(mesh, s)) for s in specs]
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    out[name] = {"calls": text.count("stablehlo.custom_call @cutecc_"), "psum": "all-reduce" in text
                 or "all_reduce" in text}
fwd = jax.shard_map(lambda x, y: ks.mul(x, y), mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))
args = [jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, s))
        for n, s in ((1024, P("d")), (512, P()))]
out["forward"] = jax.jit(fwd).trace(*args).lower(lowering_platforms=("cuda",)).as_text().count("@cutecc_")
print(json.dumps(out))
'''


def test_grad_of_a_paired_kernel_inside_shard_map_type_checks(example_cache: Path) -> None:
    got = script_json(SCRIPT, str(example_cache))
    # mul_bwd (the forward's value is not needed, so XLA drops it)
    assert got["both-sharded"]["calls"] >= 1 and not got["both-sharded"]["psum"]
    # A replicated input's gradient is summed over the shards that used it.
    assert got["y-replicated"]["calls"] >= 1 and got["y-replicated"]["psum"]
    assert got["forward"] >= 1
