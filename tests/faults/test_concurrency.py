"""Many processes on one cache at once: every key built once, no entry ever half-visible.

Two rounds. The high-rate one drives the store's publish protocol directly (store_worker.py:
fake libraries, real metadata) with many processes, while others list, verify, sweep, gc and
load. The real one runs `cutecc build` processes on overlapping manifests of a small kernel
(each compiles through the DSL in its own worker) beside list/verify/gc/load processes, and
counts compilations from the build reports and stats.json.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import PY

from cutecc.commands.verify import verify
from cutecc.store import Store

from .conftest import Swarm, fake_entries, max_overlap, soak, write_toy_project


def _problems(results: list[dict]) -> list[str]:
    return [f"{r['role']}[{r['pid']}]: {p}" for r in results for p in r["problems"]]


def test_publish_protocol_builds_each_key_once_under_many_processes(tmp_path: Path, tally) -> None:
    keys = soak(24, 96)
    entries = fake_entries(keys, tag="once")
    root = tmp_path / "cache"
    swarm = Swarm.create(tmp_path / "swarm", root, entries)
    publishers = soak(16, 48)
    swarm.start("publish", publishers)
    swarm.start("read", 2)
    swarm.start("load", 1)
    swarm.start("sweep", 1)
    swarm.go()  # once every process has imported what it needs
    swarm.wait("publish")
    swarm.stop()
    results = swarm.results()

    assert _problems(results) == []
    builds = Counter(key for kind, key in swarm.log() if kind == "B")
    assert builds == Counter({e["key"]: 1 for e in entries})  # each compiled exactly once
    assert sum(r.get("built", 0) for r in results) == keys  # and reported built by one process
    report = verify(root)
    assert report.ok and report.entries == keys == report.healthy
    assert list(Store(root).tmp_dir.iterdir()) == []
    observed = sum(r.get("observations", 0) for r in results)
    overlap = max_overlap(results)
    assert overlap >= min(8, len(results) - 2), overlap  # they really ran at once
    tally.add("concurrency", store_rounds=1, store_processes=len(results), publishes_attempted=
              publishers * keys, keys_built=keys, entries_observed_whole=observed,
              half_visible=0, built_twice=0)
    tally.peak("concurrency", "max_concurrent_processes", overlap)


def test_publish_remove_and_gc_never_expose_a_partial_entry(tmp_path: Path, tally) -> None:
    keys = soak(12, 48)
    entries = fake_entries(keys, tag="churn")
    root = tmp_path / "cache"
    swarm = Swarm.create(tmp_path / "swarm", root, entries, passes=soak(3, 10), removers=True)
    swarm.start("publish", soak(8, 24))
    swarm.start("remove", 2)
    swarm.start("read", 2)
    swarm.start("load", 1)
    swarm.start("sweep", 1)
    swarm.go()
    swarm.wait("publish")
    swarm.stop()
    results = swarm.results()

    assert _problems(results) == []
    log = swarm.log()
    builds = Counter(k for kind, k in log if kind == "B")
    removals = Counter(k for kind, k in log if kind == "R")
    store = Store(root)
    # Between two removals of a key it is built at most once: builds - removals is exactly
    # whether the entry is there now.
    for e in entries:
        assert builds[e["key"]] - removals[e["key"]] == int(store.has(e["key"])), e["key"]
    assert sum(removals.values()) > 0 and sum(builds.values()) > keys  # there was churn
    assert verify(root).ok
    tally.add("concurrency", churn_rounds=1, churn_processes=len(results),
              churn_builds=sum(builds.values()), churn_removals=sum(removals.values()),
              entries_observed_whole=sum(r.get("observations", 0) for r in results))
    tally.peak("concurrency", "max_concurrent_processes", max_overlap(results))


OBSERVER = r'''
import json, sys, time
from pathlib import Path
root, stop, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
manifest = sys.argv[4] if len(sys.argv) > 4 else None  # the project whose kernels it loads
problems, counts = [], {"list": 0, "verify": 0, "gc": 0, "load": 0, "registered": 0}
from cutecc.commands.list import list_entries
from cutecc.commands.verify import verify
from cutecc.commands.gc import gc
from cutecc.errors import CuteccError
import cutecc
registered = set()
while not stop.exists():
    if not (root / "format").is_file():
        time.sleep(0.01)
        continue
    counts["list"] += len(list_entries(root))
    r = verify(root)
    problems += [f"verify: {p.kind} {p.path} {p.detail}" for p in r.problems]
    counts["verify"] += 1
    gc(root, older_than="1000d")  # removes nothing recent; sweeps tmp/ leftovers
    counts["gc"] += 1
    try:
        ks = cutecc.load(root, arch="sm_90a", manifest=manifest)
    except CuteccError as e:  # (a manifest not built yet)
        continue
    problems += [f"set aside: {p}" for p in ks.problems]
    counts["load"] += 1
    for b in (ks.scale.builds if "scale" in ks else []):
        if b.key not in registered:
            try:
                b.register("scale")  # verify the bytes, then dlopen them
                registered.add(b.key)
            except CuteccError as e:
                problems.append(f"register {b.key[:12]}: {e}")
counts["registered"] = len(registered)
maps = open("/proc/self/maps").read()
counts["mapped"] = sum(f"cutecc_{k[:40]}" in maps for k in registered)
out.write_text(json.dumps({"problems": problems, "counts": counts}))
'''


@pytest.mark.usefixtures("dsl")
def test_concurrent_real_builds_compile_each_variant_once(tmp_path: Path, tally) -> None:
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    proj = tmp_path / "proj"
    a = write_toy_project(proj, threads=(32, 64, 128), name="a.toml")
    b = write_toy_project(proj, threads=(64, 128, 256), name="b.toml")
    cache = tmp_path / "cache"
    n = soak(12, 24)
    stop = tmp_path / "stop"
    # each observer loads one project's kernels: both build `scale`, with other keys, so a
    # load that names neither is an error (cutecc.runtime.project)
    observers = [subprocess.Popen([PY, "-c", OBSERVER, str(cache), str(stop), str(tmp_path / f"obs{i}"),
                                   str(m)], stderr=subprocess.PIPE, text=True) for i, m in enumerate((a, b))]
    builders = [subprocess.Popen([PY, "-m", "cutecc.cli", "build", str(a if i % 2 else b),
                                  "--cache-dir", str(cache), "-j", "1", "--json", "--no-lock"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(n)]
    started, ended = time.time(), {}
    while len(ended) < n and time.time() - started < 600:  # note when each one exits
        for i, p in enumerate(builders):
            if i not in ended and p.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.01)
    reports = []
    for p in builders:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    overlap = max_overlap([{"start": started, "end": t} for t in ended.values()])
    time.sleep(0.5)  # one more observer pass over the finished cache
    stop.write_text("")
    seen = []
    for i, p in enumerate(observers):
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 0, err
        seen.append(json.loads((tmp_path / f"obs{i}").read_text()))

    built = Counter(e["key"] for r in reports for e in r["entries"] if e["status"] == "built")
    planned = {e["key"] for r in reports for e in r["entries"]}
    assert len(planned) == 4  # threads 32, 64, 128, 256
    assert built == Counter(dict.fromkeys(planned, 1))  # every variant compiled exactly once
    assert all(e["status"] in ("built", "cached") for r in reports for e in r["entries"])
    stats = json.loads((cache / "stats.json").read_text())
    assert stats["misses"] == 4 and stats["failures"] == 0
    assert stats["hits"] == sum(len(r["entries"]) for r in reports) - 4
    assert [p for s in seen for p in s["problems"]] == []
    report = verify(cache)
    assert report.ok and report.entries == 4 and report.problems == []
    registered = sum(s["counts"]["registered"] for s in seen)
    assert all(s["counts"]["mapped"] == s["counts"]["registered"] for s in seen)
    tally.add("concurrency", real_rounds=1, real_build_processes=n, real_observer_processes=2,
              real_variants=4, real_compilations=sum(built.values()),
              real_registrations=registered)
    tally.peak("concurrency", "real_max_concurrent_builds", overlap)


def test_a_toolchain_changed_under_a_running_build_publishes_nothing(tmp_path: Path, tally) -> None:
    """The key holds the toolchain's versions as planned; a worker that finds another
    toolchain (a package upgraded, the link recipe edited meanwhile) must not publish an
    artifact its key does not describe."""
    import dataclasses

    from cutecc.build.workers import BuildJob, build_one
    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan

    manifest = load_manifest(write_toy_project(tmp_path / "proj", threads=(64,)))
    [p] = plan(manifest)
    job = BuildJob.of(p, manifest)
    planned = dict(job.key_inputs["toolchain"], link_recipe="0-as-planned")
    job = dataclasses.replace(job, key_inputs=dict(job.key_inputs, toolchain=planned))
    store = Store(tmp_path / "cache")
    store.ensure()
    r = build_one(job, str(store.root))
    status, error = r.status, r.error
    assert status == "failed" and "the toolchain changed after the build was planned " \
        "(link_recipe); run the build again" in error
    assert not store.has(p.key) and list(store.tmp_dir.iterdir()) == []
    tally.add("concurrency", toolchain_changed_mid_build_refused=1)
