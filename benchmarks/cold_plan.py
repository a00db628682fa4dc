"""The first, cold planning of a manifest (issue 35): `cutecc build MANIFEST --dry-run` into an
empty cache (nothing remembered: every closure source parsed, every installed file of a
full-digest distribution hashed), whole process, this tree against another revision's, the
versions alternating.

    python -m benchmarks.cold_plan [--manifest published examples] [--before REV]
                                   [--memory off warm remote] [--repeats 3] [--json PATH]

`--memory`: with the user's planning memory (cutecc/toolchain/planmemory.py) `off` (the very
first planning: nothing remembered anywhere; what `--before` runs too), and `warm` (this tree
only): into an empty cache again, with a memory one untimed dry run of the same manifest
filled first (the first planning into a new cache of a user who planned before: a fresh
checkout, another project's cache, CI with the user cache directory kept); `remote` (this
tree only): into an empty cache with the memory off, as CI's second machine, with a remote
cache (`--remote`, a local S3-compatible server started as tests/distributed does) that one
untimed dry run with the memory off and `--remote-write` filled first (issue 45: sources'
parsed facts shared, `cutecc/ship/planshare.py`).

Per run: wall, CPU (the child's user + system), the build's own `plan` seconds, and the load
average before and after (the build host is shared: read the CPU column).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.build_overhead import MANIFESTS, _cpu_children, _load
from benchmarks.common import code_versions, machine, summary


def once(code: Path, manifest: Path, memory: str = "off", cwd: Path | None = None,
         remote: list[str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cutecc-coldplan-") as cache:
        before, c0, t0 = _load(), _cpu_children(), time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", cache,
                            "--dry-run", "--json", *(remote or [])], capture_output=True, text=True,
                           cwd=cwd or cache, env={**os.environ, "CUTECC_PLAN_MEMORY": memory,
                                "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])})
        wall, cpu = time.perf_counter() - t0, _cpu_children() - c0
    if r.returncode != 0:
        raise SystemExit(f"{manifest} with {code}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rep = json.loads(r.stdout)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "plan_s": rep["timings"].get("plan"),
            "planned": rep["planned"], "load_before": before, "load_after": _load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", nargs="+", default=["published", "examples"], choices=sorted(MANIFESTS))
    ap.add_argument("--before", default=None)
    ap.add_argument("--memory", nargs="+", default=["off", "warm"], choices=["off", "warm", "remote"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cutecc-coldplan-code-") as d, \
            _s3(Path(d) / "s3" if "remote" in a.memory else None) as bucket:
        cwd = Path(d) / "cwd"
        cwd.mkdir()
        versions = code_versions(a.before, Path(d))
        time.sleep(max(0.0, 2.5 - (time.time() - cwd.stat().st_ctime)))  # settled: see below
        # (version, memory mode) -> runs; `warm` only for this tree (the other has no memory)
        modes = [(v, mem) for mem in a.memory for v in versions if mem == "off" or v == "after"]
        url = {m: f"s3://{bucket}/{m}" for m in a.manifest}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            m: {_name(v, mem): [] for v, mem in modes} for m in a.manifest}
        # `python -m` puts the working directory first on sys.path, which every import closure
        # depends on: one directory for every run (as the `cutecc` script's, whose first
        # entry is its own directory), so the memory's closures can answer a new cache (made
        # over 2 s before the first run: a closure is remembered only under settled stamps)
        for m in a.manifest:
            memory = Path(d) / f"memory-{m}"
            if "warm" in a.memory:
                once(versions["after"], MANIFESTS[m], str(memory), cwd)  # untimed: fills the memory
            if "remote" in a.memory:  # untimed: the first machine fills the remote
                once(versions["after"], MANIFESTS[m], "off", cwd, ["--remote", url[m], "--remote-write"])
            for _ in range(a.repeats):
                for v, mem in modes:
                    runs[m][_name(v, mem)].append(
                        once(versions[v], MANIFESTS[m], str(memory) if mem == "warm" else "off", cwd,
                             ["--remote", url[m]] if mem == "remote" else None))
                    print(m, v, mem, runs[m][_name(v, mem)][-1], file=sys.stderr)
    doc = {"benchmark": "cold_plan", "machine": machine(), "command": sys.argv, "before": a.before,
           "pythonpath": os.environ.get("PYTHONPATH"),
           "results": {m: {v: {"runs": rs, "cpu": summary([x["cpu_s"] for x in rs]),
                               "wall": summary([x["wall_s"] for x in rs])} for v, rs in per.items()}
                       for m, per in runs.items()}}
    text = json.dumps(doc, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    print(text)


def _name(version: str, memory: str) -> str:
    names = {"off": version, "warm": f"{version}, memory warm"}
    return names.get(memory, f"{version}, memory off, remote warm")


@contextlib.contextmanager
def _s3(directory: Path | None) -> Iterator[str]:
    """A local S3-compatible server, as tests/distributed starts it, with the AWS_* variables
    set for the runs; yields its bucket ("" when `directory` is None: none started)."""
    if directory is None:
        yield ""
        return
    from tests.distributed.conftest import serving

    with serving(directory) as server:
        yield server.bucket


if __name__ == "__main__":
    main()
