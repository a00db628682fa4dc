"""The cache gets safe modes whatever the umask.

Seen: under `umask 000` the build silently created a cache of 777 directories and
666 files (and a 666 kernels.lock), which the runtime then refuses as its own. The cache
(and what is written into it or beside it) must get safe modes whatever the umask.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from .conftest import ARCH, REPO_MANIFEST, cli, out, py, unpack_cmd

pytestmark = pytest.mark.usefixtures("dsl")


def writable_by_others(root: Path) -> list[str]:
    bad = []
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            bad.append(f"{p.relative_to(root.parent)} {stat.S_IMODE(st.st_mode):o}")
    return bad


REGISTER = ("import sys, cutecc\nfrom cutecc.errors import CuteccError\n"
            "try:\n    print('OK', len(cutecc.load(sys.argv[1], arch=sys.argv[2]).register_all()))\n"
            "except CuteccError as e:\n    print('REFUSED', e)\n")


def test_a_build_under_umask_000_makes_a_cache_the_runtime_accepts(tmp_path: Path) -> None:
    """`umask 000; cutecc build --kernel axpy` into a fresh cache: nothing in
    the cache or the lock is group/world-writable, and the runtime loads it."""
    cache, lock = tmp_path / "cache", tmp_path / "kernels.lock"
    r = cli("build", REPO_MANIFEST, "--kernel", "axpy", "--cache-dir", cache, "--lock-file", lock,
            umask=0)
    assert r.returncode == 0, out(r)
    bad = writable_by_others(cache) + writable_by_others(lock)
    loaded = py(REGISTER, cache, ARCH).stdout.strip()
    assert not bad, f"{len(bad)} paths writable by others, e.g. {bad[:4]}; the runtime: {loaded[:160]}"
    assert loaded.startswith("OK"), loaded


def test_an_unpack_under_umask_000_makes_a_cache_the_runtime_accepts(legit_tar: Path,
                                                                    tmp_path: Path) -> None:
    """The same for `cutecc unpack` into a fresh cache."""
    cache = tmp_path / "cache"
    r = cli(*unpack_cmd(legit_tar, cache), umask=0)
    assert r.returncode == 0, out(r)
    bad = writable_by_others(cache)
    loaded = py(REGISTER, cache, ARCH).stdout.strip()
    assert not bad, f"{len(bad)} paths writable by others, e.g. {bad[:4]}; the runtime: {loaded[:160]}"
    assert loaded.startswith("OK"), loaded
