"""Fixtures for the cache lifecycle commands: a real toy build, made once per module."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import PY

from cutecc.store import Entry, Store


@dataclass(frozen=True)
class Built:
    """A toy project (two variants: threads=64 and threads=128) and its built cache."""

    manifest: Path
    cache: Path

    @property
    def store(self) -> Store:
        return Store(self.cache)

    def entries(self) -> dict[str, Entry]:
        """Entries by variant id."""
        return {e.meta["variant"]: e for e in self.store.entries()}


@pytest.fixture(scope="module")
def built_once(toy_cache, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The session's toy build, copied once for this module."""
    copy = toy_cache.copy(tmp_path_factory.mktemp("built"))
    return Built(copy.manifest, copy.cache)


@pytest.fixture
def built(built_once: Built, tmp_path: Path) -> Built:
    """A private copy of the module's built project and cache (same keys: sources are
    hashed by their path relative to the manifest)."""
    shutil.copytree(built_once.manifest.parent, tmp_path / "proj")
    shutil.copytree(built_once.cache, tmp_path / "c")
    return Built(tmp_path / "proj" / "kernels.toml", tmp_path / "c")


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
