"""No-op `cutecc build` of manifests of published kernels and of the root manifest, this
tree's cutecc against another revision's, in one run on one machine (issue 27).

    python -m benchmarks.noop_installed --before 0d9c562 [--repeats 9] [--json PATH]
    python -m benchmarks.noop_installed                 # this tree only
    python -m benchmarks.noop_installed --only published --seed-cache DIR --json PATH

`examples/kernels.toml` (quack RMSNorm and cross-entropy, FA4's Hopper forward) is keyed
by the installed code its entries reach (quack's and FA4's sources, torch's 14,000 files,
triton, the DSL); the root manifest by the DSL and the toolchain alone. Each version (this
tree; `--before REF`'s `cutecc/` from `git archive`, first on PYTHONPATH) builds each
manifest into a cache of its own, untimed (two versions may key differently), twice (planning
remembers only stamps older than its start, and the working directory, the cache's parent,
was made a moment ago), then the timed no-op builds (`--no-lock`, whole process, wall clock)
alternate between the versions, repeat by repeat; each version's `cutecc/` byte-compiled
first, as an installed package is. Prints one JSON document: the machine
and command, per manifest and version the walls, their median, min and max, `build()`'s own
seconds, what the keys cover (`keyed`), and the load average before and after.
`benchmarks/manifests/published.toml` (21 entries: quack, FA4, FlashInfer's and cuDNN
frontend's CuTe launchers) is keyed by those libraries too. A manifest whose libraries are not
installed is skipped, its reason in `skip_reasons`. `--seed-cache DIR` copies a cache built
before (e.g. by `cutecc build benchmarks/manifests/published.toml --cache-dir DIR`) into each
version's cache first, so the untimed build compiles nothing that DIR has (FA4's compiles take
minutes). `keyed` counts what the keys cover: distributions, their installed files (RECORD
rows, the files a no-op build stats) and the source files of the entries' import closures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, machine, summary, version

MANIFESTS = {"examples": REPO / "examples" / "kernels.toml", "root": REPO / "kernels.toml",
             "published": REPO / "benchmarks" / "manifests" / "published.toml",
             "gemm": REPO / "examples" / "gemm" / "kernels.toml",
             "gpu-faulty": REPO / "tests" / "gpu" / "faulty_kernels" / "kernels.toml",
             "gpu-layout": REPO / "tests" / "gpu" / "layout_kernels" / "kernels.toml",
             "gpu-train": REPO / "tests" / "gpu" / "train_kernels" / "kernels.toml",
             "pathpkg": Path("pathpkg") / "kernels.toml"}  # made under the run's directory (`path_package`)
LIBRARIES = ("torch", "triton", "quack-kernels", "flash-attn-4", "flashinfer-python", "nvidia-cudnn-frontend")
# The top-level packages each manifest's entries import (found, not imported), and the
# distributions that install them: a manifest runs only where all are installed.
NEEDS = {"examples": {"quack": "quack-kernels", "flash_attn": "flash-attn-4"},
         "root": {}, "gemm": {"quack": "quack-kernels"}, "gpu-faulty": {}, "gpu-layout": {},
         "gpu-train": {}, "pathpkg": {},
         "published": {"quack": "quack-kernels", "flash_attn": "flash-attn-4",
                       "flashinfer": "flashinfer-python", "cudnn": "nvidia-cudnn-frontend"}}


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
    # the user's planning memory (cutecc/toolchain/planmemory.py) off: a no-op build plans
    # from its own cache (the memory is read only where the cache does not answer), and the
    # untimed builds write nothing into the user's cache directory
    return {**os.environ, "CUTECC_PLAN_MEMORY": "off",
            "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}


def check(code: Path, cwd: Path) -> None:
    """That a child given `code` imports its cutecc (not an installed or editable one)."""
    r = subprocess.run([sys.executable, "-c", "import cutecc; print(cutecc.__file__)"],
                       capture_output=True, text=True, env=_env(code), cwd=cwd, check=True)
    assert Path(r.stdout.strip()).is_relative_to(code), (code, r.stdout)


# A package that extends its own `__path__` at import with another distribution's directory
# (as the DSL's `cutlass` adds nvidia-cutlass-operators'), holding the root's elementwise
# kernels: planning learns the extended path by importing the package in a child process.
PATH_INIT = """\
import importlib.metadata as _md
from pathlib import Path

try:
    _dist = _md.distribution("bench-hostpkg-ext")
except _md.PackageNotFoundError:
    _dist = None
if _dist is not None:
    _portion = str(_dist.locate_file("hostpkg"))
    if Path(_portion).is_dir() and _portion not in __path__:
        __path__.append(_portion)
"""


def path_package(root: Path) -> Path:
    """`root/pathpkg`: the `__path__`-extending package (`PATH_INIT`) in `base/`, its extension
    distribution in `ext/` with `hostpkg.ext.elementwise` (a copy of `kernels/elementwise.py`),
    and a manifest of its mul, mul_bwd and axpy kernels; returns the manifest."""
    d = root / "pathpkg"
    files = {"base/hostpkg/__init__.py": PATH_INIT,
             "ext/bench_hostpkg_ext-1.0.dist-info/METADATA":
                 "Metadata-Version: 2.1\nName: bench-hostpkg-ext\nVersion: 1.0\n",
             "ext/bench_hostpkg_ext-1.0.dist-info/top_level.txt": "hostpkg\n",
             "ext/bench_hostpkg_ext-1.0.dist-info/RECORD": "",
             "ext/hostpkg/ext/__init__.py": "",
             "ext/hostpkg/ext/elementwise.py": (REPO / "kernels" / "elementwise.py").read_text()}
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    root_manifest = (REPO / "kernels.toml").read_text()
    keep = [part for part in root_manifest.split("\n[kernel.")[1:]
            if part.split("]")[0].split(".")[0] in ("mul", "mul_bwd", "axpy")]
    text = ('format = 1\narchs = ["sm_90a"]\nprofile = "h100"\npython_path = ["base", "ext"]\n\n'
            + "".join("[kernel." + part.replace('"kernels.elementwise:', '"hostpkg.ext.elementwise:') + "\n"
                      for part in keep))
    (d / "kernels.toml").write_text(text)
    return d / "kernels.toml"


def _cpu_children() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(code: Path, manifest: Path, cache: Path) -> tuple[float, dict[str, Any]]:
    """`cutecc build MANIFEST --no-lock` with `code`'s cutecc, in a fresh process started in
    the cache's parent (`-m` puts the working directory first on sys.path): (wall s, report);
    the report's `cpu_s` is the process's CPU time (user + system, its children included)."""
    t0, c0 = time.perf_counter(), _cpu_children()
    r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                        str(cache), "--no-lock", "--json"], capture_output=True, text=True,
                       env=_env(code), cwd=cache.parent)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{manifest} with {code}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return wall, {**json.loads(r.stdout), "cpu_s": _cpu_children() - c0}


def keyed(code: Path, manifest: Path, cache: Path) -> dict[str, int]:
    """What the keys of `manifest`'s entries cover, planned by `code`'s cutecc in a child:
    distributions (union over entries), their installed files (RECORD rows outside
    `__pycache__`) and the entries' closure source files."""
    prog = (
        "import json, sys, importlib.metadata as md\n"
        "from pathlib import Path\n"
        "from cutecc.toolchain.dists import HashCache\n"
        "from cutecc.manifest import load_manifest\n"
        "from cutecc.plan.build_plan import plan\n"
        "from cutecc.store.layout import HASH_CACHE\n"
        "hc = HashCache(Path(sys.argv[2]) / HASH_CACHE)\n"
        "ps = plan(load_manifest(Path(sys.argv[1])), hash_cache=hc)\n"
        "dists = sorted({d for p in ps for d in p.inputs['distributions']})\n"
        "files = 0\n"
        "for d in dists:\n"
        "    rec = md.distribution(d).read_text('RECORD') or ''\n"
        "    files += sum(1 for r in rec.splitlines() if r and '__pycache__' not in r)\n"
        "print(json.dumps({'entries': len(ps), 'distributions': len(dists), 'installed_files': files,\n"
        "                  'closure_sources': len({s for p in ps for s in p.sources})}))\n")
    r = subprocess.run([sys.executable, "-c", prog, str(manifest), str(cache)], capture_output=True,
                       text=True, env=_env(code), cwd=cache.parent, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(versions: dict[str, Path], repeats: int, root: Path, only: list[str] | None = None,
            seed: Path | None = None) -> dict[str, Any]:
    """The no-op builds of every manifest (or those in `only`) whose libraries are installed,
    by every version, interleaved (see the module)."""
    asked = [n for n in MANIFESTS if only is None or n in only]
    reasons = {m: why for m in asked if (why := unavailable(m)) is not None}
    names = [n for n in asked if n not in reasons]
    out: dict[str, Any] = {"load_before": os.getloadavg(), "skipped": sorted(reasons),
                           "skip_reasons": reasons}
    caches = {(m, v): root / f"cache-{m}-{v}" for m in names for v in versions}
    paths = {m: path_package(root) if m == "pathpkg" else MANIFESTS[m] for m in names}
    for code in versions.values():
        check(code, root)
        # byte-compiled as an installed package is (else a host with PYTHONDONTWRITEBYTECODE,
        # as the CPU build machine has, compiles `--before`'s extracted modules every run)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "cutecc")], check=True,
                       capture_output=True)
    for (m, v), cache in caches.items():
        if seed is not None:
            shutil.copytree(seed, cache, symlinks=True)
        _, rep = build(versions[v], paths[m], cache)  # fills the cache: untimed
        assert rep["failed"] == 0, rep
        # and once more, untimed: planning remembers only stamps settled before it began (a
        # cache directory made a moment ago is searched as the working directory)
        build(versions[v], paths[m], cache)
    walls: dict[tuple[str, str], list[float]] = {k: [] for k in caches}
    cpus: dict[tuple[str, str], list[float]] = {k: [] for k in caches}
    inside: dict[tuple[str, str], list[float]] = {k: [] for k in caches}
    entries: dict[tuple[str, str], int] = {}
    for _ in range(repeats):
        for (m, v), cache in caches.items():
            wall, rep = build(versions[v], paths[m], cache)
            assert rep["built"] == 0 and rep["failed"] == 0, rep
            walls[(m, v)].append(wall)
            cpus[(m, v)].append(rep["cpu_s"])
            inside[(m, v)].append(rep["seconds"])
            entries[(m, v)] = rep["cached"]
    out["load_after"] = os.getloadavg()
    out["results"] = {f"{m} {v}": {"walls": walls[(m, v)], "wall": summary(walls[(m, v)]),
                                   "cpus": cpus[(m, v)], "cpu": summary(cpus[(m, v)]),
                                   "build_seconds": summary(inside[(m, v)]),
                                   "entries": entries[(m, v)],
                                   "keyed": keyed(versions[v], paths[m], cache)}
                      for (m, v), cache in caches.items()}
    return out


def unavailable(manifest: str) -> str | None:
    """Why `manifest` cannot be built here (None: it can): the distributions its entries
    import that are not installed (their packages found, not imported)."""
    missing = [dist for top, dist in NEEDS[manifest].items() if importlib.util.find_spec(top) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def examples_available() -> bool:
    """Whether the `examples` extra is installed (found, not imported)."""
    return unavailable("examples") is None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=None, help="a git revision to compare with")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default=None, help=f"comma-separated, of {', '.join(MANIFESTS)}")
    ap.add_argument("--seed-cache", type=Path, default=None,
                    help="a cache to copy into each version's before its untimed build")
    ns = ap.parse_args()
    only = ns.only.split(",") if ns.only else None
    if only and set(only) - set(MANIFESTS):
        ap.error(f"--only: unknown manifest(s) {sorted(set(only) - set(MANIFESTS))}")
    with tempfile.TemporaryDirectory(prefix="bench-noop-installed-") as d:
        root = Path(d)
        versions = {"after": REPO}
        if ns.before:
            versions = {"before": checkout(ns.before, root / "before"), **versions}
        doc = {"machine": {**machine(), "command": " ".join(
                   [Path(sys.executable).name, "-m", "benchmarks.noop_installed", *sys.argv[1:]]),
                   "libraries": {p: version(p) for p in LIBRARIES},
                   "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")},
               "before": ns.before, "repeats": ns.repeats,
               **measure(versions, ns.repeats, root, only, ns.seed_cache)}
    text = json.dumps(doc, indent=1)
    if ns.json:
        ns.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
