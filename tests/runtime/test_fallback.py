"""A kernel's declared fallback: a call no build fits (a shape, a call keyword, a GPU whose
arch has no build) returns the fallback's result instead of failing, warns once per
signature, is counted in the cache's misses record, and is an error in strict mode; a
kernel without a fallback keeps its error. All on the CPU: the fallback path never
reaches the kernel's custom call (builds are stand-ins, see `helpers.fake_compile`)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FALLBACK, opts
from helpers import fallback_manifest as _manifest

import cutecc
from cutecc.commands.build import build
from cutecc.contract.fallbacks import closure_digest
from cutecc.errors import CuteccError, FallbackWarning, NoBuildFits
from cutecc.lock.lockfile import read_lock
from cutecc.store.misses import read_misses

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


@pytest.fixture
def project(fallback_project: Path) -> Path:
    return fallback_project


def _built(project: Path, **kw: Any) -> Path:
    cache = project.parent.parent / "cache"
    r = build(project, opts(cache_dir=cache), **kw)
    assert r.ok, r.warnings()
    return cache


def _x(*shape: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng().standard_normal(shape, dtype=np.float32))


def test_a_shape_no_variant_fits_is_served_by_the_fallback(project: Path) -> None:
    cache = _built(project)
    ks = cutecc.load(cache, arch="sm_90a")
    assert "toyfb.ref" not in sys.modules  # imported at the first miss, not at load
    x = _x(3, 32)
    with pytest.warns(FallbackWarning, match=r'"scale" \(float32\[3, 32\]\): no built variant fits'):
        out = ks.scale(x, factor=2.5)
    np.testing.assert_allclose(out, np.sin(np.asarray(x)) * 2.5, rtol=1e-6)
    assert "toyfb.ref" in sys.modules
    # the same signature again, eagerly and under another jit: no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out2 = jax.jit(lambda x: ks.scale(x, factor=2.5))(x)
    np.testing.assert_allclose(out2, out, rtol=1e-6)
    (miss,) = read_misses(cache)
    assert (miss.kernel, miss.arch, miss.arrays, miss.reason) == (
        "scale", "sm_90a", (("float32", (3, 32)),), "no built variant fits")
    assert miss.count == 2  # traced twice: the eager call's jit and the explicit one
    # a call a build fits takes the build (its custom call: not run on this CPU host)
    fits = jax.ShapeDtypeStruct((3, 64), jnp.float32)
    assert ks.scale.select(fits)[0].variant == "d=64"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        assert ks.scale._served_by_fallback([fits], {"factor": 2.0}, {}) == (False, None)
    assert read_misses(cache)[0].count == 2


def test_the_fallback_is_differentiated_vmapped_and_exported_by_jax(project: Path) -> None:
    ks = cutecc.load(_built(project), arch="sm_90a")
    x = _x(5, 16)
    with pytest.warns(FallbackWarning):
        g = jax.grad(lambda x: ks.scale(x, factor=3.0).sum())(x)
    np.testing.assert_allclose(g, 3.0 * np.cos(np.asarray(x)), rtol=1e-5)
    xs = _x(4, 5, 24)
    with pytest.warns(FallbackWarning, match=r"float32\[5, 24\]"):  # what each batch element is
        v = jax.vmap(lambda r: ks.scale(r, factor=0.5))(xs)
    np.testing.assert_allclose(v, 0.5 * np.sin(np.asarray(xs)), rtol=1e-6)
    with pytest.warns(FallbackWarning):
        exp = jax.export.export(jax.jit(lambda x: ks.scale(x, factor=2.0)))(
            jax.ShapeDtypeStruct((7, 16), jnp.float32))
    x7 = _x(7, 16)
    np.testing.assert_allclose(exp.call(x7), 2.0 * np.sin(np.asarray(x7)), rtol=1e-6)


def test_strict_makes_a_fallback_an_error(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _built(project)
    with pytest.raises(NoBuildFits, match=r"no built variant matches[\s\S]*strict, load\(strict=True\)"):
        cutecc.load(cache, arch="sm_90a", strict=True).scale(_x(3, 32))
    monkeypatch.setenv("CUTECC_STRICT", "1")
    with pytest.raises(NoBuildFits, match=r"strict, \$CUTECC_STRICT: the declared fallback toyfb.ref:scale"):
        cutecc.load(cache, arch="sm_90a").scale(_x(3, 32))
    assert read_misses(cache) == []


def test_a_kernel_without_a_fallback_keeps_its_error(project: Path) -> None:
    ks = cutecc.load(_built(project), arch="sm_90a")
    with pytest.raises(NoBuildFits) as e:
        ks.plain(_x(3, 32))
    msg = str(e.value)
    assert 'kernel "plain"' in msg and "float32[3, 32]" in msg and "d=64" in msg
    assert "extend [kernel.plain] variants" in msg


def test_a_cache_built_for_another_arch_serves_the_fallback_here(project: Path) -> None:
    project.write_text(_manifest(archs=["sm_100a"]))
    cache = _built(project)
    ks = cutecc.load(cache, arch="sm_90a")
    assert not ks.scale.builds  # nothing runs here
    x = _x(2, 64)  # the shape the sm_100a build takes
    with pytest.warns(FallbackWarning, match="no build for sm_90a"):
        np.testing.assert_allclose(ks.scale(x, factor=-1.0), -np.sin(np.asarray(x)), rtol=1e-6)
    assert read_misses(cache)[0].reason == "no build for sm_90a"
    with pytest.raises(NoBuildFits, match="no usable build for arch sm_90a"):
        ks.plain(x)


def test_the_lock_records_the_fallback_only_where_declared(project: Path) -> None:
    cache = _built(project)
    lock = read_lock(project.parent / "kernels.lock")
    by = {le.kernel: le for le in lock.entries}
    ref = dict(by["scale"].fallbacks)["fallback"]
    import hashlib

    assert ref.ref == "toyfb.ref:scale"
    # the closure: the module and its package's __init__, each pinned, and their digest
    assert [(f.module, f.path) for f in ref.files] == [("toyfb", "toyfb/__init__.py"),
                                                       ("toyfb.ref", "toyfb/ref.py")]
    for f in ref.files:
        assert f.sha256 == hashlib.sha256((project.parent / f.path).read_bytes()).hexdigest()
    assert ref.sha256 == closure_digest(ref.files)
    lines = (project.parent / "kernels.lock").read_text().splitlines()
    assert all('"fallback"' not in ln for ln in lines if '"kernel": "plain"' in ln)
    # the same kernels without the fallback: the same keys, and lines without the field
    keys = {le.key for le in lock.entries}
    project.write_text(_manifest(fallback=None))
    assert build(project, opts(cache_dir=cache)).ok
    lock2 = read_lock(project.parent / "kernels.lock")
    assert {le.key for le in lock2.entries} == keys
    assert all(not le.fallbacks for le in lock2.entries)
    assert '"fallback' not in (project.parent / "kernels.lock").read_text()


def test_under_a_lock_the_fallback_module_must_be_the_locked_one(project: Path) -> None:
    cache = _built(project)
    lock = project.parent / "kernels.lock"
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    with pytest.warns(FallbackWarning):
        ks.scale(_x(2, 8))
    (project.parent / "toyfb" / "ref.py").write_text(FALLBACK + "\n# edited\n")
    sys.modules.pop("toyfb.ref", None)
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    with pytest.raises(NoBuildFits, match=r"toyfb/ref.py \(SHA-256 \w+\.\.\.\) is not the file the lock"):
        ks.scale(_x(2, 8))


def test_a_fallback_module_that_cannot_be_found_fails_the_build(project: Path) -> None:
    project.write_text(_manifest(fallback="toyfb.nothere:scale"))
    with pytest.raises(CuteccError, match=r'kernel "scale", fallback: cannot find the fallback'):
        build(project, opts(cache_dir=project.parent.parent / "cache"))


def test_strict_is_read_at_load_and_a_variable_set_later_changes_nothing(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`$CUTECC_STRICT` is one of the settings `load()` reads, once (`RuntimeSettings`): a load
    made before it is set keeps serving its fallback, one made after refuses."""
    cache = _built(project)
    monkeypatch.delenv("CUTECC_STRICT", raising=False)
    before = cutecc.load(cache, arch="sm_90a")
    monkeypatch.setenv("CUTECC_STRICT", "1")
    after = cutecc.load(cache, arch="sm_90a")
    x = _x(3, 32)
    with pytest.warns(FallbackWarning):
        np.testing.assert_allclose(before.scale(x), np.sin(np.asarray(x)), rtol=1e-6)
    with pytest.raises(NoBuildFits, match=r"strict, \$CUTECC_STRICT"):
        after.scale(x)
    monkeypatch.delenv("CUTECC_STRICT")
    with pytest.raises(NoBuildFits, match=r"strict, \$CUTECC_STRICT"):
        after.scale(x)  # unset since: the load read it set
