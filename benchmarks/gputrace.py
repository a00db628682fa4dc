"""Device-clock measurement shared by the device benchmarks: runs in one CUPTI trace
(`jax.profiler`). `trace` (loop_carry.py, chain_gap.py) marks each run on the host by a
`TraceAnnotation` and reads it back with its GPU activities and the host events under it;
`device_chunks` (first_kernel.py, object_call.py, training_step.py) splits the device's
activities into runs where the device idled. Needs jax with CUDA."""

from __future__ import annotations

import glob
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

GAP_S = 0.004  # idle time after each run, so runs never overlap on the device
GAP_NS = 2_000_000  # `device_chunks` splits the trace at device idle gaps longer than this


@dataclass
class Run:
    """One traced run: its annotation's host window and what ran under it."""

    label: str
    host_start_ns: float
    host_end_ns: float
    gpu: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, duration)
    host: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def busy_ns(self) -> float:
        return sum(d for _, _, d in self.gpu)

    @property
    def span_ns(self) -> float:
        return max(s + d for _, s, d in self.gpu) - min(s for _, s, _ in self.gpu) if self.gpu else 0.0

    def idle_gaps_ns(self) -> list[float]:
        """The device's idle time between one activity's end and the next one's start."""
        ev = sorted(self.gpu, key=lambda e: e[1])
        out, end = [], None
        for _, s, d in ev:
            if end is not None:
                out.append(max(0.0, s - end))
            end = s + d if end is None else max(end, s + d)
        return out

    def first_launch_ns(self) -> float | None:
        """From the host's start of the run to the device's first activity."""
        return min(s for _, s, _ in self.gpu) - self.host_start_ns if self.gpu else None


def trace(runs: Sequence[tuple[str, Callable[[], Any]]], sync: Callable[[], None]) -> list[Run]:
    """Each (label, fn) called in turn inside one profiler trace, synchronised and followed
    by GAP_S of idle time; returns the runs with their GPU and host events."""
    import jax

    marks = []
    with tempfile.TemporaryDirectory() as d:
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0  # Python's own calls untraced: they would slow the host side
        jax.profiler.start_trace(d, profiler_options=opts)
        try:
            for i, (label, fn) in enumerate(runs):
                with jax.profiler.TraceAnnotation(f"bench_run_{i}"):
                    fn()
                    sync()
                marks.append(label)
                time.sleep(GAP_S)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no trace")
        data = jax.profiler.ProfileData.from_file(files[0])
        gpu, host, windows = [], [], {}
        for plane in data.planes:
            for line in plane.lines:
                for e in line.events:
                    ev = (e.name, float(e.start_ns), float(e.duration_ns))
                    if plane.name.startswith("/device:GPU"):
                        gpu.append(ev)
                    elif plane.name.startswith("/host"):
                        if e.name.startswith("bench_run_"):
                            windows[int(e.name[len("bench_run_"):])] = ev
                        else:
                            host.append(ev)
    if len(windows) != len(runs):
        raise RuntimeError(f"{len(windows)} run annotations in the trace, expected {len(runs)}")
    # The device's work, split where it idled for half the gap left after each run (the
    # device clock alone decides); by the host windows where that does not give one part a run.
    parts: list[list[tuple[str, float, float]]] = []
    end = None
    for e in sorted(gpu, key=lambda e: e[1]):
        if end is None or e[1] - end > GAP_S / 2 * 1e9:
            parts.append([])
            end = e[1] + e[2]
        parts[-1].append(e)
        end = max(end, e[1] + e[2])
    bounds = [windows[i][1] for i in range(len(runs))] + [float("inf")]
    out = []
    for i, label in enumerate(marks):
        _, s, dur = windows[i]
        r = Run(label, s, s + dur)
        r.gpu = (parts[i] if len(parts) == len(runs)
                 else [e for e in gpu if bounds[i] <= e[1] < bounds[i + 1]])
        r.host = [e for e in host if s <= e[1] < s + dur]
        out.append(r)
    return out


def clocks_agree(runs: Sequence[Run]) -> bool:
    """Whether every run's device work lies after its host start and before the next run's
    host start (so host-to-device offsets mean something)."""
    return all(r.gpu and r.host_start_ns <= min(e[1] for e in r.gpu)
               and (nxt is None or max(e[1] for e in r.gpu) < nxt.host_start_ns)
               for r, nxt in zip(runs, [*runs[1:], None]))


def host_summary(runs: Sequence[Run], top: int = 12) -> list[tuple[str, float]]:
    """The host events under `runs`, by name: median microseconds per run, largest first."""
    per: dict[str, list[float]] = {}
    for r in runs:
        tot: dict[str, float] = {}
        for name, _, d in r.host:
            tot[name] = tot.get(name, 0.0) + d
        for name, v in tot.items():
            per.setdefault(name, []).append(v)
    rows = [(n, statistics.median(v + [0.0] * (len(runs) - len(v))) / 1e3) for n, v in per.items()]
    return sorted(rows, key=lambda x: -x[1])[:top]


def stats(xs: Sequence[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": len(s)}


def device_chunks(runs: Sequence[Callable[[], Any]]) -> list[list[Any]]:
    """The GPU activities (`cutecc.tuning.trace.Event`s) of each of `runs`, called in turn
    inside one profiler trace, each waited for and followed by GAP_S of idle time; the trace
    is split where the device idled over GAP_NS, and must give one part per run."""
    import jax

    from cutecc.tuning.trace import Event, split

    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        try:
            for run in runs:
                jax.block_until_ready(run())
                time.sleep(GAP_S)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no trace")
        data = jax.profiler.ProfileData.from_file(files[0])
        events = [Event(e.name, float(e.start_ns), float(e.duration_ns))
                  for plane in data.planes if plane.name.startswith("/device:GPU")
                  for line in plane.lines for e in line.events]
    chunks = split(events, GAP_NS)
    if len(chunks) != len(runs):
        raise RuntimeError(f"the trace splits into {len(chunks)} runs, not {len(runs)} (a run "
                           f"with an idle gap over {GAP_NS / 1e6} ms inside?)")
    return chunks
