# ruff: noqa: E501  (synthetic traces and table rows read better unwrapped)
"""Device-clock timing of `cutecc tune` on CPU: parsing a profiler trace's GPU
events into per-call times (synthetic events: idle gaps, foreign XLA kernels, copies, a
wrong launch count), and the measuring child's timing rounds against a scripted trace."""

from __future__ import annotations

import types
from collections import Counter
from typing import Any

import pytest

from cutecc.tuning import trace
from cutecc.tuning.trace import Event, TraceMismatch

GAP = 1.5e6  # ns


def _chain(t0: float, calls: int, kernels: list[tuple[str, float]], spacing: float = 2e4,
           extra: list[tuple[str, float]] = ()) -> tuple[list[Event], float]:  # type: ignore[assignment]
    """`calls` calls, each launching `kernels` (name, ns) back to back, `spacing` ns apart,
    with `extra` foreign events after each call; returns (events, end)."""
    out, t = [], t0
    for _ in range(calls):
        for name, d in list(kernels) + list(extra):
            out.append(Event(name, t, d))
            t += d + 500
        t += spacing
    return out, t


def test_learn_counts_the_kernels_each_library_defines_and_nothing_else() -> None:
    """XLA's work inside a call (a transpose of a column-major operand, an in-place buffer's
    copy) and fills are in a candidate's one-call chain, but not in its cubin: not its own."""
    names = {"A": frozenset({"kernel_a_0", "reduce_a"}), "B": frozenset({"kernel_b"})}
    a, t = _chain(0, 1, [("kernel_a_0", 3000), ("reduce_a", 1000)], extra=[("Memset 3", 200), ("transpose_fusion", 9000)])
    b, t = _chain(t + 3e6, 1, [("input_copy_fusion", 9000), ("kernel_b", 5000)])
    copies, _ = _chain(t + 3e6, 1, [("MemcpyDtoH", 100)])  # copy-only run: no candidate's
    own = trace.learn(a + b + copies, ["A", "B"], GAP, names)
    assert own == {"A": Counter({"kernel_a_0": 1, "reduce_a": 1}), "B": Counter({"kernel_b": 1})}
    with pytest.raises(TraceMismatch, match="expected 3"):
        trace.learn(a + b, ["A", "B", "C"], GAP, names)
    # A trace naming none of a library's kernels times nothing: a mismatch, not an empty count.
    with pytest.raises(TraceMismatch, match="launched none of the kernels its library defines"):
        trace.learn(a + b, ["A", "B"], GAP, {"A": names["A"], "B": frozenset({"kernel_b_renamed"})})


def test_learned_kernels_time_without_xlas_work() -> None:
    """learn's own kernels fed to chain_times: each call's XLA fusion (9 us) is not timed."""
    names = {"A": frozenset({"ka"}), "B": frozenset({"kb"})}
    ev: list[Event] = []
    t = 0.0
    for key, d in (("A", 1000), ("B", 2000)):  # one call each
        e, t = _chain(t, 1, [(f"k{key.lower()}", d)], extra=[("transpose_fusion", 9000)])
        ev += e
        t += 3e6
    own = trace.learn(ev, ["A", "B"], GAP, names)
    chains: list[Event] = []
    for key, d in (("B", 2000), ("A", 1000)):
        e, t = _chain(t, 4, [(f"k{key.lower()}", d)], extra=[("transpose_fusion", 9000)])
        chains += e
        t += 3e6
    times, notes, _ = trace.chain_times(chains, ["B", "A"], own, 4, GAP)
    assert times == [2000, 1000] and notes == []


def test_chain_times_sum_own_kernels_over_calls_excluding_foreign_work() -> None:
    own = {"A": Counter({"ka": 1}), "B": Counter({"kb": 2}), "C": Counter({"ka": 1})}  # C shares A's name
    ev: list[Event] = []
    t = 0.0
    expect = []
    for _key, kern, d in [("B", [("kb", 2000), ("kb", 1000)], 3000), ("A", [("ka", 4000)], 4000),
                         ("C", [("ka", 3500)], 3500), ("A", [("ka", 4100)], 4100)]:
        # Each chain: 5 calls, each followed by one of XLA's copies (a foreign kernel).
        e, t = _chain(t, 5, kern, extra=[("input_copy_fusion", 9999)])
        ev += e
        expect.append(d)
        t += 3e6
        ev.append(Event("loop_convert_fusion", t, 700))  # XLA work on its own between chains
        t += 3e6
    times, notes, _ = trace.chain_times(ev, ["B", "A", "C", "A"], own, 5, GAP)
    assert times == pytest.approx(expect) and notes == []
    # Shuffled input order changes nothing: events are sorted by start.
    assert trace.chain_times(list(reversed(ev)), ["B", "A", "C", "A"], own, 5, GAP)[0] == times


def test_a_wrong_launch_count_voids_that_chain_only() -> None:
    own = {"A": Counter({"ka": 1}), "B": Counter({"kb": 1})}
    a, t = _chain(0, 4, [("ka", 1000)])
    b, t = _chain(t + 3e6, 4, [("kb", 2000)])
    a2, _ = _chain(t + 3e6, 4, [("ka", 1000)])
    times, notes, _ = trace.chain_times(a + b[:-1] + a2, ["A", "B", "A"], own, 4, GAP)
    assert times == [1000, None, 1000]
    assert len(notes) == 1 and "3 kernel launches of its own" in notes[0] and "expected 4" in notes[0]


def test_a_lost_gap_is_a_mismatch_not_a_wrong_attribution() -> None:
    own = {"A": Counter({"ka": 1}), "B": Counter({"kb": 1})}
    a, t = _chain(0, 4, [("ka", 1000)])
    b, _ = _chain(t + 1e5, 4, [("kb", 1000)])  # no idle gap between the chains: they merge
    with pytest.raises(TraceMismatch, match="1 separate runs"):
        trace.chain_times(a + b, ["A", "B"], own, 4, GAP)
    b, t = _chain(t + 3e6, 4, [("kb", 1000)])
    extra, _ = _chain(t + 3e6, 4, [("ka", 1000)])  # a chain nobody ran
    assert trace.chain_times(a + b, ["A", "B"], own, 4, GAP)[0] == [1000, 1000]
    with pytest.raises(TraceMismatch, match="after the last of 2 chains"):
        trace.chain_times(a + b + extra, ["A", "B"], own, 4, GAP)


def test_a_host_stall_inside_a_chain_is_joined_not_a_mismatch() -> None:
    """Seen on an H100 (mul, 2 us kernels, ~100 calls a chain): the host stalled for over
    1.5 ms inside a chain, so the GPU idled and the trace showed 63 runs for 60 chains; the
    whole trace's rounds were dropped and the bucket fell back to the host clock. The parts
    hold the chain's launches between them: joined, timed on kernel durations alone."""
    own = {"A": Counter({"ka": 1}), "B": Counter({"kb": 2})}
    ev: list[Event] = []
    t = 0.0
    for kern in ([("ka", 1000)], [("kb", 700), ("kb", 300)], [("ka", 1100)]):  # A, B, A
        first, t = _chain(t, 3, kern)
        second, t = _chain(t + 2e6, 2, kern)  # a 2 ms host stall after the third call
        third, t = _chain(t + 1.6e6, 1, kern)  # and another after the fifth
        ev += first + second + third
        t += 3e6
    times, notes, _ = trace.chain_times(ev, ["A", "B", "A"], own, 6, GAP)
    assert times == pytest.approx([1000, 1000, 1100])
    assert trace.chain_times(ev, ["A", "B", "A"], own, 6, GAP)[1:] == ([], 3)
    # A stalled chain missing a record: the parts are joined, the count is short, that chain
    # alone is void (the next chain's run would overshoot it, so it is not taken).
    short = ev[:5] + ev[6:]  # the first A chain loses one launch
    times, notes, _ = trace.chain_times(short, ["A", "B", "A"], own, 6, GAP)
    assert times[0] is None and times[1:] == pytest.approx([1000, 1100])
    assert "5 kernel launches of its own" in notes[0]


@pytest.mark.parametrize("b_name", ["kb", "ka"])  # B's kernel named apart from A's, or the same
def test_a_short_chain_never_takes_the_next_chains_launches(b_name: str) -> None:
    """A loses its last record and B is split by a stall into 1 + 3 launches. Joining A's 3
    with B's first 1 would make 4 and time A with a B kernel in it. FA4's 22 candidates in
    the examples cache share one kernel name, so names alone cannot tell them apart: a
    chain joined just before a void one is voided too. A sample is lost, never misattributed."""
    own = {"A": Counter({"ka": 1}), "B": Counter({b_name: 1}), "C": Counter({"kc": 1})}
    a, t = _chain(0, 3, [("ka", 1000)])  # 3 of 4: one record lost
    b1, t = _chain(t + 3e6, 1, [(b_name, 5000)])
    b2, t = _chain(t + 2e6, 3, [(b_name, 5000)])  # a host stall after B's first call
    c, _ = _chain(t + 3e6, 4, [("kc", 1500)])
    times, notes, _ = trace.chain_times(a + b1 + b2 + c, ["A", "B", "C"], own, 4, GAP)
    assert times[0] is None and times[2] == 1500
    assert times[1] in (None, 5000)  # B joined (names apart) or void (same names)
    if b_name == "kb":
        assert times[1] == 5000
    assert all(t != 2000 for t in times)  # (3 x 1000 + 5000) / 4: A's time with B's kernel


def test_gpu_events_come_from_the_first_gpus_stream_lines() -> None:
    bench = pytest.importorskip("cutecc.tuning.bench")
    ns = types.SimpleNamespace
    ev = ns(name="k", start_ns=10.0, duration_ns=5.0)
    data = ns(planes=[
        ns(name="/host:CPU", lines=[ns(name="python", events=[ns(name="f", start_ns=0, duration_ns=1)])]),
        ns(name="/device:GPU:1", lines=[ns(name="Stream #7(Compute)", events=[ev, ev])]),
        ns(name="/device:GPU:0", lines=[ns(name="Stream #13(Compute)", events=[ev]),
                                        ns(name="XLA Ops", events=[ns(name="custom-call.1", start_ns=10.0,
                                                                      duration_ns=5.0)])])])
    assert bench._gpu_events(data) == [Event("k", 10.0, 5.0)]
    with pytest.raises(bench.NoDeviceClock, match="no GPU plane"):
        bench._gpu_events(ns(planes=[data.planes[0]]))


def test_device_timing_rounds_learn_choose_k_and_keep_each_candidates_own_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's device-clock rounds against a scripted profiler: each call of candidate X
    'launches' kernel kX (A: 4 us, B: 6 us) and a fill; chains are told apart by the
    idle gap the child leaves (its sleep, seen here as a jump of the fake GPU clock)."""
    import numpy as np

    bench = pytest.importorskip("cutecc.tuning.bench")
    clock = {"t": 0.0, "events": []}
    dur = {"A": 4000.0, "B": 6000.0}

    def call(key: str) -> Any:
        def f(*xs: Any) -> Any:
            t = clock["t"]
            clock["events"] += [Event(f"k{key}", t, dur[key]), Event("Memset 1", t + dur[key] + 100, 50)]
            clock["t"] = t + dur[key] + 1e4
            return xs[0]
        return f

    def traced(work: Any) -> list[Event]:
        clock["events"] = []
        work()
        return list(clock["events"])

    def sleep(s: float) -> None:
        clock["t"] += s * 1e9

    monkeypatch.setattr(bench, "_traced", traced)
    monkeypatch.setattr(bench.time, "sleep", sleep)
    calls = {"A": call("A"), "B": call("B")}
    k, samples, notes = bench._device_times(calls, [np.zeros(3)], ["A", "B"], np.random.default_rng(0),
                                            warmup=2, repeats=11, names={"A": frozenset({"kA"}), "B": frozenset({"kB"})})
    assert k == round(bench.TARGET_DEVICE_NS / 4000.0) == 50 and notes == []
    assert {key: len(s) for key, s in samples.items()} == {"A": 11, "B": 11}
    assert samples["A"] == pytest.approx([4e-6] * 11) and samples["B"] == pytest.approx([6e-6] * 11)


def test_device_timing_runs_more_rounds_until_the_medians_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """At least `repeats` rounds; then, a trace of rounds at a time, more while a median's
    spread is over 1% of it (`decide.settled`), up to `max_rounds`."""
    import numpy as np

    bench = pytest.importorskip("cutecc.tuning.bench")
    jitter = {"A": 0.0}
    rng = np.random.default_rng(5)
    clock: dict[str, Any] = {"t": 0.0, "events": []}

    def f(*xs: Any) -> Any:
        d = max(100.0, 4000.0 * (1 + jitter["A"] * rng.standard_normal()))
        clock["events"].append(Event("kA", clock["t"], d))
        clock["t"] += 1e5
        return xs[0]

    def traced(work: Any) -> list[Event]:
        clock["events"] = []
        work()
        return list(clock["events"])

    monkeypatch.setattr(bench, "_traced", traced)
    monkeypatch.setattr(bench.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s * 1e9))

    def rounds() -> int:
        _, samples, _ = bench._device_times({"A": f}, [np.zeros(3)], ["A"], np.random.default_rng(0), warmup=1,
                                            repeats=11, names={"A": frozenset({"kA"})}, max_rounds=120)
        return len(samples["A"])

    assert rounds() == 11  # steady: settled at the minimum
    # A sample averages K = 50 calls: a call's jitter over sqrt(50) is a sample's.
    jitter["A"] = 0.8  # samples spread ~10%: the median's spread stays over 1% up to the limit
    assert rounds() == 120
    jitter["A"] = 0.25  # samples spread ~3.5%: settles on the way (~60), a trace of rounds at a time
    n = rounds()
    assert 11 < n < 120 and n % bench.ROUNDS_PER_TRACE == 11, n


def test_device_timing_falls_back_when_the_trace_has_no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    bench = pytest.importorskip("cutecc.tuning.bench")
    traces: list[int] = []
    monkeypatch.setattr(bench, "_traced", lambda work: (work(), traces.append(1), [Event("Memset 1", 0, 50)])[2])
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    with pytest.raises(bench.NoDeviceClock, match="no kernel.*3 traces in a row") as e:
        bench._device_times({"A": lambda *xs: xs[0]}, [np.zeros(3)], ["A"], np.random.default_rng(0), 1, 3,
                            {"A": frozenset({"kA"})})
    assert e.value.lasting  # no CUPTI: the rest of the process times on the host clock
    assert len(traces) == bench.TRACE_TRIES == 3  # fills alone are no kernel: tried again first


def test_one_empty_trace_is_tried_again_not_taken_for_missing_cupti(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on an H100: a measuring process's first trace had no GPU plane, its later ones
    did; the whole process (four buckets) was timed on the host clock. One empty trace is
    tried again; a missing plane in a later round's trace loses those rounds only."""
    import numpy as np

    bench = pytest.importorskip("cutecc.tuning.bench")
    clock = {"t": 0.0, "events": [], "traces": 0}

    def f(*xs: Any) -> Any:
        clock["events"].append(Event("kA", clock["t"], 4000.0))
        clock["t"] += 1e4
        return xs[0]

    def traced(work: Any) -> list[Event]:
        clock["events"], clock["traces"] = [], clock["traces"] + 1
        work()
        if clock["traces"] in (1, 3):  # the first trace, and the first round's
            raise bench.NoDeviceClock("the trace has no GPU plane (is CUPTI installed?)")
        return list(clock["events"])

    monkeypatch.setattr(bench, "_traced", traced)
    monkeypatch.setattr(bench.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s * 1e9))
    k, samples, notes = bench._device_times({"A": f}, [np.zeros(3)], ["A"], np.random.default_rng(0),
                                            warmup=0, repeats=24, names={"A": frozenset({"kA"})})
    assert samples["A"] == pytest.approx([4e-6] * 12)  # rounds 12-23
    assert len(notes) == 1 and "rounds 0-11 dropped: the trace has no GPU plane" in notes[0]


def test_the_benchmark_pairs_two_runs_per_bucket_and_writes_a_markdown_table() -> None:
    """benchmarks/tune.py's report from two runs' records: the winner of the first run, its
    median and the best median in the second (within 2% or not), the clock, the costs."""
    from benchmarks.tune import markdown, rows_of

    def rec(bucket: str, times: dict[str, list[float]], winner: str) -> dict[str, Any]:
        return {"kernel": "fa4_fwd", "variant": "causal=False", "arch": "sm_90a", "bucket": bucket,
                "clock": "device", "times_us": times, "winner_variant": winner,
                "default_us": times["causal=False"][1], "winner_us": times[winner][1], "dropped": {}}

    d, t = "causal=False", "causal=False,tile_n=96"
    first = [rec("s_k=4096", {d: [9, 10, 11], t: [7, 8, 9]}, t), rec("s_k=512", {d: [1, 2, 3], t: [2, 3, 4]}, d)]
    second = [rec("s_k=4096", {d: [9, 10, 11], t: [7.5, 8.1, 9]}, t), rec("s_k=512", {d: [2, 2.1, 3], t: [1, 2, 3]}, d)]
    rows = rows_of(first, second)
    assert [r["bucket"] for r in rows] == ["s_k=512", "s_k=4096"]  # numeric order
    assert rows[1]["gain"] == 1.25 and rows[1]["within_2pct"] and rows[1]["rerun_best_us"] == 8.1
    assert not rows[0]["within_2pct"] and rows[0]["rerun_winner_us"] == 2.1 and rows[0]["rerun_best_us"] == 2
    text = markdown({"device": "NVIDIA H100 80GB HBM3", "driver": "cuda 13000", "rows": rows,
                     "runs": [{"manifest": "examples/kernels.toml", "compile_seconds_cpu": {"fa4_fwd": 37.6},
                               "bench_seconds_gpu": [50.0, 51.0]}]})
    assert "| fa4_fwd | causal=False | s_k=4096 | 10.00 | tile_n=96 | 8.00 | 1.25x | 8.10 / 8.10 | yes |" in text
    assert "| fa4_fwd | causal=False | s_k=512 | 2.00 | default | 2.00 | 1.00x | 2.10 / 2.00 | no |" in text
    assert "1 of 2 winners within 2%" in text and "clock: device" in text and "{'fa4_fwd': 37.6}" in text
    assert all(r["same_winner"] for r in rows) and "2 of 2 buckets recorded the same winner" in text
    # A second run that picks another winner: named within the noise by one run, or not at all.
    second[1] = {**rec("s_k=512", {d: [2, 2.1, 3], t: [1, 2, 3]}, t), "within_noise": [t]}
    second[0] = rec("s_k=4096", {d: [9, 10, 11], t: [9, 10.1, 11]}, d)
    rows = rows_of(first, second)
    assert [(r["same_winner"], r["within_noise"]) for r in rows] == [(False, [t]), (False, [])]
    text = markdown({"device": "x", "driver": "y", "rows": rows, "runs": []})
    assert "differing within the noise: fa4_fwd[causal=False] s_k=512; differing beyond it: " \
           "fa4_fwd[causal=False] s_k=4096" in text


def test_the_benchmark_reads_the_typed_records_and_plan_that_tune_returns(tmp_path: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/tune.py's main over what `cutecc tune --measure` returns: typed records
    (TuningResult) and plan items (PlanItem), not the dicts of their JSON."""
    import json

    import benchmarks.tune as bt
    from cutecc.commands import tune as cmd
    from cutecc.plan.tuning_plan import BucketEdges, Candidate, PlanItem
    from cutecc.store.tuning_records import TuningResult

    base, other = "a" * 64, "b" * 64
    d, t = "causal=False", "causal=False,tile_n=96"
    item = PlanItem("fa4_fwd", d, "sm_90a", base, (Candidate(d, base, True), Candidate(t, other, False)),
                    "floor", (BucketEdges("s_k", (512,)),), {}, {}, None, None, None, None, {})
    line = {"kernel": "fa4_fwd", "variant": d, "arch": "sm_90a", "device": "NVIDIA H100 80GB HBM3",
            "rule": "floor", "bucket": "s_k=512", "base": base, "winner": other, "winner_variant": t,
            "library": "kernel.so", "sha256": "c" * 64, "size": 1, "symbol": "s", "backward": None,
            "contract": "d" * 64, "runtime": "e" * 64, "clock": "device",
            "times_us": {d: [9.0, 10.0, 11.0], t: [7.0, 8.0, 9.0]}, "default_us": 10.0, "winner_us": 8.0,
            "dropped": {}}
    rec = TuningResult.parse(line, "test", "record")

    def measured(manifest: Any, options: Any, **kw: Any) -> cmd.TuneReport:
        assert options.cache_dir == tmp_path / "cache"  # told as `cutecc tune --cache-dir` tells it
        report = cmd.TuneReport("measure", plan=[item], records=[rec])
        report.info = {"device": line["device"], "driver": "cuda 13000", "bench_seconds": 1.5}
        return report

    monkeypatch.setattr(cmd, "tune", measured)
    out = tmp_path / "tune.json"
    assert bt.main(["--examples-cache", str(tmp_path / "cache"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["winner"] == t and row["gain"] == 1.25 and row["within_2pct"]
    assert doc["runs"][0]["compile_seconds_cpu"] == {"fa4_fwd": 0.0}  # no entries in that cache


def test_a_real_trace_without_a_gpu_says_so_and_leaves_nothing_behind(tmp_path: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The real profiler round trip (start, work, stop, read the xplane file) on this CPU host:
    no GPU plane, so the device clock is out for the process (the host clock takes over)."""
    import tempfile

    bench = pytest.importorskip("cutecc.tuning.bench")  # needs jax: skipped without it
    import jax.numpy as jnp

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ran = []
    with pytest.raises(bench.NoDeviceClock, match="no GPU plane") as e:
        bench._traced(lambda: ran.append(jnp.ones(8).sum().block_until_ready()))
    assert ran and e.value.lasting
    assert list(tmp_path.iterdir()) == []  # the trace directory is removed


def test_agreement_takes_equal_infinities_as_equal() -> None:
    """A log-sum-exp of a fully masked row is -inf in every configuration: inf - inf is nan,
    which must not drop every candidate."""
    import jax.numpy as jnp
    import numpy as np

    bench = pytest.importorskip("cutecc.tuning.bench")
    for dt in ("float32", "bfloat16", "float64"):
        r = (jnp.array([1.0, -np.inf, np.inf, np.nan]).astype(dt) if dt != "float64"
             else np.array([1.0, -np.inf, np.inf, np.nan]),)
        assert bench._agree(r, r, [dt], None, None) is None, dt
        flipped = (r[0].at[1].set(np.inf) if dt != "float64" else np.array([1.0, np.inf, np.inf, np.nan]),)
        assert "disagrees" in bench._agree(r, flipped, [dt], None, None), dt
