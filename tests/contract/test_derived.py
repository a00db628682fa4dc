"""Derived extents and scalars, and scratch tensors, in the manifest and the contract:
the expression grammar, what the manifest stores, its errors
(file and key path, exit 2), and that contracts without them keep their JSON (and keys).

Pure Python: no GPU, no DSL, no compilation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cutecc.cli import main
from cutecc.contract import expr
from cutecc.contract.args import (
    CallingConvention,
    ScalarArg,
    TensorArg,
    arg_from_json,
    arg_to_json,
    args_from_json,
    args_to_json,
)
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest

TRAIN = Path(__file__).parents[1] / "gpu" / "train_kernels" / "kernels.toml"
X = '{ name = "x", dtype = "float32", shape = ["m", "n"] }'


def manifest(*args: str, extra: str = "", profile: str = "") -> str:
    body = ",\n  ".join(args)
    return (f"{profile}\n[kernel.k]\nentry = \"kk.elem:f\"\nargs = [\n  {body},\n  "
            f"{{ kind = \"stream\" }},\n]\n{extra}\n")


def load(tmp_path: Path, text: str):
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    return load_manifest(p), p


# The grammar ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "env", "value"), [
    ("round_up(n, 32)", {"n": 33}, 64),
    ("round_up(n, 32)", {"n": 64}, 64),
    ("ceil_div(m, 132)", {"m": 1000}, 8),
    ("ceil_div(m, 132)", {"m": 1}, 1),
    ("min(n, 4) * d + 1", {"n": 7, "d": 3}, 13),
    ("max(a, b, 2)", {"a": 1, "b": 0}, 2),
    ("(n + 127) // 128 * 128 - n % 128", {"n": 130}, 254),
    ("-n + 2 * n", {"n": 5}, 5),
])
def test_expressions_evaluate_exactly(text: str, env: dict[str, int], value: int) -> None:
    assert expr.evaluate(text, env) == value
    assert expr.evaluate(expr.canonical(text), env) == value


@pytest.mark.parametrize(("text", "why"), [
    ("__import__('os')", "only calls of"),
    ("n ** 2", "operator Pow is not allowed"),
    ("n / 2", "operator Div is not allowed"),
    ("x.y", "Attribute is not allowed"),
    ("n if m else 2", "IfExp is not allowed"),
    ("1.5 * n", "only non-negative integer literals"),
    ("True + n", "only non-negative integer literals"),
    ("round_up(n)", "round_up takes 2 arguments"),
    ("min(n)", "min takes at least 2 arguments"),
    ("ceil_div(n, k=2)", "positional"),
    ("n < 4", "Compare is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("+".join(["n"] * 80), "at most"),
    ("n +", "not an expression"),
    ("round_up", "is a function"),
])
def test_the_grammar_refuses_everything_else(text: str, why: str) -> None:
    with pytest.raises(expr.ExprError, match=why):
        expr.parse(text)


def test_division_by_zero_is_an_error_not_a_crash() -> None:
    with pytest.raises(expr.ExprError, match="division by zero"):
        expr.evaluate("ceil_div(n, k)", {"n": 4, "k": 0})
    with pytest.raises(expr.ExprError, match='symbol "k" is not bound'):
        expr.evaluate("n // k", {"n": 4})


def test_divisibility_of_derived_extents() -> None:
    assert expr.multiple_of("round_up(s, 128)", {}) == 128
    assert expr.multiple_of("round_up(s, 128) * d", {"d": 8}) == 1024
    assert expr.multiple_of("n + 1", {"n": 8}) == 1
    assert expr.multiple_of("2 * n + 4", {"n": 8}) == 4
    assert expr.multiple_of("ceil_div(n, 4)", {"n": 8}) == 1


# The manifest --------------------------------------------------------------------------

def test_the_train_manifest_stores_expressions_and_profile_numbers() -> None:
    m = load_manifest(TRAIN)
    pad = m.kernel("pad_cols").variants[0].convention
    assert pad.results[0].shape == ("m", "round_up(n, 32)")
    assert pad.scalars == (ScalarArg("cols", "int32", value="round_up(n, 32)"),)
    assert pad.given == ()  # derived: not a keyword of the call
    part = m.kernel("col_partials").variants[0].convention
    assert part.results[0].shape == (132, "d")  # h100's sm_count, fixed at build
    assert [s.value for s in part.scalars] == [132, "ceil_div(m, 132)"]
    tri = m.kernel("triple").variants[0].convention
    assert [t.name for t in tri.inputs] == ["x"] and [t.name for t in tri.results] == ["out"]
    assert [(t.name, t.zero) for t in tri.scratch] == [("tmp", False), ("acc", True)]
    assert tri.scratch[1].shape == ("round_up(n, 64)",)
    assert tri.scratch[1].divisibility == (64,)  # compiled into the kernel like a symbol's
    assert [t.name for t in tri.ffi_inputs] == ["x", "acc"]
    assert [t.name for t in tri.ffi_results] == ["out", "tmp", "acc"]
    assert tri.ffi_aliases == ((1, 2),)


def test_variant_parameters_and_hardware_facts_fold_into_expressions(tmp_path: Path) -> None:
    m, _ = load(tmp_path, manifest(
        X, '{ name = "out", role = "output", dtype = "float32", shape = ["ceil_div(m,  $t)", "$t * 2"] }',
        scalar('dtype = "int64", value = "min(n, $hw.sm_count)"'),
        extra="variants = { t = [4, 8] }", profile='profile = "a100"'))
    v = m.kernel("k").variants
    assert v[0].convention.results[0].shape == ("ceil_div(m, 4)", 8)
    assert v[1].convention.results[0].shape == ("ceil_div(m, 8)", 16)
    assert v[0].convention.scalars[0].value == "min(n, 108)"


_OUT = '{ name = "out", role = "output", dtype = "float32", shape = ["m"] }'


def out(*shape: str) -> str:
    return '{ name = "out", role = "output", dtype = "float32", shape = [' + ", ".join(shape) + "] }"


def tensor(what: str) -> str:
    return '{ name = "t", ' + what + ', dtype = "float32", shape = ["m"] }'


def scalar(what: str) -> str:
    return '{ kind = "scalar", name = "s", ' + what + " }"


BAD = [
    pytest.param(manifest('{ name = "x", dtype = "float32", shape = ["m", "n + 1"] }', _OUT),
                 'kernel "k", args[0].shape[1]', "may size only an output or a scratch", id="derived-input"),
    pytest.param(manifest(X, out('"round_up(q, 2)"')),
                 'kernel "k", args (out)', 'output extent "q" is not the extent of any input',
                 id="unbound-symbol"),
    pytest.param(manifest(X, out('"n ** 2"')),
                 'kernel "k", args[1].shape[0]', "operator Pow is not allowed", id="bad-operator"),
    pytest.param(manifest(X, out('"n * $hw.smcount"')),
                 'kernel "k", args[1].shape[0]', 'unknown hardware fact "smcount"', id="bad-hw-fact"),
    pytest.param(manifest(X, out('"n * $q"')),
                 'kernel "k", args[1].shape[0]', '"$q" names no variant parameter', id="bad-param"),
    pytest.param(manifest(X, out('"ceil_div(4, 0)"')),
                 'kernel "k", args[1].shape[0]', "division by zero", id="static-division-by-zero"),
    pytest.param(manifest(X, out('"4 - 5"')),
                 'kernel "k", args[1].shape[0]', "must be positive, got -1", id="static-non-positive"),
    pytest.param(manifest(X, _OUT, scalar('dtype = "int32", value = "ceil_div(m, q)"')),
                 'kernel "k", args (s).value', '"q" is not the extent of any input', id="scalar-unbound"),
    pytest.param(manifest(X, _OUT, scalar('dtype = "float32", value = "m"')),
                 'kernel "k", args[2].value', "must be int32 or int64", id="scalar-float"),
    pytest.param(manifest(X, _OUT, scalar('dtype = "int32", value = "m", default = 1')),
                 'kernel "k", args[2].value', "has no default", id="scalar-value-and-default"),
    pytest.param(manifest(X, _OUT, scalar('dtype = "int32", value = 3000000000')),
                 'kernel "k", args[2].value', "out of the range of int32", id="scalar-range"),
    pytest.param(manifest(X, _OUT, scalar('dtype = "int32", value = "m.real"')),
                 'kernel "k", args[2].value', "Attribute is not allowed", id="scalar-bad-expression"),
    pytest.param(manifest(X, _OUT, tensor('role = "output", zero = true')),
                 'kernel "k", args[2].zero', "only a scratch tensor", id="zero-on-output"),
    pytest.param(manifest(X, _OUT, tensor('role = "scratch", zero = 1')),
                 'kernel "k", args[2].zero', "zero = true, got 1", id="zero-not-bool"),
    pytest.param(manifest(X, _OUT, tensor('role = "scratch", buffer = ["m"]')),
                 'kernel "k", args[2].buffer', "scratch tensor cannot be padded", id="padded-scratch"),
    pytest.param(manifest(X, tensor('role = "scratch"')),
                 'kernel "k", args', "no output", id="scratch-is-no-output"),
    pytest.param(manifest(X, _OUT, '{ name = "t", role = "scratch", dtype = "float32", shape = ["z"] }'),
                 'kernel "k", args (t)', 'scratch extent "z" is not the extent of any input',
                 id="scratch-unbound"),
]


@pytest.mark.parametrize(("text", "key_path", "fragment"), BAD)
def test_bad_derived_and_scratch_declarations_name_file_and_key_path(
        tmp_path: Path, text: str, key_path: str, fragment: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    err = info.value
    assert (err.where, err.key_path, err.exit_code) == (str(p.resolve()), key_path, 2)
    assert fragment in err.message, err.message
    r = CliRunner().invoke(main, ["build", str(p), "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 2 and f": {key_path}: " in r.stderr and not (tmp_path / "c").exists()


def test_a_parameter_used_only_inside_an_expression_is_used(tmp_path: Path) -> None:
    m, _ = load(tmp_path, manifest(X, '{ name = "out", role = "output", dtype = "float32", '
                                      'shape = ["m", "round_up(n, $t)"] }', extra="variants = { t = [8] }"))
    assert m.kernel("k").variants[0].convention.results[0].shape == ("m", "round_up(n, 8)")


# The contract's JSON (what keys are made of) ------------------------------------------

def test_contracts_without_the_new_fields_keep_their_json() -> None:
    t = TensorArg("x", "input", "float32", ("n",))
    s = ScalarArg("eps", "float32", 1e-6)
    assert arg_to_json(t) == {"kind": "tensor", "name": "x", "role": "input", "dtype": "float32",
                              "shape": ["n"], "layout": "row-major", "align": 16}
    assert arg_to_json(s) == {"kind": "scalar", "name": "eps", "dtype": "float32", "default": 1e-6}


def test_new_fields_round_trip_and_a_damaged_contract_is_refused() -> None:
    m = load_manifest(TRAIN)
    for k in m.kernels:
        args = k.variants[0].args
        assert args_from_json(args_to_json(args)) == args
    bad = {"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n + 1"]}
    with pytest.raises(ValueError, match="derived extent"):
        arg_from_json(bad)
    with pytest.raises(ValueError, match="only a scratch tensor"):
        arg_from_json({**bad, "shape": ["n"], "zero": True})
    with pytest.raises(ValueError, match="not allowed"):
        arg_from_json({"kind": "scalar", "name": "s", "dtype": "int32", "value": "m.real"})
    conv = CallingConvention.of(args_from_json(args_to_json(m.kernel("triple").variants[0].args)))
    assert conv.ffi_aliases == ((1, 2),)


# Residuals, named grad pairing, reductions ---------------------------------------------

FWD = ('{ name = "x", dtype = "float32", shape = ["n"] }', '{ name = "w", dtype = "float32", shape = ["n"] }',
       '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }',
       '{ name = "r", role = "output", saved = true, dtype = "float32", shape = ["n"] }')
BWD = ('{ name = "a", dtype = "float32", shape = ["n"] }', '{ name = "b", dtype = "float32", shape = ["n"] }',
       '{ name = "dx", role = "output", dtype = "float32", shape = ["n"] }')


def pair(grad: str, fwd: tuple[str, ...] = FWD, bwd: tuple[str, ...] = BWD) -> str:
    def table(name: str, args: tuple[str, ...], extra: str = "") -> str:
        body = ",\n  ".join((*args, '{ kind = "stream" }'))
        return f'\n[kernel.{name}]\nentry = "kk.elem:f"\nargs = [\n  {body},\n]\n{extra}\n'
    return table("f", fwd, f"grad = {grad}") + table("f_bwd", bwd)


def test_named_pairing_is_parsed_and_keyed_only_when_declared(tmp_path: Path) -> None:
    from cutecc.plan.key import key_inputs

    m, _ = load(tmp_path, pair('{ backward = "f_bwd", args = ["r", "cotangent.out"], returns = ["x"] }'))
    f = m.kernel("f")
    assert f.grad == {"backward": "f_bwd", "args": ["r", "cotangent.out"], "returns": ["x"]}
    conv = f.variants[0].convention
    assert [t.name for t in conv.visible] == ["out"] and [t.name for t in conv.results] == ["out", "r"]
    assert key_inputs(f, f.variants[0], "sm_90a", "0" * 64)["grad"] == f.grad
    plain = load_manifest(Path(__file__).parents[2] / "kernels.toml").kernel("mul")
    assert plain.backward == "mul_bwd" and plain.grad is None
    assert "grad" not in key_inputs(plain, plain.variants[0], "sm_90a", "0" * 64)


# The residual r returned beside out (not saved): a backward taking only out's cotangent
# must say what becomes of r's.
FWD_R = (*FWD[:3], FWD[3].replace("saved = true, ", ""))
TAKES_OUT = '{ backward = "f_bwd", args = ["r", "cotangent.out"], returns = ["x"]'


def test_a_returned_output_without_its_cotangent_is_declared(tmp_path: Path) -> None:
    from cutecc.contract.cotangents import Cotangents
    from cutecc.plan.key import key_inputs

    m, _ = load(tmp_path, pair(TAKES_OUT + ', nondiff = ["r"] }', FWD_R))
    f = m.kernel("f")
    assert (f.grad_nondiff, f.grad_stop) == (("r",), ())
    # nondiff follows from grad.args: the pairing (and so the key) is what it was before
    assert f.grad == {"backward": "f_bwd", "args": ["r", "cotangent.out"], "returns": ["x"]}
    assert key_inputs(f, f.variants[0], "sm_90a", "0" * 64)["grad"] == f.grad
    c = Cotangents.of_pairing("f_bwd", ["out", "r"], f.grad)
    assert (c.taken, c.nondiff, c.stopped) == (("out",), ("r",), ())
    m, _ = load(tmp_path, pair(TAKES_OUT + ', stop_gradient = ["r"] }', FWD_R))
    f = m.kernel("f")
    assert f.grad == {"backward": "f_bwd", "args": ["r", "cotangent.out"], "returns": ["x"],
                      "stop_gradient": ["r"]}  # a choice the runtime must know: stored and keyed
    c = Cotangents.of_pairing("f_bwd", ["out", "r"], f.grad)
    assert (c.taken, c.nondiff, c.stopped) == (("out",), (), ("r",))


GRAD_BAD = [
    pytest.param(pair(TAKES_OUT + " }", FWD_R), 'kernel "f", grad.args',
                 'takes no cotangent of returned output "r", so jax.grad of a loss on "r" would be a '
                 'silent zero: pass "cotangent.r" to the backward, or declare it: nondiff = ["r"]',
                 id="undeclared-dropped-cotangent"),
    pytest.param(pair(TAKES_OUT + ', nondiff = ["r"] }'), 'kernel "f", grad.nondiff[0]',
                 '"r" is saved (not returned): no cotangent ever reaches it', id="nondiff-saved"),
    pytest.param(pair(TAKES_OUT + ', stop_gradient = ["q"] }', FWD_R), 'kernel "f", grad.stop_gradient[0]',
                 '"q" is no output the forward returns (returned: out, r)', id="stop-unknown"),
    pytest.param(pair(TAKES_OUT + ', nondiff = ["out", "r"] }', FWD_R), 'kernel "f", grad.nondiff[0]',
                 'the backward takes "cotangent.out" (grad.args): "out" is differentiable',
                 id="nondiff-taken"),
    pytest.param(pair(TAKES_OUT + ', nondiff = ["r"], stop_gradient = ["r"] }', FWD_R),
                 'kernel "f", grad.stop_gradient', '"r" is also in grad.nondiff', id="nondiff-and-stop"),
    pytest.param(pair(TAKES_OUT + ', nondiff = ["r", "r"] }', FWD_R), 'kernel "f", grad.nondiff[1]',
                 'names "r" twice', id="nondiff-twice"),
    pytest.param(pair('{ backward = "f_bwd", nondiff = ["r"] }', FWD_R), 'kernel "f", grad.nondiff',
                 "needs grad.args", id="nondiff-without-args"),
    pytest.param(pair(TAKES_OUT + ', nondiff = "r" }', FWD_R), 'kernel "f", grad.nondiff',
                 "must be an array of names", id="nondiff-not-a-list"),
    pytest.param(pair('{ backward = "f_bwd" }'), 'kernel "f", grad.backward',
                 'forward output "r" is saved for the backward: say what the backward takes by name',
                 id="saved-needs-named-args"),
    pytest.param(pair('{ backward = "f_bwd", args = ["r", "cotangent.r"] }'), 'kernel "f", grad.args[1]',
                 '"cotangent.r" is no forward input, output or cotangent', id="no-cotangent-of-saved"),
    pytest.param(pair('{ backward = "f_bwd", args = ["r"] }'), 'kernel "f", grad.args',
                 '"f_bwd" takes 2 input(s), grad.args names 1', id="arg-count"),
    pytest.param(pair('{ backward = "f_bwd", args = ["r", "x"], returns = ["q"] }'),
                 'kernel "f", grad.returns[0]', '"q" is no forward input', id="returns-unknown"),
    pytest.param(pair('{ backward = "f_bwd", args = ["r", "x"] }'), 'kernel "f", grad.returns',
                 '"f_bwd" returns 1 result(s), one per name of grad.returns (2: x, w)', id="returns-count"),
    pytest.param(pair('{ backward = "f_bwd", args = ["r", "x"], returns = ["x", "x"] }'),
                 'kernel "f", grad.returns', "names a forward input twice", id="returns-twice"),
    pytest.param(pair('{ backward = "f_bwd", returns = ["x"] }'), 'kernel "f", grad.returns',
                 "needs grad.args", id="returns-without-args"),
    pytest.param(pair('{ backward = "f_bwd", args = "r" }'), 'kernel "f", grad.args',
                 "must be an array of names", id="args-not-a-list"),
    pytest.param(manifest(X, tensor('role = "scratch", saved = true')), 'kernel "k", args[1].saved',
                 "only an output may be saved", id="saved-scratch"),
    pytest.param(manifest(X, tensor('role = "output", reduce = "max"')), 'kernel "k", args[1].reduce',
                 'only an output may be reduced, by "sum"', id="reduce-max"),
    pytest.param(manifest(X, tensor('role = "output", reduce = "sum", saved = true')),
                 'kernel "k", args[1].reduce', "cannot be reduced", id="reduce-saved"),
]


@pytest.mark.parametrize(("text", "key_path", "fragment"), GRAD_BAD)
def test_bad_grad_pairings_name_file_and_key_path(tmp_path: Path, text: str, key_path: str,
                                                  fragment: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    assert (info.value.key_path, info.value.exit_code) == (key_path, 2)
    assert fragment in info.value.message, info.value.message


BCAST_BAD = [
    pytest.param(manifest(X, '{ name = "out", role = "output", dtype = "float32", shape = ["m", "n"], '
                          'broadcast = [0] }'), 'kernel "k", args[1].broadcast',
                 "only an input may be broadcast", id="broadcast-output"),
    pytest.param(manifest('{ name = "x", dtype = "float32", shape = ["m", "n"], broadcast = [2] }', _OUT),
                 'kernel "k", args[0].broadcast', "from 0 to 1", id="broadcast-out-of-range"),
    pytest.param(manifest(X, '{ name = "y", dtype = "float32", shape = ["m", "q"], broadcast = [1] }', _OUT),
                 'kernel "k", args (y).shape[1]', 'the logical extent "q" of a padded dimension',
                 id="broadcast-unbound"),
    pytest.param(manifest('{ name = "x", dtype = "float32", shape = ["m", "n"], broadcast = [0], '
                          'buffer = ["m", "n"] }', _OUT), 'kernel "k", args[0].broadcast',
                 "cannot be padded too", id="broadcast-and-buffer"),
    pytest.param(manifest(X, _OUT, extra="symbols = { m = { bits = 48 } }"), 'kernel "k", symbols.m.bits',
                 "must be 32 or 64", id="bits-48"),
]


@pytest.mark.parametrize(("text", "key_path", "fragment"), BCAST_BAD)
def test_bad_broadcasts_and_bits_name_file_and_key_path(tmp_path: Path, text: str, key_path: str,
                                                        fragment: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    assert (info.value.key_path, info.value.exit_code) == (key_path, 2)
    assert fragment in info.value.message, info.value.message


def test_broadcast_and_wide_are_in_the_contract() -> None:
    m = load_manifest(TRAIN)
    b = m.kernel("add_bias").variants[0].convention.inputs[1]
    assert (b.shape, b.buffer, b.broadcast) == (("m", "d"), (1, "d"), (0,))
    x = m.kernel("plus_one_wide").variants[0].convention.inputs[0]
    assert x.wide == (0,)
    assert arg_from_json(arg_to_json(b)) == b and arg_from_json(arg_to_json(x)) == x


# Composite kernels ----------------------------------------------------------------------

def _comp(table: str) -> str:
    a = ('{ name = "x", dtype = "float32", shape = ["n"] }',
         '{ name = "g", role = "output", dtype = "float32", shape = ["n"] }')
    b = ('{ name = "g", dtype = "float32", shape = ["n"] }',
         '{ name = "y", dtype = "float32", shape = ["n"] }',
         '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }')

    def k(name: str, args: tuple[str, ...]) -> str:
        return f'\n[kernel.{name}]\nentry = "kk.elem:f"\nargs = [{", ".join((*args, STREAM))}]\n'
    return k("la", a) + k("lb", b) + "\n[kernel.c]\n" + table + "\n"


STREAM = '{ kind = "stream" }'


def test_a_composite_is_parsed_and_selected_with_its_launches(tmp_path: Path) -> None:
    m, p = load(tmp_path, _comp('launches = ["la", "lb"]\ninputs = ["x", "y"]\noutputs = ["out", "g"]'))
    (c,) = m.composites
    assert (c.launches, c.inputs, c.outputs) == (("la", "lb"), ("x", "y"), ("out", "g"))
    assert [k.name for k in m.kernels] == ["la", "lb"]
    sel = load_manifest(p, kernels=("c",))
    assert [k.name for k in sel.kernels] == ["la", "lb"] and [x.name for x in sel.composites] == ["c"]


def test_a_composite_may_return_an_input_a_launch_wrote_in_place(tmp_path: Path) -> None:
    """A launch that writes an input's buffer (inout) makes it a launch result (FA4's
    postprocess wrote dq over dout so until it could size dq by q: `extents_only`)."""
    text = _comp('launches = ["la", "lb", "lc"]\ninputs = ["x", "y"]\noutputs = ["out", "y"]') + (
        '\n[kernel.lc]\nentry = "kk.elem:f"\nargs = [{ name = "g", dtype = "float32", shape = ["n"] }, '
        '{ name = "y", role = "inout", dtype = "float32", shape = ["n"] }, ' + STREAM + "]\n")
    m, _ = load(tmp_path, text)
    assert m.composites[0].outputs == ("out", "y")


COMP_BAD = [
    pytest.param('launches = ["la", "zz"]\ninputs = ["x", "y"]\noutputs = ["out"]', 'kernel "c", launches[1]',
                 'no kernel "zz"', id="unknown-launch"),
    pytest.param('launches = ["lb", "la"]\ninputs = ["x", "y"]\noutputs = ["out"]', 'kernel "c", launches[0]',
                 '"lb" takes "g", which is no input of the composite and no result of an earlier launch',
                 id="order"),
    pytest.param('launches = ["la", "lb"]\ninputs = ["x", "y", "z"]\noutputs = ["out"]', 'kernel "c", inputs',
                 '"z" is taken by no launch', id="unused-input"),
    pytest.param('launches = ["la", "lb"]\ninputs = ["x", "y"]\noutputs = ["q"]', 'kernel "c", outputs[0]',
                 '"q" is no launch result', id="unknown-output"),
    pytest.param('launches = ["la", "lb"]\ninputs = ["x", "y"]\noutputs = ["y"]', 'kernel "c", outputs[0]',
                 '"y" is no launch result', id="input-as-output"),
    pytest.param('launches = ["la", "lb"]\ninputs = ["x", "y"]\noutputs = ["out"]\nentry = "a:b"',
                 'kernel "c"', 'unknown key "entry"', id="composite-with-entry"),
    pytest.param('launches = []\ninputs = ["x"]\noutputs = ["out"]', 'kernel "c", launches',
                 "must be a non-empty array of names", id="no-launches"),
]


@pytest.mark.parametrize(("table", "key_path", "fragment"), COMP_BAD)
def test_bad_composites_name_file_and_key_path(tmp_path: Path, table: str, key_path: str,
                                               fragment: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(_comp(table))
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    assert (info.value.key_path, info.value.exit_code) == (key_path, 2)
    assert fragment in info.value.message, info.value.message


def test_a_composite_backward_is_checked_like_a_kernel(tmp_path: Path) -> None:
    text = _comp('launches = ["la", "lb"]\ninputs = ["x", "y"]\noutputs = ["out"]') + (
        '\n[kernel.f]\nentry = "kk.elem:f"\nargs = [{ name = "a", dtype = "float32", shape = ["n"] }, '
        '{ name = "o", role = "output", dtype = "float32", shape = ["n"] }, ' + STREAM + "]\n"
        'grad = { backward = "c", args = ["a", "cotangent.o"] }\n')
    m, _ = load(tmp_path, text)
    assert m.kernel("f").backward == "c"
    assert load_manifest(tmp_path / "kernels.toml", kernels=("f",)).composites[0].name == "c"
    bad = text.replace('grad = { backward = "c", args = ["a", "cotangent.o"] }', 'grad = { backward = "c" }')
    bad = bad.replace('outputs = ["out"]', 'outputs = ["out", "g"]')
    (tmp_path / "kernels.toml").write_text(bad)
    with pytest.raises(CuteccError, match='"c" must take the forward inputs then one cotangent'):
        load_manifest(tmp_path / "kernels.toml")


# Parameters that follow a variant axis (derive) -----------------------------------------

TILED = (X, '{ name = "acc", role = "output", dtype = "float32", shape = ["m", "round_up(n, $tile)"] }')


def test_a_derived_parameter_follows_its_axis_and_is_no_keyword_of_its_own(tmp_path: Path) -> None:
    """FA4's backward: causal attention takes a 64-row tile, non-causal an 80-row one. The
    tile sizes the scratch and reaches the factory; `causal` stays the one call keyword."""
    extra = ('factory_args = { is_causal = "$causal", tile_m = "$tile" }\n'
             "variants = { causal = [false, true] }\n"
             "derive = { tile = { causal = { false = 80, true = 64 } } }\n")
    m, _ = load(tmp_path, manifest(*TILED, extra=extra))
    got = {v.id: (dict(v.factory_args)["tile_m"], v.convention.results[0].shape, v.call)
           for v in m.kernel("k").variants}
    assert got == {"causal=False": (80, ("m", "round_up(n, 80)"), (("causal", False),)),
                   "causal=True": (64, ("m", "round_up(n, 64)"), (("causal", True),))}


def test_an_axis_followed_only_by_a_derived_parameter_is_used(tmp_path: Path) -> None:
    extra = ("variants = { causal = [false, true] }\n"
             "derive = { tile = { causal = { false = 80, true = 64 } } }\n")
    m, _ = load(tmp_path, manifest(*TILED, extra=extra))
    assert [v.call for v in m.kernel("k").variants] == [(("causal", False),), (("causal", True),)]


DERIVE_BAD = [
    pytest.param("derive = { tile = { causal = { false = 80 } } }", "derive.tile.causal",
                 "has no value for causal = true", id="missing-value"),
    pytest.param("derive = { tile = { causal = { false = 80, true = 64, maybe = 1 } } }",
                 "derive.tile.causal.maybe", 'is no value of "causal" (false, true)', id="extra-value"),
    pytest.param("derive = { tile = { colour = { red = 1 } } }", "derive.tile.colour",
                 "names no variant axis (axes: causal)", id="unknown-axis"),
    pytest.param("derive = { causal = { causal = { false = 1, true = 2 } } }", "derive.causal",
                 "is a variant axis already", id="clash"),
    pytest.param("derive = { tile = { causal = { false = [1], true = 2 } } }", "derive.tile.causal.false",
                 "must be a number, string or bool, got an array", id="array-value"),
    pytest.param("derive = { tile = { causal = { false = 80, true = 64 }, d = { x = 1 } } }",
                 "derive.tile", "must be a table with one variant axis", id="two-axes"),
    pytest.param("derive = { tile = { causal = { false = 80, true = 64 } }, unused = "
                 "{ causal = { false = 1, true = 2 } } }", "derive.unused",
                 'parameter "unused" is never used', id="unused"),
]


@pytest.mark.parametrize(("line", "key", "fragment"), DERIVE_BAD)
def test_bad_derived_parameters_name_file_and_key_path(tmp_path: Path, line: str, key: str,
                                                      fragment: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(manifest(*TILED, extra="variants = { causal = [false, true] }\n" + line + "\n"))
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    assert (info.value.key_path, info.value.exit_code) == (f'kernel "k", {key}', 2)
    assert fragment in info.value.message, info.value.message
