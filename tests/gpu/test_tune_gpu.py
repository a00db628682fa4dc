"""`cutecc tune --measure` on a real GPU, from a cache built elsewhere.

Needs CUTECC_TUNE_CACHE: a cache where `cutecc build` and `cutecc tune --compile-only` ran
for the root kernels.toml (the device machine has no DSL). Measures the real spaces of mul
and rmsnorm over their 4 buckets each, then checks the records (the measurement policy, each
candidate's median spread, winners beyond the noise) and the recorded winners: each is within
2% of the best candidate measured again and at least as fast as the default within the noise,
and dispatch serves it for its bucket.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import REPO, run_cli

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    src = os.environ.get("CUTECC_TUNE_CACHE")
    if not src:
        pytest.skip("set CUTECC_TUNE_CACHE to a cache with `cutecc tune --compile-only` done")
    base = tmp_path_factory.mktemp("tune")
    cache = base / "c"
    shutil.copytree(src, cache)
    proj = base / "proj"
    proj.mkdir()
    shutil.copy(REPO / "kernels.toml", proj / "kernels.toml")
    shutil.copy(REPO / "kernels.lock", proj / "kernels.lock")
    shutil.copytree(REPO / "kernels", proj / "kernels")
    r = run_cli("tune", str(proj / "kernels.toml"), "--measure", "--cache-dir", str(cache),
                "--kernel", "mul", "--kernel", "rmsnorm", "--results", str(base / "r.json"), "--json",
                timeout=3000)
    assert r.returncode == 0, r.stderr[-3000:]
    return proj, cache, json.loads(r.stdout)


def test_real_spaces_are_measured_over_four_buckets_and_recorded(tuned: tuple[Path, Path, dict]) -> None:
    proj, cache, doc = tuned
    recs = doc["records"]
    for kernel in ("mul", "rmsnorm"):
        buckets = {r["bucket"] for r in recs if r["kernel"] == kernel}
        assert len(buckets) >= 4, (kernel, buckets)
    for r in recs:
        assert r["winner_us"] <= r["default_us"] and not r["dropped"], r
        assert len(r["times_us"]) >= 3
        # The policy on the line and in the record; each candidate's median spread and samples.
        m = r["measurement"]
        assert r["policy"] == m["method"] and m["launch"] == "eager" and m["clock"] == r["clock"]
        assert m["device"] == r["device"] and m["driver"] and m["toolchain"] == r["built_with"]
        assert set(r["spread_us"]) == set(r["times_us"]) == set(r["samples"])
        assert all(n >= 15 for n in r["samples"].values()), r["samples"]  # at least repeats // 2
        # A winner other than the default beat it beyond both spreads plus 1%.
        if r["winner_variant"] != r["variant"]:
            w, d = r["times_us"][r["winner_variant"]][1], r["times_us"][r["variant"]][1]
            assert d - w > r["spread_us"][r["winner_variant"]] + r["spread_us"][r["variant"]] + 0.01 * d, r
    # Timed on the device clock (a profiler trace's kernel durations), not the host fallback.
    assert all(r["clock"] == "device" for r in recs), {r.get("clock_note") for r in recs}
    lock = json.loads((proj / "kernels.lock").read_text())
    assert len(lock["tuning"]) == len(recs)


def test_a_second_run_finds_the_winners_within_two_percent(tuned: tuple[Path, Path, dict]) -> None:
    proj, cache, doc = tuned
    r = run_cli("tune", str(proj / "kernels.toml"), "--check", "--cache-dir", str(cache), "--kernel", "mul",
                "--kernel", "rmsnorm", "--json", timeout=3000)
    again = json.loads(r.stdout)
    first = {(x["kernel"], x["variant"], x["bucket"]): x for x in doc["records"]}
    bad, strict = [], 0
    for x in again["records"]:
        w = first[(x["kernel"], x["variant"], x["bucket"])]["winner_variant"]
        win = x["times_us"][w]  # (low, median, high) of this run's samples
        best = min(x["times_us"].values(), key=lambda t: t[1])
        strict += win[1] <= best[1] * 1.02
        # Slower by over 2% and beyond this run's own spread: a ~10 us kernel's samples
        # spread +-9% on the H100, so a 2% gap inside that is noise, not a wrong winner.
        if win[1] > best[1] * 1.02 and win[0] > best[2]:
            bad.append((x["kernel"], x["variant"], x["bucket"], w, win, best))
    print(f"{strict} of {len(again['records'])} winners within 2% of the best median")
    assert not bad, bad
    # Every recorded winner, timed again, is at least as fast as the default within the noise.
    slower = []
    for x in again["records"]:
        w = first[(x["kernel"], x["variant"], x["bucket"])]["winner_variant"]
        win, d = x["times_us"][w], x["times_us"][x["variant"]]
        if win[1] > d[1] + x["spread_us"][w] + x["spread_us"][x["variant"]] + 0.01 * d[1]:
            slower.append((x["kernel"], x["variant"], x["bucket"], w, win, d))
    assert not slower, slower


def test_dispatch_serves_the_recorded_winner(tuned: tuple[Path, Path, dict]) -> None:
    import jax.numpy as jnp
    import numpy as np

    import cutecc

    proj, cache, doc = tuned
    ks = cutecc.load(cache, lock=proj / "kernels.lock", allow_unsigned=True)
    rec = next(r for r in doc["records"] if r["kernel"] == "mul" and r["variant"] == "dtype=float32"
               and r["bucket"] == "n=1048576")
    b, env = ks.mul.select(jnp.zeros(1048576 + 7, jnp.float32), jnp.zeros(1048576 + 7, jnp.float32))
    assert ks.mul.tuning.pick(b, env).key == rec["winner"]
    rng = np.random.default_rng(7)
    x, y = (jnp.asarray(rng.standard_normal(1048576 + 7, dtype=np.float32)) for _ in range(2))
    np.testing.assert_array_equal(np.asarray(ks.mul(x, y)), np.asarray(x) * np.asarray(y))


def test_a_wrong_or_faulting_candidate_is_dropped(tmp_path: Path) -> None:
    src = os.environ.get("CUTECC_FAULT_TUNE_CACHE")
    if not src:
        pytest.skip("set CUTECC_FAULT_TUNE_CACHE (tests/gpu/faulty_kernels built and --compile-only)")
    cache = tmp_path / "c"
    shutil.copytree(src, cache)
    m = Path(__file__).with_name("faulty_kernels") / "kernels.toml"
    r = run_cli("tune", str(m), "--measure", "--no-lock", "--cache-dir", str(cache), "--kernel", "tuned_copy",
                "--json", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = json.loads(r.stdout)["records"]
    assert len(recs) == 4
    for rec in recs:
        assert "mode=1" in rec["dropped"] and "disagrees" in rec["dropped"]["mode=1"]
        assert "mode=2" in rec["dropped"] and ("faulted" in rec["dropped"]["mode=2"]
                                               or "killed" in rec["dropped"]["mode=2"])
        assert "failed to compile" in rec["dropped"]["mode=3"]  # dropped by --compile-only
        assert rec["winner_variant"] == "default" and set(rec["times_us"]) == {"default"}
