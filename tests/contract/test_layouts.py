"""Tensor layouts (column-major, any stride order) and the
divisibility of symbolic extents reach the compile, the key and the call-time check.

The caller passes logical arrays; a tensor declared in another layout is handed to the
kernel as the dense buffer of that layout (the logical array transposed), and a result
so declared is transposed back. Built for sm_90a, lowered on the CPU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.contract.args import TensorArg, arg_from_json, arg_to_json
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.key import key_inputs

# The GPU suite's layout kernels (tests/gpu/layout_kernels/ops.py). copy_rows copies one
# 128-bit vector per thread along rows of a row-major (m, n) tensor, copy_cols down the
# columns of a column-major (m, k) one. The DSL refuses both unless the vectorised extent
# is known to be a multiple of 8 bf16 elements.
OPS = Path(__file__).parents[1] / "gpu" / "layout_kernels" / "ops.py"

ROWS = '''
[kernel.rows]
entry = "lay.ops:copy_rows"
args = [
  { name = "x", dtype = "bfloat16", shape = ["m", "n"] },
  { name = "y", role = "output", dtype = "bfloat16", shape = ["m", "n"] },
  { kind = "stream" },
]
'''
DIV_N = 'symbols = { n = { divisibility = 8 } }\n'
COLS = '''
[kernel.cols]
entry = "lay.ops:copy_cols"
args = [
  { name = "x", dtype = "bfloat16", shape = ["m", "k"], layout = "column-major" },
  { name = "y", role = "output", dtype = "bfloat16", shape = ["m", "k"], layout = [0, 1] },
  { kind = "stream" },
]
symbols = { m = { divisibility = 8 } }
'''


def _project(root: Path, text: str) -> Path:
    (root / "lay").mkdir(parents=True, exist_ok=True)
    (root / "lay/__init__.py").write_text("")
    shutil.copy(OPS, root / "lay/ops.py")
    (root / "kernels.toml").write_text('archs = ["sm_90a"]\n' + text)
    return root / "kernels.toml"


def _tensors(manifest: Path, kernel: str) -> list[TensorArg]:
    return [a for a in load_manifest(manifest).kernel(kernel).variants[0].args if isinstance(a, TensorArg)]


def test_layouts_and_divisibility_parse_into_the_contract(tmp_path: Path) -> None:
    x, y = _tensors(_project(tmp_path, COLS), "cols")
    assert x.order == y.order == (0, 1) and x.layout == y.layout == "column-major"
    assert x.perm == (1, 0) and x.divisibility == (8, 1)
    r, _ = _tensors(_project(tmp_path, ROWS + DIV_N), "rows")
    assert r.order is None and r.perm == (0, 1) and r.divisibility == (1, 8)
    three = ROWS.replace('shape = ["m", "n"] }', 'shape = [2, "m", "n"], layout = [1, 0, 2] }')
    t, _ = _tensors(_project(tmp_path, three), "rows")
    assert t.order == (1, 0, 2) and t.perm == (2, 0, 1) and t.layout == "strided"
    assert arg_from_json(arg_to_json(t)) == t and arg_from_json(arg_to_json(x)) == x


@pytest.mark.parametrize("edit, key_path, why", [
    (('layout = [0, 1] }', 'layout = [0, 0] }'), "args[1].layout", "a permutation of 0..1"),
    (('layout = [0, 1] }', 'layout = [0] }'), "args[1].layout", "a permutation of 0..1"),
    (('layout = [0, 1] }', 'layout = "transposed" }'), "args[1].layout", '"column-major" or a stride order'),
    (("divisibility = 8", "divisibility = 0"), "symbols.m.divisibility", "must be an int from 1"),
    (("divisibility = 8", 'divisibility = "8"'), "symbols.m.divisibility", "must be an int from 1"),
    (("{ m = {", "{ q = {"), "symbols.q", "names no symbolic extent"),
    (("{ divisibility = 8 }", "{ align = 8 }"), "symbols.m", 'unknown key "align"'),
])
def test_bad_layouts_and_symbols_are_manifest_errors(tmp_path: Path, edit, key_path: str, why: str) -> None:
    with pytest.raises(CuteccError) as e:
        load_manifest(_project(tmp_path, COLS.replace(*edit)))
    assert e.value.exit_code == 2 and e.value.key_path == f'kernel "cols", {key_path}'
    assert why in str(e.value)


def test_layout_and_divisibility_are_in_the_key(tmp_path: Path) -> None:
    def args(text: str) -> object:
        m = load_manifest(_project(tmp_path, text))
        k = m.kernels[0]
        return key_inputs(k, k.variants[0], "sm_90a", "src")["args"]

    plain = args(ROWS)
    assert args(ROWS + DIV_N) != plain
    col = 'shape = ["m", "n"], layout = "column-major" }'
    assert args(ROWS.replace('shape = ["m", "n"] }', col)) != plain
    # row-major spelled as a stride order is row-major: one contract, one key
    assert args(ROWS.replace('shape = ["m", "n"] }', 'shape = ["m", "n"], layout = [1, 0] }')) == plain


@pytest.mark.usefixtures("dsl")
def test_a_vectorised_copy_over_a_symbolic_extent_needs_its_divisibility(tmp_path: Path) -> None:
    """Without `divisibility` the DSL refuses the 128-bit copy; with it, it compiles."""
    without = build(_project(tmp_path / "a", ROWS), opts(cache_dir=tmp_path / "ca", jobs=1), lock=False)
    (o,) = without.outcomes
    assert o.status == "failed" and "alignment" in (o.error or ""), o.error
    with_ = build(_project(tmp_path / "b", ROWS + DIV_N), opts(cache_dir=tmp_path / "cb", jobs=1),
                  lock=False)
    assert [x.status for x in with_.outcomes] == ["built"], [x.error for x in with_.outcomes]


@pytest.fixture(scope="module")
def cols_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lay")
    report = build(_project(root, COLS + ROWS + DIV_N), opts(cache_dir=root / "cache", jobs=2), lock=False)
    assert [o.status for o in report.outcomes] == ["built", "built"], [o.error for o in report.outcomes]
    return root / "cache"


def _lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.usefixtures("dsl")
def test_a_column_major_operand_compiles_and_travels_as_its_transposed_buffer(cols_cache: Path) -> None:
    """The caller passes the logical (m, k) array; the kernel gets the dense (k, m) buffer
    and sees it as (m, k) with stride 1 down the columns; the (k, m) result comes back
    as the logical (m, k) array."""
    ks = cutecc.load(cols_cache, arch="sm_90a")
    x = jax.ShapeDtypeStruct((24, 5), jnp.bfloat16)
    out = jax.eval_shape(ks.cols, x)
    assert out.shape == (24, 5) and out.dtype == jnp.bfloat16
    text = _lower(ks.cols, x)
    call = re.search(r"stablehlo.custom_call @cutecc_\w+\((%\S+)\).*\(tensor<(\S+)>\) -> tensor<(\S+)>", text)
    assert call is not None, text
    assert call.group(2) == call.group(3) == "5x24xbf16", text  # the buffers are (k, m)
    assert text.count("stablehlo.transpose") == 2, text  # in and out
    # A caller holding the (k, m) buffer w passes w.T: the two transposes meet in the HLO
    # (XLA folds them when it compiles for the GPU: tests/gpu/test_layouts_gpu.py runs it).
    text = _lower(lambda w: ks.cols(w.T).T, jax.ShapeDtypeStruct((5, 24), jnp.bfloat16))
    assert "5x24xbf16" in text


@pytest.mark.usefixtures("dsl")
def test_the_call_checks_divisibility_naming_argument_dimension_and_symbol(cols_cache: Path) -> None:
    ks = cutecc.load(cols_cache, arch="sm_90a")
    with pytest.raises(CuteccError) as e:
        ks.cols.select(jax.ShapeDtypeStruct((20, 5), jnp.bfloat16))
    assert "x: dimension 0 is 20, expected a multiple of 8 (symbols.m.divisibility)" in str(e.value)
    with pytest.raises(CuteccError, match=r"x: dimension 1 is 12, expected a multiple of 8 \(symbols.n"):
        _lower(ks.rows, jax.ShapeDtypeStruct((3, 12), jnp.bfloat16))
    b, env = ks.rows.select(jax.ShapeDtypeStruct((3, 16), jnp.bfloat16))
    assert env == {"m": 3, "n": 16}


def test_buffers_follow_the_declared_order_on_numbers() -> None:
    """The runtime's relayout on fresh random numbers (CPU): what the kernel receives is the
    dense buffer of the declared layout, and reading it back gives the logical array."""
    from cutecc.runtime.dispatch import _from_buffer, _to_buffer

    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = TensorArg("x", "input", "float32", ("a", "b", "c"), "strided", order=(1, 0, 2))
    buf = np.asarray(_to_buffer(jnp.asarray(a), t))
    assert buf.shape == (5, 3, 4)
    # element (i, j, l) of the logical array sits at the strides order (1, 0, 2) implies
    strides = {1: 1, 0: 4, 2: 12}  # dim 1 fastest (order 0), then dim 0, then dim 2
    flat = buf.reshape(-1)
    for i, j, c in [(0, 0, 0), (2, 3, 4), (1, 2, 3)]:
        assert flat[i * strides[0] + j * strides[1] + c * strides[2]] == a[i, j, c]
    np.testing.assert_array_equal(np.asarray(_from_buffer(jnp.asarray(buf), t)), a)
