"""The most specific variant wins where contracts nest: a call fitting `vec=2` (built for
`n % 2 == 0`) and `vec=4` (`n % 4 == 0`) takes `vec=4`, whose contract implies the other's;
where neither implies the other (`m % 2` against `n % 2`) the call is refused naming both,
never a silent pick. On the CPU: builds are stand-ins (`helpers.fake_compile`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CallError, NoBuildFits

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

HEAD = """\
archs = ["sm_90a"]

[kernel.vec]
entry = "toyfb.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["m", "n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["m", "n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
"""

NESTED = HEAD + """\
constants = { vec = "$vec" }
symbols = { n = { divisibility = "$vec" } }
variants = { vec = [1, 2, 4] }
"""

CROSSED = HEAD + """\
constants = { along = "$along" }
symbols = { m = { divisibility = "$dm" }, n = { divisibility = "$dn" } }
variants = { along = ["rows", "cols"] }
derive = { dm = { along = { rows = 2, cols = 1 } }, dn = { along = { rows = 1, cols = 2 } } }
"""


def _kernel(project: Path, manifest: str) -> cutecc.runtime.dispatch.KernelFn:
    project.write_text(manifest)
    cache = project.parent.parent / "cache"
    r = build(project, opts(cache_dir=cache))
    assert r.ok, r.warnings()
    return cutecc.load(cache, arch="sm_90a").vec


def _x(m: int, n: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((m, n), jnp.float32)


def test_the_variant_whose_divisibility_implies_the_others_wins(fallback_project: Path) -> None:
    k = _kernel(fallback_project, NESTED)
    assert k.select(_x(3, 4096))[0].variant == "vec=4"
    assert k.select(_x(3, 6))[0].variant == "vec=2"
    assert k.select(_x(3, 7))[0].variant == "vec=1"


def test_contracts_neither_of_which_implies_the_other_are_ambiguous(fallback_project: Path) -> None:
    k = _kernel(fallback_project, CROSSED)
    assert k.select(_x(4, 3))[0].variant == "along=rows"
    assert k.select(_x(3, 4))[0].variant == "along=cols"
    with pytest.raises(CallError, match=r"fits several variants, none more specific than the others: "
                                        r"along=cols, along=rows"):
        k.select(_x(4, 4))
    with pytest.raises(NoBuildFits):
        k.select(_x(3, 3))
