"""`cutecc tune --check`'s report: recorded winners against what was measured again.

Pure over records (`TuningResult`s: the recorded ones, and those just measured on this
device), so the report is tested on recorded data on a CPU; measuring is the caller's.
A recorded winner drifts when its median moved by more than `threshold`, when it no longer
beats the default by more than the noise (`cutecc.tuning.decide`: the default would win
now), or when another candidate now wins by the noise rule. Records measured on another
clock are not compared (a host-clock time includes dispatch), nor those measured by another
method (`cutecc.tuning.policy`): both are reported, to record again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cutecc.store.tuning_records import TuningResult
from cutecc.tuning import decide


def _timing(r: TuningResult, variant: str) -> decide.Timing | None:
    t = r.times_us.get(variant)
    if t is None:
        return None
    spread = r.spread_us.get(variant, (t[2] - t[0]) / 2)  # a record before spreads: half the IQR
    return decide.Timing(t[0], t[1], t[2], spread, r.samples.get(variant, 0))


def report(recorded: Mapping[tuple[str, str, str, str, str], TuningResult], measured: Iterable[TuningResult],
           threshold: float) -> list[str]:
    """One line per drift (see the module docstring); `recorded` by `key(record)`."""
    out = []
    for r in measured:
        t = r.line
        what = f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket}"
        old = recorded.get(key(r))
        if old is None:
            out.append(f"{what} on {t.device}: never recorded")
            continue
        was, default = old.line.winner_variant, t.variant  # a line's variant is its default's
        now = _timing(r, was)
        if now is None:
            out.append(f"{what}: the winner {was} was dropped: {r.dropped.get(was, '?')}")
            continue
        if was not in old.times_us:  # a record that lacks its own winner's times: nothing to compare
            out.append(f"{what}: the recorded times hold none for its winner {was}; record again "
                       "(`cutecc tune --measure`)")
            continue
        if old.clock != r.clock:  # a host-clock time holds dispatch a device-clock one lacks
            out.append(f"{what}: recorded on the {old.clock} clock, measured now on the {r.clock} clock: "
                       "times not compared; record again (`cutecc tune --measure`)")
            continue
        if old.line.policy is not None and old.line.policy != t.policy:
            out.append(f"{what}: recorded by {old.line.policy!r}, measured now by {t.policy!r}: not "
                       "compared; record again (`cutecc tune --measure`)")
            continue
        then = old.times_us[was][1]
        if abs(now.median / then - 1) > threshold:
            out.append(f"{what}: {was} took {then:.2f} us, now {now.median:.2f} us "
                       f"({now.median / then - 1:+.1%}, threshold {threshold:.0%})")
        base = _timing(r, default)
        if was != default and base is not None and \
                base.median - now.median <= decide.noise(now, base, base):
            out.append(f"{what}: the recorded winner {was} ({now.median:.2f} +- {now.spread:.2f} us) no "
                       f"longer beats the default ({base.median:.2f} +- {base.spread:.2f} us) beyond the "
                       "noise: the default would win now")
        elif t.winner_variant != was:
            won = _timing(r, t.winner_variant)
            out.append(f"{what}: {t.winner_variant} now beats {was} beyond the noise "
                       f"({won.median if won else r.winner_us:.2f} vs {now.median:.2f} us)")
    return out


def key(r: TuningResult) -> tuple[str, str, str, str, str]:
    """What a re-measured record is matched to its recorded one by."""
    t = r.line
    return t.kernel, t.variant, t.arch, t.device, t.bucket
