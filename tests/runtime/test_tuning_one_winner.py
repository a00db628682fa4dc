"""One winner on every rank: at run time a tuned winner is read from the record (the lock's
tuning lines), never measured or chosen per process, so every process of a multi-GPU job
that loads the same lock on the same device kind serves every bucket with the same build."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from helpers import REPO

RUNTIME = REPO / "cutecc" / "runtime"
# What measuring would need: a clock, a profiler, the tuning (measuring) side.
MEASURING = ("perf_counter", "monotonic", "process_time", "profiler", "cutecc.tuning", "random")

PICKS = r"""
import json, sys
from dataclasses import dataclass
from cutecc.lock.lockfile import read_lock
from cutecc.runtime.tuning import TuningTable

@dataclass(frozen=True)
class B:
    key: str
    variant: str

lock = read_lock(sys.argv[1])
by_key = {t.winner: B(t.winner, t.winner_variant) for t in lock.tuning}
picks = {}
for t in lock.tuning:
    same = [x for x in lock.tuning if x.kernel == t.kernel]
    table = TuningTable(t.kernel, same, lambda x: by_key[x.winner], kind=lambda: t.device)
    for m in (200, 256, 3000, 8192, 20000):
        for n in (1024, 5000, 8192):
            env = {"m": m, "n": n, "k": 4096}
            picks[f"{t.kernel} m={m} n={n}"] = table.pick(B(t.base, t.variant), env).key
print(json.dumps(picks, sort_keys=True))
"""


def test_the_runtime_never_measures_or_picks_by_chance() -> None:
    """No module of the runtime reads a clock, starts a profiler, draws a random number or
    imports the measuring side: a pick is a table lookup on the record."""
    found = []
    for f in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or "", *(a.name for a in node.names)]
            found += [f"{f.name}:{node.lineno} {n}" for n in names if n and any(
                n == w or n.startswith(w + ".") for w in MEASURING)]
    assert found == []


def test_every_process_reading_one_lock_picks_the_same_winners() -> None:
    """The committed examples/gemm lock, read by separate processes (hash seeds differ, as
    ranks' would): the same build for every call shape."""
    lock = REPO / "examples" / "gemm" / "kernels.lock"
    outs = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-c", PICKS, str(lock)], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1] == outs[2]
    winners = {t["winner"] for t in json.loads(lock.read_text())["tuning"]}
    assert len(set(outs[0].values()) & winners) >= 2  # tuned winners serve, not only defaults
