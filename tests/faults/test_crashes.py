"""Builds, removals and gc killed with SIGKILL at random points.

After every kill the cache holds only whole entries (`verify` finds nothing wrong but the
killed process's leftovers in tmp/); the next build completes; and a later run removes
every leftover. Store-level rounds (store_worker.py `crash-*`: publish/remove, gc,
quarantine, stats.json updates, cache creation) hit the short publish and gc windows many
times; real rounds kill `cutecc build` (its process group: the CLI, its compile workers and
the linker) during compile, export, link and publish.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import PY

from cutecc.commands.verify import verify
from cutecc.entry.rules import META, STORE_FORMAT
from cutecc.store import Store

from .conftest import SEED, WORKER, Swarm, assert_clean_failure, cli, fake_entries, soak
from .store_worker import producer

MODES = ("publish", "gc", "quarantine", "stats", "create")


def _leftovers(store: Store) -> dict[str, str]:
    """What killed processes left behind: path -> kind."""
    found = {str(d): "removal_dir" if ".rm-" in d.name else "staging_dir"
             for d in (store.tmp_dir.iterdir() if store.tmp_dir.is_dir() else [])}
    found.update({str(f): "atomic_write_tmp" for f in store.root.glob(".*.tmp")})
    return found


def _only_leftovers(store: Store) -> None:
    """Every published entry is whole: the only problems are unlocked tmp/ leftovers and the
    index records a killed publish or removal left beside them (the next sweep takes both)."""
    report = verify(store.root)
    assert [(p.kind, p.path, p.detail) for p in report.problems
            if p.kind not in ("stale-tmp", "stale-index")] == []
    assert report.entries == report.healthy


def test_kills_during_publish_remove_gc_quarantine_and_stats(tmp_path: Path, tally) -> None:
    rng = random.Random(SEED)
    print(f"CUTECC_FAULT_SEED={SEED}")
    entries = fake_entries(6, tag="crash")
    root = tmp_path / "cache"
    swarm = Swarm.create(tmp_path / "swarm", root, entries, create_in=str(tmp_path / "new"))
    store = Store(root)
    rounds = soak(60, 600)
    kills: Counter = Counter()
    seen: dict[str, str] = {}  # leftover path -> kind (each counted once)
    for i in range(rounds):
        mode = MODES[i % len(MODES)]
        p = subprocess.Popen([PY, str(WORKER), f"crash-{mode}", str(swarm.base / "spec.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate()[1]
        time.sleep(rng.uniform(0.0, 0.04))
        p.send_signal(signal.SIGKILL)
        p.communicate()
        assert p.returncode == -signal.SIGKILL, f"seed {SEED}: the worker ended before the kill"
        kills[mode] += 1
        seen.update(_leftovers(store))
        _only_leftovers(store)
        s = store.read_stats()  # stats.json is never torn: replaced whole or not at all
        assert (root / "stats.json").exists() <= (s.updated_at is not None)
        for new in (tmp_path / "new").iterdir() if (tmp_path / "new").is_dir() else []:
            Store(new).ensure()  # a half-created cache is completed by the next build
            assert (new / "format").read_text() == f"{STORE_FORMAT}\n" and (new / "README").stat().st_size > 0
        if i % 10 == 9:  # the next build completes: every key published, whole
            for e in entries:
                entry, _ = store.publish(e["key"], producer(e, None, 1, 0))
                assert (entry.path / "kernel.so").stat().st_size == entry.doc["files"]["kernel.so"]["size"]
            _only_leftovers(store)

    kinds = Counter(seen.values())
    assert kinds["staging_dir"], (SEED, kinds)  # kills landed inside publishes
    for e in entries:
        store.publish(e["key"], producer(e, None, 1, 0))  # the next build
    assert_clean_failure(cli("gc", "--older-than", "3650d", "--cache-dir", str(root)), 0, "swept")
    r = cli("verify", "--cache-dir", str(root))
    assert r.returncode == 0 and " 0 problem(s)" in r.stdout, r.stdout + r.stderr
    assert list(store.tmp_dir.iterdir()) == [] and list(root.glob(".*.tmp")) == []
    tally.add("crashes", store_kills=sum(kills.values()),
              **{f"store_kills_{m}": n for m, n in kills.items()},
              **{f"leftover_{k}": n for k, n in kinds.items()},
              entries_lost=0, entries_half_visible=0)


def _staged(store: Store) -> list[set[str]]:
    """The file names in each staging directory of tmp/ (one per build under way)."""
    out = []
    try:
        for d in store.tmp_dir.iterdir():
            out.append({f.name for f in d.iterdir()})
    except OSError:  # a directory published or removed while we looked
        pass
    return out


def _phase_of(names: set[str]) -> str:
    """The step a build had reached, from its staging directory's files."""
    if META in names or any(n.startswith(f".{META}.") for n in names):
        return "publish"
    if "kernel.so" in names and "kernel.o" not in names:
        return "publish"  # linked, object removed: hashing and writing meta.json
    if names & {"kernel.so", "kernel.so.map"}:
        return "link"
    if "kernel.o" in names:
        return "export"
    return "compile"


_TRIGGERS = {  # kill as soon as some build shows this in its staging directory
    "export": lambda s: "kernel.o" in s,
    "link": lambda s: bool(s & {"kernel.so", "kernel.so.map"}),
    "publish": lambda s: "kernel.so" in s and "kernel.o" not in s,
}


def _kill_during(p: subprocess.Popen, store: Store, target: str, rng: random.Random) -> None:
    """SIGKILL the build's process group when it reaches `target` (or at a random time)."""
    t0 = time.monotonic()
    delay = rng.uniform(0.05, 1.5) if target == "random" else rng.uniform(0.0, 0.3)
    armed: float | None = None
    while p.poll() is None and time.monotonic() - t0 < 60:
        now = time.monotonic()
        staged = _staged(store)
        if target == "random":
            hit = now - t0 >= delay
        elif target == "compile":  # a random moment after the first compile starts
            if armed is None and staged:
                armed = now
            hit = armed is not None and now - armed >= delay
        else:
            hit = any(_TRIGGERS[target](s) for s in staged)
        if hit:
            break
        time.sleep(0.0005)
    os.killpg(p.pid, signal.SIGKILL)  # the CLI, its workers and any linker, at once
    p.wait()
    _wait_group_gone(p.pid)


def _wait_group_gone(pgid: int, timeout: float = 30) -> None:
    """Wait until no thread of group `pgid` is still running: killed workers die a little
    after the CLI, and their flock()s go only when their last thread has exited (a
    thread-group leader shows as a zombie while its other threads still tear down)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                alive = True
                break
        if not alive:
            return
        time.sleep(0.01)
    raise AssertionError(f"processes of group {pgid} survived SIGKILL")


@pytest.mark.usefixtures("dsl")
def test_killed_real_builds_leave_whole_entries_and_the_next_build_completes(toy8, tmp_path: Path,
                                                                            tally) -> None:
    rng = random.Random(SEED)
    print(f"CUTECC_FAULT_SEED={SEED}")
    toy = toy8.copy(tmp_path)
    store = toy.store
    keys = [e.key for e in store.entries()]
    targets = ("compile", "export", "link", "publish", "random")
    rounds = soak(10, 60)
    phases: Counter = Counter()
    for i in range(rounds):
        for key in rng.sample(keys, 4):  # four misses for this round's build
            store.remove(key, timeout=30)
        p = subprocess.Popen([PY, "-m", "cutecc.cli", "build", str(toy.manifest), "--cache-dir",
                              str(toy.cache), "-j", "2", "--no-lock"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _kill_during(p, store, targets[i % len(targets)], rng)
        staged = _staged(store)
        phases.update(_phase_of(s) for s in staged)
        if not staged:
            phases["startup" if sum(1 for _ in store.entries()) < len(keys) else "finishing"] += 1
        _only_leftovers(store)
    assert "compile" in phases and {"export", "link", "publish"} & set(phases), (SEED, phases)
    r = cli("build", str(toy.manifest), "--cache-dir", str(toy.cache), "-j", "2", "--no-lock")
    assert r.returncode == 0 and "0 failed" in r.stdout, r.stdout + r.stderr
    r = cli("verify", "--cache-dir", str(toy.cache))
    assert r.returncode == 0 and "8 entries, 8 healthy, 0 problem(s)" in r.stdout, r.stdout
    assert list(store.tmp_dir.iterdir()) == []  # the build swept what the kills left
    tally.add("crashes", build_kills=rounds,  # a kill can catch two builds (-j 2) at once
              **{f"killed_build_in_{k}": n for k, n in phases.items()},
              builds_completed_after=1)


@pytest.mark.usefixtures("dsl")
def test_a_later_build_sweeps_leftovers_even_when_everything_is_cached(toy8, tmp_path: Path) -> None:
    """What a kill leaves (a staging directory, a removal in progress, the temporary file of
    an atomic write in the root) goes with the next build, even one that compiles nothing;
    a leftover whose lock is held (a live build) stays."""
    toy = toy8.copy(tmp_path)
    store = toy.store
    key = next(store.entries()).key
    dead = [store.tmp_dir / f"{key}.0123456789ab", store.tmp_dir / f"{'ab' * 32}.rm-0123456789ab"]
    for d in dead:
        d.mkdir(parents=True)
        (d / "kernel.so").write_bytes(b"half a library")
    torn = [toy.cache / ".stats.json.0123456789ab.tmp", toy.cache / ".README.0123456789ab.tmp"]
    for f in torn:
        f.write_bytes(b"{half")
    live = store.tmp_dir / f"{'cd' * 32}.0123456789ab"
    live.mkdir()
    holder = subprocess.Popen([PY, "-c", "import filelock, sys, time\n"
                               "l = filelock.FileLock(sys.argv[1]); l.acquire()\n"
                               "print('held', flush=True); time.sleep(60)\n",
                               str(store.locks_dir / f"{'cd' * 32}.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = cli("build", str(toy.manifest), "--cache-dir", str(toy.cache), "--no-lock")
        assert r.returncode == 0 and "0 built, 8 cached" in r.stdout, r.stdout + r.stderr
        assert [p for p in dead + torn if p.exists()] == [] and live.exists()
    finally:
        holder.kill()
        holder.wait()
