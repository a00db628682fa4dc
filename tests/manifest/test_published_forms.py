"""Declaring published launchers with no adapter module:
typed factory values (a DSL type, a tuple), a NamedTuple argument with a tensor field, a
compile-time positional argument mid-signature, a keyword-passed scalar with a parameter
left at its default, and a DSL failure reported with the manifest values that caused it.
Compiles with the real DSL (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import opts

from cutecc.commands.build import build
from cutecc.contract.args import ConstArg, StructArg
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest

OPS = '''\
from typing import NamedTuple

import cutlass
import cutlass.cute as cute


class Extra(NamedTuple):
    out: cute.Tensor
    bias: object = None  # left at its default by the manifest


@cute.kernel
def _k(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * factor


class Scale:
    def __init__(self, dtype, tile):
        assert dtype is cutlass.Float32  # a DSL class, not a string
        assert tile == (32, 4), tile  # an array arrives as a tuple
        self.threads = tile[0] * tile[1]

    @cute.jit
    def __call__(self, x: cute.Tensor, extra: Extra, threads: cutlass.Constexpr, stream,
                 unused=None, factor: cutlass.Float32 = 1.0):
        assert threads == self.threads
        n = x.shape[0]
        _k(x, extra.out, factor, n).launch(grid=[(n + threads - 1) // threads, 1, 1],
                                           block=[threads, 1, 1], stream=stream)
'''

OUT = '{ name = "out", role = "output", dtype = "float32", shape = ["n"] }'
ARGS = '''args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { kind = "struct", type = "pub.ops:Extra", fields = { out = OUT } },
  { kind = "const", value = 128 },
  { kind = "stream" },
  { kind = "scalar", name = "factor", dtype = "float32", default = 2.0, param = "factor" },
]
'''

MANIFEST = f'''archs = ["sm_90a"]

[kernel.good]
entry = "pub.ops:Scale"
factory_args = {{ dtype = {{ dtype = "float32" }}, tile = [32, 4] }}
{ARGS.replace("OUT", OUT)}
[kernel.bad]
entry = "pub.ops:Scale"
factory_args = {{ dtype = "Float32", tile = [32, 4] }}
{ARGS.replace("OUT", OUT)}'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pub").mkdir()
    (tmp_path / "pub/__init__.py").write_text("")
    (tmp_path / "pub/ops.py").write_text(OPS)
    (tmp_path / "kernels.toml").write_text(MANIFEST)
    return tmp_path / "kernels.toml"


def test_manifest_parses_typed_values_structs_consts_and_keywords(project: Path) -> None:
    v = load_manifest(project).kernel("good").variants[0]
    assert dict(v.factory_args or ()) == {"dtype": {"dtype": "float32"}, "tile": [32, 4]}
    assert isinstance(v.args[1], StructArg) and isinstance(v.args[2], ConstArg)
    assert v.args[4].param == "factor"
    assert [t.name for t in v.convention.results] == ["out"]  # the struct's tensor is a result


@pytest.mark.parametrize("bad, why", [
    ('{ kind = "const" }', 'missing "value"'),
    ('{ kind = "struct", type = "nocolon" }', "NamedTuple or dataclass"),
    ('{ kind = "const", value = { dtype = "f8x" } }', 'unknown dtype'),
    ('{ kind = "const", value = { dsl = "Int32", import = "a:b" } }', "exactly one of"),
])
def test_bad_forms_are_manifest_errors(project: Path, bad: str, why: str) -> None:
    project.write_text(MANIFEST.replace('{ kind = "const", value = 128 }', bad, 1))
    with pytest.raises(CuteccError, match=why) as e:
        load_manifest(project)
    assert e.value.exit_code == 2


def test_a_positional_after_a_keyword_is_a_manifest_error(project: Path) -> None:
    project.write_text(MANIFEST.replace('{ kind = "stream" },', '{ kind = "stream", param = "stream" },', 1)
                       .replace('default = 2.0, param = "factor" }', "default = 2.0 }", 1))
    with pytest.raises(CuteccError, match='positional argument after keyword "stream"'):
        load_manifest(project)


@pytest.mark.usefixtures("dsl")
def test_published_forms_compile_and_dsl_errors_name_the_manifest(project: Path, tmp_path: Path) -> None:
    report = build(project, opts(cache_dir=tmp_path / "cache", jobs=2), lock=False)
    by = {o.planned.kernel.name: o for o in report.outcomes}
    assert by["good"].status == "built", by["good"].error
    err = by["bad"].error or ""
    assert by["bad"].status == "failed"
    assert 'kernel "bad", variant default, arch sm_90a' in err, err
    assert 'factory_args.dtype = "Float32"' in err and "factory_args.tile = [32, 4]" in err, err
    assert 'hint: factory_args.dtype is a plain string' in err, err
