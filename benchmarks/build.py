"""Group build: cold builds of kernels.toml (-j 1 and -j nproc) and no-op rebuilds.

Cold: `cutecc build kernels.toml --cache-dir FRESH --no-lock -j J` in a fresh process
(wall time), into a new empty cache each time. No-op: the generated manifests of
benchmarks/noop_rebuild.py with 1,000 and 10,000 variants, their caches seeded from one
compiled entry (`common.plant`; the no-op path reads each key's index record and stats
its meta.json), timed as whole `cutecc build` processes (which write kernels.lock). And
the no-op builds of examples/kernels.toml (published kernels, keyed by the installed code
they reach) and of kernels.toml (`noop_installed.py`, which compares with another revision
on its own).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks import noop_installed, noop_rebuild
from benchmarks.common import REPO, GroupResult, Row, dsl_available, run_child, sample_row, summary

G = "build"
NOOP_TARGET_S = 2.0
NOOP_INSTALLED_TARGET_S = 0.5  # issue 27: examples/ as fast as the root manifest


def cold(jobs: int, root: Path) -> tuple[float, dict]:
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=root))
    wall, rep = run_child(["-m", "cutecc.cli", "build", str(REPO / "kernels.toml"), "--cache-dir",
                           str(cache), "--no-lock", "-j", str(jobs), "--json"],
                          {"CUTE_DSL_CACHE_DIR": str(root / "dsl-cache")})
    assert rep["failed"] == 0 and rep["built"] > 0, rep
    return wall, rep


def noop(variants: int, root: Path, repeats: int) -> tuple[list[float], list[float]]:
    d = root / f"noop-{variants}"
    (d / "bench_kernels").mkdir(parents=True)
    (d / "bench_kernels" / "__init__.py").write_text("")
    (d / "bench_kernels" / "ops.py").write_text(noop_rebuild.KERNEL)
    m = d / "kernels.toml"
    m.write_text(noop_rebuild.manifest(variants))
    noop_rebuild._seed(m, d / "cache")
    noop_rebuild.cutecc(str(m), "--cache-dir", str(d / "cache"))  # writes kernels.lock: not timed
    walls, inside = [], []
    for _ in range(repeats):
        wall, rep = noop_rebuild.cutecc(str(m), "--cache-dir", str(d / "cache"))
        assert rep["built"] == 0 and rep["cached"] == variants, rep
        walls.append(wall)
        inside.append(rep["seconds"])
    return walls, inside


def run(repeats: int, cold_repeats: int) -> GroupResult:
    res = GroupResult()
    if not dsl_available():
        res.skipped = "skipped: building needs the DSL (pip install 'cutecc[build]')"
        return res
    ncpu = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-build-") as d:
        root = Path(d)
        walls: dict[int, list[float]] = {}
        entries = 0
        for jobs in sorted({1, ncpu}):
            walls[jobs] = []
            for _ in range(cold_repeats):
                wall, rep = cold(jobs, root)
                walls[jobs].append(wall)
                entries = rep["built"]
            res.rows.append(sample_row(G, f"cold build kernels.toml ({entries} entries), -j {jobs}",
                                       walls[jobs], note=f"repeats={cold_repeats}"))
        if ncpu > 1:
            sp = summary(walls[1])["median"] / summary(walls[ncpu])["median"]
            res.rows.append(Row(G, f"cold build speed-up, -j {ncpu} vs -j 1", "x", value=sp,
                                note=f"{ncpu} cores"))
        res.data["cold"] = walls
        for n in (1000, 10000):
            w, inside = noop(n, root, repeats)
            res.data[f"noop_{n}"] = {"walls": w, "in_process": inside}
            med = summary(w)["median"]
            note = (f"target < {NOOP_TARGET_S:.0f} s: {'met' if med < NOOP_TARGET_S else 'missed'}"
                    if n == 10000 else "")
            res.rows.append(sample_row(G, f"no-op rebuild, {n} variants, whole process", w, note=note))
            res.rows.append(sample_row(G, f"no-op rebuild, {n} variants, inside build()", inside,
                                       "ms"))
        # published.toml's cold build (FA4, minutes) is left to `python -m benchmarks.noop_installed`
        got = noop_installed.measure({"this-tree": REPO}, repeats, root, only=["examples", "root"])
        res.data["noop_installed"] = got
        for name, r in got["results"].items():
            res.rows.append(sample_row(G, f"no-op build, {name.split()[0]} manifest ({r['entries']} "
                                       "entries), whole process", r["walls"],
                                       note=f"target < {NOOP_INSTALLED_TARGET_S} s"))
        for name in got["skipped"]:
            res.rows.append(Row(G, f"no-op build, {name} manifest", "s", value=None,
                                note=f"skipped: {got['skip_reasons'][name]}"))
    return res
