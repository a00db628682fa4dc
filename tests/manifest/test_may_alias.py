"""`may_alias`: an output the kernel may write in an input's memory, declared in the manifest,
kept in the entry's contract (and so in its key), checked again when the runtime reads it.

Pure Python: no GPU, no DSL, no compilation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cutecc.contract.args import CallingConvention, args_from_json, args_to_json
from cutecc.entry.meta import EntryMeta, FileRec, RuntimeLink
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.runtime.calls import Build

X = '{ name = "x", dtype = "float32", shape = ["n"] }'
Y = '{ name = "y", dtype = "float32", shape = ["n"] }'


def _manifest(tmp_path: Path, *args: str) -> Path:
    (tmp_path / "kk").mkdir(exist_ok=True)
    (tmp_path / "kk" / "__init__.py").write_text("")
    (tmp_path / "kk" / "elem.py").write_text("def f(*a):\n    return None\n")
    body = ",\n  ".join(args)
    p = tmp_path / "kernels.toml"
    p.write_text(f'format = 1\narchs = ["sm_90a"]\n\n[kernel.k]\nentry = "kk.elem:f"\n'
                 f"args = [\n  {body},\n]\n")
    return p


def _out(extra: str, dtype: str = "float32", shape: str = '["n"]', role: str = "output") -> str:
    return f'{{ name = "out", role = "{role}", dtype = "{dtype}", shape = {shape}{extra} }}'


def test_declared_alias_reaches_the_convention_and_the_stored_contract(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, X, Y, _out(', may_alias = "y"')))
    v = m.kernels[0].variants[0]
    conv = v.convention
    assert conv.may_aliases == ((1, 0),)  # input y (index 1) -> result out (index 0)
    assert conv.ffi_aliases == ()  # nothing is aliased unless a call asks (`in_place`)
    stored = args_to_json(v.args)
    assert stored[-1]["may_alias"] == "y"
    back = args_from_json(stored)
    assert back == v.args and CallingConvention.of(back).may_aliases == ((1, 0),)
    # An output without it keeps its stored form (and so the key of every other kernel).
    plain = load_manifest(_manifest(tmp_path, X, Y, _out(""))).kernels[0].variants[0]
    assert "may_alias" not in args_to_json(plain.args)[-1]


@pytest.mark.parametrize(("args", "key_path", "words"), [
    ((X, _out(', may_alias = "z"')), "args (out).may_alias", '"z" is not an input'),
    ((X, _out(', may_alias = "x"', dtype="float16")), "args (out).may_alias", "dtype, shape or layout"),
    ((X, _out(', may_alias = "x"', shape='["n", 2]')), "args (out).may_alias", "dtype, shape or layout"),
    ((X, _out(', may_alias = 3')), "args[1].may_alias", "only an output"),
    ((X, '{ name = "y", role = "inout", dtype = "float32", shape = ["n"], may_alias = "x" }'),
     "args[1].may_alias", "on an inout"),
    ((X, '{ name = "a", role = "output", dtype = "float32", shape = ["n"], may_alias = "x" }',
      _out(', may_alias = "x"')), "args (out).may_alias", 'already named by output "a"'),
    (('{ name = "x", dtype = "float32", shape = [8], buffer = [16] }',
      _out(', may_alias = "x"', shape="[8]")),
     "args (out).may_alias", "padded or broadcast"),
])
def test_an_alias_xla_could_not_honour_is_bad_input_naming_the_key(
        tmp_path: Path, args: tuple[str, ...], key_path: str, words: str) -> None:
    with pytest.raises(CuteccError) as info:
        load_manifest(_manifest(tmp_path, *args))
    err = info.value
    assert err.exit_code == 2 and err.key_path is not None and err.key_path.endswith(key_path), err.key_path
    assert words in err.message, err.message


def _meta(args: list[dict]) -> EntryMeta:
    """An entry's record holding the contract `args` (as a damaged or planted one could)."""
    return EntryMeta(key="k", kernel="k", variant="default", arch="sm_90a", platform="x86_64",
                     symbol="cutecc_kernel", library_name="kernel.so",
                     files=(FileRec("kernel.so", "0" * 64, 1),),
                     runtime=RuntimeLink("1" * 64, "librt.so", "2" * 64, 1), backward=None,
                     built_at=None, build_seconds=0.0, artifact=None, ptx_isa=None, entry="m:f",
                     params={}, args=args, toolchain={}, key_inputs={}, sources=())


def test_the_runtime_refuses_a_stored_alias_it_could_not_honour(tmp_path: Path) -> None:
    x = {"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n"],
         "layout": "row-major", "align": 16}
    out = {**x, "name": "out", "role": "output"}
    entry = tmp_path / "entries" / "ab" / "k"
    good = Build.of(_meta([x, {**out, "may_alias": "x"}]), entry)
    assert good.conv.may_aliases == ((0, 0),)
    with pytest.raises(ValueError, match="dtype, shape or layout"):
        Build.of(_meta([x, {**out, "dtype": "float16", "may_alias": "x"}]), entry)
    with pytest.raises(ValueError, match="only an output"):
        Build.of(_meta([{**x, "may_alias": "out"}, out]), entry)
