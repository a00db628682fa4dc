"""Symbolic strides in contracts (`stride = ["lda", 1]`): what the manifest stores (and keys
only when declared), its errors, the runtime's check of the dense arrays a call passes and
gets, `cutecc show`'s account of which strides are static, and (slow) that the compiled
kernel takes the stride as a runtime value where a dense contract compiles it in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import REPO, run_cli, unbuilt_kernels

from cutecc.commands.show import ShowReport, strides
from cutecc.contract.args import (
    StrideSymbol,
    TensorArg,
    arg_from_json,
    arg_to_json,
    args_to_json,
    stride_text,
)
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _manifest(a: str, extra: str = 'symbols = { lda = { divisibility = 4 } }', out: str = "") -> str:
    return f"""
[kernel.k]
entry = "kk.elem:row_dot"
args = [
  {{ name = "a", dtype = "float32", shape = ["m", "k"], {a} }},
  {{ name = "v", dtype = "float32", shape = ["k"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["m", "k"]{out} }},
  {{ kind = "stream" }},
]
{extra}
"""


def _load(tmp_path: Path, text: str):
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    return p, load_manifest(p)


def test_a_declared_stride_is_stored_and_keyed_only_when_declared(tmp_path: Path) -> None:
    _, m = _load(tmp_path, _manifest('stride = ["lda", 1]'))
    a = m.kernel("k").variants[0].args[0]
    assert isinstance(a, TensorArg) and a.stride == (StrideSymbol("lda", 4, 32), 1)
    assert arg_to_json(a)["stride"] == [{"symbol": "lda", "divisibility": 4, "bits": 32}, 1]
    assert arg_from_json(arg_to_json(a)) == a
    _, plain = _load(tmp_path, _manifest('align = 16', extra=""))
    assert all("stride" not in d for d in args_to_json(plain.kernel("k").variants[0].args))
    _, wide = _load(tmp_path, _manifest('stride = ["lda", 1]', 'symbols = { lda = { bits = 64 } }'))
    assert wide.kernel("k").variants[0].args[0].stride == (StrideSymbol("lda", 1, 64), 1)


@pytest.mark.parametrize(("a", "extra", "key_path", "fragment"), [
    ('stride = ["lda"]', "", 'args[0].stride', "one stride per dimension (2)"),
    ('stride = ["lda", 1.5]', "", "args[0].stride[1]", "an int (static) or a symbol name"),
    ('stride = ["k", 1]', "", "args[0].stride[0]", '"k" is an extent of this tensor'),
    ('stride = ["lda", 1], buffer = ["m", "ldb"]', "", "args[0].stride", "takes its buffer's strides"),
    ('stride = ["lda", -1]', "", "args[0].stride[1]", "an int (static) or a symbol name"),
    ('align = 16', 'symbols = { lda = { divisibility = 4 } }', "symbols.lda", "names no symbolic extent"),
])
def test_bad_strides_name_the_key(tmp_path: Path, a: str, extra: str, key_path: str, fragment: str) -> None:
    with pytest.raises(CuteccError) as info:
        _load(tmp_path, _manifest(a, extra))
    assert info.value.exit_code == 2 and key_path in (info.value.key_path or ""), info.value.key_path
    assert fragment in info.value.message, info.value.message


def test_a_stride_symbol_that_is_another_tensors_extent_is_refused(tmp_path: Path) -> None:
    text = _manifest("align = 16", "").replace('shape = ["k"] }', 'shape = ["k"], stride = ["m"] }')
    with pytest.raises(CuteccError) as info:
        _load(tmp_path, text)
    assert info.value.key_path == 'kernel "k", args (v).stride'
    assert '"m" is an extent of the kernel' in info.value.message


def test_a_call_passes_dense_arrays_whose_strides_fit(tmp_path: Path) -> None:
    p, _ = _load(tmp_path, _manifest('stride = ["lda", 1]', out=', stride = ["lda", 1]'))
    k = unbuilt_kernels(p)["k"]
    assert jax.eval_shape(k, S((5, 12), F32), S((12,), F32)).shape == (5, 12)
    with pytest.raises(CuteccError, match=r"a: dimension 0 has stride 10, not a multiple of 4 "
                                          r"\(symbols.lda.divisibility\)"):
        jax.eval_shape(k, S((5, 10), F32), S((10,), F32))


def test_a_static_stride_must_be_the_dense_arrays(tmp_path: Path) -> None:
    p, _ = _load(tmp_path, _manifest('stride = [64, 1]', ""))
    k = unbuilt_kernels(p)["k"]
    assert jax.eval_shape(k, S((3, 64), F32), S((64,), F32)).shape == (3, 64)
    with pytest.raises(CuteccError, match=r"a: dimension 0 has stride 32 in the dense array, but the "
                                          r"kernel was compiled for stride 64"):
        jax.eval_shape(k, S((3, 32), F32), S((32,), F32))


def test_show_says_which_strides_are_static(tmp_path: Path) -> None:
    _, m = _load(tmp_path, _manifest('stride = ["lda", 1]'))
    meta = {"args": args_to_json(m.kernel("k").variants[0].args)}
    got = strides(meta)
    assert got["a"] == {"strides": ["lda", "1"], "static": [False, True]}
    assert got["out"] == {"strides": ["k", "1"], "static": [False, True]}  # dense over a symbolic k
    assert got["v"] == {"strides": ["1"], "static": [True]}
    info = {"key": "k" * 64, "label": "k[default]@sm_90a", "path": "/c", "last_used": "never",
            "disk_bytes": 0, "meta": meta, "files": [], "strides": got}
    lines = ShowReport(info).lines()
    assert "strides    a: (lda, 1) runtime: lda" in lines and "strides    v: (1) all static" in lines
    static = strides({"args": [{**meta["args"][0], "shape": ["m", 4096]}]})
    assert static["a"]["strides"] == ["lda", "1"]
    unstrided = {k: v for k, v in meta["args"][0].items() if k != "stride"}
    dense = strides({"args": [{**unstrided, "shape": ["m", 4096]}]})
    assert dense["a"] == {"strides": ["4096", "1"], "static": [True, True]}  # what quack's bwd got


def test_the_compiled_kernel_takes_a_symbolic_stride_as_a_runtime_value(dsl: None, tmp_path: Path) -> None:
    """The same launcher over (m, 64) rows: from a dense contract the row stride is compiled
    in (64); declared `stride = ["lda", 1]` it is a runtime value, a multiple of 4, as the
    kernel's mangled name (its layout) shows."""
    from cutecc.cubin import kernel_names

    p = tmp_path / "kernels.toml"
    p.write_text(f'archs = ["sm_90a"]\npython_path = ["{REPO / "tests" / "gpu"}"]\n' + """
[kernel.dense64]
entry = "layout_kernels.ops:row_dot"
args = [
  { name = "a", dtype = "float32", shape = ["m", 64] },
  { name = "v", dtype = "float32", shape = [64] },
  { name = "out", role = "output", dtype = "float32", shape = ["m"] },
  { kind = "stream" },
]

[kernel.sym64]
entry = "layout_kernels.ops:row_dot"
args = [
  { name = "a", dtype = "float32", shape = ["m", 64], stride = ["lda", 1] },
  { name = "v", dtype = "float32", shape = [64] },
  { name = "out", role = "output", dtype = "float32", shape = ["m"] },
  { kind = "stream" },
]
symbols = { lda = { divisibility = 4 } }
""")
    r = run_cli("build", str(p), "--cache-dir", str(tmp_path / "c"), "--no-lock")
    assert r.returncode == 0, r.stderr + r.stdout
    import cutecc

    ks = cutecc.load(tmp_path / "c", arch="sm_90a")
    dense, sym = (kernel_names(ks[n].builds[0].library.read_bytes()) for n in ("dense64", "sym64"))
    assert any("o64641_" in n for n in dense), dense  # (?, 64):(64, 1), static row stride
    assert any("o64div41_" in n for n in sym), sym  # (?, 64):(?{div=4}, 1)


def _partials(tmp_path: Path, dw: str, extra: str = "") -> Path:
    """quack's RMSNorm backward shape: per-dtype stride divisibility and dw alignment, and
    partial rows sized from the hardware profile."""
    p = tmp_path / "kernels.toml"
    align = ", dw_align = { dtype = { bfloat16 = 32, float32 = 16 } }" if "$dw_align" in dw else ""
    p.write_text(f"""
[kernel.bwd]
entry = "kk.ops:bwd"
args = [
  {{ name = "x", dtype = "$dtype", shape = ["m", 64], stride = ["ldx", 1] }},
  {{ name = "dw", role = "output", reduce = "sum", dtype = "float32", shape = ["2*$hw.sm_count", 64], {dw} }},
  {{ kind = "stream" }},
]
variants = {{ dtype = ["bfloat16", "float32"] }}
derive = {{ div = {{ dtype = {{ bfloat16 = 8, float32 = 4 }} }}{align} }}
symbols = {{ ldx = {{ divisibility = "$div", bits = 64 }}{extra} }}
""")
    return p


def test_divisibility_and_align_may_follow_a_variant(tmp_path: Path) -> None:
    p = _partials(tmp_path, 'align = "$dw_align"')
    bf16, f32 = load_manifest(p).kernel("bwd").variants
    assert bf16.args[0].stride == (StrideSymbol("ldx", 8, 64), 1)
    assert f32.args[0].stride == (StrideSymbol("ldx", 4, 64), 1)
    assert (bf16.args[1].align, f32.args[1].align) == (32, 16)
    assert bf16.args[1].shape == (264, 64)  # a derived extent reading no symbol is folded, static


@pytest.mark.parametrize(("dw", "extra", "key_path", "fragment"), [
    ('align = "$nope"', "", "args[1].align", '"$nope" names no variant parameter'),
    ("runtime = [2]", "", "args[1].runtime", "distinct dimension indices from 0 to 1"),
    ("runtime = [0, 0]", "", "args[1].runtime", "distinct dimension indices from 0 to 1"),
    ("align = 16", ', n = { divisibility = "$dtype" }', "symbols.n.divisibility", "must be an int from 1"),
])
def test_bad_variant_facts_name_the_key(tmp_path: Path, dw: str, extra: str, key_path: str,
                                        fragment: str) -> None:
    with pytest.raises(CuteccError) as info:
        load_manifest(_partials(tmp_path, dw, extra))
    assert key_path in (info.value.key_path or ""), info.value.key_path
    assert fragment in info.value.message, info.value.message


def test_runtime_names_no_symbol_and_no_padded_tensor(tmp_path: Path) -> None:
    for a, fragment in (('runtime = [0]', 'dimension 0 (\'m\') is a symbol'),
                        ('runtime = [1], buffer = ["m", "lda"]', "a padded or broadcast tensor")):
        with pytest.raises(CuteccError) as info:
            _load(tmp_path, _manifest(a, "").replace('"k"]', "64]", 1))
        assert "args[0].runtime" in (info.value.key_path or "") and fragment in info.value.message, info.value


def test_a_runtime_extent_is_checked_or_computed_per_call_and_keyed(tmp_path: Path) -> None:
    """`runtime = [i]`: the extent stays static (or derived) in the contract, so the call
    checks it (an output's is computed, the partials summed), and the contract records
    which dimensions the kernel compiles as values of their own."""
    p = _partials(tmp_path, "runtime = [0]")
    bf16 = load_manifest(p).kernel("bwd").variants[0]
    dw = bf16.args[1]
    assert dw.shape == (264, 64) and dw.runtime == (0,)
    assert arg_to_json(dw)["runtime"] == [0] and arg_from_json(arg_to_json(dw)) == dw
    assert "runtime" not in arg_to_json(bf16.args[0])
    assert stride_text(dw) == ["64", "1"]
    assert stride_text(dataclasses.replace(dw, runtime=(1,))) == ["dim1", "1"]  # rows as long as a value
    st = strides({"args": args_to_json(bf16.args)})
    assert st["dw"] == {"strides": ["64", "1"], "static": [True, True], "runtime": [0], "shape": [264, 64]}
    info = {"key": "k" * 64, "label": "bwd@sm_90a", "path": "/c", "last_used": "never", "disk_bytes": 0,
            "meta": {}, "files": [], "strides": st}
    assert ("strides    dw: (64, 1) all static; extent 0 (264) compiled as a runtime value"
            in ShowReport(info).lines())
    k = unbuilt_kernels(p)["bwd"]
    got = jax.eval_shape(lambda x: k(x), S((7, 64), jnp.bfloat16))
    assert got.shape == (64,)  # the (264, 64) partials summed over their rows
    lowered = jax.jit(lambda x: k(x)).trace(S((7, 64), jnp.bfloat16)).lower(lowering_platforms=("cuda",))
    assert "tensor<264x64xf32>" in lowered.as_text()
    with pytest.raises(CuteccError, match="64"):  # a static extent compiled as a value is still checked
        jax.eval_shape(lambda x: k(x), S((7, 32), jnp.bfloat16))
    with pytest.raises(ValueError, match="not indices of static or derived"):
        arg_from_json({**arg_to_json(bf16.args[0]), "runtime": [0]})


def test_the_examples_compile_quacks_strides_as_its_own_build_does() -> None:
    """examples/kernels.toml declares quack's row strides as runtime values (64-bit, 16-byte
    multiples in elements of the dtype) and RMSNorm's dw partial rows as a runtime extent."""
    m = load_manifest(REPO / "examples" / "kernels.toml")
    for v in m.kernel("quack_rmsnorm_bwd").variants:
        div = 8 if dict(v.params)["dtype"] == "bfloat16" else 4
        x, dw = v.args[0], v.args[7]
        assert isinstance(x, TensorArg) and x.stride == (StrideSymbol("ldx", div, 64), 1)
        assert isinstance(dw, TensorArg) and dw.name == "dw" and dw.shape[0] == 264 and dw.runtime == (0,)
        assert dw.align == div * 4 and dw.stride == (StrideSymbol("lddw", div, 64), 1)
    bwd = m.kernel("quack_cross_entropy_bwd").variants[0]
    logits, dlogits = bwd.args[0], bwd.args[3]
    assert logits.stride == dlogits.stride == (StrideSymbol("ld", 8, 64), 1)  # quack's one fake for both


UNIT = """
[kernel.k]
entry = "kk.elem:f"
args = [
  { name = "b", dtype = "float32", shape = [1, 256, 64, 128], stride = [0, 8192, 128, 1] },
  { name = "x", dtype = "float32", shape = ["l", "n"], stride = [7, 1] },
  { name = "out", role = "output", dtype = "float32", shape = [1, "n"], stride = [5, 1] },
  { kind = "stream" },
]
"""


def test_any_stride_on_an_extent_1_dimension_fits_the_call(tmp_path: Path) -> None:
    # cutlass_call's static layout (1,256,64,128):(0,8192,128,1): dimension 0 has one index,
    # so its stride never addresses memory; the dense array's 2097152 there is as good as 0
    p, _ = _load(tmp_path, UNIT)
    k = unbuilt_kernels(p)["k"]
    b = S((1, 256, 64, 128), F32)
    assert jax.eval_shape(k, b, S((1, 9), F32)).shape == (1, 9)  # "l" is 1 at this call
    with pytest.raises(CuteccError, match=r"x: dimension 0 has stride 9 in the dense array, but the "
                                          r"kernel was compiled for stride 7"):
        jax.eval_shape(k, b, S((2, 9), F32))  # "l" is 2: the stride addresses memory


def test_divisibility_reaches_what_the_symbols_width_carries(tmp_path: Path) -> None:
    # cutlass_call's dynamic layouts carry 2,097,152 (2^21) on a 64-bit stride
    wide = 'symbols = { lda = { divisibility = 2097152, bits = 64 } }'
    _, m = _load(tmp_path, _manifest('stride = ["lda", 1]', wide))
    assert m.kernel("k").variants[0].args[0].stride == (StrideSymbol("lda", 2097152, 64), 1)
    narrow = 'symbols = { lda = { divisibility = 1073741824 } }'
    _, m = _load(tmp_path, _manifest('stride = ["lda", 1]', narrow))
    assert m.kernel("k").variants[0].args[0].stride[0].divisibility == 1 << 30
    for k, bits, cap in ((1 << 31, 32, "1073741824"), (1 << 63, 64, "4611686018427387904")):
        with pytest.raises(CuteccError, match=f"must be an int from 1 to {cap}") as info:
            _load(tmp_path, _manifest('stride = ["lda", 1]',
                                      f'symbols = {{ lda = {{ divisibility = {k}, bits = {bits} }} }}'))
        assert info.value.key_path == 'kernel "k", symbols.lda.divisibility'
    derived = 'symbols = { lda = { divisibility = "$div", bits = 64 } }\nvariants = { div = [2097152] }'
    _, m = _load(tmp_path, _manifest('stride = ["lda", 1]', derived))
    assert m.kernel("k").variants[0].args[0].stride[0].divisibility == 2097152
