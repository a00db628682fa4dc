"""quack's Hopper GEMM (examples/gemm/kernels.toml) on a GPU, from a cache built elsewhere.

Needs CUTECC_GEMM_CACHE: a cache where `cutecc build examples/gemm/kernels.toml` ran (and
`cutecc tune --compile-only`, for the test of every configuration). Results on fresh random
inputs with an m that is no multiple of any tile, against the float32 product of the same
(bf16- or fp8-valued) inputs; benchmarks/gemm_tune.py times them against XLA's dot.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from .conftest import rand

pytestmark = pytest.mark.gpu

MANIFEST = REPO / "examples" / "gemm" / "kernels.toml"
KERNELS = [("quack_gemm", "bfloat16"), ("quack_gemm_fp8", "float8_e4m3fn")]
M, N, K = 300, 392, 512  # m ragged; n and k multiples of 8 and 16 (16-byte rows)


@pytest.fixture(scope="module")
def gemm_cache() -> Path:
    src = os.environ.get("CUTECC_GEMM_CACHE")
    if not src or not Path(src).is_dir():
        pytest.skip("set CUTECC_GEMM_CACHE to a cache with examples/gemm/kernels.toml built")
    return Path(src)


def _close(d: object, a: object, b: object) -> None:
    import jax.numpy as jnp

    ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32).T
    assert d.shape == (M, N) and d.dtype == jnp.bfloat16  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.asarray(d, np.float32), ref, rtol=2e-2, atol=2e-2 * math.sqrt(K))


@pytest.mark.parametrize(("kernel", "dtype"), KERNELS)
def test_the_locked_kernel_computes_a_times_b_transposed(gemm_cache: Path, rng: np.random.Generator,
                                                          kernel: str, dtype: str) -> None:
    import jax

    import cutecc

    ks = cutecc.load(gemm_cache, lock=MANIFEST.parent / "kernels.lock", allow_unsigned=True)
    a, b = rand(rng, (M, K), dtype), rand(rng, (N, K), dtype)
    fn = getattr(ks, kernel)
    _close(fn(a, b), a, b)
    _close(jax.jit(fn)(a, b), a, b)


def test_every_compiled_configuration_computes_the_same_product(gemm_cache: Path,
                                                                 rng: np.random.Generator) -> None:
    from cutecc.runtime.dispatch import Build, KernelFn
    from cutecc.store.writer import Store
    from cutecc.tuning.plan import manifest_digest, read_plan

    try:
        items = read_plan(gemm_cache, manifest_digest(MANIFEST), str(MANIFEST))
    except Exception as err:
        pytest.skip(f"no tuning plan in the cache (`cutecc tune --compile-only`): {err}")
    store = Store(gemm_cache)
    dtypes = dict(KERNELS)
    seen = 0
    for it in items:
        a, b = rand(rng, (M, K), dtypes[it.kernel]), rand(rng, (N, K), dtypes[it.kernel])
        for c in it.candidates:
            e = store.get(c.key)
            assert e is not None, c
            fn = KernelFn(it.kernel, [Build.from_meta(c.key, e.path, e.meta)], arch=it.arch)
            _close(fn(a, b), a, b)
            seen += 1
    assert seen == 24
