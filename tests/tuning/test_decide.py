"""The noise rule on synthetic measurements: a candidate wins only beyond the measured noise,
the default keeps every bucket it is not clearly beaten in, and ties go to the plan's order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cutecc.tuning import decide
from cutecc.tuning.decide import Timing


def _t(median: float, spread: float) -> Timing:
    return Timing(median - spread, median, median + spread, spread, 30)


def test_the_medians_spread_is_an_order_statistic_interval_that_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(3)
    few = decide.timing(list(10 + rng.standard_normal(9)))
    many = decide.timing(list(10 + rng.standard_normal(400)))
    assert few.n == 9 and many.n == 400
    assert abs(many.median - 10) < 0.2
    # ~95% interval of a normal sample's median: about 1.96 * 1.2533 / sqrt(n) on each side
    assert 0.07 < many.spread < 0.18, many.spread
    assert few.spread > 2 * many.spread
    xs = sorted(10 + rng.standard_normal(101))
    t = decide.timing(xs)
    assert t.median == pytest.approx(float(np.median(xs)))
    assert (t.q1, t.q3) == pytest.approx((float(np.percentile(xs, 25)), float(np.percentile(xs, 75))))
    # One wild sample moves the quartiles' distance but not the median's interval much.
    wild = decide.timing(xs[:-1] + [1e6])
    assert wild.spread == pytest.approx(t.spread, rel=0.2)
    assert decide.timing([5.0]) == Timing(5.0, 5.0, 5.0, 0.0, 1)
    with pytest.raises(ValueError):
        decide.timing([])


def test_rounds_settle_when_every_medians_spread_is_within_the_target() -> None:
    assert decide.settled({"a": _t(100, 0.9), "b": _t(10, 0.09)})
    assert not decide.settled({"a": _t(100, 0.9), "b": _t(10, 0.2)})


def test_the_default_wins_within_the_noise() -> None:
    # 3% faster, but the spreads (1 + 1) plus 1% of 100 make a noise of 3: not beyond it.
    d = decide.decide({"D": _t(100, 1), "A": _t(97, 1)}, "D", ["D", "A"])
    assert d == decide.Decision("D", ("A",))  # kept, and named as decided within the noise
    # Just beyond it: A wins, and nothing was close.
    assert decide.decide({"D": _t(100, 1), "A": _t(96.9, 1)}, "D", ["D", "A"]) == decide.Decision("A", ())
    # A noisy candidate must beat the default by its own spread too.
    assert decide.decide({"D": _t(100, 0.1), "A": _t(80, 19)}, "D", ["D", "A"]).winner == "D"
    # Slower candidates are not "close": the default's place was never in doubt.
    assert decide.decide({"D": _t(100, 1), "A": _t(130, 1)}, "D", ["D", "A"]) == decide.Decision("D", ())


def test_candidates_tying_within_the_noise_go_to_the_earliest_in_plan_order() -> None:
    times = {"D": _t(100, 0.5), "A": _t(80.4, 0.5), "B": _t(80.0, 0.5), "C": _t(90, 0.5)}
    order = ["D", "A", "B", "C"]
    # B's median is lower, but within the noise of A's: the tie goes to A, the earlier.
    got = decide.decide(times, "D", order)
    assert got == decide.Decision("A", ("B",))
    # The same whatever order the timings arrive in (a dict from a shuffled run).
    for perm in itertools.permutations(times):
        assert decide.decide({k: times[k] for k in perm}, "D", order) == got
    # With the plan in the other order, B is the earlier.
    assert decide.decide(times, "D", ["D", "B", "A", "C"]) == decide.Decision("B", ("A",))
    # Beyond the noise of each other, the faster one wins wherever it stands.
    times["B"] = _t(70, 0.5)
    assert decide.decide(times, "D", order) == decide.Decision("B", ())


def test_two_noisy_runs_of_the_same_candidates_agree_or_name_the_bucket() -> None:
    """Synthetic runs: per bucket, candidates whose true times differ by 0% (a tie), 0.5%
    (within the noise) or 8% (clear). Every pair of runs picks the same winner wherever
    neither run names the bucket within the noise."""
    rng = np.random.default_rng(11)
    truth = {"tie": {"D": 100.0, "A": 100.0}, "slight": {"D": 100.0, "A": 99.5},
             "clear": {"D": 100.0, "A": 92.0}, "two": {"D": 100.0, "A": 90.0, "B": 90.0}}

    def run(seed: int) -> dict[str, decide.Decision]:
        r = np.random.default_rng(seed)
        out = {}
        for bucket, means in truth.items():
            ts = {k: decide.timing(list(m * (1 + 0.02 * r.standard_normal(60)))) for k, m in means.items()}
            out[bucket] = decide.decide(ts, "D", list(means))
        return out

    runs = [run(int(s)) for s in rng.integers(0, 2**31, 20)]
    for a, b in itertools.combinations(runs, 2):
        for bucket in truth:
            if not a[bucket].close and not b[bucket].close:
                assert a[bucket].winner == b[bucket].winner, bucket
    assert all(r["clear"] == decide.Decision("A", ()) for r in runs)
    assert all(r["tie"].winner == "D" and r["slight"].winner == "D" for r in runs)
    assert all(r["two"].winner == "A" for r in runs)  # B ties A: plan order
