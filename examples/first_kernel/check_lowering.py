"""On a machine without a GPU (CI): load the builds for sm_90a and lower one training step
through them for CUDA, which is what checks the contract, the variant choice and the
gradient pairing without running anything."""

import jax

import cutecc

kernels = cutecc.load(arch="sm_90a")     # no GPU needed: loaded to lower for sm_90a
print(kernels.silu_mul)
loss = lambda a, b: kernels.silu_mul(a, b).astype("float32").sum()
step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
spec = jax.ShapeDtypeStruct((4096, 11008), "bfloat16")
hlo = step.trace(spec, spec).lower(lowering_platforms=("cuda",)).as_text()
print(hlo.count("custom_call @cutecc_"), "kernel calls: silu_mul and silu_mul_bwd")
