"""The noise rule: which candidate serves a bucket, from each candidate's timing samples.

Pure functions (no JAX, no GPU), so the rule is tested on synthetic measurements.

A candidate's samples reduce to a `Timing`: quartiles and the median's spread, the half-width
of a ~95% confidence interval of the median from the samples' order statistics (distribution
free: a sample's outliers widen it only as far as they move the middle ranks). The measuring
child runs rounds until every candidate's spread is at most SETTLED of its median (`settled`),
or up to its round limit.

`decide`: a candidate beats the default (the build's own variant) only when the default's
median exceeds the candidate's by more than the noise, the two spreads plus MIN_GAIN of the
default's median (a gain below that is never worth a lock line that a rerun might flip).
Among the candidates that beat it, the fastest median wins, and any whose median lies within
the noise of that one ties with it: a tie goes to the earliest in the plan's order (the
manifest's), never to whichever happened to measure faster. No candidate beating the default:
the default wins. `Decision.close` names the candidates whose place was inside the noise (one
faster than the default but not beyond the noise, or one tying the winner): the buckets where
two runs may decide differently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z95 = 1.96  # normal quantile of a two-sided 95% interval
SETTLED = 0.01  # rounds go on until each median's spread is at most this fraction of it
MIN_GAIN = 0.01  # a winner must beat the default by this fraction of its median, besides the noise
RULE = f"median-ci95+{MIN_GAIN:g}"  # how `decide` rules, as a policy names it


@dataclass(frozen=True)
class Timing:
    """One candidate's samples reduced (microseconds): quartiles, and `spread`, the
    half-width of the median's ~95% confidence interval; `n` samples."""

    q1: float
    median: float
    q3: float
    spread: float
    n: int


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), of sorted `xs`."""
    at = q * (len(xs) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def timing(samples: Sequence[float]) -> Timing:
    """The timing of `samples` (at least one). The median's interval spans the order
    statistics n/2 -+ Z95 * sqrt(n)/2 (clamped to the samples): with few samples it is the
    whole range, so a short run never claims a precision it lacks."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    half = Z95 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return Timing(_quantile(xs, 0.25), _quantile(xs, 0.5), _quantile(xs, 0.75),
                  max(0.0, (xs[hi] - xs[lo]) / 2), n)


def settled(timings: Mapping[str, Timing], target: float = SETTLED) -> bool:
    """Whether every median's spread is at most `target` of it (more rounds would not move
    a decision between candidates further apart than that)."""
    return all(t.spread <= target * t.median for t in timings.values())


def noise(a: Timing, b: Timing, base: Timing, min_gain: float = MIN_GAIN) -> float:
    """The margin by which `a` must beat `b` to count: their spreads plus `min_gain` of the
    default's median."""
    return a.spread + b.spread + min_gain * base.median


@dataclass(frozen=True)
class Decision:
    """The winner (a key of the timings) and `close`: the candidates inside the noise, in
    plan order (see the module docstring)."""

    winner: str
    close: tuple[str, ...]


def decide(timings: Mapping[str, Timing], base: str, order: Sequence[str],
           min_gain: float = MIN_GAIN) -> Decision:
    """The bucket's winner by the noise rule (see the module docstring). `order`: every
    candidate in the plan's order (those without timings are skipped)."""
    d = timings[base]
    rank = {k: i for i, k in enumerate(order)}
    others = sorted((k for k in timings if k != base), key=lambda k: (rank.get(k, len(rank)), k))
    beat = [k for k in others if d.median - timings[k].median > noise(timings[k], d, d, min_gain)]
    inside = [k for k in others if k not in beat and timings[k].median < d.median]
    if not beat:
        return Decision(base, tuple(inside))
    best = min(beat, key=lambda k: (timings[k].median, rank.get(k, len(rank)), k))
    ties = [k for k in beat
            if timings[k].median - timings[best].median <= noise(timings[k], timings[best], d, min_gain)]
    winner = ties[0]  # plan order
    return Decision(winner, tuple(k for k in others if k in ties and k != winner))
