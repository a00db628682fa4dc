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
    from cutecc.plan.tuning_plan import manifest_digest, read_plan
    from cutecc.runtime.dispatch import Build, KernelFn
    from cutecc.store.writer import Store

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
            fn = KernelFn(it.kernel, [Build.of(e.meta, e.path)], arch=it.arch)
            _close(fn(a, b), a, b)
            seen += 1
    assert seen == 24


def _tune(cache: Path, out: Path) -> dict:
    """One independent `cutecc tune --measure` of examples/gemm over benchmarks/gemm_tune.py's
    8 shapes (its buckets), into a fresh copy of the committed lock (`--replace-tuning`: its
    older lines go); the report's JSON."""
    import json
    import shutil

    from helpers import run_cli

    from benchmarks.gemm_tune import SHAPES

    out.mkdir(parents=True)
    shutil.copy(MANIFEST.parent / "kernels.lock", out / "kernels.lock")
    buckets = [a for s in SHAPES for a in ("--bucket", s.bucket)]
    r = run_cli("tune", str(MANIFEST), "--measure", "--cache-dir", str(cache), "--lock-file",
                str(out / "kernels.lock"), "--replace-tuning", "--repeats", "20", *buckets, "--json",
                timeout=3000)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_two_independent_tunes_agree_or_name_the_within_noise_buckets(gemm_cache: Path,
                                                                       tmp_path: Path) -> None:
    """Two tunes of the same buckets on this GPU: identical locks, or every bucket whose
    winner differs is named within the noise by one of them; and every winner of the first,
    timed again by the second, is at least as fast as the default within the noise."""
    import shutil

    from benchmarks.gemm_tune import stability

    cache = tmp_path / "c"
    shutil.copytree(gemm_cache, cache)  # the tunes write records into the cache
    first, second = _tune(cache, tmp_path / "1"), _tune(cache, tmp_path / "2")
    from benchmarks.gemm_tune import SHAPES

    # every --bucket is measured for each tuned kernel that declares it: both GEMMs here
    measured = {(k, s.bucket) for s in SHAPES for k in ("quack_gemm", "quack_gemm_fp8")}
    for doc in (first, second):
        assert {(r["kernel"], r["bucket"]) for r in doc["records"]} == measured
        for r in doc["records"]:
            assert r["clock"] == "device", r.get("clock_note")
            assert r["policy"] == first["records"][0]["policy"] and r["measurement"]["launch"] == "eager"
            assert set(r["spread_us"]) == set(r["times_us"]) and r["winner_us"] <= r["default_us"]
    by = [{(r["kernel"], r["bucket"]): r for r in doc["records"]} for doc in (first, second)]
    st = stability(by[0], by[1], tmp_path / "1" / "kernels.lock", tmp_path / "2" / "kernels.lock")
    print(f"identical locks: {st['identical_locks']}; within the noise: {st['within_noise']}; "
          f"differing: {st['differing']}")
    assert st["unexplained"] == [] and st["missing"] == [], st
    assert st["slower"] == [], st
    assert st["identical_locks"] or st["differing"], st  # bytes differ only where winners do
    assert first["within_noise"] == [f"{k}[{r['variant']}]@{r['arch']} {r['bucket']}"
                                     for (k, _), r in by[0].items() if r["within_noise"]]
