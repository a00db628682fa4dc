"""`jax.grad` through a composite backward under `load(manifest=...)` and with the composite
asked for by name, on a real GPU against a jax.numpy reference on fresh random inputs.

Before the fix the composite was not in a manifest's kernel set, so the grad of `expw2`
(whose backward is the composite `expw2_bwd`) failed there, and `load(kernels=["expw2_bwd"])`
said "no entries ... run `cutecc build`". The train cache may have been built on another
host (its records name that host's manifest path), so the test records this checkout's
manifest path in a copy of the cache as a build here would."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.store.writer import Store

from .conftest import rand

pytestmark = pytest.mark.gpu

MANIFEST = Path(__file__).parent / "train_kernels" / "kernels.toml"


@pytest.fixture(scope="module")
def as_built_here(train_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(shutil.copytree(train_cache, tmp_path_factory.mktemp("train") / "cache"))
    store = Store(root)
    manifest = MANIFEST.resolve()
    by: dict[str, dict[str, list[str]]] = {}
    for name in store.kernel_names():
        for key in store.kernel_keys(name):
            e = store.get(key)
            if e is not None:
                by.setdefault(name, {}).setdefault(str(e.doc["arch"]), []).append(key)
    store.record_manifest(manifest, hashlib.sha256(manifest.read_bytes()).hexdigest(), by, partial=False)
    for name in store.composite_names():
        rec = store.composite(name)
        assert rec is not None, name
        store.record_composite(dataclasses.replace(rec, manifest=str(manifest)))
    return root


def _grad_matches(ks, rng) -> None:
    x = rand(rng, (300, 70), "float32") * 0.5
    w = rand(rng, (70,), "float32")
    t = rand(rng, (300, 70), "float32")
    loss = lambda f: (lambda x, w: jnp.sum((f(x, w) - t) ** 2))  # noqa: E731
    gx, gw = jax.jit(jax.grad(loss(ks.expw2), argnums=(0, 1)))(x, w)
    rx, rw = jax.grad(loss(lambda x, w: jnp.exp(x) * w), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-4, atol=1e-3)


def test_grad_through_a_composite_backward_under_a_manifest(as_built_here: Path, rng) -> None:
    ks = cutecc.load(as_built_here, manifest=MANIFEST)
    assert "expw2_bwd" in ks
    _grad_matches(ks, rng)


def test_a_composite_asked_for_by_name_runs(as_built_here: Path, rng) -> None:
    ks = cutecc.load(as_built_here, kernels=["expw2", "expw2_bwd"])
    assert {"expw2", "expw2_bwd", "bwd_g", "bwd_dxdw"} <= set(ks)
    _grad_matches(ks, rng)
