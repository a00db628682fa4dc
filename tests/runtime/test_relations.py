"""A relation between the input arrays' extents (`relations = ["ls == l * $split_k"]`) is
checked at every call: one that breaks it (`ls = 7`) is refused naming the relation and the
arrays each extent was read from, never run on a last partial slice. On the CPU: builds are
stand-ins (`helpers.fake_compile`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CuteccError, NoBuildFits
from cutecc.manifest import load_manifest

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

MANIFEST = """\
archs = ["sm_90a"]

[kernel.splitk]
entry = "toyfb.ops2:splitk"
args = [
  {{ name = "a", dtype = "float32", shape = ["l", 8] }},
  {{ name = "b", dtype = "float32", shape = ["ls", 8] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["l", 8] }},
  {{ kind = "stream" }},
]
constants = {{ split_k = "$split_k" }}
variants = {{ split_k = [4] }}
relations = [{relations}]
"""


def _manifest(project: Path, relations: str) -> Path:
    (project.parent / "toyfb" / "ops2.py").write_text("def splitk(a, b, out, stream, split_k=1):\n    pass\n")
    project.write_text(MANIFEST.format(relations=relations))
    return project


def _x(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_a_call_that_breaks_a_relation_is_refused_naming_it(fallback_project: Path) -> None:
    m = _manifest(fallback_project, '"ls == l * $split_k"')
    (v,) = load_manifest(m).kernels[0].variants
    assert v.relations == ("ls == l * 4",)
    cache = fallback_project.parent.parent / "cache"
    assert build(m, opts(cache_dir=cache)).ok
    k = cutecc.load(cache, arch="sm_90a").splitk
    b, env = k.select(_x(2, 8), _x(8, 8))
    assert b.relations == (("ls", "l * 4"),) and env == {"l": 2, "ls": 8}
    with pytest.raises(NoBuildFits, match=r"relation ls == l \* 4 does not hold: ls \(b: dimension 0\) is 7, "
                                          r"l \* 4 is 8 \(l = 2, from a: dimension 0\)"):
        k.select(_x(2, 8), _x(7, 8))
    with pytest.raises(NoBuildFits, match="relation ls == l"):
        jax.eval_shape(k, _x(2, 8), _x(7, 8))


@pytest.mark.parametrize(("relations", "said"), [
    ('"ls == q * 4"', 'relations\\[0\\]: "q" is bound by no input array'),
    ('"ls = l * 4"', "relations\\[0\\]: .* is not two expressions joined by =="),
    ('"ls == l * $nope"', 'names no variant parameter'),
    ('"4 == 4"', "reads no extent"),
])
def test_a_relation_off_its_grammar_is_refused_naming_it(fallback_project: Path, relations: str,
                                                         said: str) -> None:
    m = _manifest(fallback_project, relations)
    with pytest.raises(CuteccError, match=said):
        load_manifest(m)
