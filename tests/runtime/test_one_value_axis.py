"""A one-value variant axis (`alpha = [2.5]`) is a call keyword too: a call may say the value
it was built with (`k(x, alpha=2.5)`), another value is refused as not built, and leaving it
out still works. On the CPU: builds are stand-ins (`helpers.fake_compile`)."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CallTypeError, FallbackWarning, NoBuildFits
from cutecc.store.misses import read_misses

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

MANIFEST = """\
archs = ["sm_90a"]

[kernel.ax]
entry = "toyfb.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["m", 64] },
  { name = "out", role = "output", dtype = "float32", shape = ["m", 64] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
constants = { alpha = "$alpha", factor_name = "$factor" }
variants = { alpha = [2.5], factor = [3] }
"""


def test_a_one_value_axis_is_a_call_keyword(fallback_project: Path) -> None:
    fallback_project.write_text(MANIFEST)
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
    k = cutecc.load(cache, arch="sm_90a").ax
    x = jnp.ones((2, 64), jnp.float32)
    # `factor` is a runtime scalar's name: that keyword stays the scalar
    assert k.keywords == {"alpha": [2.5]} and "alpha" in str(k.__signature__)
    b, _ = k.select(x, alpha=2.5)
    assert b.variant == "alpha=2.5,factor=3" and k.select(x)[0] is b
    assert k.select(x, alpha=2.5)[0] is k.select(x, alpha=2.5)[0]
    with pytest.raises(NoBuildFits, match=r"alpha=3.0 was not built; built: alpha=2.5"):
        k.select(x, alpha=3.0)
    with pytest.raises(NoBuildFits, match=r"alpha=True was not built"):
        k.select(x, alpha=True)
    with pytest.raises(CallTypeError, match="unknown keyword argument 'beta'"):
        k.select(x, beta=1)


def test_a_miss_records_the_one_value_axis_keyword(fallback_project: Path) -> None:
    """A call no build fits, served by the fallback, records the one-value axis it named
    (`cutecc misses --toml` then proposes a variant with it), as it records any call keyword."""
    fallback_project.write_text(MANIFEST + 'fallback = "toyfb.ref:scale"\n')
    (fallback_project.parent / "toyfb" / "ref.py").write_text(
        "def scale(x, *, factor=1.0, alpha=2.5):\n    return x * factor * alpha\n")
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
    k = cutecc.load(cache, arch="sm_90a").ax
    with pytest.warns(FallbackWarning, match=r"\(float32\[2, 32\], alpha=2.5\)"):
        out = k(jnp.ones((2, 32), jnp.float32), alpha=2.5)
    assert float(out[0, 0]) == 2.5
    (miss,) = read_misses(cache)
    assert miss.keywords == (("alpha", 2.5),)
