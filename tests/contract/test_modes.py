"""`mode` as cutlass_call means it, seen from JAX on a CPU: the caller passes its array as it
holds it, the kernel views it through the declared mode with no copy, and results come back
in the caller's order. Ported from cutlass_call's own examples: its layout/mode printout
((128, 512, 64) viewed as (128, 64, 512), an output viewed as (64, 512, 128)) and its GEMM
convention ([M][K][L] A, [N][K][L] B, [M][N][L] C over batch-first arrays).

Nothing compiles: the contracts are the manifest's, traced and lowered but never run
(tests/gpu/test_layouts_gpu.py runs the GEMM on a GPU).
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import unbuilt_kernels

from cutecc.errors import CuteccError

S = jax.ShapeDtypeStruct
F32 = jnp.float32

MANIFEST = """
[kernel.printout]
entry = "kk.elem:printout"
args = [
  { name = "x", dtype = "float32", shape = ["b", "c", "r"], {x} },
  { name = "out", role = "output", dtype = "float32", shape = ["c", "r", "b"], {out} },
  { kind = "stream" },
]

[kernel.gemm_mkl]
entry = "kk.elem:gemm"
args = [
  { name = "a", dtype = "float32", shape = ["m", "k", "l"], mode = [1, 2, 0] },
  { name = "b", dtype = "float32", shape = ["n", "k", "l"], mode = [1, 2, 0] },
  { name = "c", role = "output", dtype = "float32", shape = ["m", "n", "l"], mode = [1, 2, 0] },
  { kind = "stream" },
]

[kernel.gemm_static]
entry = "kk.elem:gemm"
args = [
  { name = "a", dtype = "float32", shape = [32, "k", "l"], mode = [1, 2, 0] },
  { name = "b", dtype = "float32", shape = ["n", "k", "l"], mode = [1, 2, 0] },
  { name = "c", role = "output", dtype = "float32", shape = [32, "n", "l"], mode = [1, 2, 0] },
  { kind = "stream" },
]
"""


def _kernels(tmp_path: Path, x: str = "mode = [0, 2, 1]", out: str = "mode = [2, 1, 0]") -> dict:
    p = tmp_path / "kernels.toml"
    p.write_text(MANIFEST.replace("{x}", x).replace("{out}", out))
    return unbuilt_kernels(p)


def _lowered(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def test_the_callers_array_in_and_the_callers_order_out(tmp_path: Path) -> None:
    """cutlass_call's printout: a = (128, 512, 64) with input mode (0, 2, 1) is seen as
    (128, 64, 512):(32768, 1, 64); the output, mode (2, 1, 0), as (64, 512, 128):(1, 64, 32768),
    while the caller holds both as (128, 512, 64)."""
    ks = _kernels(tmp_path)
    x = ks["printout"].builds[0].args[0]
    assert x.mode and x.held == (0, 2, 1) and x.transpose is None
    out = jax.eval_shape(ks["printout"], S((128, 512, 64), F32))
    assert out.shape == (128, 512, 64)
    text = _lowered(ks["printout"], S((128, 512, 64), F32))
    (call,) = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert "(tensor<128x512x64xf32>) -> tensor<128x512x64xf32>" in call
    assert "stablehlo.transpose" not in text  # a view: nothing is copied on either side
    # symbols bind where the caller holds them: x (b, r, c) = (2, 3, 5), out as (b, r, c)
    assert jax.eval_shape(ks["printout"], S((2, 3, 5), F32)).shape == (2, 3, 5)


def test_layout_keeps_the_kernels_order_and_transposes(tmp_path: Path) -> None:
    """The same view declared with `layout` (stride orders [2, 0, 1] and [0, 1, 2]): the call
    takes and returns the kernel's order, and the runtime transposes to the buffer."""
    ks = _kernels(tmp_path, "layout = [2, 0, 1]", "layout = [0, 1, 2]")
    by_mode = _kernels(tmp_path)["printout"].builds[0].args[0]
    assert ks["printout"].builds[0].args[0].order == by_mode.order
    out = jax.eval_shape(ks["printout"], S((128, 64, 512), F32))
    assert out.shape == (64, 512, 128)
    assert "stablehlo.transpose" in _lowered(ks["printout"], S((128, 64, 512), F32))


def test_gemm_modes_over_batch_first_arrays(tmp_path: Path) -> None:
    """cutlass_call's GEMM convention: the kernel indexes A as [M][K][L], B as [N][K][L] and
    C as [M][N][L]; the caller holds batch-first a (l, m, k), b (l, n, k) and gets c (l, m, n)."""
    gemm = _kernels(tmp_path)["gemm_mkl"]
    c = jax.eval_shape(gemm, S((4, 32, 16), F32), S((4, 24, 16), F32))
    assert c.shape == (4, 32, 24)
    text = _lowered(gemm, S((4, 32, 16), F32), S((4, 24, 16), F32))
    assert re.search(r"\(tensor<4x32x16xf32>, tensor<4x24x16xf32>\) -> tensor<4x32x24xf32>", text)
    assert "stablehlo.transpose" not in text
    assert jax.eval_shape(lambda a, b: gemm(a, b), S((1, 1, 1), F32), S((1, 5, 1), F32)).shape == (1, 1, 5)


@pytest.mark.parametrize(("a", "b", "fragment"), [
    # the caller's dimension is named: k is dimension 2 of b as held, dimension 1 of the kernel's B
    ((4, 32, 16), (4, 24, 7), 'b: dimension 2 is 7, but "k" is 16 from an earlier argument'),
    ((4, 32, 16), (5, 24, 16), 'b: dimension 0 is 5, but "l" is 4 from an earlier argument'),
    ((4, 32, 16), (4, 24), "b: rank 2, expected 3 ['l', 'n', 'k']"),
])
def test_a_mismatch_names_the_dimension_of_the_array_passed(tmp_path: Path, a, b, fragment: str) -> None:
    gemm = _kernels(tmp_path)["gemm_mkl"]
    with pytest.raises(CuteccError) as info:
        jax.eval_shape(gemm, S(a, F32), S(b, F32))
    assert fragment in str(info.value)


def test_a_static_extent_is_checked_where_the_caller_holds_it(tmp_path: Path) -> None:
    """m = 32 is the kernel's dimension 0 and the caller's dimension 1: (l, 32, k) passes,
    and a (32, m, k) array is refused naming dimension 1 (not the kernel's order)."""
    gemm = _kernels(tmp_path)["gemm_static"]
    assert jax.eval_shape(gemm, S((512, 32, 8), F32), S((512, 3, 8), F32)).shape == (512, 32, 3)
    with pytest.raises(CuteccError, match="a: dimension 1 is 512, expected 32"):
        jax.eval_shape(gemm, S((32, 512, 8), F32), S((32, 3, 8), F32))


def test_the_contract_records_mode_only_when_declared(tmp_path: Path) -> None:
    """Stored with the entry (the runtime reads it from there), so it is part of the key; a
    tensor declared with `layout` keeps its JSON, and so its key."""
    from cutecc.contract.args import arg_from_json, arg_to_json

    ks = _kernels(tmp_path, "layout = [2, 0, 1]")
    x, out = ks["printout"].builds[0].args[:2]
    assert "mode" not in arg_to_json(x) and arg_to_json(out)["mode"] is True
    assert arg_from_json(arg_to_json(out)) == out
    for bad in ({**arg_to_json(x), "mode": True, "order": None},  # row-major: nothing to view
                {**arg_to_json(out), "mode": "yes"},
                {**arg_to_json(out), "reduce": "sum"}):
        with pytest.raises(ValueError, match="mode"):
            arg_from_json({k: v for k, v in bad.items() if v is not None})


def test_a_mode_kernel_prints_its_signature_in_the_callers_order(tmp_path: Path) -> None:
    """The repr and NoBuildFits' "Built for" line show each array as the caller passes it,
    the order the call's shape errors name dimensions in: A is held as (l, m, k)."""
    k = _kernels(tmp_path)["gemm_static"]
    assert "(a: float32['l', 32, 'k'], b: float32['l', 'n', 'k'])" in repr(k)
    with pytest.raises(CuteccError) as info:
        k.select(S((32, 512, 64), F32), S((32, 16, 64), F32))
    msg = str(info.value)
    assert "a: float32['l', 32, 'k']" in msg and "a: dimension 1 is 512, expected 32" in msg, msg
    assert "float32[32, 'k', 'l']" not in msg
