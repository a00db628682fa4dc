"""GPU tests: skipped cleanly on a machine where JAX sees no CUDA GPU; and what the GPU
test modules share: a per-test random generator, random arrays, poisoned memory."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# The suite starts GPU processes of its own (tune's measuring children, a packed wheel's
# interpreter) while this one holds the device: XLA's default takes 75% of its memory up
# front, and a measuring child then got profiler traces without a GPU plane in two full-suite
# runs (the tuning tests alone passed). Each process takes what it uses.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

def prepared_cache(tmp_path_factory: pytest.TempPathFactory, manifest: Path, env: str) -> Path:
    """The cache of `manifest`'s kernels: the one `$env` names (the device machine has no DSL:
    tests/gpu/prepare.sh builds it elsewhere), else built here into a fresh directory where the
    DSL is installed; else the test is skipped, saying which variable to set."""
    pre = os.environ.get(env)
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason=f"set {env} to a cache built from {manifest} "
                        "(building it here needs nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp(f"{manifest.parent.name}-cache")
    r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                        str(cache), "--no-lock"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    return cache


def _has_gpu() -> bool:
    try:
        import jax

        return bool(jax.devices("gpu"))
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to JAX")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Fresh random inputs per test, reproducible from its node id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))  # hash() is salted per process


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> Any:
    """A torch CUDA generator for fresh random inputs per test, seeded from its node id
    (the cutecc.torch tests)."""
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


def poison(nbytes: int) -> None:
    """Fill and free device memory with NaN so the allocator hands it out next."""
    import jax.numpy as jnp

    junk = jnp.full((max(nbytes // 4, 1) * 2,), jnp.nan, jnp.float32)
    junk.block_until_ready()
    del junk


def rand(rng: np.random.Generator, shape: Any, dtype: str) -> Any:
    """Standard-normal values of `shape` as a JAX array of `dtype`."""
    import jax.numpy as jnp

    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)


@pytest.fixture(scope="module")
def examples_ks():
    """The published examples (examples/kernels.toml) loaded from `$CUTECC_EXAMPLES_CACHE`
    for this device; skipped when that cache is not given."""
    from pathlib import Path

    import cutecc

    pre = os.environ.get("CUTECC_EXAMPLES_CACHE")
    if not pre or not Path(pre).is_dir():
        pytest.skip("CUTECC_EXAMPLES_CACHE is not set to a built examples cache "
                    "(cutecc build examples/kernels.toml --cache-dir DIR)")
    k = cutecc.load(pre)  # the device's own arch
    assert k.arch.startswith("sm_90"), k.arch  # FA4's Sm90 kernels are built for Hopper only
    return k


def hlo_copies(hlo: str) -> list[str]:
    """The instructions of an optimized HLO text that copy (a `copy`, `copy-start`, or a
    fusion XLA named after one), metadata left out."""
    return [ln.strip() for ln in hlo.splitlines()
            if " = " in ln and "copy" in ln.split("metadata=")[0].lower()]
