"""A variant axis of import references (`op = [{ import = "operator:add" }, ..]`) is called
with the object the reference names, as NVIDIA's elementwise-apply example passes its op
(`k(a, b, op=operator.add)`): that object reaches the build, never the fallback; an object
no build was made for is a miss recorded as `{ import = .. }`, which `cutecc misses --toml`
proposes. On the CPU: builds are stand-ins (`helpers.fake_compile`)."""

from __future__ import annotations

import enum
import json
import operator
import warnings
from pathlib import Path

import jax.numpy as jnp
import pytest
from click.testing import CliRunner
from helpers import opts

import cutecc
from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.contract import refs
from cutecc.errors import FallbackWarning, NoBuildFits
from cutecc.store.misses import read_misses

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

MANIFEST = """\
archs = ["sm_90a"]

[kernel.ew]
entry = "toyfb.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["m", 64] },
  { name = "out", role = "output", dtype = "float32", shape = ["m", 64] },
  { kind = "stream" },
]
constants = { op = "$op" }
variants = { op = [{ import = "operator:add" }, { import = "operator:sub" }] }
fallback = "toyfb.ref:ew"
"""

FALLBACK = "def ew(x, *, op):\n    return op(x, x)\n"


class Color(enum.Enum):
    RED = 1


@pytest.fixture
def cache(fallback_project: Path) -> Path:
    fallback_project.write_text(MANIFEST)
    (fallback_project.parent / "toyfb" / "ref.py").write_text(FALLBACK)
    cache = fallback_project.parent.parent / "cache"
    r = build(fallback_project, opts(cache_dir=cache))
    assert r.ok, r.warnings()
    return cache


def test_the_object_a_reference_names_selects_its_build_not_the_fallback(cache: Path) -> None:
    ks = cutecc.load(cache, arch="sm_90a")
    x = jnp.ones((2, 64), jnp.float32)
    for op, text in ((operator.add, "operator:add"), (operator.sub, "operator:sub")):
        b, _ = ks.ew.select(x, op=op)
        assert b.variant == f"op={text}" and b.refs == ("op",)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            assert ks.ew._served_by_fallback([x], {"op": op}, {"op": op}) == (False, None)
    assert read_misses(cache) == []
    # the reference's text still selects it, and a look-alike object does not
    assert ks.ew.select(x, op="operator:add")[0].variant == "op=operator:add"
    with pytest.raises(NoBuildFits, match="was not built; built: op='operator:add', op='operator:sub'"):
        ks.ew.select(x, op=lambda a, b: a + b)


def test_an_object_not_built_is_a_miss_named_as_an_import_reference(cache: Path,
                                                                    fallback_project: Path) -> None:
    ks = cutecc.load(cache, arch="sm_90a")
    x = jnp.ones((2, 64), jnp.float32)
    with pytest.warns(FallbackWarning):
        out = ks.ew(x, op=operator.mul)
    assert float(out[0, 0]) == 1.0
    (m,) = read_misses(cache)
    assert dict(m.keywords) == {"op": {"import": "operator:mul"}}
    r = CliRunner().invoke(main, ["misses", "--cache-dir", str(cache), "--toml", "-m", str(fallback_project)],
                           catch_exceptions=False, prog_name="cutecc")
    assert r.exit_code == 0, r.output
    assert ('variants = { op = [{ import = "operator:add" }, { import = "operator:sub" }, '
            '{ import = "operator:mul" }] }\n# adds op=operator:mul') in r.stdout, r.stdout
    doc = json.loads((cache / "misses.json").read_text())
    assert doc["misses"][0]["keywords"] == {"op": {"import": "operator:mul"}}


def test_references_are_resolved_among_loaded_modules_only() -> None:
    assert refs.ref_of(operator.add) == "operator:add"  # public name, not _operator:add
    assert refs.ref_of(Color.RED) == f"{__name__}:Color.RED"
    assert refs.ref_of(lambda: 0) is None
    assert refs.names("operator:add", operator.add) and not refs.names("operator:add", operator.sub)
    assert refs.loaded_target("no_such_module_xyz:f") is None  # never imported to find out
