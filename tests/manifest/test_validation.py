"""The manifest validator: every bad manifest is one CuteccError naming the file and the key
path (exit 2 at the CLI, nothing written); valid manifests parse into the contract dataclasses.

Pure Python: no GPU, no DSL, no compilation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutecc.cli import main
from cutecc.contract.args import (
    CallingConvention,
    NoneArg,
    ScalarArg,
    StreamArg,
    TensorArg,
    TupleArg,
)
from cutecc.errors import CuteccError
from cutecc.manifest import BUILTIN_PROFILES, find_manifest, load_manifest

X = '{ name = "x", dtype = "float32", shape = ["n"] }'
OUT = '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }'


def kernel(name: str = "k", *args: str, entry: str = "kk.elem:scale", extra: str = "") -> str:
    """A [kernel.NAME] table; `args` default to one input x and one output out over n."""
    body = ",\n  ".join(args or (X, OUT))
    return f'\n[kernel.{name}]\nentry = "{entry}"\nargs = [\n  {body},\n]\n{extra}\n'


GOOD = kernel()


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """A project directory holding a fake kernel package `kk` (never imported here)."""
    root = tmp_path / "proj"
    (root / "kk").mkdir(parents=True)
    (root / "kk" / "__init__.py").write_text('"""A fake kernel package."""\n')
    (root / "kk" / "elem.py").write_text(
        "def scale(x, out, stream=None):\n    return None\n\n\nmul = mul_bwd = make_rms = scale\n")
    return root


def _write(proj: Path, content: str | bytes, name: str = "kernels.toml") -> Path:
    p = proj / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    return p


def _load_text(proj: Path, text: str, **kw: object):
    return load_manifest(_write(proj, text), **kw)


# Bad manifests ---------------------------------------------------------------------

_NON_UTF8_PREFIX = GOOD.encode() + b"# caf"
_SCALARS = "float32, float64, int32, int64, bool"

# (manifest text or bytes, file name, the exact key path or None, a fragment of the message)
BAD = [
    pytest.param('archs = ["sm_90a"\n' + GOOD, "kernels.toml", None, "invalid TOML: ", id="invalid-toml"),
    pytest.param('[kernel.k]\nentry = "kk.elem:scale"\nentry = "kk.elem:other"\n', "kernels.toml", None,
                 "invalid TOML: ", id="toml-duplicate-key"),
    pytest.param(_NON_UTF8_PREFIX + b"\xe9\n", "kernels.toml", None,
                 f"not UTF-8 (byte {len(_NON_UTF8_PREFIX)})", id="non-utf8"),
    pytest.param('arch = ["sm_90a"]\n' + GOOD, "kernels.toml", "<top level>",
                 'unknown key "arch" (allowed: ', id="unknown-top-level-key"),
    pytest.param("format = 2\n" + GOOD, "kernels.toml", "format",
                 "manifest format 2 is not supported (this cutecc reads 1)", id="wrong-format"),
    pytest.param(f"[kernel.k]\nargs = [{X}, {OUT}]\n", "kernels.toml", 'kernel "k"',
                 'missing "entry" ("package.module:attr")', id="kernel-missing-entry"),
    pytest.param(kernel(entry="kk.elem.scale"), "kernels.toml", 'kernel "k", entry',
                 '"kk.elem.scale" is not of the form "package.module:attr"', id="malformed-entry"),
    pytest.param(kernel(entry="kk/elem:scale"), "kernels.toml", 'kernel "k", entry',
                 '"kk/elem:scale" is not of the form', id="malformed-entry-slash"),
    pytest.param(kernel("k", X, OUT, extra="constant = { threads = 1 }"), "kernels.toml", 'kernel "k"',
                 'unknown key "constant"', id="unknown-kernel-key"),
    pytest.param(kernel("k", '{ name = "x", dtpye = "float32", shape = ["n"] }', OUT), "kernels.toml",
                 'kernel "k", args[0]', 'unknown key "dtpye"', id="unknown-tensor-key"),
    pytest.param(kernel("rmsnorm", X, '{ name = "w", dtype = "float32", shape = ["n"] }',
                        '{ name = "out", role = "output", dtype = "f8", shape = ["n"] }'),
                 "kernels.toml", 'kernel "rmsnorm", args[2].dtype', 'unknown dtype "f8" (known: float64, ',
                 id="unknown-dtype"),
    pytest.param(kernel("k", '{ name = "x", dtype = "$dtype", shape = ["n"] }', OUT,
                        extra='variants = { dtype = ["float32", "f8"] }'),
                 "kernels.toml", 'kernel "k", variant dtype=f8, args[0].dtype', 'unknown dtype "f8"',
                 id="unknown-dtype-in-one-variant"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = ["n"] }',
                        '{ kind = "tuple", items = [{ name = "o", role = "output", dtype = "fp32", '
                        'shape = ["n"] }] }'),
                 "kernels.toml", 'kernel "k", args[1].items[0].dtype', 'unknown dtype "fp32"',
                 id="unknown-dtype-in-tuple"),
    pytest.param(kernel("k", '{ name = "x", shape = ["n"] }', OUT), "kernels.toml", 'kernel "k", args[0]',
                 'missing "dtype"', id="missing-dtype"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = [0] }', OUT), "kernels.toml",
                 'kernel "k", args[0].shape[0]', "a static extent must be positive, got 0", id="zero-extent"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = ["n", -4] }', OUT), "kernels.toml",
                 'kernel "k", args[0].shape[1]', "a static extent must be positive, got -4",
                 id="negative-extent"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = [2.5] }', OUT), "kernels.toml",
                 'kernel "k", args[0].shape[0]', "a dimension is an int or a symbol name, got 2.5",
                 id="float-extent"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = ["n-1"] }', OUT), "kernels.toml",
                 'kernel "k", args[0].shape[0]', '"n-1" is not a valid symbol name', id="bad-symbol"),
    pytest.param(kernel("k", X, '{ name = "out", role = "outptu", dtype = "float32", shape = ["n"] }'),
                 "kernels.toml", 'kernel "k", args[1].role',
                 'unknown role "outptu" (input, output, inout, scratch)',
                 id="unknown-role"),
    pytest.param(kernel("k", '{ kind = "pointer", name = "p" }', X, OUT), "kernels.toml",
                 'kernel "k", args[0].kind', 'unknown argument kind "pointer"', id="unknown-arg-kind"),
    pytest.param(kernel("k", X, '{ name = "x", role = "output", dtype = "float32", shape = ["n"] }'),
                 "kernels.toml", 'kernel "k", args', 'argument name "x" is used twice', id="duplicate-names"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "out", dtype = "float32" }'),
                 "kernels.toml", 'kernel "k", args', 'argument name "out" is used twice',
                 id="duplicate-tensor-scalar-name"),
    pytest.param(kernel("k", X, '{ name = "out", role = "output", dtype = "float32", shape = ["n", "m"] }'),
                 "kernels.toml", 'kernel "k", args (out)', 'output extent "m" is not the extent of any input',
                 id="unbound-output-symbol"),
    pytest.param(kernel("k", X, '{ name = "y", dtype = "float32", shape = ["n"] }'), "kernels.toml",
                 'kernel "k", args', 'no output: at least one tensor needs role "output" or "inout"',
                 id="no-output"),
    pytest.param(kernel("k", '{ name = "n", dtype = "float32", shape = ["n"] }',
                        '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }'),
                 "kernels.toml", 'kernel "k", args', '"n" is both an argument and a symbol',
                 id="name-is-also-a-symbol"),
    pytest.param(kernel("k", '{ kind = "stream" }', X, OUT, '{ kind = "stream" }'), "kernels.toml",
                 'kernel "k", args', "more than one stream argument", id="two-streams"),
    pytest.param('archs = ["sm90a"]\n' + GOOD, "kernels.toml", "archs[0]",
                 '"sm90a" is not a GPU architecture such as "sm_90a"', id="bad-arch"),
    pytest.param(kernel(extra='archs = ["sm_90a", "gfx90a"]'), "kernels.toml", 'kernel "k", archs[1]',
                 '"gfx90a" is not a GPU architecture', id="bad-kernel-arch"),
    pytest.param("archs = []\n" + GOOD, "kernels.toml", "archs", "must be a non-empty array",
                 id="empty-archs"),
    pytest.param('profile = "h300"\n' + GOOD, "kernels.toml", "profile",
                 'unknown hardware profile "h300" (known: a100, b200, h100, h200)', id="unknown-profile"),
    pytest.param(kernel(extra='profile = "mi300"'), "kernels.toml", 'kernel "k", profile',
                 'unknown hardware profile "mi300"', id="unknown-kernel-profile"),
    pytest.param("[hardware.mine]\nsm_count = true\n" + GOOD, "kernels.toml", "hardware.mine.sm_count",
                 "must be a number or string, got a bool", id="hardware-fact-bool"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = ["$d"] }',
                        '{ name = "out", role = "output", dtype = "float32", shape = ["$d"] }'),
                 "kernels.toml", 'kernel "k", args[0].shape[0]',
                 '"$d" names no variant parameter (parameters: none)', id="dollar-param-without-variants"),
    pytest.param(kernel(extra='constants = { threads = "$thread", d = "$d" }\nvariants = { d = [1, 2] }'),
                 "kernels.toml", 'kernel "k", variant d=1, constants.threads',
                 '"$thread" names no variant parameter (parameters: d)', id="dollar-param-misspelt"),
    pytest.param(kernel(extra='factory_args = { block = "$blk" }'), "kernels.toml",
                 'kernel "k", factory_args.block', '"$blk" names no variant parameter',
                 id="dollar-param-in-factory-args"),
    pytest.param(kernel(extra="variants = { block = [128, 256] }"), "kernels.toml",
                 'kernel "k", variants.block', 'parameter "block" is never used (refer to it as "$block")',
                 id="unused-variant-parameter"),
    pytest.param(kernel(extra='constants = { t = "$t" }\nvariants = { t = [1, 1] }'), "kernels.toml",
                 'kernel "k", variants.t', "repeats a value", id="variant-repeats-a-value"),
    pytest.param(kernel(extra="variants = { t = [] }"), "kernels.toml", 'kernel "k", variants.t',
                 "must be a non-empty array of values", id="variant-empty"),
    pytest.param(kernel(extra='constants = { sms = "$hw.sm_cnt" }'), "kernels.toml",
                 'kernel "k", constants.sms', 'unknown hardware fact "sm_cnt" (known: ',
                 id="unknown-hw-fact"),
    pytest.param(kernel(extra="constants = { class = 1 }"), "kernels.toml", 'kernel "k", constants.class',
                 "a keyword argument name must be an identifier", id="constant-named-a-keyword"),
    pytest.param(kernel(extra="constants = { t = { x = 1 } }"), "kernels.toml", 'kernel "k", constants.t',
                 "a typed value is a table with exactly one of", id="constant-untyped-table"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "eps", dtype = "float16" }'),
                 "kernels.toml", 'kernel "k", args[2].dtype',
                 f'a runtime scalar must be one of {_SCALARS}, got "float16"', id="scalar-non-scalar-dtype"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "n_iter", dtype = "int32", default = 0.5 }'),
                 "kernels.toml", 'kernel "k", args[2].default', "0.5 is not a int32",
                 id="scalar-int-default-float"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "flag", dtype = "bool", default = 1 }'),
                 "kernels.toml", 'kernel "k", args[2].default', "1 is not a bool",
                 id="scalar-bool-default-int"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "eps", dtype = "float32", default = true }'),
                 "kernels.toml", 'kernel "k", args[2].default', "True is not a float32",
                 id="scalar-float-default-bool"),
    pytest.param(kernel("k", X, OUT, '{ kind = "scalar", name = "eps", dtype = "float32", shape = [1] }'),
                 "kernels.toml", 'kernel "k", args[2]', 'unknown key "shape"', id="scalar-with-shape"),
    pytest.param(kernel(extra='grad = { backward = "k_bwd" }'), "kernels.toml", 'kernel "k", grad.backward',
                 'no kernel "k_bwd" in the manifest', id="grad-missing-kernel"),
    pytest.param(kernel(extra='grad = { backward = "k" }'), "kernels.toml", 'kernel "k", grad.backward',
                 "a kernel cannot be its own backward", id="grad-self"),
    pytest.param(kernel(extra='grad = { backwards = "k2" }') + kernel("k2"), "kernels.toml",
                 'kernel "k", grad', 'must be a table { backward = "KERNEL" }', id="grad-bad-table"),
    pytest.param(kernel(extra='grad = { backward = "k_bwd" }')
                 + kernel("k_bwd", X, '{ name = "dx", role = "output", dtype = "float32", shape = ["n"] }'),
                 "kernels.toml", 'kernel "k", grad.backward',
                 '"k_bwd" must take the forward inputs then one cotangent per forward output (2 inputs) '
                 "and return one gradient per forward input (1 outputs); it takes 1 and returns 1",
                 id="backward-wrong-arity"),
    pytest.param(kernel("k", '{ name = "y", role = "inout", dtype = "float32", shape = ["n"] }',
                        extra='grad = { backward = "k_bwd" }')
                 + kernel("k_bwd", '{ name = "y", dtype = "float32", shape = ["n"] }',
                          '{ name = "dout", dtype = "float32", shape = ["n"] }',
                          '{ name = "dy", role = "output", dtype = "float32", shape = ["n"] }'),
                 "kernels.toml", 'kernel "k", grad.backward',
                 "in-place forwards cannot be differentiated", id="backward-of-inplace"),
    pytest.param(kernel("k", '{ name = "x", dtype = "float32", shape = ["n"], layout = "col-major" }', OUT),
                 "kernels.toml", 'kernel "k", args[0].layout', "or a stride order",
                 id="unsupported-layout"),
    pytest.param(kernel("k", X, '{ name = "out", role = "output", dtype = "float32", shape = ["n"], '
                        "align = 24 }"),
                 "kernels.toml", 'kernel "k", args[1].align',
                 "must be a positive power of two (bytes), got 24",
                 id="align-not-power-of-two"),
    pytest.param(kernel("k", X, '{ name = "out", role = "output", dtype = "float32", shape = ["n"], '
                        "align = 0 }"),
                 "kernels.toml", 'kernel "k", args[1].align', "got 0", id="align-zero"),
    pytest.param(kernel("k", '{ name = "cutecc_x", dtype = "float32", shape = ["n"] }', OUT), "kernels.toml",
                 'kernel "k", args[0].name', 'names starting with "cutecc_" are reserved',
                 id="reserved-name"),
    pytest.param(kernel("k", '{ name = "lambda", dtype = "float32", shape = ["n"] }', OUT), "kernels.toml",
                 'kernel "k", args[0].name', "'lambda' is not a valid identifier", id="keyword-name"),
    pytest.param('[kernel."my-kernel"]\nentry = "kk.elem:scale"\nargs = []\n', "kernels.toml",
                 'kernel "my-kernel"', "a kernel name must be an identifier", id="bad-kernel-name"),
    pytest.param('archs = ["sm_90a"]\n', "kernels.toml", "kernel", "the manifest declares no kernels",
                 id="no-kernels"),
    pytest.param('[tool.cutecc]\nprofiles = "h100"\n[tool.cutecc.kernel.k]\nentry = "kk.elem:scale"\n'
                 f"args = [{X}, {OUT}]\n", "pyproject.toml", "tool.cutecc", 'unknown key "profiles"',
                 id="pyproject-unknown-key"),
    pytest.param('[tool.cutecc]\narchs = ["sm_9"]\n[tool.cutecc.kernel.k]\nentry = "kk.elem:scale"\n'
                 f"args = [{X}, {OUT}]\n", "pyproject.toml", "tool.cutecc.archs[0]",
                 '"sm_9" is not a GPU architecture', id="pyproject-bad-arch"),
    pytest.param('[project]\nname = "x"\n', "pyproject.toml", None, "no [tool.cutecc] table",
                 id="pyproject-without-tool-cutecc"),
]


@pytest.mark.parametrize(("content", "name", "key_path", "fragment"), BAD)
def test_bad_manifest_is_one_error_with_file_and_key_path(
    proj: Path, content: str | bytes, name: str, key_path: str | None, fragment: str
) -> None:
    path = _write(proj, content, name)
    with pytest.raises(CuteccError) as info:
        load_manifest(path)
    err = info.value
    text = err.render()
    assert err.where == str(path.resolve())
    assert err.key_path == key_path
    assert err.exit_code == 2
    prefix = f"{path.resolve()}: {key_path}: " if key_path else f"{path.resolve()}: "
    assert text.startswith(prefix), text
    assert fragment in text[len(prefix):], text
    assert "\n" not in text
    assert str(err) == text


@pytest.mark.parametrize(("content", "name", "key_path", "fragment"), BAD)
def test_bad_manifest_at_the_cli_exits_2_and_writes_nothing(
    proj: Path, tmp_path: Path, content: str | bytes, name: str, key_path: str | None, fragment: str
) -> None:
    path = _write(proj, content, name)
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(cache)])
    assert r.exit_code == 2, (r.output, r.exception)
    assert isinstance(r.exception, SystemExit)  # a rendered error, not a traceback
    assert r.stdout == ""
    assert r.stderr.startswith(f"error: {path.resolve()}: ")
    assert r.stderr.count("\n") == 1
    assert fragment in r.stderr
    if key_path:
        assert f": {key_path}: " in r.stderr
    assert not cache.exists()


def test_wrong_format_type_is_rejected(proj: Path) -> None:
    """A string format is caught (it compares unequal to 1)."""
    with pytest.raises(CuteccError, match=r"format: manifest format '1' is not supported"):
        _load_text(proj, 'format = "1"\n' + GOOD)


@pytest.mark.parametrize("value", ["true", "1.0"])
def test_format_must_be_the_integer_1(proj: Path, value: str) -> None:
    with pytest.raises(CuteccError, match=r": format: "):
        _load_text(proj, f"format = {value}\n" + GOOD)


def test_pyproject_with_non_table_tool_is_a_cutecc_error(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, "tool = 1\n", "pyproject.toml")
    with pytest.raises(CuteccError, match="tool"):
        load_manifest(path)


def test_pyproject_with_non_table_tool_at_the_cli(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, "tool = 1\n", "pyproject.toml")
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {path.resolve()}: ")


def test_missing_manifest_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "kernels.toml"
    with pytest.raises(CuteccError, match="cannot read manifest") as info:
        load_manifest(path)
    assert info.value.where == str(path) and info.value.exit_code == 2
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {path}: cannot read manifest")
    assert not (tmp_path / "cache").exists()


def test_entry_module_that_does_not_exist_is_bad_input(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, kernel(entry="kk.missing:scale"))
    load_manifest(path)  # the manifest itself is well-formed; the module is looked up at planning
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(cache), "--dry-run"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert 'cannot find module "kk.missing"' in r.stderr
    assert not cache.exists()


def test_entry_module_that_does_not_exist_names_manifest_and_key_path(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, kernel(entry="kk.missing:scale"))
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(tmp_path / "cache"), "--dry-run"])
    assert str(path.resolve()) in r.stderr and 'kernel "k", entry' in r.stderr


def test_entry_attribute_the_module_lacks_is_bad_input(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, kernel(entry="kk.elem:scal"))
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(cache)])
    assert r.exit_code == 2, r.output
    assert r.stderr == f'error: {path.resolve()}: kernel "k", entry: module "kk.elem" defines no "scal"\n'
    assert not cache.exists()


def test_unknown_kernel_selection_is_an_error(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, kernel("a") + kernel("b"))
    with pytest.raises(CuteccError) as info:
        load_manifest(path, kernels=("a", "zz"))
    assert info.value.render() == f'{path.resolve()}: no kernel "zz" (kernels: a, b)'
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(path), "--kernel", "zz", "--cache-dir", str(cache)])
    assert r.exit_code == 2
    assert r.stderr == f'error: {path.resolve()}: no kernel "zz" (kernels: a, b)\n'
    assert not cache.exists()


def test_bad_arch_option_is_bad_input(proj: Path, tmp_path: Path) -> None:
    path = _write(proj, GOOD)
    cache = tmp_path / "cache"
    r = CliRunner().invoke(main, ["build", str(path), "--arch", "sm_90a,hopper", "--cache-dir", str(cache)])
    assert r.exit_code == 2
    assert r.stderr == 'error: --arch: "hopper" is not a GPU architecture such as "sm_90a"\n'
    assert not cache.exists()


# Valid manifests -------------------------------------------------------------------


def test_variant_matrix_is_the_cartesian_product_in_order(proj: Path) -> None:
    m = _load_text(proj, kernel(
        "rms",
        '{ name = "x", dtype = "$dtype", shape = ["m", "$d"] }',
        '{ name = "out", role = "output", dtype = "$dtype", shape = ["m", "$d"] }',
        extra='variants = { dtype = ["float32", "float16", "bfloat16"], d = [1024, 4096] }'))
    (k,) = m.kernels
    assert [v.id for v in k.variants] == [
        "dtype=float32,d=1024", "dtype=float32,d=4096",
        "dtype=float16,d=1024", "dtype=float16,d=4096",
        "dtype=bfloat16,d=1024", "dtype=bfloat16,d=4096",
    ]
    assert len({v.id for v in k.variants}) == 6
    assert all(v.kernel == "rms" for v in k.variants)
    assert k.variants[3].params == (("dtype", "float16"), ("d", 4096))


def test_a_kernel_without_variants_has_one_default_variant(proj: Path) -> None:
    (k,) = _load_text(proj, GOOD).kernels
    assert [v.id for v in k.variants] == ["default"]
    assert k.variants[0].params == () and k.variants[0].constants == ()
    assert k.variants[0].factory_args is None


def test_param_substitution_into_dtype_shape_constants_and_factory_args(proj: Path) -> None:
    m = _load_text(proj, kernel(
        "rms",
        '{ name = "x", dtype = "$dtype", shape = ["m", "$d"] }',
        '{ name = "w", dtype = "$dtype", shape = ["$d"] }',
        '{ name = "out", role = "output", dtype = "$dtype", shape = ["m", "$d"] }',
        entry="kk.elem:make_rms",
        extra='factory_args = { block_size = "$block", fixed = "literal" }\n'
              'constants = { threads = "$block", d_const = "$d", flag = true }\n'
              'variants = { dtype = ["bf16", "float32"], d = [1024], block = [128, 256] }'))
    (k,) = m.kernels
    assert len(k.variants) == 4
    v = k.variants[1]
    assert v.id == "dtype=bf16,d=1024,block=256"  # ids keep the manifest's spelling
    x, w, out = v.args
    assert x == TensorArg("x", "input", "bfloat16", ("m", 1024))
    assert w == TensorArg("w", "input", "bfloat16", (1024,))
    assert out == TensorArg("out", "output", "bfloat16", ("m", 1024))
    assert v.constants == (("threads", 256), ("d_const", 1024), ("flag", True))
    assert v.factory_args == (("block_size", 256), ("fixed", "literal"))
    assert k.variants[2].args[0].dtype == "float32"
    assert k.variants[2].factory_args == (("block_size", 128), ("fixed", "literal"))


def test_param_can_name_a_symbol(proj: Path) -> None:
    (k,) = _load_text(proj, kernel(
        "k", '{ name = "x", dtype = "float32", shape = ["$s"] }',
        '{ name = "out", role = "output", dtype = "float32", shape = ["$s"] }',
        extra='variants = { s = ["rows", 8] }')).kernels
    assert [v.args[0].shape for v in k.variants] == [("rows",), (8,)]


def test_hw_facts_from_builtin_and_custom_profiles(proj: Path) -> None:
    text = (
        'profile = "h100"\n'
        "[hardware.mygpu]\nsm_count = 7\nname = \"toy\"\n"
        "[hardware.h200]\nsm_count = 100\n"
        + kernel("a", extra='constants = { sms = "$hw.sm_count", l2 = "$hw.l2_bytes" }')
        + kernel("b", extra='profile = "a100"\nconstants = { sms = "$hw.sm_count" }')
        + kernel("c", '{ name = "x", dtype = "float32", shape = ["$hw.sm_count"] }',
                 '{ name = "out", role = "output", dtype = "float32", shape = ["n", "$hw.sm_count"] }',
                 '{ name = "n_in", dtype = "float32", shape = ["n"] }',
                 extra='profile = "mygpu"\nconstants = { gpu = "$hw.name" }')
        + kernel("d", extra='profile = "h200"\nconstants = { sms = "$hw.sm_count", l2 = "$hw.l2_bytes" }')
    )
    m = _load_text(proj, text)
    a, b, c, d = m.kernels
    assert a.profile == "h100" and a.variants[0].constants == (
        ("sms", BUILTIN_PROFILES["h100"]["sm_count"]), ("l2", BUILTIN_PROFILES["h100"]["l2_bytes"]))
    assert a.variants[0].constants[0][1] == 132
    assert b.profile == "a100" and b.variants[0].constants == (("sms", 108),)
    assert c.profile == "mygpu"
    assert c.variants[0].args[0].shape == (7,) and c.variants[0].args[1].shape == ("n", 7)
    assert c.variants[0].constants == (("gpu", "toy"),)
    # A custom table named like a builtin profile overrides only the facts it names.
    assert d.variants[0].constants == (("sms", 100), ("l2", BUILTIN_PROFILES["h200"]["l2_bytes"]))


@pytest.mark.parametrize(("alias", "canonical"), [
    ("bf16", "bfloat16"), ("f32", "float32"), ("f16", "float16"), ("f64", "float64"),
    ("i8", "int8"), ("u16", "uint16"), ("float8_e4m3fn", "float8_e4m3fn"), ("bool", "bool"),
])
def test_dtype_aliases_are_canonicalised(proj: Path, alias: str, canonical: str) -> None:
    (k,) = _load_text(proj, kernel(
        "k", f'{{ name = "x", dtype = "{alias}", shape = ["n"] }}',
        f'{{ name = "out", role = "output", dtype = "{alias}", shape = ["n"] }}')).kernels
    assert [a.dtype for a in k.variants[0].args] == [canonical, canonical]


def test_scalar_dtype_alias_and_defaults(proj: Path) -> None:
    (k,) = _load_text(proj, kernel(
        "k", X, OUT,
        '{ kind = "scalar", name = "eps", dtype = "f32", default = 1e-6 }',
        '{ kind = "scalar", name = "scale", dtype = "float64", default = 2 }',
        '{ kind = "scalar", name = "steps", dtype = "i64" }',
        '{ kind = "scalar", name = "flag", dtype = "bool", default = false }')).kernels
    assert k.variants[0].args[2:] == (
        ScalarArg("eps", "float32", 1e-6), ScalarArg("scale", "float64", 2),
        ScalarArg("steps", "int64", None), ScalarArg("flag", "bool", False))


def test_tuple_none_stream_scalar_args_parse_into_dataclasses(proj: Path) -> None:
    (k,) = _load_text(proj, kernel(
        "bwd",
        '{ name = "x", dtype = "float32", shape = ["n"], align = 32 }',
        '{ kind = "tuple", items = [\n'
        '    { name = "dx", role = "output", dtype = "float32", shape = ["n"] },\n'
        '    { kind = "tuple", items = [{ kind = "none" }, '
        '{ name = "dy", role = "output", dtype = "bf16", shape = [4, "n"] }] },\n'
        "  ] }",
        '{ kind = "none" }',
        '{ kind = "scalar", name = "eps", dtype = "float32", default = 0.5 }',
        '{ kind = "stream" }')).kernels
    assert k.variants[0].args == (
        TensorArg("x", "input", "float32", ("n",), "row-major", 32),
        TupleArg((
            TensorArg("dx", "output", "float32", ("n",)),
            TupleArg((NoneArg(), TensorArg("dy", "output", "bfloat16", (4, "n")))),
        )),
        NoneArg(),
        ScalarArg("eps", "float32", 0.5),
        StreamArg(),
    )
    conv = k.variants[0].convention
    assert [t.name for t in conv.inputs] == ["x"]
    assert [t.name for t in conv.results] == ["dx", "dy"]
    assert [s.name for s in conv.scalars] == ["eps"]
    assert conv.aliases == ()


def test_calling_convention_with_inout(proj: Path) -> None:
    (k,) = _load_text(proj, kernel(
        "axpy",
        '{ kind = "stream" }',
        '{ kind = "scalar", name = "alpha", dtype = "float32", default = 1.0 }',
        '{ name = "x", dtype = "float32", shape = ["n"] }',
        '{ name = "stats", role = "output", dtype = "float32", shape = [2] }',
        '{ name = "y", role = "inout", dtype = "float32", shape = ["n"] }',
        '{ kind = "none" }',
        '{ name = "w", dtype = "float32", shape = ["n"] }',
        '{ kind = "scalar", name = "beta", dtype = "int32" }')).kernels
    conv = k.variants[0].convention
    assert isinstance(conv, CallingConvention)
    assert [t.name for t in conv.inputs] == ["x", "y", "w"]
    assert [t.name for t in conv.results] == ["stats", "y"]
    assert [s.name for s in conv.scalars] == ["alpha", "beta"]
    assert conv.aliases == ((1, 1),)
    assert conv == CallingConvention.of(k.variants[0].args)


def test_inout_extent_binds_output_symbols(proj: Path) -> None:
    (k,) = _load_text(proj, kernel(
        "k", '{ name = "y", role = "inout", dtype = "float32", shape = ["n"] }',
        '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }')).kernels
    assert [t.role for t in k.variants[0].args] == ["inout", "output"]


def test_defaults_and_overrides(proj: Path) -> None:
    m = _load_text(proj, 'compile_options = "--top"\n' + kernel("a") + kernel(
        "b", extra='archs = ["sm_90a", "sm_100a", "sm_80", "sm_90a"]\nprofile = "b200"\n'
                   'compile_options = "--mine"')
        + kernel("c", extra='archs = "sm_80"'))
    a, b, c = m.kernels
    assert (a.archs, a.profile, a.compile_options) == (("sm_90a",), "h100", "--top")
    assert (b.archs, b.profile, b.compile_options) == (("sm_90a", "sm_100a", "sm_80"), "b200", "--mine")
    assert c.archs == ("sm_80",)
    assert a.entry == "kk.elem:scale" and a.module == "kk.elem"
    assert m.python_path == (proj.resolve(),) and m.root == proj.resolve()


def test_python_path_is_relative_to_the_manifest(proj: Path) -> None:
    m = _load_text(proj, 'python_path = ["src", "../lib", "."]\n' + GOOD)
    assert m.python_path == ((proj / "src").resolve(), (proj.parent / "lib").resolve(), proj.resolve())


PYPROJECT = """\
[project]
name = "demo"
version = "0.1"

[tool.ruff]
line-length = 100

[tool.cutecc]
archs = ["sm_90a", "sm_100a"]
profile = "h200"

[tool.cutecc.kernel.mul]
entry = "kk.elem:mul"
args = [
  { kind = "stream" },
  { name = "x", dtype = "$dtype", shape = ["n"] },
  { name = "y", dtype = "$dtype", shape = ["n"] },
  { name = "out", role = "output", dtype = "$dtype", shape = ["n"] },
]
constants = { threads = 256, sms = "$hw.sm_count" }
variants = { dtype = ["float32", "bf16"] }
grad = { backward = "mul_bwd" }

[tool.cutecc.kernel.mul_bwd]
entry = "kk.elem:mul_bwd"
args = [
  { name = "x", dtype = "$dtype", shape = ["n"] },
  { name = "y", dtype = "$dtype", shape = ["n"] },
  { name = "dout", dtype = "$dtype", shape = ["n"] },
  { kind = "tuple", items = [
      { name = "dx", role = "output", dtype = "$dtype", shape = ["n"] },
      { name = "dy", role = "output", dtype = "$dtype", shape = ["n"] },
  ] },
]
variants = { dtype = ["float32", "bf16"] }
"""


def test_pyproject_tool_cutecc_equals_kernels_toml(proj: Path, tmp_path: Path) -> None:
    from cutecc.plan.build_plan import plan

    py = _write(proj, PYPROJECT, "pyproject.toml")
    other = tmp_path / "other"
    other.mkdir()
    shutil.copytree(proj / "kk", other / "kk")
    body = PYPROJECT.split("[tool.cutecc]\n", 1)[1].replace("[tool.cutecc.", "[")
    kt = _write(other, body)
    a, b = load_manifest(py), load_manifest(kt)
    assert [k.name for k in a.kernels] == ["mul", "mul_bwd"]
    assert a.kernels == b.kernels
    assert a.kernels[0].backward == "mul_bwd"
    assert a.kernels[0].archs == ("sm_90a", "sm_100a") and a.kernels[0].profile == "h200"
    assert a.kernels[0].variants[1].args[1].dtype == "bfloat16"
    assert [p.key for p in plan(a)] == [p.key for p in plan(b)]
    assert len(plan(a)) == 8  # 2 kernels x 2 dtypes x 2 archs


def test_find_manifest_prefers_kernels_toml_then_pyproject(proj: Path, tmp_path: Path) -> None:
    _write(proj, '[project]\nname = "x"\n', "pyproject.toml")
    with pytest.raises(CuteccError, match="no kernels.toml"):
        find_manifest(proj)
    py = _write(proj, PYPROJECT, "pyproject.toml")
    assert find_manifest(proj) == py
    kt = _write(proj, GOOD)
    assert find_manifest(proj) == kt


def test_kernel_selection_keeps_the_backward(proj: Path) -> None:
    path = _write(proj, PYPROJECT.split("[tool.cutecc]\n", 1)[1].replace("[tool.cutecc.", "[")
                  + kernel("other"))
    assert [k.name for k in load_manifest(path).kernels] == ["mul", "mul_bwd", "other"]
    assert [k.name for k in load_manifest(path, kernels=("mul",)).kernels] == ["mul", "mul_bwd"]
    assert [k.name for k in load_manifest(path, kernels=("mul_bwd",)).kernels] == ["mul_bwd"]
    assert [k.name for k in load_manifest(path, kernels=("other",)).kernels] == ["other"]
    assert [k.name for k in load_manifest(path, kernels=("other", "mul")).kernels] == [
        "mul", "mul_bwd", "other"]


# [build]: where a project builds ------------------------------------------


def test_build_table_sets_executor_address_and_remote(proj: Path) -> None:
    m = load_manifest(_write(proj, '[build]\nexecutor = "ray"\nray_address = "10.0.0.1:6379"\n'
                             'remote = "s3://team-kernels/cutecc"\n' + GOOD))
    assert (m.build.executor, m.build.ray_address, m.build.remote) == (
        "ray", "10.0.0.1:6379", "s3://team-kernels/cutecc")
    assert m.select(["k"]).build == m.build
    assert load_manifest(_write(proj, GOOD)).build.executor is None
    py = load_manifest(_write(proj, '[tool.cutecc.build]\nexecutor = "local"\n'
                              + GOOD.replace("[kernel.", "[tool.cutecc.kernel."), "pyproject.toml"))
    assert py.build.executor == "local"


@pytest.mark.parametrize(("table", "key_path", "words"), [
    ('executor = "dask"', "build.executor", 'unknown executor "dask"'),
    ('ray_address = "h:1"', "build.ray_address", 'needs executor = "ray"'),
    ('remote = "http://x/y"', "build.remote", "not a remote cache URL"),
    ('remote = "s3://b/../up"', "build.remote", "not a remote cache URL"),
    ("remote_write = true", "build", "remote_write"),
    ("executor = 3", "build.executor", "string"),
    ('pins = "req\\u001b[2J.txt"', "build.pins", "must name a requirements file"),  # printed in advice
])
def test_bad_build_table_names_its_key(proj: Path, table: str, key_path: str, words: str) -> None:
    path = _write(proj, f"[build]\n{table}\n" + GOOD)
    with pytest.raises(CuteccError) as info:
        load_manifest(path)
    assert info.value.key_path == key_path and words in info.value.message, info.value.render()
    assert info.value.where == str(path.resolve())
