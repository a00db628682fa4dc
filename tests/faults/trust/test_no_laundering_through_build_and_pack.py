"""No laundering through build and pack: `build`, `pack`, `unpack` and `verify` apply the
runtime's ownership policy, and a changed library under an unchanged key never rewrites its
lock line.

Seen: `build`, `pack` and `unpack` never applied the runtime's ownership/permission check, and when
an unchanged key's library hash changes, `cutecc build` silently rewrites that lock line.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from cutecc.entry.rules import STORE_FORMAT

from .conftest import (
    ARCH,
    LIB,
    UNSIGNED_OK,
    Cache,
    chown_tree,
    cli,
    marker_runs,
    one_line_error,
    out,
    py,
    unpack_cmd,
)

pytestmark = pytest.mark.usefixtures("dsl")


def test_build_refuses_a_cached_entry_whose_library_differs_from_the_lock(cache: Cache) -> None:
    """An entry whose key is unchanged but whose library differs from the lock's
    line is an error naming it (exit 1), and the lock is not rewritten to vouch for it."""
    mul = cache.key("mul", "float32")
    other = (cache.entry(cache.key("axpy")) / LIB).read_bytes()  # a real ELF, not mul's
    cache.plant_library(mul, other)  # meta.json agrees with the new bytes
    before = cache.lock.read_bytes()
    r = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", cache.lock)
    assert cache.lock.read_bytes() == before, "kernels.lock was rewritten to the planted library"
    err = one_line_error(r, (1,))
    assert mul[:12] in err or "mul[dtype=float32]" in err, err


def test_build_refuses_a_world_writable_cached_entry(cache: Cache, tmp_path: Path) -> None:
    """Build applies the runtime's trust policy to the entries it reports
    cached and locks: an entry directory anyone can write is refused, the lock not written."""
    mul = cache.key("mul", "float32")
    os.chmod(cache.entry(mul), 0o777)
    lock = tmp_path / "fresh.lock"
    r = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", lock)
    assert not lock.exists(), f"a lock vouching for a world-writable entry was written:\n{out(r)}"
    err = one_line_error(r, (1,))
    assert "writable" in err, err


@pytest.mark.needs_root
def test_build_refuses_a_cache_another_user_owns(cache: Cache, other_user, tmp_path: Path) -> None:
    """Root's `cutecc build` over a cache another uid owns must not report its
    entries cached and lock them."""
    chown_tree(cache.root, other_user.pw_uid, other_user.pw_gid)
    lock = tmp_path / "fresh.lock"
    r = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", lock)
    assert not lock.exists(), f"a lock vouching for another user's cache was written:\n{out(r)}"
    err = one_line_error(r, (1,))
    assert "owned by" in err or "uid" in err, err


def test_pack_refuses_a_world_writable_entry(cache: Cache, tmp_path: Path) -> None:
    """Pack applies the trust policy too (a wheel is what production runs)."""
    os.chmod(cache.entry(cache.key("axpy")) / LIB, 0o666)
    r = cli("pack", "--lock", cache.lock, "--name", "k", "--version", "1.0", "--out", tmp_path / "d",
            "--cache-dir", cache.root)
    assert not list((tmp_path / "d").glob("*.whl")), "a wheel was written from a world-writable entry"
    err = one_line_error(r, (1,))
    assert "writable" in err, err


@pytest.mark.needs_root
def test_pack_refuses_a_cache_another_user_owns(cache: Cache, other_user, tmp_path: Path) -> None:
    """`cutecc pack` by root from another uid's cache is refused."""
    chown_tree(cache.root, other_user.pw_uid, other_user.pw_gid)
    r = cli("pack", "--lock", cache.lock, "--name", "k", "--version", "1.0", "--out", tmp_path / "d",
            "--cache-dir", cache.root)
    assert not list((tmp_path / "d").glob("*.whl")), "a wheel was written from another user's cache"
    err = one_line_error(r, (1,))
    assert "owned by" in err or "uid" in err, err


@pytest.mark.needs_root
def test_unpack_refuses_a_destination_cache_another_user_owns(built: Cache, legit_tar: Path,
                                                              other_user, tmp_path: Path) -> None:
    """Unpack does not publish into a cache another uid owns (its owner could
    swap what lands)."""
    dest = tmp_path / "theirs"
    dest.mkdir()
    for d in ("entries", "tmp", "locks"):
        (dest / d).mkdir(exist_ok=True)
    (dest / "format").write_text(f"{STORE_FORMAT}\n")
    chown_tree(dest, other_user.pw_uid, other_user.pw_gid)
    r = cli(*unpack_cmd(legit_tar, dest))
    err = one_line_error(r, (1,))
    assert "owned by" in err or "uid" in err, err


def test_verify_reports_a_world_writable_entry(cache: Cache) -> None:
    """`cutecc verify` applies the trust policy: it does not call an entry that
    anyone can write healthy."""
    key = cache.key("rmsnorm", "float32,d=1024")
    os.chmod(cache.entry(key), 0o777)
    r = cli("verify", "--json", "--cache-dir", cache.root)
    assert r.returncode == 1, f"verify called a world-writable entry healthy:\n{r.stdout[-1500:]}"
    problems = json.loads(r.stdout)["problems"]
    assert any(key in p["path"] for p in problems), problems


@pytest.mark.needs_root
def test_the_laundering_chain_never_runs_the_other_users_library(cache: Cache, other_user,
                                                                 evil_so: bytes,
                                                                 tmp_path: Path) -> None:
    """The whole chain: another uid's cache with a planted (self-consistent)
    library -> root's `cutecc build` -> `cutecc pack --lock` -> installed wheel ->
    `load(package=...)`: the planted ELF's constructor must never run."""
    cache.plant_library(cache.key("mul", "float32"), evil_so)
    chown_tree(cache.root, other_user.pw_uid, other_user.pw_gid)
    marker = tmp_path / "ran"
    r1 = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", cache.lock)
    r2 = cli("pack", "--lock", cache.lock, "--name", "laundered", "--version", "1.0",
             "--out", tmp_path / "dist", "--cache-dir", cache.root)
    wheels = list((tmp_path / "dist").glob("laundered-*.whl"))
    if wheels:  # the chain went through: install the wheel (pip install --target) and load it
        site = tmp_path / "site"
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(site)
        py("import sys, cutecc\nsys.path.insert(0, sys.argv[1])\n"
           "ks = cutecc.load(package='laundered', arch=sys.argv[2])\n"
           "try:\n    ks.register_all()\nexcept Exception as e:\n    print(type(e).__name__, e)\n",
           site, ARCH, env={"CUTECC_TEST_MARKER": str(marker), **UNSIGNED_OK})
    assert marker_runs(marker) == 0, (
        "the other user's library ran in root's process; build said: "
        f"{r1.stdout.strip()[-200:]!r}, pack said: {r2.stdout.strip()[-200:]!r}")
    assert r1.returncode == 1 or r2.returncode == 1, out(r1) + out(r2)
