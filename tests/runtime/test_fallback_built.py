"""A real build (the toy kernel, compiled through the DSL) with a fallback declared: adding
the fallback to the manifest rebuilds nothing (the keys are the same) and changes its lock
lines only by the documented field; a call a build fits lowers to exactly the same program
with or without a fallback declared (it costs nothing once traced), and a call no build fits
lowers to the fallback's XLA ops, with no custom call."""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import Toy, opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import FallbackWarning

TOY_FALLBACK = "def scale(x, *, factor=1.0, threads=None):\n    return x * factor\n"


@pytest.fixture
def with_fallback(toy_cache: Toy, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Toy, Toy]]:
    """(the toy's build as it is, a copy whose manifest declares `toy.ref:scale`, rebuilt)."""
    plain = toy_cache.copy(tmp_path / "plain")
    fb = toy_cache.copy(tmp_path / "fb")
    (fb.manifest.parent / "toy" / "ref.py").write_text(TOY_FALLBACK)
    text = fb.manifest.read_text().replace('entry = "toy.ops:scale"',
                                           'entry = "toy.ops:scale"\nfallback = "toy.ref:scale"')
    fb.manifest.write_text(text)
    monkeypatch.syspath_prepend(str(fb.manifest.parent))
    sys.modules.pop("toy.ref", None)
    sys.modules.pop("toy", None)
    yield plain, fb
    sys.modules.pop("toy.ref", None)
    sys.modules.pop("toy", None)


def lower(fn, *specs) -> str:  # type: ignore[no-untyped-def]
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def test_a_fallback_rebuilds_nothing_and_costs_nothing_where_a_build_fits(with_fallback) -> None:  # type: ignore[no-untyped-def]
    plain, fb = with_fallback
    before = fb.lock.read_text().splitlines()
    r = build(fb.manifest, opts(cache_dir=fb.cache))
    assert r.ok and r.count("built") == 0, [o.status for o in r.outcomes]  # every key cached
    after = fb.lock.read_text().splitlines()
    assert len(after) == len(before)
    for old, new in zip(before, after):
        if old != new:  # an entry line of scale: the same line with the field appended
            o, n = json.loads(old.rstrip(",")), json.loads(new.rstrip(","))
            assert {k: v for k, v in n.items() if k != "fallback"} == o
            assert n["fallback"]["ref"] == "toy.ref:scale"
    assert sum(old != new for old, new in zip(before, after)) == 2  # threads=64 and threads=128

    fits = jax.ShapeDtypeStruct((1000,), jnp.float32)
    ks_plain, ks_fb = cutecc.load(plain.cache, arch="sm_90a"), cutecc.load(fb.cache, arch="sm_90a")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        want = lower(lambda x: ks_plain.scale(x, factor=2.0, threads=64), fits)
        got = lower(lambda x: ks_fb.scale(x, factor=2.0, threads=64), fits)
    assert got == want and "cutecc_" in got
    assert "toy.ref" not in sys.modules  # never imported: nothing missed

    misses = jax.ShapeDtypeStruct((1000,), jnp.float16)  # no variant takes float16
    with pytest.warns(FallbackWarning):
        text = lower(lambda x: ks_fb.scale(x, factor=2.0), misses)
    assert "cutecc_" not in text and "multiply" in text
