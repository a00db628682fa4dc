"""Helpers for the commands' tests (copies of the session's toy build, `built`, are
tests/conftest.py's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, run_cli

from cutecc.store import Store


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `root` with (inode, size, mtime_ns): equal snapshots, untouched tree."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def hold_lock() -> Iterator:
    """hold_lock(store, key, seconds): another process holds the key's lock (as a build does)."""
    procs: list[subprocess.Popen] = []

    def start(store: Store, key: str, seconds: float = 60) -> subprocess.Popen:
        code = ("import filelock, sys, time\n"
                "lock = filelock.FileLock(sys.argv[1]); lock.acquire()\n"
                "print('held', flush=True); time.sleep(float(sys.argv[2]))\n")
        p = subprocess.Popen([PY, "-c", code, str(store.locks_dir / f"{key}.lock"), str(seconds)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory, dsl: None) -> tuple[Path, Path, dict]:
    """A copy of the example project, built and `tune --compile-only`d once per session
    (tests that change its lock or cache work on copies, or come after those that read them)."""
    pytest.importorskip("cutlass", reason="compiling needs the build extra")
    base = tmp_path_factory.mktemp("tune")
    proj = base / "proj"
    shutil.copytree(REPO / "kernels", proj / "kernels")
    shutil.copy(REPO / "kernels.toml", proj / "kernels.toml")
    shutil.copy(REPO / "kernels.lock", proj / "kernels.lock")
    cache = base / "c"
    b = run_cli("build", str(proj / "kernels.toml"), "--cache-dir", str(cache), "--json", timeout=900)
    assert b.returncode == 0, b.stderr
    assert (proj / "kernels.lock").read_bytes() == (REPO / "kernels.lock").read_bytes()
    first = run_cli("tune", str(proj / "kernels.toml"), "--compile-only", "--cache-dir", str(cache), "--json",
                    timeout=900)
    assert first.returncode == 0, first.stderr
    return proj, cache, json.loads(first.stdout)
