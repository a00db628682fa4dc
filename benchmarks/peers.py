"""What a user would pick instead of cutecc, on the same launchers (needs the DSL).

- `cutlass_call_fn`: NVIDIA's `cutlass.jax.cutlass_call`. It wants `fn(stream, *inputs,
  *outputs, **constexprs)`, so launchers of another order get the small `@cute.jit`
  adapters below, as a user would write them (runtime scalars become compile-time
  constants: cutlass_call has no runtime scalars).
- `inprocess_fn`: the seeds' in-process TVM-FFI path (ejkernel's `build_cute_ffi_call`):
  `cute.compile(..., options="--enable-tvm-ffi")` on fake tensors in this process, the
  result registered with `jax_tvm_ffi.register_ffi_target`, called by `jax.ffi.ffi_call`.
  It compiles exactly what cutecc compiles (cutecc's generated canonical-order wrapper
  and fake arguments), minus the export and link, so the two differ only in when and
  where the compile happens.

Import this module only in a child process: it imports the DSL for `CUTE_DSL_ARCH`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from cutlass.jax import cutlass_call  # noqa: E402

from benchmarks.calls import Call  # noqa: E402
from kernels.axpy import axpy_  # noqa: E402
from kernels.elementwise import mul, mul_bwd  # noqa: E402
from kernels.rmsnorm import make_rmsnorm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@cute.jit
def mul_bwd_cc(stream, x, y, dout, dx, dy, threads: cutlass.Constexpr = 256):
    mul_bwd(x, y, dout, (dx, dy), stream, threads=threads)


@cute.jit
def rmsnorm_cc(stream, x, w, out, eps: cutlass.Constexpr, block: cutlass.Constexpr):
    make_rmsnorm(block_size=block)(x, w, out, cutlass.Float32(eps), stream)


@cute.jit
def axpy_cc(stream, x, y, alpha: cutlass.Constexpr, threads: cutlass.Constexpr = 256):
    axpy_(stream, cutlass.Float32(alpha), x, y, None, threads=threads)


def cutlass_call_fn(c: Call) -> Any:
    """A JAX function of `c`'s inputs that calls the kernel through cutlass_call."""
    sds = jax.ShapeDtypeStruct(c.shapes[0], jnp.dtype(c.dtype))
    scal = dict(c.scalars)
    if c.kernel == "mul":
        return cutlass_call(mul, output_shape_dtype=sds, threads=256)
    if c.kernel == "mul_bwd":
        return cutlass_call(mul_bwd_cc, output_shape_dtype=(sds, sds), threads=256)
    if c.kernel == "rmsnorm":
        # d must be static for this launcher; cutlass_call makes shapes static only as a whole.
        return cutlass_call(rmsnorm_cc, output_shape_dtype=sds, use_static_tensors=True,
                            eps=scal["eps"], block=256)  # the manifest's default
    if c.kernel == "axpy":
        return cutlass_call(axpy_cc, output_shape_dtype=jax.ShapeDtypeStruct(c.shapes[1], c.dtype),
                            input_output_aliases={1: 0}, alpha=scal["alpha"], threads=256)
    raise KeyError(c.kernel)


# --- the in-process TVM-FFI path --------------------------------------------------

_manifest: Any = None


def variant_of(c: Call) -> tuple[Any, Any]:
    """The manifest's (Kernel, Variant) for `c`."""
    global _manifest
    from cutecc.manifest import load_manifest

    if _manifest is None:
        _manifest = load_manifest(REPO / "kernels.toml")
    for k in _manifest.kernels:
        if k.name == c.kernel:
            for v in k.variants:
                if dict(v.params) == dict(c.params):
                    return k, v
    raise KeyError(c.label)


def compile_inprocess(kernel: Any, variant: Any) -> Any:
    """cute.compile of the launcher through cutecc's canonical wrapper, for TVM-FFI."""
    from cutecc.build.compiler import compile_variant

    return compile_variant(kernel.entry, variant, kernel.compile_options, engine=True)


_count = 0


def inprocess_fn(c: Call) -> Any:
    """Compile now, register with jax_tvm_ffi, and return a function lowering to ffi_call."""
    global _count
    import jax_tvm_ffi

    kernel, variant = variant_of(c)
    compiled = compile_inprocess(kernel, variant)
    conv = variant.convention
    _count += 1
    name = f"bench_inprocess_{_count}"
    jax_tvm_ffi.register_ffi_target(name, compiled, ["args", "rets"] + [f"attrs.{s.name}" for s in
                                    conv.scalars], platform="gpu")

    def fn(*arrays: Any) -> Any:
        env: dict[str, int] = {}
        for t, a in zip(conv.inputs, arrays):
            env.update({d: n for d, n in zip(t.shape, a.shape) if isinstance(d, str)})
        results = [jax.ShapeDtypeStruct(tuple(env.get(d, d) for d in t.shape), jnp.dtype(t.dtype))
                   for t in conv.results]
        attrs = {s.name: np.dtype(s.dtype).type(dict(c.scalars).get(s.name, s.default))
                 for s in conv.scalars}
        call = jax.ffi.ffi_call(name, results, input_output_aliases=dict(conv.aliases))
        return call(*arrays, **attrs)

    return fn
