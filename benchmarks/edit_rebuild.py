"""The edit-and-rebuild loop (issue 35): one kernel source edited, `cutecc build` again, with
the compile service kept between builds (resident, cutecc/build/executors/service_process.py) and
with one per build (`CUTECC_SERVICE_IDLE=0`), alternating.

    python -m benchmarks.edit_rebuild [--repeats 5] [--json PATH]

A copy of the root project (`kernels.toml` and its `kernels/` package) is built once per
kind into a cache of its own, untimed (the resident kind's first build leaves its service).
Each repeat then appends a comment to `kernels/rmsnorm.py` (its entries' keys change, the
other kernels' do not) and times `cutecc build --no-lock --json` of each kind into its cache:
wall, CPU (the build and its waited-for children, plus the resident service's CPU with its
reaped workers', from /proc: they are its children, not the build's), the entries compiled,
the build's `timings`, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.build_overhead import _load, _resident_cpu, _stop_residents, _timed
from benchmarks.common import REPO, machine, summary

KINDS = ("resident", "per-build")


def _env(kind: str, run: Path) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"CUTECC_SERVICE_IDLE": "900" if kind == "resident" else "0", "XDG_RUNTIME_DIR": str(run),
            "CUTECC_PLAN_MEMORY": "off", "PYTHONPATH": path}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cutecc-edit-") as d:
        scratch = Path(d)
        run = Path(tempfile.mkdtemp(prefix="eb", dir="/tmp"))  # short: a socket's path is
        run.chmod(0o700)
        try:
            doc = _measure(scratch, run, a.repeats)
        finally:
            _stop_residents(run)
            shutil.rmtree(run, ignore_errors=True)
    text = json.dumps(doc, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    print(text)


def _measure(scratch: Path, run: Path, repeats: int) -> dict[str, Any]:
    project = scratch / "project"
    project.mkdir()
    shutil.copy(REPO / "kernels.toml", project / "kernels.toml")
    shutil.copytree(REPO / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "cutecc.cli", "build", str(project / "kernels.toml"), "--no-lock", "--json"]
    for kind in KINDS:  # untimed: each kind's cache, and the resident kind's service
        first = _timed([*cmd, "--cache-dir", str(scratch / kind)], _env(kind, run), project)
        if first["returncode"] != 0:
            raise SystemExit(f"the first build ({kind}) failed: {first.get('stderr')}")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    edited = project / "kernels" / "rmsnorm.py"
    for i in range(repeats):
        for kind in KINDS:
            with edited.open("a") as f:
                f.write(f"# edit {kind} {i}\n")
            r = _timed([*cmd, "--cache-dir", str(scratch / kind)], _env(kind, run), project,
                       run if kind == "resident" else None)
            rep = r.pop("report", None) or {}
            r.update({"built": rep.get("built"), "cached": rep.get("cached"), "workers": rep.get("workers"),
                      "timings": rep.get("timings")})
            runs[kind].append(r)
            print(f"{kind} #{i}: {r['wall_s']} s wall, {r['cpu_s']} s CPU, built {r['built']} "
                  f"({r['workers']}; load {r['load_before']} -> {r['load_after']})", file=sys.stderr)
    return {"benchmark": "edit_rebuild", "machine": machine(), "command": sys.argv, "load_end": _load(),
            "resident_cpu_left": _resident_cpu(run),
            "results": {k: {"runs": v, "wall": summary([x["wall_s"] for x in v]),
                            "cpu": summary([x["cpu_s"] for x in v])} for k, v in runs.items()}}


if __name__ == "__main__":
    main()
