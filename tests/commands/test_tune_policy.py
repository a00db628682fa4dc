"""Tuning records you can trust, on the CPU side: the measurement policy in each record and
on each lock line, the noise rule as `--measure` records it, `--record`'s refusal to mix
policies in one lock, and the load-time recheck of a line's bytes and toolchain (which
`cutecc verify --lock` names). The measuring itself is the GPU suite's (tests/gpu/test_tune_gpu.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, run_cli

from cutecc.plan.tuning_plan import PlanItem
from cutecc.runtime.tuning import toolchain_of
from cutecc.store import Store
from cutecc.store.tuning_records import TuningResult, TuningResults

H100 = "NVIDIA H100 80GB HBM3"
D, T64, T128, T512 = ("dtype=float32", "dtype=float32,threads=64", "dtype=float32,threads=128",
                      "dtype=float32,threads=512")
INFO = {"device": H100, "driver": "cuda 12080"}


@pytest.fixture
def project(compiled: tuple[Path, Path, dict], tmp_path: Path) -> tuple[Path, Path, PlanItem]:
    """Private copies of the compiled project (with the committed lock) and its cache, and
    the plan item of mul[dtype=float32]."""
    from cutecc.plan.tuning_plan import manifest_digest, read_plan

    proj, cache, _ = compiled
    mine, copy = tmp_path / "proj", tmp_path / "c"
    shutil.copytree(proj / "kernels", mine / "kernels")
    shutil.copy(proj / "kernels.toml", mine / "kernels.toml")
    shutil.copy(REPO / "kernels.lock", mine / "kernels.lock")
    shutil.copytree(cache, copy, symlinks=True)
    items = read_plan(copy, manifest_digest(mine / "kernels.toml"), "x")
    item = next(it for it in items if it.kernel == "mul" and it.variant == D)
    return mine, copy, item


def _event(item: PlanItem, times: dict[str, tuple[float, float]], **extra: Any) -> dict[str, Any]:
    """A child's `bucket` event: each variant's (median, spread) in microseconds."""
    keys = {c.variant: c.key for c in item.candidates}
    return {"times": {keys[v]: [m - 2 * s, m, m + 2 * s] for v, (m, s) in times.items()},
            "spread": {keys[v]: s for v, (_, s) in times.items()},
            "samples": {keys[v]: 40 for v in times}, "dropped": {}, "k": 8, "clock": "device",
            "warmup": 3, "rounds": 30, "max_rounds": 120, **extra}


def _record(cache: Path, item: PlanItem, bucket: str, ev: dict[str, Any]) -> TuningResult:
    from cutecc.tuning.measure import _record as record

    return record(Store(cache), item, bucket, ev, {}, INFO)


def test_a_record_holds_its_policy_and_each_candidates_median_and_spread(
        project: tuple[Path, Path, PlanItem]) -> None:
    from cutecc.tuning.policy import Policy

    _, cache, item = project
    ev = _event(item, {D: (10.0, 0.05), T128: (5.0, 0.02)}, sm_clock_mhz=[1980.0, 1755.0, 1980.0])
    r = _record(cache, item, "n=65536", ev)
    method = Policy("eager", "device", 3, 30, 120).method
    assert method == "eager launches, device clock, warmup 3, rounds 30..120, median-ci95+0.01"
    dsl = toolchain_of(Store(cache).get(item.base).meta)  # type: ignore[union-attr]
    assert dsl is not None and dsl.startswith("nvidia-cutlass-dsl ")
    assert (r.line.winner_variant, r.line.policy, r.line.built_with) == (T128, method, dsl)
    assert r.measurement == {"launch": "eager", "clock": "device", "warmup": 3, "rounds": 30,
                             "max_rounds": 120, "rule": "median-ci95+0.01", "method": method, "device": H100,
                             "driver": "cuda 12080", "toolchain": dsl, "sm_clock_mhz": [1755.0, 1980.0]}
    assert r.times_us == {D: (9.9, 10.0, 10.1), T128: (4.96, 5.0, 5.04)}
    assert r.spread_us == {D: 0.05, T128: 0.02} and r.samples == {D: 40, T128: 40}
    assert r.within_noise == ()
    doc = r.to_json()
    assert TuningResult.parse(json.loads(json.dumps(doc)), "x", "r") == r
    # No SM clock readable: the policy says so (null), and the rest stands.
    ev.pop("sm_clock_mhz")
    assert _record(cache, item, "n=65536", ev).measurement["sm_clock_mhz"] is None


def test_a_gain_within_the_noise_keeps_the_default_and_ties_go_to_plan_order(
        project: tuple[Path, Path, PlanItem]) -> None:
    _, cache, item = project
    # 0.5% faster: inside both spreads plus 1% of the default's median. The default stays,
    # and the record names the candidate that came within the noise.
    r = _record(cache, item, "n=4096", _event(item, {D: (10.0, 0.05), T128: (9.95, 0.02)}))
    assert r.line.winner == item.base and r.line.winner_variant == D and r.within_noise == (T128,)
    # threads=512's median is lowest, but within the noise of threads=128's, which comes first
    # in the plan (the manifest's order): threads=128 wins, and threads=512 is named.
    tie = {D: (10.0, 0.05), T128: (8.0, 0.05), T512: (7.95, 0.05)}
    r = _record(cache, item, "n=65536", _event(item, tie))
    assert r.line.winner_variant == T128 and r.within_noise == (T512,)
    assert r.winner_us == 8.0 and r.default_us == 10.0
    # the lock line itself carries what the decision rests on: the winner's spread, the default's time
    from cutecc.contract.pinned import TunedTiming

    assert r.line.timing == TunedTiming(8.0, 0.05, 10.0, 0.05)
    assert r.line.to_json()["timing"] == {"winner_us": 8.0, "winner_spread_us": 0.05, "default_us": 10.0,
                                          "default_spread_us": 0.05}


def _results(path: Path, records: list[TuningResult]) -> Path:
    """A results file as `--measure` writes it."""
    path.write_bytes(TuningResults(tuple(records), H100, INFO["driver"], 1.0).dumps())
    return path


def _tune_record(proj: Path, cache: Path, results: Path, *extra: str) -> Any:
    return run_cli("tune", str(proj / "kernels.toml"), "--record", str(results), "--cache-dir", str(cache),
                   *extra)


def test_recording_refuses_to_mix_policies_in_one_lock(project: tuple[Path, Path, PlanItem],
                                                        tmp_path: Path) -> None:
    from cutecc.lock.lockfile import read_lock
    from cutecc.runtime.tuning import read_cached

    proj, cache, item = project
    first = [_record(cache, item, f"n={n}", _event(item, {D: (10.0, 0.05), T128: (5.0, 0.05)}))
             for n in (4096, 65536)]
    r = _tune_record(proj, cache, _results(tmp_path / "a.json", first))
    assert r.returncode == 0, r.stderr
    lock_bytes = (proj / "kernels.lock").read_bytes()
    assert {t.policy for t in read_lock(proj / "kernels.lock").tuning} == {first[0].line.policy}
    cached = read_cached(cache, item.base)
    # Measured with other rounds: another policy. Refused; the lock and the cache unchanged.
    other = _record(cache, item, "n=1048576", _event(item, {D: (10.0, 0.05), T128: (5.0, 0.05)}, rounds=5,
                                                     max_rounds=5))
    r = _tune_record(proj, cache, _results(tmp_path / "b.json", [other]))
    assert r.returncode == 1, r.stderr
    assert "tuning lines measured under different policies would share one lock" in r.stderr
    assert "2 line(s) measured by 'eager launches, device clock, warmup 3, rounds 30..120" in r.stderr
    assert "--replace-tuning" in r.stderr
    assert (proj / "kernels.lock").read_bytes() == lock_bytes and read_cached(cache, item.base) == cached
    # Told to, the lines of the other policy go.
    r = _tune_record(proj, cache, tmp_path / "b.json", "--replace-tuning")
    assert r.returncode == 0, r.stderr
    assert [(t.bucket, t.policy) for t in read_lock(proj / "kernels.lock").tuning] == [
        ("n=1048576", other.line.policy)]
    # Lines from before policies (none recorded) are another policy too.
    doc = json.loads((proj / "kernels.lock").read_text())
    for t in doc["tuning"]:
        del t["policy"]
    (proj / "kernels.lock").write_text(json.dumps(doc))
    r = _tune_record(proj, cache, tmp_path / "a.json")
    assert r.returncode == 1 and "1 line(s) with no recorded policy" in r.stderr, r.stderr


def test_recording_signs_the_lock_by_the_builds_road(project: tuple[Path, Path, PlanItem],
                                                      tmp_path: Path) -> None:
    """`--sign-key`: the lock `tune` records is written and signed as `build` does it
    (`record_lock`): the key is read before anything is written, the signature is of the
    bytes written, and recording the same results again rewrites neither file."""
    import os

    from cutecc.lock import signing
    from cutecc.runtime.tuning import results_path

    proj, cache, item = project
    lock, sig = proj / "kernels.lock", proj / f"kernels.lock{signing.SIG_SUFFIX}"
    recs = [_record(cache, item, "n=65536", _event(item, {D: (10.0, 0.05), T128: (5.0, 0.05)}))]
    results = _results(tmp_path / "a.json", recs)
    before = lock.read_bytes()
    cached = results_path(cache, item.base)  # other tests of the shared project may have recorded some
    cached_before = cached.read_bytes() if cached.exists() else None
    r = _tune_record(proj, cache, results, "--sign-key", str(tmp_path / "absent.key"))
    assert r.returncode == 2 and "cannot read the signing key" in r.stderr, r.stderr
    assert lock.read_bytes() == before and not sig.exists()
    assert (cached.read_bytes() if cached.exists() else None) == cached_before  # nothing recorded
    private, public = signing.keygen(tmp_path / "ci")
    r = _tune_record(proj, cache, results, "--sign-key", str(private))
    assert r.returncode == 0, r.stderr
    assert lock.read_bytes() != before
    assert signing.verify_file(lock, [signing.read_public_key(public)], "lock") == lock.read_bytes()
    stamps = [(p.read_bytes(), os.stat(p).st_mtime_ns) for p in (lock, sig)]
    r = _tune_record(proj, cache, results, "--sign-key", str(private))
    assert r.returncode == 0, r.stderr
    assert [(p.read_bytes(), os.stat(p).st_mtime_ns) for p in (lock, sig)] == stamps


def _target(ks: Any, n: int) -> str:
    import jax
    import jax.numpy as jnp

    s = jax.ShapeDtypeStruct((n,), jnp.float32)
    text = jax.jit(lambda a, b: ks.mul(a, b)).trace(s, s).lower(lowering_platforms=("cuda",)).as_text()
    return text.split("custom_call @cutecc_")[1][:40]


@pytest.mark.parametrize(("field", "value", "why"), [
    ("built_with", "nvidia-cutlass-dsl 0.0.1", "recorded for nvidia-cutlass-dsl 0.0.1, its default was"),
    ("sha256", "0" * 64, "sha256 differs from the tuning record"),  # other bytes than were measured
])
def test_a_line_of_another_toolchain_or_other_bytes_is_ignored_at_load_and_named_by_verify(
        project: tuple[Path, Path, PlanItem], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        field: str, value: str, why: str) -> None:
    import cutecc

    proj, cache, item = project
    rec = _record(cache, item, "n=65536", _event(item, {D: (10.0, 0.05), T128: (5.0, 0.05)}))
    r = _tune_record(proj, cache, _results(tmp_path / "a.json", [rec]), "--no-lock")
    assert r.returncode == 0, r.stderr
    lock = proj / "kernels.lock"
    doc = json.loads(lock.read_text())
    doc["tuning"] = [{**rec.line.to_json(), field: value}]
    lock.write_text(json.dumps(doc))
    monkeypatch.setenv("CUTECC_DEVICE_KIND", H100)
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert _target(ks, 70000) == item.base[:40]  # the default serves the bucket
    assert any(why in p for p in ks.problems), ks.problems
    v = run_cli("verify", "--cache-dir", str(cache), "--lock", str(lock), "--json")
    problems = json.loads(v.stdout)["problems"]
    assert v.returncode == 1 and [p["kind"] for p in problems] == ["stale-tuning"], problems
    assert why in problems[0]["detail"] and "mul[dtype=float32]@sm_90a n=65536" in problems[0]["detail"]
    # The line as recorded serves its winner, and verify finds nothing.
    doc["tuning"] = [rec.line.to_json()]
    lock.write_text(json.dumps(doc))
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert _target(ks, 70000) == rec.line.winner[:40]
    v = run_cli("verify", "--cache-dir", str(cache), "--lock", str(lock), "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["tuning_notes"] == [], v.stdout
    # On another device kind, verify names the lines this device ignores.
    monkeypatch.setenv("CUTECC_DEVICE_KIND", "NVIDIA H200")
    v = run_cli("verify", "--cache-dir", str(cache), "--lock", str(lock), "--json")
    (note,) = json.loads(v.stdout)["tuning_notes"]
    assert f"1 tuning line(s) recorded for {H100}, not this device (NVIDIA H200)" in note
