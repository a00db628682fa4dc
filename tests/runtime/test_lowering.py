"""Every example kernel loads, registers and lowers to its custom call on a CPU-only JAX."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import PY

import cutecc
from cutecc.contract.args import TensorArg
from cutecc.runtime.library import target_name
from cutecc.store import Store


def specs_for(inputs: tuple[TensorArg, ...], n: int = 8) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(tuple(d if isinstance(d, int) else n for d in t.shape),
                                 jnp.dtype(t.dtype)) for t in inputs]


def lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def test_every_example_variant_lowers_to_its_own_custom_call(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    assert set(ks) >= {"mul", "mul_bwd", "rmsnorm", "axpy"}
    seen = 0
    for name in ks:
        fn = ks[name]
        for b in fn.builds:
            specs = specs_for(b.conv.inputs)
            text = lower(lambda *a, fn=fn: fn(*a), *specs)
            calls = re.findall(r"stablehlo.custom_call @(\w+)", text)
            assert calls == [target_name(b.key)], (name, b.variant, calls)
            seen += 1
    assert seen == len(list(Store(example_cache).entries()))


def test_scalars_travel_as_attributes_and_defaults_apply(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    x = jax.ShapeDtypeStruct((4, 1024), jnp.float32)
    w = jax.ShapeDtypeStruct((1024,), jnp.float32)
    text = lower(lambda x, w: ks.rmsnorm(x, w, eps=0.25), x, w)
    assert "eps = 2.500000e-01 : f32" in text
    text = lower(lambda x, w: ks.rmsnorm(x, w), x, w)
    assert "eps = 9.99999997E-7 : f32" in text or "eps = 9.99999997e-07 : f32" in text


def test_output_shapes_follow_the_contract(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    out = jax.eval_shape(lambda x, w: ks.rmsnorm(x, w), jax.ShapeDtypeStruct((7, 4096), jnp.bfloat16),
                         jax.ShapeDtypeStruct((4096,), jnp.bfloat16))
    assert out.shape == (7, 4096) and out.dtype == jnp.bfloat16
    dx, dy = jax.eval_shape(ks.mul_bwd, *[jax.ShapeDtypeStruct((5,), jnp.float16)] * 3)
    assert dx.shape == dy.shape == (5,) and dx.dtype == jnp.float16


def test_inplace_argument_aliases_its_output(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((100,), jnp.float32)
    text = lower(lambda x, y: ks.axpy(x, y, alpha=2.0), s, s)
    assert "output_operand_aliases" in text and "operand_index = 1" in text


def test_custom_vjp_pairs_forward_and_backward_kernels(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((64,), jnp.float32)
    # value_and_grad keeps the forward result live, so XLA cannot drop its call.
    text = lower(jax.value_and_grad(lambda x, y: ks.mul(x, y).sum(), argnums=(0, 1)), s, s)
    fwd = [b for b in ks.mul.builds if b.variant == "dtype=float32"][0]
    bwd = [b for b in ks.mul_bwd.builds if b.variant == "dtype=float32"][0]
    assert f"@{target_name(fwd.key)}" in text and f"@{target_name(bwd.key)}" in text


def test_export_round_trip(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((32,), jnp.float32)
    exp = jax.export.export(jax.jit(lambda x, y: ks.mul(x, y) * 2), platforms=["cuda"],
                            disabled_checks=ks.disabled_safety_checks())(s, s)
    blob = exp.serialize()
    back = jax.export.deserialize(blob)
    assert back.in_avals == exp.in_avals and back.out_avals == exp.out_avals
    fwd = [b for b in ks.mul.builds if b.variant == "dtype=float32"][0]
    assert target_name(fwd.key) in back.mlir_module()


def test_lowering_is_identical_in_a_fresh_process(example_cache: Path) -> None:
    """Target names come from keys, so HLO (and JAX's persistent cache key) is stable."""
    code = (
        "import cutecc, jax, jax.numpy as jnp, sys\n"
        f"ks = cutecc.load({str(example_cache)!r}, arch='sm_90a')\n"
        "s = jax.ShapeDtypeStruct((128,), jnp.bfloat16)\n"
        "f = lambda x, y: ks.mul(ks.mul(x, y), y)\n"
        "sys.stdout.write(jax.jit(f).trace(s, s).lower(lowering_platforms=('cuda',)).as_text())\n"
    )
    outs = [subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1] and "cutecc_" in outs[0]


def test_eager_call_on_cpu_says_gpu_only(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    if jax.default_backend() != "cpu":
        pytest.skip("checks the CPU message")
    with pytest.raises(NotImplementedError, match="runs on CUDA GPUs only"):
        ks.mul(jnp.ones(4), jnp.ones(4))
