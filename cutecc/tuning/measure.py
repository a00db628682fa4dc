"""Measuring a tuning plan on this host's GPU, one child process per plan item.

A child (`cutecc.tuning.bench`) that faults, dies or hangs (no result within CHILD_TIMEOUT)
is replaced by a fresh one without the candidate it was running, and with the buckets it
had not finished; that candidate is reported dropped. Imports nothing of the DSL or of JAX
here (the children do the GPU work).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cutecc import settings
from cutecc.contract.buckets import bucket_text
from cutecc.contract.pinned import Pin, Tuned, TunedTiming
from cutecc.errors import WorkError
from cutecc.plan.tuning_plan import PlanItem
from cutecc.runtime.tuning import toolchain_of
from cutecc.store.tuning_records import MEASURED, TuningResult
from cutecc.store.view import StoreView
from cutecc.tuning import decide
from cutecc.tuning.policy import LAUNCH, Policy

MAX_RESTARTS = 32
# Seconds a measuring child may go without a word (an event line): past it, a kernel hung.
# Every event resets it, so a long healthy run over many buckets is never cut short.
CHILD_IDLE_TIMEOUT = 600.0
MAX_EVENT_BYTES = 1 << 20  # one event line from the child
MAX_OUTPUT_BYTES = 256 << 20  # all of one child's standard output


def _event(line: bytes) -> dict[str, Any] | None:
    """One protocol event from a line of the child's output; None for anything else (a
    library printing to standard output)."""
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) and isinstance(ev.get("event"), str) else None


def _run_child(cmd: list[str], job: dict[str, Any], env: dict[str, str], idle: float
               ) -> tuple[list[dict[str, Any]], int, str]:
    """Run one measuring child on `job`: (its events, exit code, stderr's tail). A child
    that sends no event for `idle` seconds (output that is not an event does not count)
    is killed (exit -9); what it said before counts. The job goes in through a file and
    what comes out is bounded, so no pipe can block the parent."""
    import selectors
    import tempfile

    events: list[dict[str, Any]] = []
    killed = False
    with tempfile.TemporaryFile() as job_file, tempfile.TemporaryFile() as err:
        job_file.write(json.dumps(job).encode())
        job_file.seek(0)
        proc = subprocess.Popen(cmd, stdin=job_file, stdout=subprocess.PIPE, stderr=err, env=env)
        assert proc.stdout is not None
        try:
            buf, total = b"", 0
            deadline = time.monotonic() + idle
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not sel.select(timeout=left):
                        killed = True
                        break
                    chunk = proc.stdout.read1(1 << 16)  # type: ignore[attr-defined]
                    if not chunk:
                        break
                    total += len(chunk)
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    if len(buf) > MAX_EVENT_BYTES or total > MAX_OUTPUT_BYTES:
                        raise WorkError(f"the measuring process wrote over {MAX_EVENT_BYTES} bytes in a "
                                        f"line or {MAX_OUTPUT_BYTES} in all", where=cmd[-1])
                    new = [ev for ev in map(_event, lines) if ev is not None]
                    if new:
                        events += new
                        deadline = time.monotonic() + idle
            if not killed:
                try:  # stdout closed: it should be exiting; one that lingers is stopped
                    proc.wait(timeout=idle)
                except subprocess.TimeoutExpired:
                    killed = True
        finally:
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
        err.seek(0, 2)
        err.seek(max(0, err.tell() - 4096))
        tail = err.read().decode(errors="replace")
    if killed:
        code, tail = -9, f"no event for {idle:.0f} s (hung?), killed. {tail.strip()[-300:]}"
    return events, code, tail


def measure(root: Path, items: list[PlanItem], *, buckets: tuple[str, ...] = (),
            repeats: int = 30, warmup: int = 3, seed: int = 0, max_rounds: int | None = None,
            child: str = "cutecc.tuning.bench") -> tuple[list[TuningResult], dict[str, Any]]:
    """Time every candidate of `items` per bucket; returns (records, info). A record is a
    `Tuned` line plus what was measured (quartiles, the median's spread per candidate,
    dropped ones, the policy). Rounds: at least `repeats`, more until the medians settle, at
    most `max_rounds` (default 4 x `repeats`). `child` is the measuring module run per item
    (`python -m CHILD`)."""
    max_rounds = max(repeats, max_rounds if max_rounds is not None else 4 * repeats)
    store = StoreView(root)
    records: list[TuningResult] = []
    info: dict[str, Any] = {"device": None, "driver": None, "bench_seconds": 0.0, "failed": [],
                            "warmup": warmup, "rounds": repeats, "max_rounds": max_rounds}
    t0 = time.perf_counter()
    # One GPU: a kernel call outside shard_map is refused when several are visible.
    env = {**os.environ, settings.SYNC_CHECK.env: "0",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    for item in items:
        points = item.points()  # each in the extents' order, as bucket_text names it
        if buckets:
            points = [p for p in points if bucket_text(p) in buckets]
        excluded: dict[str, str] = {}
        results: dict[str, dict[str, Any]] = {}
        skipped: dict[str, str] = {}  # buckets whose timing killed the child: not tried again
        for _ in range(MAX_RESTARTS):
            done = results.keys() | skipped.keys()
            todo = [p for p in points if bucket_text(p) not in done]
            if not todo or item.base in excluded:
                break
            job = {"cache": str(root), "item": item.to_json(), "buckets": todo, "exclude": sorted(excluded),
                   "repeats": repeats, "warmup": warmup, "seed": seed, "max_rounds": max_rounds}
            events, code, stderr = _run_child([sys.executable, "-m", child], job, env, CHILD_IDLE_TIMEOUT)
            last = None  # the candidate running when the child stopped
            timing = None  # the bucket being timed when it stopped
            for ev in events:
                if ev["event"] == "device":
                    info["device"], info["driver"] = ev["device"], ev["driver"]
                elif ev["event"] == "start":
                    last = ev["key"]
                elif ev["event"] == "checked":
                    last, timing = None, ev["bucket"]
                elif ev["event"] == "fault":
                    excluded[ev["key"]] = f"faulted: {ev['error']}"
                    last = None
                elif ev["event"] == "bucket":
                    results[ev["bucket"]] = ev
                    timing = None
            if code == 0:
                break
            if last is not None:  # died while running `last`, with no word: a crash (or a hang)
                excluded[last] = f"killed its process (exit {code}): {stderr.strip()[-300:]}"
            elif timing is not None:  # died timing a bucket's survivors: no one candidate to blame
                skipped[timing] = f"exit {code} while timing: {stderr.strip()[-300:]}"
            elif code != 3:  # 3: a `fault` event named the candidate (excluded above)
                raise WorkError(f"the measuring process failed (exit {code}): "
                                f"{stderr.strip()[-800:]}", where=f"kernel {item.kernel}")
        for text, why in sorted(skipped.items()):
            info["failed"].append(f"{item.label} {text}: not measured ({why})")
        if item.base in excluded:
            info["failed"].append(f"{item.label}: the default configuration {excluded[item.base]}")
            continue
        for text, ev in sorted(results.items()):
            records.append(_record(store, item, text, ev, excluded, info))
    info["bench_seconds"] = round(time.perf_counter() - t0, 3)
    return records, info


def _timings(ev: dict[str, Any]) -> dict[str, decide.Timing]:
    """Each candidate's timing from a child's `bucket` event; an event without spreads (a
    child that predates them) takes half the quartiles' distance as the spread."""
    spread, counts = ev.get("spread") or {}, ev.get("samples") or {}
    return {k: decide.Timing(v[0], v[1], v[2], float(spread.get(k, (v[2] - v[0]) / 2)), int(counts.get(k, 0)))
            for k, v in ev["times"].items()}


def _record(store: StoreView, item: PlanItem, bucket: str, ev: dict[str, Any], excluded: dict[str, str],
            info: dict[str, Any]) -> TuningResult:
    """The record of one measured bucket: the winner by the noise rule (`decide`), the
    policy it was measured under, each candidate's median and spread."""
    variant = {c.key: c.variant for c in item.candidates}
    timings = _timings(ev)
    base = item.base
    decision = decide.decide(timings, base, [c.key for c in item.candidates])
    winner = decision.winner
    e = store.get(winner)
    try:  # just built or found healthy by the child: not expected to fail
        meta = e.meta if e is not None else None
    except ValueError as err:
        raise WorkError(f"the winner {winner[:12]}: {err}", where=f"kernel {item.kernel}") from None
    pin = Pin.of(meta) if meta is not None else None
    if meta is None or pin is None:
        raise WorkError(f"the winner {winner[:12]} records no library, symbol or runtime library",
                        where=f"kernel {item.kernel}")
    toolchain = toolchain_of(meta)
    clock = ev.get("clock", "host")
    pol = Policy(LAUNCH, clock, int(ev.get("warmup", info.get("warmup", 0))),
                 int(ev.get("rounds", info.get("rounds", 0))),
                 int(ev.get("max_rounds", info.get("max_rounds", ev.get("rounds", info.get("rounds", 0))))))
    won, default = timings[winner], timings[base]
    line = Tuned(item.kernel, item.variant, item.arch, str(info["device"]), item.rule, bucket,
                 base, winner, variant[winner], pin, pol.method, toolchain,
                 TunedTiming(round(won.median, 3), round(won.spread, 3), round(default.median, 3),
                             round(default.spread, 3)))
    dropped = {variant[k]: why for k, why in {**excluded, **ev["dropped"]}.items() if k in variant}
    dropped.update(item.dropped or {})  # failed to compile: not in the plan's candidates
    note = ev.get("clock_note")
    # Samples lost on the device clock and chains joined after host stalls, and why.
    notes = ev["notes"] if isinstance(ev.get("notes"), list) else []
    clocks = [float(c) for c in ev.get("sm_clock_mhz") or () if isinstance(c, (int, float))]
    absent = {n for n, has in (("clock_note", note), ("timing_notes", notes), ("toolchain", toolchain))
              if not has}
    return TuningResult(
        line, ev["k"], info["driver"], clock, note or None,
        tuple(str(n)[:300] for n in notes[:10]), toolchain,
        {variant[k]: (round(t.q1, 3), round(t.median, 3), round(t.q3, 3))
         for k, t in sorted(timings.items())},
        round(timings[base].median, 3), round(timings[winner].median, 3), dict(sorted(dropped.items())),
        {variant[k]: round(t.spread, 3) for k, t in sorted(timings.items())},
        {variant[k]: t.n for k, t in sorted(timings.items())},
        tuple(variant[k] for k in decision.close),
        pol.record(info["device"], info["driver"], toolchain, clocks),
        frozenset(MEASURED) - absent)
