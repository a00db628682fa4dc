"""`cutecc tune --check`'s report on recorded data: records as the cache holds them, and
records measured again (here made up), compared on the CPU."""

from __future__ import annotations

import dataclasses

from cutecc.contract.pinned import Pin, Tuned
from cutecc.store.tuning_records import TuningResult
from cutecc.tuning import drift

D, A, B = "dtype=float32", "dtype=float32,threads=128", "dtype=float32,threads=512"
KEYS = {D: "a" * 64, A: "b" * 64, B: "c" * 64}
METHOD = "eager launches, device clock, warmup 3, rounds 30..120, median-ci95+0.01"


def _rec(times: dict[str, tuple[float, float]], winner: str, policy: str | None = METHOD,
         clock: str = "device", bucket: str = "n=65536") -> TuningResult:
    """A record: each variant's (median, spread) in microseconds."""
    line = Tuned("mul", D, "sm_90a", "NVIDIA H100 80GB HBM3", "floor", bucket, KEYS[D], KEYS[winner], winner,
                 Pin("lib.so", "e" * 64, 1, "s", None, "c" * 64, "d" * 64), policy)
    return TuningResult(line, 8, "cuda 12080", clock,
                        times_us={v: (m - s, m, m + s) for v, (m, s) in times.items()},
                        default_us=times[D][0], winner_us=times[winner][0],
                        spread_us={v: s for v, (_, s) in times.items()})


RECORDED = _rec({D: (10.0, 0.05), A: (8.0, 0.05), B: (9.0, 0.05)}, A)


def _check(now: TuningResult, threshold: float = 0.05) -> list[str]:
    return drift.report({drift.key(RECORDED): RECORDED}, [now], threshold)


def test_the_same_measurements_report_no_drift() -> None:
    assert _check(RECORDED) == []
    # Within the threshold and the noise: still none.
    assert _check(_rec({D: (10.1, 0.05), A: (8.2, 0.05), B: (9.0, 0.05)}, A)) == []


def test_a_winner_that_no_longer_beats_the_default_beyond_the_noise_is_reported() -> None:
    now = _rec({D: (8.1, 0.05), A: (8.0, 0.05), B: (9.0, 0.05)}, D)
    (line,) = _check(now, threshold=1.0)
    assert "the recorded winner dtype=float32,threads=128 (8.00 +- 0.05 us) no longer beats the default " \
           "(8.10 +- 0.05 us) beyond the noise: the default would win now" in line


def test_another_winner_and_a_time_that_moved_are_reported() -> None:
    now = _rec({D: (10.0, 0.05), A: (8.0, 0.05), B: (6.0, 0.05)}, B)
    (line,) = _check(now)
    assert line.endswith("dtype=float32,threads=512 now beats dtype=float32,threads=128 beyond the noise "
                         "(6.00 vs 8.00 us)")
    slower = _rec({D: (12.0, 0.05), A: (9.0, 0.05), B: (11.0, 0.05)}, A)
    (line,) = _check(slower)
    assert "dtype=float32,threads=128 took 8.00 us, now 9.00 us (+12.5%, threshold 5%)" in line


def test_records_of_another_clock_or_policy_are_not_compared_and_unrecorded_buckets_are_named() -> None:
    (line,) = _check(dataclasses.replace(RECORDED, clock="host"))
    assert "recorded on the device clock, measured now on the host clock: times not compared" in line
    other = _rec({D: (10.0, 0.05), A: (8.0, 0.05), B: (9.0, 0.05)}, A, policy="eager launches, device clock, "
                 "warmup 1, rounds 5..5, median-ci95+0.01")
    (line,) = _check(other)
    assert f"recorded by {METHOD!r}" in line and "not compared" in line
    (line,) = _check(_rec({D: (10.0, 0.05), A: (8.0, 0.05)}, A, bucket="n=4096"))
    assert line.endswith("n=4096 on NVIDIA H100 80GB HBM3: never recorded")
    # A record from before policies (none on its line) is compared with any.
    legacy = dataclasses.replace(RECORDED, line=dataclasses.replace(RECORDED.line, policy=None))
    assert drift.report({drift.key(legacy): legacy}, [RECORDED], 0.05) == []


def test_a_record_without_spreads_takes_half_its_quartiles_distance() -> None:
    """Records written before spreads existed hold quartiles only: a winner 5% ahead with a
    quartile distance of 4 us (spread 2) is inside the noise."""
    old = dataclasses.replace(RECORDED, spread_us={})
    now = dataclasses.replace(_rec({D: (10.0, 2.0), A: (9.5, 2.0)}, A), spread_us={})
    (line,) = drift.report({drift.key(old): old}, [now], 1.0)
    assert "no longer beats the default" in line
