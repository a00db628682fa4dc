"""No-op `cutecc build` of a manifest of published kernels and of the root manifest, this
tree's cutecc against another revision's, in one run on one machine (issue 27).

    python -m benchmarks.noop_installed --before 0d9c562 [--repeats 9] [--json PATH]
    python -m benchmarks.noop_installed                 # this tree only

`examples/kernels.toml` (quack RMSNorm and cross-entropy, FA4's Hopper forward) is keyed
by the installed code its entries reach (quack's and FA4's sources, torch's 14,000 files,
triton, the DSL); the root manifest by the DSL and the toolchain alone. Each version (this
tree; `--before REF`'s `cutecc/` from `git archive`, first on PYTHONPATH) builds each
manifest once into a cache of its own, untimed (two versions may key differently), then the
timed no-op builds (`--no-lock`, whole process, wall clock) alternate between the versions,
repeat by repeat. Prints one JSON document: per manifest and version the walls, their
median, min and max, `build()`'s own seconds, and the load average before and after.
Skips examples/ without the `examples` extra (quack-kernels, flash-attn-4).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, summary

MANIFESTS = {"examples": REPO / "examples" / "kernels.toml", "root": REPO / "kernels.toml"}


def checkout(ref: str, into: Path) -> Path:
    """`ref`'s `cutecc/` package, extracted into `into` (no work tree touched)."""
    tar = subprocess.run(["git", "archive", "--format=tar", ref, "cutecc"], cwd=REPO,
                         capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    tar_path = into / "src.tar"
    tar_path.write_bytes(tar)
    with tarfile.open(tar_path) as t:
        t.extractall(into, filter="data")
    tar_path.unlink()
    return into


def _env(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}


def check(code: Path, cwd: Path) -> None:
    """That a child given `code` imports its cutecc (not an installed or editable one)."""
    r = subprocess.run([sys.executable, "-c", "import cutecc; print(cutecc.__file__)"],
                       capture_output=True, text=True, env=_env(code), cwd=cwd, check=True)
    assert Path(r.stdout.strip()).is_relative_to(code), (code, r.stdout)


def build(code: Path, manifest: Path, cache: Path) -> tuple[float, dict[str, Any]]:
    """`cutecc build MANIFEST --no-lock` with `code`'s cutecc, in a fresh process started in
    the cache's parent (`-m` puts the working directory first on sys.path): (wall s, report)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                        str(cache), "--no-lock", "--json"], capture_output=True, text=True,
                       env=_env(code), cwd=cache.parent)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{manifest} with {code}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return wall, json.loads(r.stdout)


def measure(versions: dict[str, Path], repeats: int, root: Path) -> dict[str, Any]:
    """The no-op builds of every manifest by every version, interleaved (see the module)."""
    names = [n for n in MANIFESTS if n != "examples" or examples_available()]
    out: dict[str, Any] = {"load_before": os.getloadavg(), "skipped": sorted(set(MANIFESTS) - set(names))}
    caches = {(m, v): root / f"cache-{m}-{v}" for m in names for v in versions}
    for code in versions.values():
        check(code, root)
    for (m, v), cache in caches.items():
        _, rep = build(versions[v], MANIFESTS[m], cache)  # fills the cache: untimed
        assert rep["failed"] == 0, rep
    walls: dict[tuple[str, str], list[float]] = {k: [] for k in caches}
    inside: dict[tuple[str, str], list[float]] = {k: [] for k in caches}
    entries: dict[tuple[str, str], int] = {}
    for _ in range(repeats):
        for (m, v), cache in caches.items():
            wall, rep = build(versions[v], MANIFESTS[m], cache)
            assert rep["built"] == 0 and rep["failed"] == 0, rep
            walls[(m, v)].append(wall)
            inside[(m, v)].append(rep["seconds"])
            entries[(m, v)] = rep["cached"]
    out["load_after"] = os.getloadavg()
    out["results"] = {f"{m} {v}": {"walls": walls[(m, v)], "wall": summary(walls[(m, v)]),
                                   "build_seconds": summary(inside[(m, v)]),
                                   "entries": entries[(m, v)]}
                      for (m, v) in caches}
    return out


def examples_available() -> bool:
    """Whether the `examples` extra is installed (found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in ("quack", "flash_attn"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=None, help="a git revision to compare with")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-noop-installed-") as d:
        root = Path(d)
        versions = {"after": REPO}
        if ns.before:
            versions = {"before": checkout(ns.before, root / "before"), **versions}
        doc = {"before": ns.before, "repeats": ns.repeats, **measure(versions, ns.repeats, root)}
    text = json.dumps(doc, indent=1)
    if ns.json:
        ns.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
