"""A grad-paired kernel whose forward fits a call but whose backward was built for fewer
shapes: jax.grad runs the backward's own declared fallback where none of its builds takes
the arrays (and keeps the forward's build), and without one says which backward call fits
nothing. Lowered only (`helpers.unbuilt_kernels`): nothing runs on this CPU host."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import unbuilt_kernels, unbuilt_target

from cutecc.contract.fallbacks import ClosureFile, FallbackRef
from cutecc.errors import FallbackWarning, NoBuildFits
from cutecc.runtime.fallback import Fallback

MANIFEST = """
[kernel.sq]
entry = "kk.elem:sq"
args = [
  { name = "x", dtype = "float32", shape = ["m", "n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["m", "n"] },
  { kind = "stream" },
]
grad = { backward = "sq_bwd" }

[kernel.sq_bwd]
entry = "kk.elem:sq_bwd"
args = [
  { name = "x", dtype = "float32", shape = ["m", 64] },
  { name = "dout", dtype = "float32", shape = ["m", 64] },
  { name = "dx", role = "output", dtype = "float32", shape = ["m", 64] },
  { kind = "stream" },
]
"""


@pytest.fixture
def ks(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "kernels.toml").write_text(MANIFEST)
    SQREF.write_to(tmp_path)
    sys.modules.pop("sqref", None)
    return unbuilt_kernels(tmp_path / "kernels.toml")


class SQREF:
    """The backward's fallback module, and its pin (as a build records it)."""

    text = b"def sq_bwd(x, dout):\n    return 2 * x * dout\n"
    file = ClosureFile("sqref", "sqref.py", hashlib.sha256(text).hexdigest())

    @classmethod
    def write_to(cls, root: Path) -> None:
        (root / "sqref.py").write_bytes(cls.text)


def _lowered(fn: Any, n: int) -> str:
    spec = jax.ShapeDtypeStruct((3, n), jnp.float32)
    traced = jax.jit(jax.value_and_grad(lambda x: fn(x).sum())).trace(spec)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def test_the_backwards_fallback_serves_what_its_builds_do_not_take(ks: dict[str, Any]) -> None:
    fwd, bwd = (unbuilt_target(n, ks[n].builds[0].key) for n in ("sq", "sq_bwd"))
    assert re.findall(r"custom_call @(cutecc_\w+)", _lowered(ks["sq"], 64)) == [fwd, bwd]
    with pytest.raises(NoBuildFits, match=r'(?s)kernel "sq_bwd".*dimension 1 is 32, expected 64'):
        _lowered(ks["sq"], 32)
    root = Path(ks["sq"].builds[0].library).parent  # the manifest's directory, where sqref.py is
    ks["sq_bwd"]._fallback = Fallback("sq_bwd", FallbackRef.of("sqref:sq_bwd", [SQREF.file]), arch="sm_90a",
                                      strict=False, misses_root=None, roots=[root])
    with pytest.warns(FallbackWarning, match=r'"sq_bwd" \(float32\[3, 32\], float32\[3, 32\]\)'):
        text = _lowered(ks["sq"], 32)
    assert re.findall(r"custom_call @(cutecc_\w+)", text) == [fwd]  # the forward's build, no backward's
    assert "stablehlo.multiply" in text
    assert re.findall(r"custom_call @(cutecc_\w+)", _lowered(ks["sq"], 64)) == [fwd, bwd]  # fits: its build
