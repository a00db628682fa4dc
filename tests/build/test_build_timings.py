"""`cutecc build --timings`: the text report says where the build spent its time, stage by
stage and entry by entry, and which workers compiled; without it (or -v) it says nothing
of the kind, and the JSON report carries the timings either way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cutecc.build.outcome import Outcome
from cutecc.build.timings import Timings
from cutecc.commands.build import BuildReport


def _report(show: bool) -> BuildReport:
    clock = Timings()
    for stage, s in (("parse", 0.01), ("plan", 0.4), ("probe", 0.002), ("compile", 3.5), ("lock", 0.05)):
        clock.add(stage, s)

    def planned(dtype: str, key: str) -> Any:
        kernel, variant = SimpleNamespace(name="mul"), SimpleNamespace(id=f"dtype={dtype}")
        return SimpleNamespace(label=f"mul[dtype={dtype}]@sm_90a", key=key, kernel=kernel,
                               variant=variant, arch="sm_90a", platform="x86_64")

    parts = {"startup": 1.2, "compile": 1.5, "link": 0.1, "publish": 0.3}
    built = Outcome(planned("float32", "ab" * 32), "built", 3.1, timings=parts, worker="fork")
    hit = Outcome(planned("float16", "cd" * 32), "cached")
    return BuildReport(outcomes=[built, hit], seconds=4.0, timings=clock, show_timings=show)


def test_timings_are_printed_when_asked_and_always_in_the_json() -> None:
    lines = _report(show=True).lines()
    assert "timings: parse 0.01s, plan 0.40s, probe 0.00s, compile 3.50s, lock 0.05s; total 4.00s" in lines
    assert "workers: fork" in lines
    assert "  mul[dtype=float32]@sm_90a: startup 1.20s, compile 1.50s, link 0.10s, publish 0.30s" in lines
    assert not any("float16" in x for x in lines)  # a hit compiled nothing
    quiet = _report(show=False)
    assert not any(x.startswith(("timings:", "workers:", "  mul")) for x in quiet.lines())
    assert any(x.startswith("timings:") for x in quiet.lines(verbose=1))
    j = quiet.to_json()
    assert j["timings"]["compile"] == 3.5 and j["workers"] == "fork"
