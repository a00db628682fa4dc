"""benchmarks/gemm_tune.py on a CPU: its 8 shapes are buckets of examples/gemm's tuning spaces
(so `cutecc tune --measure --bucket` measures exactly them), its result check accepts XLA's
product and refuses a wrong entry, and its dry run plans both spaces and writes its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import gemm_tune
from cutecc.contract.buckets import bucket_text
from cutecc.manifest import load_manifest


def test_every_shape_is_a_bucket_of_its_kernels_space() -> None:
    m = load_manifest(gemm_tune.MANIFEST)
    assert len(gemm_tune.SHAPES) == 8
    for s in gemm_tune.SHAPES:
        k = m.kernel(s.kernel)
        assert k.tuning is not None
        assert s.bucket in {bucket_text(p) for p in k.tuning.bucket_points()}, s
        assert [v.id for v in k.variants] == [f"dtype={s.dtype}"]
    shapes = {(s.dtype, s.m, s.n, s.k) for s in gemm_tune.SHAPES}
    assert len(shapes) == 8
    assert {s.dtype for s in gemm_tune.SHAPES} == {"bfloat16", "float8_e4m3fn"}
    assert any(s.m == s.n == s.k for s in gemm_tune.SHAPES) and any(s.n * 8 <= s.m for s in gemm_tune.SHAPES)


def test_the_spaces_hold_twelve_configurations_each_from_quacks_sm90_list() -> None:
    m = load_manifest(gemm_tune.MANIFEST)
    for name in gemm_tune.KERNELS:
        k = m.kernel(name)
        ((vid, cands),) = k.candidates
        assert len(cands) + 1 == 12
        tiles = {(dict(c.factory_args)["tile_shape_mnk"][0], dict(c.factory_args)["tile_shape_mnk"][1],
                  dict(c.factory_args)["pingpong"]) for c in (*cands, k.variants[0])}
        assert tiles == {(128, 128, True), (128, 192, True), (256, 128, False), (256, 192, False),
                         (128, 256, False)}
        # every cluster is 2 CTAs, so max_active_clusters is the profile's SMs over 2
        for v in (*cands, k.variants[0]):
            cm, cn, ck = dict(v.factory_args)["cluster_shape_mnk"]
            assert cm * cn == 2 and ck == 1
            (mac,) = [s for s in v.convention.scalars if s.name == "max_active_clusters"]
            assert mac.value == 66  # h100: 132 SMs
            assert v.convention.given == ()  # nothing for the call to pass


def test_the_check_accepts_the_rounded_product_and_refuses_a_wrong_entry(rng: np.random.Generator) -> None:
    import jax.numpy as jnp

    m, n, k = 64, 40, 512
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32)
    ref = a @ b.T
    rounded = jnp.asarray(ref).astype(jnp.bfloat16)
    ok = gemm_tune.agree(rounded, ref, k)
    assert ok["ok"] and 0 < ok["max_abs_diff"] < 0.02 * math.sqrt(k), ok
    wrong = np.array(ref)
    wrong[7, 3] += 0.05 * abs(wrong[7, 3]) + 0.05 * math.sqrt(k)
    assert not gemm_tune.agree(wrong, ref, k)["ok"]
    wrong[7, 3] = np.nan
    assert not gemm_tune.agree(wrong, ref, k)["ok"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.mark.usefixtures("examples_extra")
def test_the_dry_run_without_a_cache_plans_both_spaces_and_writes_its_json(tmp_path: Path) -> None:
    assert gemm_tune.main(["--dry-run", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gemm_tune.json").read_text())
    assert doc["dry_run"] and doc["failed"] == [] and doc["shapes"] == 8
    counts = {k: len(v) for k, v in doc["plan"]["candidates"].items()}
    assert counts == {"quack_gemm": 12, "quack_gemm_fp8": 12}
    assert doc["plan"]["candidates"]["quack_gemm"][0] == "dtype=bfloat16"  # the default first
    for dtype, got in doc["self_check"].items():
        assert "skipped" in got or (got["xla_vs_f32"]["ok"] and not got["perturbed"]["ok"]), (dtype, got)


def _rec(winner: str, times: dict[str, float], close: tuple[str, ...] = ()) -> dict:
    return {"variant": "dtype=bfloat16", "winner_variant": winner, "within_noise": list(close),
            "times_us": {v: [t - 0.1, t, t + 0.1] for v, t in times.items()},
            "spread_us": {v: 0.05 for v in times}}


def test_two_tunes_agree_or_name_the_within_noise_buckets_and_winners_stay_at_least_as_fast(
        tmp_path: Path) -> None:
    d, a, b = "dtype=bfloat16", "dtype=bfloat16,tile_m=256", "dtype=bfloat16,tile_n=128"
    lock1, lock2 = tmp_path / "1", tmp_path / "2"
    lock1.write_text("x")
    lock2.write_text("x")
    m1, m2 = ("quack_gemm", "m=1"), ("quack_gemm", "m=2")
    first = {m1: _rec(a, {d: 10.0, a: 8.0}), m2: _rec(d, {d: 10.0, b: 9.95}, (b,))}
    second = {m1: _rec(a, {d: 10.0, a: 8.1}), m2: _rec(d, {d: 10.0, b: 10.0})}
    st = gemm_tune.stability(first, second, lock1, lock2)
    assert st["identical_locks"] and st["differing"] == [] and st["unexplained"] == [] and st["slower"] == []
    assert st["within_noise"] == [f"quack_gemm m=2: {b}"]
    # The second run picks b at m=2: named within the noise by the first, so explained.
    second[m2] = _rec(b, {d: 10.0, b: 9.0})
    lock2.write_text("y")
    st = gemm_tune.stability(first, second, lock1, lock2)
    assert not st["identical_locks"] and st["differing"] == [f"quack_gemm m=2: {d} vs {b}"]
    assert st["unexplained"] == []
    # A flip that neither run saw coming, and a first-run winner slower than the default the second time.
    second[m1] = _rec(b, {d: 10.0, a: 11.0, b: 8.0})
    st = gemm_tune.stability(first, second, lock1, lock2)
    assert st["unexplained"] == ["quack_gemm m=1"]
    assert st["slower"] and st["slower"][0].startswith(f"quack_gemm m=1: {a} 11.00 us vs the default's 10.00")
