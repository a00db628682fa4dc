"""The compile service: workers forked from one process that has imported the DSL build
the same keys and bytes as spawned ones; the build says which kind ran and where its time
went; a service that cannot fork safely, or that dies, leaves the build to spawned
workers; a forked worker's death is reported with its exit status, as a spawned one's."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, write_toy_project

from cutecc.build.executors import preload, service
from cutecc.build.executors.preload import Preload
from cutecc.errors import CuteccError
from cutecc.store import Store


def _build(manifest: Path, cache: Path, workers: str, *extra: str) -> dict[str, Any]:
    import subprocess

    r = subprocess.run([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", str(cache),
                        "--no-lock", "--json", *extra], capture_output=True, text=True,
                       env={**os.environ, "CUTECC_WORKERS": workers, "CUTECC_SERVICE_IDLE": "0"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _digests(cache: Path) -> dict[str, str]:
    return {e.key: hashlib.sha256((e.path / e.doc["library"]).read_bytes()).hexdigest()
            for e in Store(cache).entries()}


@pytest.mark.usefixtures("dsl")
def test_a_forked_worker_builds_the_same_keys_and_bytes_as_a_spawned_one(tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "p", threads=(64, 96, 128))
    forked = _build(manifest, tmp_path / "fork", "fork", "-j", "2")
    spawned = _build(manifest, tmp_path / "spawn", "spawn", "-j", "2")
    assert {e["worker"] for e in forked["entries"]} == {"fork"}, forked["entries"]
    assert {e["worker"] for e in spawned["entries"]} == {"spawn ($CUTECC_WORKERS)"}
    assert forked["workers"] == "fork"
    a, b = _digests(tmp_path / "fork"), _digests(tmp_path / "spawn")
    assert len(a) == 3 and a == b  # same keys, and each library's SHA-256 the same


@pytest.mark.usefixtures("dsl")
def test_an_installed_librarys_kernels_built_by_forked_workers_match_spawned_ones_and_the_lock(
        tmp_path: Path) -> None:
    """quack's module is imported by the compile service before it forks (an installed
    library: `preload.Preload`), with the device answers a compile gives: the libraries
    are the spawned workers' bytes, and the committed lock's where its keys are ours."""
    pytest.importorskip("quack", reason="needs the examples extra (quack-kernels, torch)")
    from helpers import REPO

    manifest = REPO / "examples" / "kernels.toml"
    args = ("--kernel", "quack_rmsnorm", "-j", "2")
    forked = _build(manifest, tmp_path / "fork", "fork", *args)
    _build(manifest, tmp_path / "spawn", "spawn", *args)
    a, b = _digests(tmp_path / "fork"), _digests(tmp_path / "spawn")
    assert forked["workers"] == "fork" and forked["built"] == len(a) == 4  # with its backward
    assert a == b
    lock = json.loads((REPO / "examples" / "kernels.lock").read_text())
    locked = {e["key"]: e["sha256"] for e in lock["entries"]}
    assert all(locked[k] == h for k, h in a.items() if k in locked)


@pytest.mark.usefixtures("dsl")
def test_a_build_says_where_its_time_went(tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "p", threads=(64,))
    rep = _build(manifest, tmp_path / "c", "fork", "-j", "1")
    assert {"parse", "plan", "probe", "compile", "publish", "lock"} <= set(rep["timings"])
    assert rep["timings"]["compile"] > 0
    [e] = rep["entries"]
    assert set(e["timings"]) == {"startup", "compile", "link", "audit", "audit_cpu", "publish"}, e
    assert e["timings"]["compile"] > 0 and e["timings"]["link"] > 0
    assert 0 < e["timings"]["audit_cpu"] <= e["timings"]["audit"] + 0.01  # (CPU of the check's thread)
    wall = {k: v for k, v in e["timings"].items() if k != "audit_cpu"}
    assert sum(wall.values()) <= rep["timings"]["compile"] + 0.05
    again = _build(manifest, tmp_path / "c", "fork", "-j", "1")  # a no-op compiles nothing
    assert again["cached"] == 1 and again["workers"] is None and again["entries"][0]["timings"] == {}


def test_the_worker_mode_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_WORKERS", raising=False)
    assert service.mode() == ("fork", "default")
    monkeypatch.setenv("CUTECC_WORKERS", "spawn")
    assert service.mode()[0] == "spawn"
    monkeypatch.setenv("CUTECC_WORKERS", "vfork")
    with pytest.raises(CuteccError, match="vfork.*not a worker mode"):
        service.mode()


def test_a_worker_imports_the_dsl_torch_and_installed_libraries_not_the_projects_modules(
        tmp_path: Path) -> None:
    """What the compile service (and a spawned worker) imports before the first compile: a
    project module that hangs or starts processes at import must stay one entry's failure."""
    from types import SimpleNamespace

    (tmp_path / "proj" / "mine").mkdir(parents=True)
    (tmp_path / "proj" / "solo.py").write_text("")

    def job(entry: str, device: Any = None, dists: Any = None) -> Any:
        return SimpleNamespace(entry=entry, python_path=(str(tmp_path / "proj"),), device=device,
                               key_inputs={"distributions": dists or {}})

    plain = preload.preloads([job("mine.k:launch"), job("solo:f")])
    assert plain.modules[:2] == ("cutlass", "cutlass.cute") and "torch" not in plain.modules
    assert plain.entries == ()
    lib = preload.preloads([job("quack.rmsnorm:rmsnorm_fwd", {"major": 9}, {"torch": "2"}),
                            job("quack.rmsnorm:rmsnorm_fwd", {"major": 9}), job("mine.k:launch")])
    assert "torch" in lib.modules and lib.entries == ("quack.rmsnorm",) and lib.device == {"major": 9}


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _own(tmp_path: Path, text: str = "VALUE = 1\n",
         final: Preload | None = None) -> tuple[service.Service, Any]:
    """This build's own service (idle 0) that imported a module of `text` (and `final`)."""
    (tmp_path / "lib").mkdir(exist_ok=True)
    (tmp_path / "lib" / "own_a.py").write_text(text)
    svc = service.Service("sm_90a", {}, None, Preload((), ("own_a",), (str(tmp_path / "lib"),)), 0)
    return svc, svc.ready(60, final=final)


def test_a_forked_worker_is_the_services_child_and_its_death_is_told(tmp_path: Path) -> None:
    svc, why = _own(tmp_path)
    try:
        assert why is None and svc.proc is not None and _parent(svc.proc.pid) == os.getpid()
        w = svc.fork("tok1")
        assert w.conn.recv() == "ready"
        assert w.is_alive() and _parent(w.pid) == svc.proc.pid
        os.kill(w.pid, signal.SIGSEGV)
        w.join(10)
        assert not w.is_alive() and w.exitcode == -signal.SIGSEGV
        other = svc.fork("tok2")  # the service forks on after a worker died
        assert other.conn.recv() == "ready"
        other.conn.send(None)  # its job loop ends
        other.join(10)
        assert other.exitcode == 0
    finally:
        svc.close()
    assert svc.proc.poll() is not None  # this build's own: gone with its session


def test_a_worker_told_to_stop_is_joined_when_its_exit_is_told_not_at_the_deadline(
        tmp_path: Path) -> None:
    """Every build ends by telling its workers to stop and joining them; the join waited
    for its whole timeout (5 s at the end of every build) even after the service had told
    the worker's exit status, which was recorded and then waited past."""
    import time

    svc, why = _own(tmp_path)
    try:
        assert why is None
        w = svc.fork("tok")
        assert w.conn.recv() == "ready"
        w.conn.send(None)  # its job loop ends; the service reaps it within 0.2 s
        t0 = time.monotonic()
        w.join(60)
        waited = time.monotonic() - t0
        assert w.exitcode == 0
        assert waited < 30, f"join waited {waited:.1f} s of its 60 for a told exit"
    finally:
        svc.close()


def test_the_builds_own_service_imports_what_planning_named_on_top_of_its_guess(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    said = str(tmp_path / "imported")
    (lib / "own_b.py").write_text(f"import os\nopen({said!r}, 'w').write(str(os.getpid()))\n")
    final = Preload((), ("own_a", "own_b"), (str(lib),))
    svc, why = _own(tmp_path, final=final)
    try:
        assert why is None and svc.proc is not None
        assert (tmp_path / "imported").read_text() == str(svc.proc.pid)  # the service imported it
    finally:
        svc.close()


def test_a_service_that_runs_threads_refuses_to_fork(tmp_path: Path) -> None:
    svc, why = _own(tmp_path, "import threading, time\n"
                    "threading.Thread(target=time.sleep, args=(60,)).start()\n")
    svc.close()
    assert why is not None and "not safe" in why and "2 threads" in why
    assert svc.proc is not None and svc.proc.poll() is not None


def test_a_dead_service_is_told_not_waited_for(tmp_path: Path) -> None:
    svc, why = _own(tmp_path)
    try:
        assert why is None and svc.proc is not None
        svc.proc.kill()
        svc.proc.wait(5)
        with pytest.raises(service.ServiceGone):
            svc.fork("tok")
    finally:
        svc.close()


def test_the_guess_before_planning_is_what_planning_gives_a_project_kernel(tmp_path: Path) -> None:
    """A cold build starts the compile service before it plans (`local.prestart`), from a
    guess of the first pool's imports; for a project's own kernel the guess is the plan's."""
    from cutecc.build.workers import BuildJob
    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan

    manifest = load_manifest(write_toy_project(tmp_path / "p", threads=(64, 96)))
    guessed = preload.guess(manifest)
    assert guessed is not None
    arch, env, modules = guessed
    jobs = [BuildJob.of(p, manifest) for p in plan(manifest)]
    final = preload.preloads(jobs)
    assert arch == jobs[0].arch and env == dict(jobs[0].env)
    assert preload.covers(final, modules) and modules.entries == () and modules.device is None
    # a guess that imported what the pool would not, or other device answers, is not adopted
    path = modules.python_path
    assert not preload.covers(final, Preload(modules.modules, ("quack.rmsnorm",), path))
    assert not preload.covers(final, Preload(modules.modules, (), path, {"major": 9}))


def test_a_prestarted_service_no_pool_adopts_is_stopped(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.build.executors import local
    from cutecc.manifest import load_manifest

    monkeypatch.delenv("CUTECC_WORKERS", raising=False)
    monkeypatch.setenv("CUTECC_SERVICE_IDLE", "0")  # the build's own service (a resident one stays)
    manifest = load_manifest(write_toy_project(tmp_path / "p", threads=(64,)))
    assert local.prestart(manifest)
    (svc,) = [x[-1] for x in local._PRESTARTED]
    assert not local.prestart(manifest)  # one at a time
    local.discard_prestarted()
    assert local._PRESTARTED == [] and svc.proc.poll() is not None
