"""The resident compile service: kept between builds, one per state, private, never stale,
gone when idle; a build's workers forked there die with that build; a build served by it
gives the bytes a spawned worker gives."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, resident_services, stop_resident_services, write_toy_project

from cutecc.build.executors import service
from cutecc.build.executors.preload import NOTHING, Preload
from cutecc.errors import CuteccError
from cutecc.store import Store, homes


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid and _alive(int(d.name)):
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $XDG_RUNTIME_DIR (short: a socket's path is); every resident service started
    there is killed after."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    monkeypatch.setenv("CUTECC_SERVICE_IDLE", "60")
    yield d
    stop_resident_services(d)
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _module(where: Path, name: str, text: str = "VALUE = 1\n") -> Preload:
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(text)
    return Preload((), (name,), (str(where),))


def _open(modules: Preload, idle: float = 60) -> service.Service:
    svc = service.Service("sm_90a", {}, None, modules, idle)
    assert svc.ready(60) is None
    return svc


def test_a_second_build_is_served_by_the_service_the_first_left(run_dir: Path, tmp_path: Path) -> None:
    modules = _module(tmp_path / "lib", "kept_a")
    first = _open(modules)
    assert first.how == "started"
    w = first.fork("tok1")
    assert w.conn.recv() == "ready"
    w.conn.send(None)  # the worker's job loop ends
    w.join(10)
    assert w.exitcode == 0
    first.close()
    [pid] = resident_services(run_dir)
    second = _open(modules)
    try:
        assert second.how == "kept" and resident_services(run_dir) == [pid]
    finally:
        second.close()
    # another state (other [env]) gets a service of its own
    other = service.Service("sm_90a", {"QUACK_ARCH": "sm_90a"}, None, modules, 60)
    try:
        assert other.ready(60) is None and other.how == "started"
        assert len(resident_services(run_dir)) == 2
        assert len(list(run_dir.glob("cutecc-services-*/*.sock"))) == 2
    finally:
        other.close()


def test_a_build_that_ends_takes_its_forked_workers_with_it(run_dir: Path, tmp_path: Path) -> None:
    svc = _open(_module(tmp_path / "lib", "kept_b"))
    w = svc.fork("tok2")
    assert w.conn.recv() == "ready"
    assert _alive(w.pid) and w.pid in _children(resident_services(run_dir)[0])
    svc.close()  # the build's session is over while its worker still waits for jobs
    assert _wait(lambda: not _alive(w.pid), 5), "a worker outlived its build's session"
    # and a build killed outright: the service sees its connection close
    lib = str(tmp_path / "lib")
    code = ("import sys, time; from cutecc.build.executors import preload, service; "
            f"m = preload.Preload((), ('kept_b',), ({lib!r},)); "
            "s = service.Service('sm_90a', {}, None, m, 60); "
            "assert s.ready(60) is None; w = s.fork('tok3'); assert w.conn.recv() == 'ready'; "
            "print(w.pid, flush=True); time.sleep(60)")
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert p.stdout is not None
        worker = int(p.stdout.readline())
        assert _alive(worker)
        p.kill()
        p.wait(10)
        assert _wait(lambda: not _alive(worker), 5), "a worker outlived its killed build"
    finally:
        if p.poll() is None:
            p.kill()


def test_a_service_whose_imports_changed_retires_and_a_fresh_one_serves(run_dir: Path,
                                                                        tmp_path: Path) -> None:
    modules = _module(tmp_path / "lib", "kept_c")
    _open(modules).close()
    [old] = resident_services(run_dir)
    time.sleep(0.01)
    (tmp_path / "lib" / "kept_c.py").write_text("VALUE = 2\n")  # edited after the service imported it
    again = service.Service("sm_90a", {}, None, modules, 60)
    assert again.how == "started"  # the old one said it retired and is gone
    try:
        assert again.ready(60) is None
        assert _wait(lambda: old not in resident_services(run_dir), 5)
        assert len(resident_services(run_dir)) == 1
    finally:
        again.close()


def test_an_idle_service_exits_and_removes_its_socket(run_dir: Path, tmp_path: Path) -> None:
    _open(_module(tmp_path / "lib", "kept_d"), idle=0.5).close()
    assert _wait(lambda: not resident_services(run_dir), 10)
    assert not list(run_dir.glob("cutecc-services-*/*.sock"))


def test_no_service_is_kept_where_its_socket_would_not_be_private(run_dir: Path) -> None:
    d = homes.services()
    assert d.parent == run_dir
    d.mkdir(mode=0o700)
    d.chmod(0o755)
    assert service.socket_dir() is None
    with pytest.raises(service.ServiceGone, match="private"):
        service.Service("sm_90a", {}, None, NOTHING, 60)
    d.chmod(0o700)
    assert service.socket_dir() == d


def test_the_idle_time_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_SERVICE_IDLE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert service.idle_seconds() == service.IDLE_SECONDS
    monkeypatch.setenv("CI", "true")  # a CI job: one build on a fresh machine, nothing kept
    assert service.idle_seconds() == 0
    monkeypatch.setenv("CUTECC_SERVICE_IDLE", "90")
    assert service.idle_seconds() == 90  # unless asked
    for off in ("0", "off", "no"):
        monkeypatch.setenv("CUTECC_SERVICE_IDLE", off)
        assert service.idle_seconds() == 0
    monkeypatch.setenv("CUTECC_SERVICE_IDLE", "90")
    assert service.idle_seconds() == 90
    for bad in ("soon", "-1", "1e9", "nan"):
        monkeypatch.setenv("CUTECC_SERVICE_IDLE", bad)
        with pytest.raises(CuteccError, match=r"\$CUTECC_SERVICE_IDLE"):
            service.idle_seconds()


def test_the_state_key_covers_the_environment_and_the_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    base = service.state_key("sm_90a", {}, None, NOTHING)
    assert base == service.state_key("sm_90a", {}, None, NOTHING)
    monkeypatch.setenv("CUTE_DSL_SOMETHING", "1")
    assert service.state_key("sm_90a", {}, None, NOTHING) != base
    monkeypatch.delenv("CUTE_DSL_SOMETHING")
    for other in (service.state_key("sm_100a", {}, None, NOTHING),
                  service.state_key("sm_90a", {"A": "1"}, None, NOTHING),
                  service.state_key("sm_90a", {}, 1 << 30, NOTHING),
                  service.state_key("sm_90a", {}, None, Preload(("torch",)))):
        assert other != base


def _build(manifest: Path, cache: Path, env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", str(cache),
                        "--no-lock", "--json", "-j", "2"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.usefixtures("dsl")
def test_builds_served_by_a_resident_service_give_a_spawned_workers_keys_and_bytes(
        run_dir: Path, tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "p", threads=(64, 96, 128))
    first = _build(manifest, tmp_path / "c1", {})
    [pid] = resident_services(run_dir)
    second = _build(manifest, tmp_path / "c2", {})
    spawned = _build(manifest, tmp_path / "c3", {"CUTECC_WORKERS": "spawn"})
    assert spawned["workers"].startswith("spawn")
    assert first["workers"] == second["workers"] == "fork (resident)"
    assert {e["worker"] for e in second["entries"]} == {"fork (resident)"}
    assert resident_services(run_dir) == [pid]  # the second build used the first's service

    def digests(cache: Path) -> dict[str, str]:
        return {e.key: hashlib.sha256((e.path / e.doc["library"]).read_bytes()).hexdigest()
                for e in Store(cache).entries()}

    assert len(digests(tmp_path / "c1")) == 3
    assert digests(tmp_path / "c1") == digests(tmp_path / "c2") == digests(tmp_path / "c3")


def test_a_build_connected_when_the_service_goes_stale_gets_no_more_workers_from_it(
        run_dir: Path, tmp_path: Path) -> None:
    modules = _module(tmp_path / "lib", "kept_e")
    svc = _open(modules)
    try:
        first = svc.fork("tok5")
        assert first.conn.recv() == "ready"
        time.sleep(0.01)
        (tmp_path / "lib" / "kept_e.py").write_text("VALUE = 3\n")
        with pytest.raises(service.ServiceGone, match="retired.*kept_e.py"):
            svc.fork("tok6")  # this build spawns the rest; the next one starts a fresh service
    finally:
        svc.close()
    fresh = service.Service("sm_90a", {}, None, modules, 60)
    try:
        assert fresh.how == "started" and fresh.ready(60) is None
    finally:
        fresh.close()


def test_a_service_that_cannot_fork_safely_says_so_and_does_not_stay(run_dir: Path, tmp_path: Path) -> None:
    """An import that leaves a thread running: the service refuses and exits at once (a normal
    exit would wait for that thread), so nothing is left behind."""
    modules = _module(tmp_path / "lib", "kept_f", "import threading, time\n"
                      "threading.Thread(target=time.sleep, args=(120,)).start()\n")
    svc = service.Service("sm_90a", {}, None, modules, 60)
    why = svc.ready(60)
    svc.close()
    assert why is not None and "not safe" in why and "2 threads" in why
    assert _wait(lambda: not resident_services(run_dir), 5)


def test_the_interpreters_own_flags_name_the_state(tmp_path: Path) -> None:
    code = ("from cutecc.build.executors import preload, service; "
            "print(service.state_key('sm_90a', {}, None, preload.NOTHING))")
    plain, optimized = (subprocess.run([PY, *flags, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                                       check=True).stdout for flags in ([], ["-O"]))
    assert plain.strip() and plain != optimized


def _served(modules: Preload, n: int) -> service.Service:
    """A build of state `n` (its [env]) served, its session over."""
    svc = service.Service("sm_90a", {"STATE": str(n)}, None, modules, 60)
    assert svc.ready(60) is None
    svc.close()
    return svc


def test_a_third_service_retires_the_least_recently_used_one(run_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_SERVICE_MAX", raising=False)
    modules = _module(tmp_path / "lib", "kept_g")
    _served(modules, 1)
    [first] = resident_services(run_dir)
    _served(modules, 2)
    [second] = [p for p in resident_services(run_dir) if p != first]
    assert _served(modules, 1).how == "kept"  # the first is now the more recently used
    assert _served(modules, 3).how == "started"
    assert _wait(lambda: len(resident_services(run_dir)) == 2, 10), resident_services(run_dir)
    live = resident_services(run_dir)
    assert first in live and second not in live
    assert len(list(run_dir.glob("cutecc-services-*/*.sock"))) == 2
    monkeypatch.setenv("CUTECC_SERVICE_MAX", "3")  # the setting raises the bound
    _served(modules, 4)
    assert _wait(lambda: len(resident_services(run_dir)) == 3, 10)
    assert _served(modules, 2).how == "started"  # the retired one's state starts afresh
    assert _wait(lambda: len(resident_services(run_dir)) == 3, 10)


def test_the_number_of_services_kept_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_SERVICE_MAX", raising=False)
    assert service.most_services() == service.MOST_SERVICES == 2
    monkeypatch.setenv("CUTECC_SERVICE_MAX", "5")
    assert service.most_services() == 5
    for bad in ("0", "many", "-1", "1e3", "65"):
        monkeypatch.setenv("CUTECC_SERVICE_MAX", bad)
        with pytest.raises(CuteccError, match=r"\$CUTECC_SERVICE_MAX"):
            service.most_services()


def test_env_lists_the_live_services_with_their_memory_and_age(run_dir: Path, tmp_path: Path) -> None:
    def env() -> dict[str, Any]:
        r = subprocess.run([PY, "-m", "cutecc.cli", "env", "--json"], capture_output=True, text=True,
                           check=True, env={**os.environ, "CUTECC_ARCH": "sm_90a"})
        return json.loads(r.stdout)

    assert env()["services"] == []
    _served(_module(tmp_path / "lib", "kept_h"), 1)
    [pid] = resident_services(run_dir)
    [live] = env()["services"]
    assert live["pid"] == pid and live["rss"] > 1 << 20 and 0 <= live["age_s"] < 600
    assert 0 <= live["unused_s"] <= live["age_s"] + 1
    text = subprocess.run([PY, "-m", "cutecc.cli", "env"], capture_output=True, text=True, check=True,
                          env={**os.environ, "CUTECC_ARCH": "sm_90a"}).stdout
    assert f"pid {pid}" in text and "1 resident compile service(s) live" in text
    stop_resident_services(run_dir)
    assert _wait(lambda: env()["services"] == [], 10)  # a dead one's socket is not a live service
