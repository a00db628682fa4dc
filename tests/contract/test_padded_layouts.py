"""Padded leading strides. A tensor declared with `buffer` is
the `shape` block at the origin of a larger array (BLAS's `lda`): the caller passes the
whole buffer, the kernel sees the logical extents with the buffer's strides.

The kernels are those of tests/gpu/layout_kernels (tests/gpu/test_layouts_gpu.py runs them
on a GPU); here they are parsed, keyed, built for sm_90a and lowered on the CPU."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import opts

import cutecc
from cutecc.build.compiler import wrapper_source
from cutecc.commands.build import build
from cutecc.contract.args import TensorArg, arg_from_json, arg_to_json
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.key import key_inputs

GPU_KERNELS = Path(__file__).parents[1] / "gpu"

ROW_DOT = '''
[kernel.row_dot]
entry = "layout_kernels.ops:row_dot"
args = [
  { name = "a", dtype = "float32", shape = ["m", "k"], buffer = ["m", "lda"] },
  { name = "v", dtype = "float32", shape = ["k"] },
  { name = "out", role = "output", dtype = "float32", shape = ["m"] },
  { kind = "stream" },
]
'''
PAD_ROWS = '''
[kernel.pad_rows]
entry = "layout_kernels.ops:copy_rows"
args = [
  { name = "x", dtype = "bfloat16", shape = ["m", "$k"], buffer = ["m", "ldx"] },
  { name = "y", role = "inout", dtype = "bfloat16", shape = ["m", "$k"], buffer = ["m", "ldy"] },
  { kind = "stream" },
]
symbols = { ldx = { divisibility = 8 }, ldy = { divisibility = 8 } }
variants = { k = [64, 1024] }
'''
PAD_COLS = '''
[kernel.pad_cols]
entry = "layout_kernels.ops:copy_cols"
args = [
  { name = "x", dtype = "bfloat16", shape = [64, "k"], buffer = ["ldm", "k"], layout = "column-major" },
  { name = "y", role = "output", dtype = "bfloat16", shape = [64, "k"], layout = "column-major" },
  { kind = "stream" },
]
symbols = { ldm = { divisibility = 8 } }
'''


def _manifest(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "kernels.toml").write_text(f'archs = ["sm_90a"]\npython_path = ["{GPU_KERNELS}"]\n' + text)
    return root / "kernels.toml"


def _tensors(manifest: Path, kernel: str, variant: int = 0) -> list[TensorArg]:
    args = load_manifest(manifest).kernel(kernel).variants[variant].args
    return [a for a in args if isinstance(a, TensorArg)]


def test_a_buffer_parses_into_the_contract_and_its_json(tmp_path: Path) -> None:
    a, v, _ = _tensors(_manifest(tmp_path, ROW_DOT), "row_dot")
    assert a.shape == ("m", "k") and a.buffer == ("m", "lda") and a.extents == ("m", "lda")
    assert a.padded == (1,) and a.symbols == ("m", "k", "lda") and v.buffer is None
    assert arg_from_json(arg_to_json(a)) == a and arg_to_json(a)["buffer"] == ["m", "lda"]
    assert "buffer" not in arg_to_json(v)  # unpadded contracts keep their JSON, and their keys
    x, y = _tensors(_manifest(tmp_path, PAD_ROWS), "pad_rows")
    # divisibility is that of the array passed: the buffer's row stride ldx
    assert x.shape == ("m", 64) and x.divisibility == (1, 8) and y.role == "inout"
    c, _ = _tensors(_manifest(tmp_path, PAD_COLS), "pad_cols")
    assert c.order == (0, 1) and c.perm == (1, 0) and c.padded == (0,) and c.divisibility == (8, 1)


def test_a_buffer_equal_to_the_shape_is_no_padding(tmp_path: Path) -> None:
    same = ROW_DOT.replace('buffer = ["m", "lda"]', 'buffer = ["m", "k"]')
    a, _, _ = _tensors(_manifest(tmp_path, same), "row_dot")
    assert a.buffer is None and a.padded == ()


@pytest.mark.parametrize("text, edit, key_path, why", [
    (ROW_DOT, ('buffer = ["m", "lda"]', 'buffer = ["lda"]'), 'args[0].buffer', "has 1 extents, the shape 2"),
    (ROW_DOT, ('buffer = ["m", "lda"]', 'buffer = "lda"'), 'args[0].buffer', "must be an array"),
    (ROW_DOT, ('buffer = ["m", "lda"]', 'buffer = ["m", 0]'), 'args[0].buffer[1]', "must be positive"),
    (ROW_DOT, ('buffer = ["m", "lda"]', 'buffer = ["m", 1.5]'), 'args[0].buffer[1]', "an int or a symbol"),
    (PAD_ROWS, ('buffer = ["m", "ldx"]', 'buffer = ["m", 32]'), 'variant k=64, args[0].buffer[1]',
     "the buffer's extent 32 is smaller than the logical extent 64 (shape[1])"),
    (ROW_DOT, ('shape = ["k"] }', 'shape = ["n"] }'), 'args (a).shape[1]',
     'the logical extent "k" of a padded dimension is not the extent of any array passed'),
    (ROW_DOT, ('role = "output", dtype = "float32", shape = ["m"] }',
               'role = "output", dtype = "float32", shape = ["m"], buffer = ["ldo"] }'),
     'args[2].buffer', 'an output cannot be padded'),
])
def test_bad_buffers_are_manifest_errors(tmp_path: Path, text: str, edit: tuple[str, str],
                                         key_path: str, why: str) -> None:
    assert edit[0] in text
    with pytest.raises(CuteccError) as e:
        load_manifest(_manifest(tmp_path, text.replace(*edit)))
    kernel = re.search(r"\[kernel\.(\w+)\]", text).group(1)  # type: ignore[union-attr]
    assert e.value.exit_code == 2 and e.value.key_path == f'kernel "{kernel}", {key_path}', str(e.value)
    assert why in str(e.value)


def test_a_padded_output_error_says_to_declare_it_inout(tmp_path: Path) -> None:
    text = ROW_DOT.replace('shape = ["m"] }', 'shape = ["m"], buffer = ["ldo"] }')
    with pytest.raises(CuteccError, match='declare it role = "inout"'):
        load_manifest(_manifest(tmp_path, text))


def test_a_padded_forward_input_cannot_be_differentiated(tmp_path: Path) -> None:
    """Its gradient would be the whole buffer, padding included: JAX asks for a cotangent
    of the array passed, which no declared (dense, unpadded) output can promise."""
    back = '''
[kernel.row_dot_bwd]
entry = "layout_kernels.ops:row_dot"
args = [
  { name = "a", dtype = "float32", shape = ["m", "lda"] },
  { name = "v", dtype = "float32", shape = ["k"] },
  { name = "ct", dtype = "float32", shape = ["m"] },
  { name = "ga", role = "output", dtype = "float32", shape = ["m", "lda"] },
  { name = "gv", role = "output", dtype = "float32", shape = ["k"] },
  { kind = "stream" },
]
'''
    end = '  { kind = "stream" },\n]\n'
    text = ROW_DOT.replace(end, end + 'grad = { backward = "row_dot_bwd" }\n', 1)
    assert text != ROW_DOT
    with pytest.raises(CuteccError) as e:
        load_manifest(_manifest(tmp_path, text + back))
    assert e.value.key_path and "grad.backward" in str(e.value) and 'input "a" is padded' in str(e.value)


def test_a_logical_extent_bound_by_an_unpadded_dimension_of_the_same_tensor(tmp_path: Path) -> None:
    """A square block (k, k) of a (k, ld) buffer: dimension 0 binds k."""
    text = ROW_DOT.replace('shape = ["m", "k"], buffer = ["m", "lda"]',
                           'shape = ["k", "k"], buffer = ["k", "lda"]')
    a, _, _ = _tensors(_manifest(tmp_path, text.replace('shape = ["m"] }', 'shape = ["k"] }')), "row_dot")
    assert a.padded == (1,)


def test_the_buffer_is_in_the_key(tmp_path: Path) -> None:
    def args(text: str) -> object:
        k = load_manifest(_manifest(tmp_path, text)).kernels[0]
        return key_inputs(k, k.variants[0], "sm_90a", "src")["args"]

    padded = args(ROW_DOT)
    dense = args(ROW_DOT.replace(', buffer = ["m", "lda"]', ''))
    assert padded != dense and padded[0]["buffer"] == ["m", "lda"]
    assert args(ROW_DOT.replace('buffer = ["m", "lda"]', 'buffer = ["m", "k"]')) == dense
    assert args(ROW_DOT.replace('"lda"', '"ld"')) != padded  # other name, other symbol facts
    assert args(ROW_DOT + "symbols = { lda = { divisibility = 4 } }\n") != padded


def test_a_static_padded_extent_is_a_call_keyword(tmp_path: Path) -> None:
    """No array shows k = 64 or 1024 (both fit a buffer that is wide enough), so the variants
    are told apart by a keyword: `ks.pad_rows(x, y, k=64)`."""
    vs = load_manifest(_manifest(tmp_path, PAD_ROWS)).kernel("pad_rows").variants
    assert [v.call for v in vs] == [(("k", 64),), (("k", 1024),)]


def test_a_padded_variant_and_a_dense_one_of_the_same_buffer_need_a_keyword(tmp_path: Path) -> None:
    """With buffer = [m, 128], k = 128 is the dense (m, 128) tensor and k = 64 its padded
    block: the same arrays fit both, so k is a call keyword (the runtime never prefers one
    for its static view extent, which no array shows)."""
    text = (PAD_ROWS.replace('"ldx"', "128").replace('"ldy"', "128").replace("[64, 1024]", "[64, 128]")
            .replace("symbols = { ldx = { divisibility = 8 }, ldy = { divisibility = 8 } }\n", ""))
    vs = load_manifest(_manifest(tmp_path, text)).kernel("pad_rows").variants
    assert [v.args[0].buffer for v in vs] == [("m", 128), None]  # type: ignore[union-attr]
    assert [v.call for v in vs] == [(("k", 64),), (("k", 128),)]


def test_an_unknown_or_bad_contract_field_is_refused() -> None:
    """A newer cutecc's tensor field is refused rather than dropped (an older reader would
    otherwise serve a padded kernel as a dense one)."""
    good = {"kind": "tensor", "name": "a", "role": "input", "dtype": "float32", "shape": ["m", "k"],
            "layout": "row-major", "align": 16, "buffer": ["m", "lda"]}
    assert arg_from_json(good).buffer == ("m", "lda")
    with pytest.raises(ValueError, match="unknown tensor field 'pad'"):
        arg_from_json({**good, "pad": 1})
    for bad in (["m"], "lda", ["m", 0], ["m", None]):
        with pytest.raises(ValueError, match="buffer"):
            arg_from_json({**good, "buffer": bad})
    # what the manifest refuses, a contract read back from disk refuses too
    with pytest.raises(ValueError, match="an output cannot be padded"):
        arg_from_json({**good, "role": "output"})
    with pytest.raises(ValueError, match="smaller than the shape"):
        arg_from_json({**good, "shape": ["m", 64], "buffer": ["m", 32]})


def test_wrapper_views_the_buffer_with_logical_extents(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, ROW_DOT + PAD_ROWS + PAD_COLS))
    src = wrapper_source(m.kernel("row_dot").variants[0].args)
    # k is read from v, the array that binds it; the strides are a's buffer's
    assert ("cute.make_layout((cutecc_buf_a.shape[0], v.shape[0],), stride=cutecc_buf_a.stride)"
            in src), src
    src = wrapper_source(m.kernel("pad_rows").variants[1].args)
    assert "cute.make_layout((cutecc_buf_y.shape[0], 1024,), stride=cutecc_buf_y.stride)" in src, src
    src = wrapper_source(m.kernel("pad_cols").variants[0].args)
    assert "cutecc_buf_x = cute.select(x.layout, mode=[1, 0])" in src, src
    assert "cute.make_layout((64, cutecc_buf_x.shape[1],), stride=cutecc_buf_x.stride)" in src, src


@pytest.mark.usefixtures("dsl")
def test_a_vectorised_copy_in_a_padded_buffer_needs_the_stride_divisibility(tmp_path: Path) -> None:
    """128-bit copies along rows of an (m, ldx) buffer need each row 16-byte aligned: the
    DSL refuses them unless ldx is declared a multiple of 8 bf16 (and builds them then)."""
    without = PAD_ROWS.replace("symbols = { ldx = { divisibility = 8 }, ldy = { divisibility = 8 } }\n", "")
    r = build(_manifest(tmp_path / "a", without.replace("[64, 1024]", "[64]")),
              opts(cache_dir=tmp_path / "ca", jobs=1), lock=False)
    (o,) = r.outcomes
    assert o.status == "failed" and "alignment" in (o.error or ""), o.error


@pytest.fixture(scope="module")
def padded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pad")
    report = build(_manifest(root, ROW_DOT + PAD_ROWS + PAD_COLS), opts(cache_dir=root / "cache", jobs=2),
                   lock=False)
    assert [o.status for o in report.outcomes] == ["built"] * 4, [o.error for o in report.outcomes]
    return root / "cache"


def _lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def _call(text: str) -> re.Match[str]:
    m = re.search(r"stablehlo.custom_call @cutecc_\w+\(.*\) \{.*\} : \((.*)\) -> (.*)", text)
    assert m is not None, text
    return m


S = jax.ShapeDtypeStruct
BF, F32 = jnp.bfloat16, jnp.float32


@pytest.mark.usefixtures("dsl")
def test_the_padded_buffer_travels_as_is(padded_cache: Path) -> None:
    """The caller's (m, lda) array is the kernel's operand, with no slice or copy; an inout
    padded tensor gives back its whole buffer."""
    ks = cutecc.load(padded_cache, arch="sm_90a")
    text = _lower(ks.row_dot, S((5, 40), F32), S((33,), F32))
    call = _call(text)
    assert call.group(1) == "tensor<5x40xf32>, tensor<33xf32>" and call.group(2) == "tensor<5xf32>"
    assert "stablehlo.slice" not in text and "stablehlo.transpose" not in text
    out = jax.eval_shape(lambda x, y: ks.pad_rows(x, y, k=64), S((3, 72), BF), S((3, 80), BF))
    assert out.shape == (3, 80) and out.dtype == BF
    assert ks.row_dot.select(S((5, 40), F32), S((33,), F32))[1] == {"m": 5, "lda": 40, "k": 33}
    # the column-major padded operand: the (ldm, k) array goes as its (k, ldm) buffer
    call = _call(_lower(ks.pad_cols, S((72, 5), BF)))
    assert call.group(1) == "tensor<5x72xbf16>" and call.group(2) == "tensor<5x64xbf16>"
    assert jax.eval_shape(ks.pad_cols, S((72, 5), BF)).shape == (64, 5)


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("kernel, keywords, specs, why", [
    ("row_dot", {}, ((5, 40, F32), (41,)),
     'a: dimension 1 of the buffer is 40, smaller than the logical extent 41 ("k") the kernel views in it'),
    ("row_dot", {}, ((5,), (4,)), "a: rank 1, expected 2 ['m', 'lda'] (the buffer)"),
    ("row_dot", {}, ((5, 40), (33, 2)), "v: rank 2, expected 1 ['k']"),
    ("pad_rows", {"k": 64}, ((3, 32, BF), (3, 80, BF)),
     "x: dimension 1 of the buffer is 32, smaller than the logical extent 64 the kernel views in it"),
    ("pad_rows", {"k": 64}, ((3, 72, BF), (3, 60, BF)),
     "y: dimension 1 is 60, expected a multiple of 8 (symbols.ldy.divisibility)"),
    ("pad_rows", {"k": 64}, ((3, 72, BF), (4, 80, BF)),
     'y: dimension 0 is 4, but "m" is 3 from an earlier argument'),
    ("pad_cols", {}, ((56, 5, BF),),
     "x: dimension 0 of the buffer is 56, smaller than the logical extent 64 the kernel views in it"),
])
def test_call_time_checks_name_argument_and_dimension(padded_cache: Path, kernel: str, keywords: dict,
                                                      specs: tuple, why: str) -> None:
    ks = cutecc.load(padded_cache, arch="sm_90a")
    arrays = [S(s[:-1], s[-1]) if not isinstance(s[-1], int) else S(s, F32) for s in specs]
    with pytest.raises(CuteccError) as e:
        getattr(ks, kernel).select(*arrays, **keywords)
    assert why in str(e.value), str(e.value)


@pytest.mark.usefixtures("dsl")
def test_a_static_padded_extent_must_be_named_at_the_call(padded_cache: Path) -> None:
    """(3, 72) fits only k = 64, but a wider buffer would fit k = 1024 too: the call says
    which, always, rather than the runtime guessing from the buffer's width."""
    ks = cutecc.load(padded_cache, arch="sm_90a")
    with pytest.raises(CuteccError, match=r"missing call keyword 'k'.*built: k = "):
        ks.pad_rows.select(S((3, 72), BF), S((3, 80), BF))
    b, env = ks.pad_rows.select(S((3, 2048), BF), S((3, 1024), BF), k=1024)
    assert b.variant == "k=1024" and env == {"m": 3, "ldx": 2048, "ldy": 1024}
    assert "x: bfloat16['m', 1024] in ['m', 'ldx']" in repr(ks.pad_rows)


@pytest.mark.usefixtures("dsl")
def test_an_entry_whose_padded_extent_no_array_binds_is_refused(padded_cache: Path) -> None:
    """A contract the manifest would refuse, read from disk (damaged or planted): the
    runtime refuses the entry rather than fail, or guess, at call time."""
    import dataclasses
    import json

    from cutecc.entry.meta import EntryMeta
    from cutecc.runtime.dispatch import Build

    meta_path = next(p for p in (padded_cache / "entries").glob("*/*/meta.json")
                     if json.loads(p.read_text())["kernel"] == "row_dot")
    meta = json.loads(meta_path.read_text())
    rec = EntryMeta.parse(meta, meta["key"])
    Build.of(rec, meta_path.parent)  # as built: fine
    meta["args"][1]["shape"] = ["n"]
    with pytest.raises(ValueError, match='a: extent "k" is bound by no input array'):
        Build.of(dataclasses.replace(rec, args=meta["args"]), meta_path.parent)
    meta["args"][1]["shape"] = ["k"]
    meta["args"][2]["shape"] = ["q"]
    with pytest.raises(ValueError, match='out: extent "q" is bound by no input array'):
        Build.of(dataclasses.replace(rec, args=meta["args"]), meta_path.parent)


def test_a_tuning_benchmark_size_smaller_than_a_padded_extent_is_refused(tmp_path: Path) -> None:
    """The benchmark would pass a buffer narrower than the view: caught when the manifest is
    read, not as a fault on the GPU."""
    tune = '''
[kernel.row_dot.tune]
params = { t = [1, 2] }
default = { t = 1 }
buckets = { k = [64, 4096] }
sizes = { m = 128, lda = SIZE }
'''
    ok = ROW_DOT.replace('entry = "layout_kernels.ops:row_dot"',
                         'entry = "layout_kernels.ops:row_dot"\nconstants = { t = "$t" }')
    load_manifest(_manifest(tmp_path / "a", ok + tune.replace("SIZE", "4096")))
    with pytest.raises(CuteccError) as e:
        load_manifest(_manifest(tmp_path / "b", ok + tune.replace("SIZE", "128")))
    assert e.value.key_path and "sizes" in e.value.key_path
    assert 'at the bucket k=4096, input "a"\'s buffer extent 128 (dimension 1) is smaller' in str(e.value)
