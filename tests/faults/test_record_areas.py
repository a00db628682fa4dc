"""Every record area of the cache (stats.json, index records, composites, build records) is
opened as meta.json is: a regular file, no link followed, owned by this user or root and
written by no one else, bounded in size and nesting. One bad file is set aside with a named
problem; it never hangs, grows without bound or takes down a command or a kernel set.

Before the fix: a FIFO at stats.json hung `cutecc stats` and every build's counter update
(the subprocesses below timed out); stats.json linked to /dev/zero read without end; verify
called both caches healthy. A FIFO, link or directory in composites/ made `len`, iteration,
`repr`, `problems` and `register_all` of every kernel set raise Untrusted. A 1,100-deep index
record ended `verify` and `verify --fix` in a RecursionError traceback, and a 300 MB one was
read whole (300 MB allocated at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cutecc

from .conftest import cli
from .fake_store import add, new_store

PY = sys.executable
TIMEOUT = 60
# Python allocations at their peak (tracemalloc: RSS would count a large test process's pages
# the child inherited across fork): a 300 MB record read whole shows as 300 MB.
MAX_PEAK = 32 << 20


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    store, rt = new_store(tmp_path / "cache")
    add(store, rt, "k", "a")
    add(store, rt, "k", "b")
    store.add_stats(hits=2)
    return store.root


def _problems(root: Path, *extra: str) -> tuple[int, list[dict]]:
    r = cli("verify", "--json", "--cache-dir", str(root), *extra, timeout=TIMEOUT)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)["problems"]


# stats.json ---------------------------------------------------------------------------------


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "directory", "deep", "huge"])
def test_a_bad_stats_file_hangs_nothing_and_verify_names_it(cache: Path, plant: str) -> None:
    stats = cache / "stats.json"
    stats.unlink()
    if plant == "fifo":
        os.mkfifo(stats)
    elif plant == "dev-zero":
        stats.symlink_to("/dev/zero")
    elif plant == "directory":
        stats.mkdir()
    elif plant == "deep":
        stats.write_text("[" * 1100 + "]" * 1100)
    else:
        with open(stats, "wb") as f:
            f.truncate(300 << 20)
    r = cli("stats", "--json", "--cache-dir", str(cache), timeout=TIMEOUT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout)["entries"] == 2
    # What every build does after its work (a no-op build too): count, under the stats lock.
    count = ("import sys, tracemalloc; from cutecc.store.writer import Store; tracemalloc.start(); "
             "Store(sys.argv[1]).add_stats(hits=1); print(tracemalloc.get_traced_memory()[1])")
    r2 = subprocess.run([PY, "-c", count, str(cache)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert int(r2.stdout.split()[-1]) < MAX_PEAK, "read the bad stats.json whole"
    code, problems = _problems(cache)
    named = [p for p in problems if p["path"] == str(stats)]
    if plant in ("fifo", "dev-zero", "directory"):  # a build does not write over what is not a file
        assert code == 1 and named, problems
        assert named[0]["kind"] == "orphan" and "regular file" in named[0]["detail"], named
        code, problems = _problems(cache, "--fix")
        assert code == 0 and not os.path.lexists(stats), problems
    else:  # the counter update replaced the damaged file with a sound one
        assert code == 0 and not named, problems
        assert json.loads(stats.read_text())["hits"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
def test_a_no_op_build_over_a_bad_stats_file_finishes(toy_cache, tmp_path: Path, plant: str) -> None:
    """The real build (its counter update after the work) on a cache whose stats.json is a
    FIFO or a link to /dev/zero: every key served from the cache, nothing waits or grows."""
    toy = toy_cache.copy(tmp_path)
    stats = toy.cache / "stats.json"
    stats.unlink(missing_ok=True)
    os.mkfifo(stats) if plant == "fifo" else stats.symlink_to("/dev/zero")
    r = cli("build", str(toy.manifest), "--cache-dir", str(toy.cache), "--json", timeout=TIMEOUT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout)["cached"] == 2, r.stdout[-2000:]
    assert os.path.islink(stats) or not stats.is_file()  # left as it was, for verify to name


# composites/ --------------------------------------------------------------------------------


LOAD = r'''
import json, sys, cutecc
ks = cutecc.load(sys.argv[1], arch="sm_90a")
out = {"len": len(ks), "names": list(ks), "repr": repr(ks), "problems": ks.problems}
print(json.dumps(out))
'''


def test_one_bad_file_in_composites_never_takes_down_the_kernel_set(cache: Path, tmp_path: Path) -> None:
    comp = cache / "composites"
    comp.mkdir()
    os.mkfifo(comp / "piped.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"format": 1, "launches": ["k"], "inputs": [],
                                                         "outputs": []}))
    (comp / "linked.json").symlink_to(tmp_path / "elsewhere.json")
    (comp / "folder.json").mkdir()
    r = subprocess.run([PY, "-c", LOAD, str(cache)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["names"] == ["k"] and got["len"] == 1 and "'k'" in got["repr"], got
    said = "\n".join(got["problems"])
    for name in ("piped.json", "linked.json", "folder.json"):
        assert name in said, said
    ks = cutecc.load(cache, arch="sm_90a")
    assert list(ks) == ["k"] and "piped" not in ks and ks.get("linked") is None
    code, problems = _problems(cache)
    assert {Path(p["path"]).name for p in problems} >= {"piped.json", "linked.json", "folder.json"}


# Index records ------------------------------------------------------------------------------


def _record(cache: Path) -> Path:
    (rec,) = [p for p in (cache / "by-kernel" / "k").iterdir()][:1]
    return rec


def test_a_deeply_nested_index_record_is_a_problem_not_a_traceback(cache: Path) -> None:
    rec = _record(cache)
    rec.write_text("[" * 1100 + "]" * 1100)  # 2.2 KB
    code, problems = _problems(cache)
    assert code == 1 and [p["kind"] for p in problems if p["path"] == str(rec)] == ["stale-index"]
    code, problems = _problems(cache, "--fix")
    assert code == 0, problems
    assert _problems(cache) == (0, [])
    assert json.loads(rec.read_text())["key"] == rec.name


def test_a_huge_index_record_is_not_read_whole(cache: Path) -> None:
    rec = _record(cache)
    with open(rec, "r+b") as f:
        f.truncate(300 << 20)  # sparse: 300 MB to read, nothing on disk
    probe = ("import json, sys, tracemalloc; from cutecc.commands.verify import verify; "
             "tracemalloc.start(); r = verify(sys.argv[1]); peak = tracemalloc.get_traced_memory()[1]; "
             "print(json.dumps([[p.kind, p.path] for p in r.problems])); print(peak)")
    r = subprocess.run([PY, "-c", probe, str(cache)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert ["stale-index", str(rec)] in json.loads(lines[-2])
    assert int(lines[-1]) < MAX_PEAK, f"{int(lines[-1]) >> 20} MB allocated at once: read whole"


# Tuning results ------------------------------------------------------------------------------


def test_a_fifo_or_directory_among_tuning_results_is_named_and_removed(cache: Path) -> None:
    """(Before: `verify --fix` stopped at the directory with "cannot remove: Is a directory".)"""
    results = cache / "tuning" / "results"
    results.mkdir(parents=True)
    keys = sorted(p.name for p in (cache / "by-kernel" / "k").iterdir())
    (results / f"{keys[0]}.json").mkdir()
    os.mkfifo(results / f"{keys[1]}.json")
    code, problems = _problems(cache)
    assert code == 1 and sorted(p["kind"] for p in problems) == ["bad-tuning", "bad-tuning"], problems
    assert all("regular file" in p["detail"] for p in problems), problems
    code, problems = _problems(cache, "--fix")
    assert code == 0 and not any(results.iterdir()), problems
