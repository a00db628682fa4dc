"""Bounded compiles: a kernel whose compile runs past the time limit
(`$CUTECC_COMPILE_TIMEOUT`, `[build] compile_timeout`, `--compile-timeout`) or asks for
more memory than the memory limit (`$CUTECC_COMPILE_MEMORY`, ...) is stopped, named and
reported failed; the rest of the build goes on (with one worker: the stopped worker's
slot is replaced), and nothing of the stopped compile is published."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import PY

from cutecc.store import Store

from .conftest import run_bounded, write_hang_project

pytestmark = [pytest.mark.usefixtures("dsl")]
# Long enough for the toy kernels' own compiles (DSL import included) on a loaded 2-core CI
# host, where 6 s was seen too short; the hanging compile sleeps an hour regardless.
LIMIT = 20


def _build(manifest: Path, cache: Path, env: dict[str, str], *extra: str, timeout: float = 240):
    return run_bounded([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", str(cache),
                        "--no-lock", "--json", *extra], env=env, timeout=timeout)


def _check(r, cache: Path, why: str) -> dict:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    rep = json.loads(r.stdout)  # (an entry's `traceback` field carries a compile error's own)
    assert not any("Traceback" in (e.get("error") or "") for e in rep["entries"]), rep
    assert r.returncode == 1, (r.returncode, rep, r.stderr[-2000:])
    by = {e["kernel"] + e["variant"]: e for e in rep["entries"]}
    assert by["scalethreads=64"]["status"] == by["scalethreads=128"]["status"] == "built", rep
    hang = by["hangdefault"]
    assert hang["status"] == "failed" and why in hang["error"], hang
    assert {e.doc["kernel"] for e in Store(cache).entries()} == {"scale"}  # nothing of hang's
    return hang


def test_a_compile_past_the_time_limit_is_stopped_and_the_build_goes_on(tmp_path: Path) -> None:
    manifest = write_hang_project(tmp_path / "p")
    t0 = time.monotonic()
    r = _build(manifest, tmp_path / "c", {"CUTECC_COMPILE_TIMEOUT": str(LIMIT)}, "-j", "1")
    hang = _check(r, tmp_path / "c", f"{LIMIT} s")
    assert "hang" not in hang["error"] or "limit" in hang["error"], hang
    assert time.monotonic() - t0 < 200


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_compile_stopped_at_the_time_limit_takes_its_processes_with_it(
        tmp_path: Path, executor: str) -> None:
    if executor == "ray":
        pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    manifest = write_hang_project(tmp_path / "p")
    kids = tmp_path / "kids"
    try:
        r = _build(manifest, tmp_path / "c", {"CUTECC_COMPILE_TIMEOUT": str(LIMIT),
                                              "HANG_CHILDREN": str(kids)}, "--kernel", "hang",
                   "--executor", executor, timeout=300)
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        [hang] = json.loads(r.stdout)["entries"]
        assert hang["status"] == "failed" and f"{LIMIT} s" in hang["error"], hang
        pids = [int(x) for x in kids.read_text().split()]
        assert len(pids) == 2, pids  # the plain child and the detached one
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)], "the stopped compile's processes still run"
    finally:
        for pid in [int(x) for x in kids.read_text().split()] if kids.exists() else []:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_compile_over_the_memory_limit_fails_by_name(tmp_path: Path) -> None:
    manifest = write_hang_project(tmp_path / "p")
    env = {"CUTECC_COMPILE_MEMORY": "2G", "HANG_MAP_BYTES": str(6 << 30), "HANG_SECONDS": "0"}
    _check(_build(manifest, tmp_path / "c", env, "-j", "1"), tmp_path / "c", "memory limit")


def test_a_ray_compile_past_the_time_limit_is_stopped_too(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    manifest = write_hang_project(tmp_path / "p")
    r = _build(manifest, tmp_path / "c", {"CUTECC_COMPILE_TIMEOUT": str(LIMIT)}, "--executor", "ray",
               "-j", "2", timeout=300)
    _check(r, tmp_path / "c", f"{LIMIT} s")


def test_the_limits_are_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.build.executors import compile_limits
    from cutecc.errors import CuteccError
    from cutecc.settings import BuildOptions

    def limits(seconds: str | None = None, memory: str | None = None) -> tuple[float | None, int | None]:
        """As a build resolves them: the flags, else the environment, else `[build]` (30 s, 1G)."""
        o = BuildOptions.from_environment(compile_timeout=seconds, compile_memory=memory)
        return compile_limits(o.compile_timeout, o.compile_memory, default_seconds=30, default_memory=1 << 30)

    monkeypatch.delenv("CUTECC_COMPILE_TIMEOUT", raising=False)
    monkeypatch.delenv("CUTECC_COMPILE_MEMORY", raising=False)
    assert limits() == (30.0, 1 << 30)
    monkeypatch.setenv("CUTECC_COMPILE_TIMEOUT", "0")  # off
    monkeypatch.setenv("CUTECC_COMPILE_MEMORY", "512M")
    assert limits() == (None, 512 << 20)
    assert limits("90", "off") == (90.0, None)  # flags win
    with pytest.raises(CuteccError) as e:
        limits("soon")
    assert e.value.exit_code == 2 and e.value.where == "--compile-timeout"
    monkeypatch.setenv("CUTECC_COMPILE_MEMORY", "1M")
    with pytest.raises(CuteccError) as e:
        limits()
    assert e.value.exit_code == 2 and e.value.where == "$CUTECC_COMPILE_MEMORY"
    monkeypatch.setenv("CUTECC_COMPILE_MEMORY", "512M")
    manifest = write_hang_project(tmp_path / "p")
    manifest.write_text(manifest.read_text().replace(
        'archs = ["sm_90a"]\n', 'archs = ["sm_90a"]\n[build]\ncompile_timeout = 45\ncompile_memory = "3G"\n'))
    from cutecc.manifest import load_manifest

    b = load_manifest(manifest).build
    assert (b.compile_timeout, b.compile_memory) == (45.0, 3 << 30)
    for bad in ("compile_timeout = -1", 'compile_timeout = "soon"', 'compile_memory = "lots"'):
        manifest.write_text(manifest.read_text().replace("[build]\n", f"[build]\n{bad}\n", 1)
                            .replace("compile_timeout = 45\n", "").replace('compile_memory = "3G"\n', ""))
        with pytest.raises(CuteccError) as e:
            load_manifest(manifest)
        assert e.value.exit_code == 2 and "build.compile_" in str(e.value.render()), e.value.render()
        manifest.write_text(manifest.read_text().replace(f"{bad}\n", ""))
    assert os.environ.get("CUTECC_COMPILE_TIMEOUT") == "0"
