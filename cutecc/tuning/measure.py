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

from cutecc.entry import acted_on
from cutecc.errors import CuteccError
from cutecc.runtime.tuning import Tuned
from cutecc.store import Store

MAX_RESTARTS = 32
CHILD_TIMEOUT = 1200.0  # seconds one child may take for its buckets: past it, a kernel hung


def measure(root: Path, items: list[dict[str, Any]], *, buckets: tuple[str, ...] = (),
            repeats: int = 30, warmup: int = 3, seed: int = 0, child: str = "cutecc.tuning.bench"
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every candidate of `items` per bucket; returns (records, info). A record is a
    `Tuned` line plus what was measured (median, quartiles per candidate, dropped ones).
    `child` is the measuring module run per item (`python -m CHILD`)."""
    store = Store(root)
    records: list[dict[str, Any]] = []
    info: dict[str, Any] = {"device": None, "driver": None, "bench_seconds": 0.0, "failed": []}
    t0 = time.perf_counter()
    # One GPU: a kernel call outside shard_map is refused when several are visible.
    env = {**os.environ, "CUTECC_SYNC_CHECK": "0",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    for item in items:
        names = [b["extent"] for b in item["buckets"]]
        points = _points(item)
        if buckets:
            points = [p for p in points if ",".join(f"{n}={p[n]}" for n in names) in buckets]
        excluded: dict[str, str] = {}
        results: dict[str, dict[str, Any]] = {}
        for _ in range(MAX_RESTARTS):
            todo = [p for p in points if ",".join(f"{n}={p[n]}" for n in names) not in results]
            if not todo or item["base"] in excluded:
                break
            job = {"cache": str(root), "item": item, "buckets": todo, "exclude": sorted(excluded),
                   "repeats": repeats, "warmup": warmup, "seed": seed}
            try:
                r = subprocess.run([sys.executable, "-m", child], input=json.dumps(job),
                                   capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT)
                stdout, code, stderr = r.stdout, r.returncode, r.stderr
            except subprocess.TimeoutExpired as e:  # a hung kernel: the child was killed
                stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                code, stderr = -9, f"no result within {CHILD_TIMEOUT:.0f} s (hung?), killed"
            last = None
            for line in stdout.splitlines():
                ev = json.loads(line)
                if ev["event"] == "device":
                    info["device"], info["driver"] = ev["device"], ev["driver"]
                elif ev["event"] == "start":
                    last = ev["key"]
                elif ev["event"] == "checked":
                    last = None
                elif ev["event"] == "fault":
                    excluded[ev["key"]] = f"faulted: {ev['error']}"
                    last = None
                elif ev["event"] == "bucket":
                    results[ev["bucket"]] = ev
            if code == 0:
                break
            if last is not None:  # died while running `last`, with no word: a crash (or a hang)
                excluded[last] = f"killed its process (exit {code}): {stderr.strip()[-300:]}"
            elif code != 3:  # 3: a `fault` event named the candidate (excluded above)
                raise CuteccError(f"the measuring process failed (exit {code}): "
                                  f"{stderr.strip()[-800:]}", where=f"kernel {item['kernel']}", exit_code=1)
        if item["base"] in excluded:
            info["failed"].append(f"{item['kernel']}[{item['variant']}]@{item['arch']}: the default "
                                  f"configuration {excluded[item['base']]}")
            continue
        for text, ev in sorted(results.items()):
            records.append(_record(store, item, text, ev, excluded, info))
    info["bench_seconds"] = round(time.perf_counter() - t0, 3)
    return records, info


def _points(item: dict[str, Any]) -> list[dict[str, int]]:
    import itertools

    names = [b["extent"] for b in item["buckets"]]
    return [dict(zip(names, c)) for c in itertools.product(*(b["edges"] for b in item["buckets"]))]


def _record(store: Store, item: dict[str, Any], bucket: str, ev: dict[str, Any], excluded: dict[str, str],
            info: dict[str, Any]) -> dict[str, Any]:
    variant = {c["key"]: c["variant"] for c in item["candidates"]}
    times = {k: v for k, v in ev["times"].items()}
    best = min(times, key=lambda k: times[k][1])
    base = item["base"]
    # The default stays the winner unless the best beats it by more than their spread: a
    # winner within noise would flip between runs and churn the lock.
    noise = max((times[best][2] - times[best][0]) / 2, (times[base][2] - times[base][0]) / 2)
    winner = best if times[base][1] - times[best][1] > noise else base
    e = store.get(winner)
    meta = e.meta if e is not None else {}
    acted = acted_on(meta) or {}
    tc = meta.get("toolchain") or {}
    line = Tuned(item["kernel"], item["variant"], item["arch"], str(info["device"]), item["rule"], bucket,
                 base, winner, variant[winner], str(acted.get("library")), str(acted.get("sha256")),
                 int(acted.get("size") or 0), str(acted.get("symbol")), acted.get("backward"),
                 str(acted.get("contract")), str(acted.get("runtime")))
    dropped = {variant[k]: why for k, why in {**excluded, **ev["dropped"]}.items() if k in variant}
    dropped.update(item.get("dropped") or {})  # failed to compile: not in the plan's candidates
    return {**line.to_json(), "k": ev["k"], "driver": info["driver"], "clock": ev.get("clock", "host"),
            **({"clock_note": ev["clock_note"]} if ev.get("clock_note") else {}),
            "toolchain": f"nvidia-cutlass-dsl {tc.get('nvidia-cutlass-dsl', '?')}",
            "times_us": {variant[k]: [round(x, 3) for x in v] for k, v in sorted(times.items())},
            "default_us": round(times[base][1], 3), "winner_us": round(times[winner][1], 3),
            "dropped": dict(sorted(dropped.items()))}
