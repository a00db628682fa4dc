"""`kernel.in_place`: outputs declared `may_alias` lowered as aliases of their inputs, so XLA
may write them in the input's buffer (and copies the input first only where it stays live).
Lowered for CUDA on a CPU-only JAX."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.errors import CallError
from cutecc.runtime.library import target_name

ALIAS = re.compile(r"output_operand_alias<output_tuple_indices = \[(\d*)\], operand_index = (\d+)")


def lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def aliases_of(text: str, target: str) -> list[tuple[int, int]]:
    """(output index, operand index) pairs of every custom call of `target` in `text`."""
    out = []
    for line in text.splitlines():
        if f"@{target}(" not in line:
            continue
        out += [(int(a or 0), int(b)) for a, b in ALIAS.findall(line)]
    return out


def build_of(fn, dtype: str, **fixed: int):
    return next(b for b in fn.builds if b.conv.inputs[0].dtype == dtype
                and all(str(v) in b.variant for v in fixed.values()))


def test_in_place_aliases_the_declared_input_and_the_plain_call_does_not(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((256,), jnp.float32)
    t = target_name(build_of(ks.mul, "float32").key)
    assert aliases_of(lower(lambda x, y: ks.mul.in_place(x, y), s, s), t) == [(0, 0)]  # out <- x
    assert aliases_of(lower(lambda x, y: ks.mul(x, y), s, s), t) == []
    r = jax.ShapeDtypeStruct((8, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4096,), jnp.bfloat16)
    t = target_name(build_of(ks.rmsnorm, "bfloat16", d=4096).key)
    assert aliases_of(lower(lambda x, w: ks.rmsnorm.in_place(x, w, eps=1e-5), r, w), t) == [(0, 0)]


def test_a_loop_carry_written_in_place_lowers_with_the_alias_inside_the_loop(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((4096,), jnp.float32)
    t = target_name(build_of(ks.mul, "float32").key)

    def loop(x, y):
        return jax.lax.fori_loop(0, 10, lambda i, c: ks.mul.in_place(c, y), x)

    def scan(x, y):
        return jax.lax.scan(lambda c, _: (ks.mul.in_place(c, y), None), x, length=10)[0]

    for f in (loop, scan):
        text = lower(f, s, s)
        assert "stablehlo.while" in text and aliases_of(text, t) == [(0, 0)], f.__name__


def test_in_place_keeps_the_backward_pairing(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    s = jax.ShapeDtypeStruct((64,), jnp.float32)
    text = lower(jax.value_and_grad(lambda x, y: ks.mul.in_place(x, y).sum(), argnums=(0, 1)), s, s)
    fwd, bwd = build_of(ks.mul, "float32"), build_of(ks.mul_bwd, "float32")
    assert aliases_of(text, target_name(fwd.key)) == [(0, 0)]
    assert f"@{target_name(bwd.key)}(" in text and aliases_of(text, target_name(bwd.key)) == []


def test_in_place_is_one_view_and_refused_where_nothing_may_alias(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_90a")
    view = ks.mul.in_place
    assert view is ks.mul.in_place and view.in_place is view and view.builds is ks.mul.builds
    with pytest.raises(CallError, match="may_alias") as info:
        ks.axpy.in_place  # noqa: B018  (its y is inout: always in place)
    assert "donate" in info.value.message and "axpy" in str(info.value)


def test_an_eager_in_place_call_runs_the_plain_call(example_cache: Path) -> None:
    """Outside jit nothing can be reused (the arguments stay the caller's): the plain call's
    cached jit runs, never one that would copy its argument first."""
    if jax.default_backend() != "cpu":
        pytest.skip("checks the path on a CPU, where the call itself cannot run")
    ks = cutecc.load(example_cache, arch="sm_90a")
    before = len(ks.mul._eager)
    with pytest.raises(NotImplementedError, match="runs on CUDA GPUs only"):
        ks.mul.in_place(jnp.ones(4), jnp.ones(4))
    assert len(ks.mul._eager) == before + 1 and ks.mul.in_place._eager == {}
