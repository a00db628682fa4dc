"""What the read-set check (issue 44, `cutecc/build/read_set.py`) costs a cold build, in CPU
seconds, which a shared host's neighbours inflate far less than wall seconds.

    python -m benchmarks.read_set_cost [--manifest examples root] [--builds 2] [--json PATH]

Per manifest, in one run on one machine:
- the check: cold builds as CI runs them (`CI=true`: no resident service; an empty cache;
  the planning memory off; `-j 1`), `cutecc build MANIFEST --no-lock --json`; each entry's
  `audit_cpu` (the check's thread CPU, from the build's own timings) summed, against the
  whole build's CPU (the children's user + system time, every worker included);
- the recording: the audit hook runs on every audit event of a worker, from its first
  import. One fresh process installs cutecc's hook and a counting one, then compiles every
  entry directly (`build_overhead.direct`): the events counted by name. Each kind's cost is
  then timed here (cutecc's `_hook` called with that event, the minimum of repeats; the
  recorded kinds with a path never seen, so they take the slow path, a frame walk): their
  sum over the counts is an estimate (the interpreter's own dispatch to a Python hook is
  not in it) of what recording adds to the compiles;
- a no-op build into each cold build's cache: the check runs only where an entry compiles.
The bound (issue 44): the check and the recording together at most 3% of a cold build.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, machine

MANIFESTS = {"examples": REPO / "examples" / "kernels.toml", "root": REPO / "kernels.toml"}


def events(manifest: Path) -> dict[str, Any]:
    """In this fresh process: audit events during the direct compiles, by name."""
    from cutecc.build import read_set

    read_set.install()
    counts: collections.Counter[str] = collections.Counter()
    sys.addaudithook(lambda ev, _args: counts.update((ev,)))
    from benchmarks.build_overhead import direct

    res = direct(manifest)
    return {"counts": dict(counts), "direct_cpu_s": round(sum(e["cpu_s"] for e in res["entries"]), 2)}


def per_event_ns(names: list[str]) -> dict[str, float]:
    """cutecc's hook timed per event kind (ns, min of repeats); recorded kinds with new paths."""
    from cutecc.build import read_set

    hook, out, n = read_set._hook, {}, 20000
    fresh = iter(range(10**9))
    samples: dict[str, Any] = {
        "open": lambda: (f"/nonexistent/cost/{next(fresh)}.py", "r", 0),
        "import": lambda: ("m", f"/nonexistent/cost/{next(fresh)}.py", None, None, None),
        "os.listdir": lambda: (f"/nonexistent/cost/{next(fresh)}",),
        "os.scandir": lambda: (f"/nonexistent/cost/{next(fresh)}",),
    }
    for ev in names:
        make = samples.get(ev)
        if make is None:
            args = (object(), "x")
            t = min(timeit.repeat(lambda ev=ev, args=args: hook(ev, args), number=n, repeat=5)) / n
        else:
            made = [make() for _ in range(n)]
            t = timeit.timeit(lambda ev=ev, made=made: [hook(ev, a) for a in made], number=1) / n
        out[ev] = round(t * 1e9, 1)
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(manifest: Path, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "CI": "true", "CUTECC_PLAN_MEMORY": "off", "PYTHONPATH": str(REPO)}
    c0 = _children_cpu()
    cmd = [sys.executable, "-m", "cutecc", "build", str(manifest), "--cache-dir", str(cache), "-j", "1",
           "--no-lock", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    cpu = _children_cpu() - c0
    if r.returncode != 0:
        raise SystemExit(f"build failed:\n{r.stderr[-3000:]}")
    rep = json.loads(r.stdout)
    parts = [e.get("timings") or {} for e in rep["entries"]]
    return {"cpu_s": round(cpu, 2), "wall_s": round(rep["seconds"], 2), "built": rep["built"],
            "audit_cpu_s": round(sum(p.get("audit_cpu", 0.0) for p in parts), 3),
            "audit_wall_s": round(sum(p.get("audit", 0.0) for p in parts), 3),
            "load": round(os.getloadavg()[0], 2)}


def measure(name: str, builds: int) -> dict[str, Any]:
    path = MANIFESTS[name]
    r = subprocess.run([sys.executable, "-m", "benchmarks.read_set_cost", "events", str(path)],
                       capture_output=True, text=True, cwd=REPO, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    ev = json.loads(r.stdout.strip().splitlines()[-1])
    cost = per_event_ns(sorted(ev["counts"]))
    recording = sum(ev["counts"][k] * cost[k] for k in cost) / 1e9
    out: dict[str, Any] = {"manifest": str(path.relative_to(REPO)), "events": sum(ev["counts"].values()),
                           "event_ns": cost, "recording_estimate_s": round(recording, 3),
                           "direct_cpu_s": ev["direct_cpu_s"], "builds": []}
    for _ in range(builds):
        with tempfile.TemporaryDirectory() as d:
            cold = build(path, Path(d) / "cache")
            cold["noop"] = build(path, Path(d) / "cache")
            cold["share"] = round((cold["audit_cpu_s"] + recording) / cold["cpu_s"], 4)
            out["builds"].append(cold)
            print(f"{name}: cold {cold['cpu_s']} s CPU ({cold['wall_s']} s wall, load {cold['load']}), "
                  f"check {cold['audit_cpu_s']} s CPU + recording ~{round(recording, 3)} s = "
                  f"{cold['share']:.1%}; no-op {cold['noop']['cpu_s']} s CPU", flush=True)
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "events":
        print(json.dumps(events(Path(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", nargs="+", default=["examples", "root"], choices=sorted(MANIFESTS))
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "cutecc"], capture_output=True, text=True,
                                cwd=REPO).stdout.strip())
    res = {"machine": machine(), "commit": commit + (" + uncommitted changes" if dirty else ""),
           "command": "python -m benchmarks.read_set_cost " + " ".join(sys.argv[1:]),
           "results": [measure(m, a.builds) for m in a.manifest]}
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
