"""`extents_only`: an input a call passes only so that its extents bind an output's shape
(FA4's backward postprocess sizes dq by q), which the launcher never receives. Declared in
the manifest, kept in the entry's contract and so in its key, left out of the launcher's
call by the generated wrapper, and checked again when the runtime reads a stored contract.

Pure Python: no GPU, no DSL, no compilation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cutecc.build.compiler import wrapper_source
from cutecc.contract.args import CallingConvention, TensorArg, args_from_json, args_to_json, launched
from cutecc.entry.rules import compute_key
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.key import key_inputs
from cutecc.runtime.calls import Build
from tests.manifest.test_may_alias import _meta

P = '{ name = "p", dtype = "float32", shape = ["m", "np"] }'
Q = '{ name = "q", extents_only = true, dtype = "float32", shape = ["m", "n"] }'
DQ = '{ name = "dq", role = "output", dtype = "float32", shape = ["m", "n"] }'
STREAM = '{ kind = "stream" }'


def _manifest(tmp_path: Path, *args: str) -> Path:
    (tmp_path / "kk").mkdir(parents=True, exist_ok=True)
    (tmp_path / "kk" / "__init__.py").write_text("")
    (tmp_path / "kk" / "elem.py").write_text("def f(*a):\n    return None\n")
    body = ",\n  ".join(args)
    p = tmp_path / "kernels.toml"
    p.write_text(f'format = 1\narchs = ["sm_90a"]\n\n[kernel.k]\nentry = "kk.elem:f"\n'
                 f"args = [\n  {body},\n]\n")
    return p


def _key(tmp_path: Path, *args: str) -> tuple[str, dict]:
    k = load_manifest(_manifest(tmp_path, *args)).kernels[0]
    inputs = key_inputs(k, k.variants[0], "sm_90a", "0" * 64)
    return compute_key(inputs), inputs


def test_it_is_a_call_input_the_launcher_never_receives(tmp_path: Path) -> None:
    v = load_manifest(_manifest(tmp_path, P, Q, DQ, STREAM)).kernels[0].variants[0]
    conv = v.convention
    # The call passes (p, q) and gets dq, a plain result: nothing aliased, nothing in place.
    assert [t.name for t in conv.inputs] == [t.name for t in conv.ffi_inputs] == ["p", "q"]
    assert [t.name for t in conv.results] == ["dq"] and conv.ffi_aliases == ()
    assert [a.name for a in launched(v.args) if isinstance(a, TensorArg)] == ["p", "dq"]
    src = wrapper_source(v.args)
    # The wrapper takes q (the custom call's operand, a pointer) and hands the launcher
    # only its own arguments.
    assert "def cutecc_entry(cutecc_stream, p: cute.Tensor, q: cute.Tensor, dq: cute.Tensor)" in src
    assert "cutecc_launcher(p, dq, cutecc_stream, **cutecc_consts)" in src
    stored = args_to_json(v.args)
    assert stored[1]["extents_only"] is True and all("extents_only" not in d for d in stored[::2])
    assert args_from_json(stored) == v.args


def test_it_is_in_the_key(tmp_path: Path) -> None:
    """The declaration decides the bytes (the wrapper's call) and what a call passes: two
    contracts that differ only by it have different keys, through their args."""
    plain = Q.replace("extents_only = true, ", "")
    a, ia = _key(tmp_path / "a", P, Q, DQ, STREAM)
    b, ib = _key(tmp_path / "b", P, plain, DQ, STREAM)
    assert a != b
    assert {f for f in ia if ia[f] != ib[f]} == {"args"}
    # A contract without it keeps its stored form, and so its key.
    assert all("extents_only" not in d for d in ib["args"])


@pytest.mark.parametrize(("args", "key_path", "words"), [
    ((P, Q.replace("true", '"yes"'), DQ), "args[1].extents_only", "must be true or false"),
    ((P, Q.replace("extents_only", 'role = "inout", extents_only'), DQ), "args[1].extents_only",
     "not an inout"),
    ((P, '{ name = "q", role = "output", extents_only = true, dtype = "float32", shape = ["m", "n"] }', DQ),
     "args[1].extents_only", "not an output"),
    ((P, Q.replace("extents_only = true", 'extents_only = true, param = "mq"'), DQ), "args[1].param",
     "takes no param"),
    ((P, Q.replace("extents_only = true", 'extents_only = true, buffer = ["m", 64]'), DQ),
     "args[1].buffer", "takes no buffer"),
    ((P, f'{{ kind = "tuple", items = [{Q}] }}', DQ), "args[1].items[0].extents_only",
     "top-level arguments"),
    # It must bind something an output needs that the launcher's own arrays do not.
    ((P, Q.replace('"n"', '"np"'), DQ.replace('"n"', '"np"')), "args[1].extents_only",
     "binds no extent that an output needs"),
    ((P, Q, DQ.replace("}", ', may_alias = "q" }')), "args (dq).may_alias", "for its extents only"),
])
def test_a_bad_declaration_is_bad_input_naming_the_key(
        tmp_path: Path, args: tuple[str, ...], key_path: str, words: str) -> None:
    with pytest.raises(CuteccError) as info:
        load_manifest(_manifest(tmp_path, *args))
    err = info.value
    assert err.exit_code == 2 and err.key_path is not None and err.key_path.endswith(key_path), err.key_path
    assert words in err.message, err.message


def test_the_runtime_refuses_a_stored_declaration_it_could_not_honour(tmp_path: Path) -> None:
    base = {"kind": "tensor", "role": "input", "dtype": "float32", "layout": "row-major", "align": 16}
    p = {**base, "name": "p", "shape": ["m", "np"]}
    q = {**base, "name": "q", "shape": ["m", "n"], "extents_only": True}
    dq = {**base, "name": "dq", "role": "output", "shape": ["m", "n"]}
    entry = tmp_path / "entries" / "ab" / "k"
    good = Build.of(_meta([p, q, dq]), entry)
    assert CallingConvention.of(good.args).inputs[1].extents_only
    for bad, words in (({**q, "role": "output"}, "only an unpadded input"),
                       ({**q, "extents_only": 1}, "only an unpadded input"),
                       ({**q, "param": "mq"}, "only an unpadded input")):
        with pytest.raises(ValueError, match=words):
            Build.of(_meta([p, bad, dq]), entry)
    with pytest.raises(ValueError, match="tuple or struct"):
        Build.of(_meta([p, {"kind": "tuple", "items": [q]}, dq]), entry)
