"""Call the first kernel from JAX on a GPU host, after `cutecc build` in this folder: eagerly,
inside `jax.jit`, differentiated, and in a dtype no build serves (the declared fallback)."""

import warnings

import jax
import jax.numpy as jnp

import cutecc

kernels = cutecc.load()  # this GPU's builds, from the cache `cutecc build` wrote
print(kernels.silu_mul)

ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, (4096, 11008), jnp.bfloat16)
b = jax.random.normal(kb, (4096, 11008), jnp.bfloat16)

# A dtype no build serves runs the declared fallback (reference.py), whose bytes the build
# pinned: it is checked, then run from those bytes. Import it yourself only after that (the
# checked module is then the one you get): one imported before would be refused.
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    h = kernels.silu_mul(a.astype(jnp.float16), b.astype(jnp.float16))  # no float16 build
for w in seen:
    print("warning:", w.message)

from reference import silu_mul  # noqa: E402  (the module the fallback checked and ran)


def error(got, want):
    """Largest difference, relative to 1 + |want|, in float32."""
    got, want = got.astype(jnp.float32), want.astype(jnp.float32)
    return float(jnp.max(jnp.abs(got - want) / (1 + jnp.abs(want))))


out = kernels.silu_mul(a, b)                                     # eagerly
twice = jax.jit(lambda a, b: 2 * kernels.silu_mul(a, b))(a, b)   # inside a jitted program
print("forward", out.dtype, out.shape, "error", error(out, silu_mul(a, b)))
print("jit", "error", error(twice, 2 * silu_mul(a, b)))


def loss(f):
    return lambda a, b: f(a, b).astype(jnp.float32).sum()


da, db = jax.grad(loss(kernels.silu_mul), argnums=(0, 1))(a, b)  # runs silu_mul_bwd
want_da, want_db = jax.grad(loss(silu_mul), argnums=(0, 1))(a, b)
print("grad", "error", max(error(da, want_da), error(db, want_db)))
print("float16", "error", error(h, silu_mul(a.astype(jnp.float16), b.astype(jnp.float16))))
