"""Group write is refused as world write is: a library, its records or a trusted public key
writable by a group with another member could have been rewritten by that member, with the
SHA-256 beside it. A group only this user is in (a user-private group under umask 002)
is this user's alone and stays trusted.

Before the fix, with the second user's group owning a group-writable entry: `verify`
called the cache healthy (exit 0), the runtime's trust check (`library.untrusted`) passed,
a group-writable composite record and stats.json were read, and `read_public_key` accepted
a group-writable trusted key (so `unpack` and `load` believed what it vouched for)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cutecc.lock import signing
from cutecc.runtime import library
from cutecc.store.build_records import CompositeRecord
from cutecc.store.view import StoreView

from ..fake_store import add, new_store
from .conftest import cli, out

SOLO = "cuteccsolo"  # a group with no member: as private as a user-private group


@pytest.fixture(scope="module")
def solo_group() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a group (groupadd)")
    created = False
    try:
        gid = grp.getgrnam(SOLO).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", SOLO], check=True, capture_output=True)
        created = True
        gid = grp.getgrnam(SOLO).gr_gid
    yield gid
    if created:
        subprocess.run(["groupdel", SOLO], capture_output=True)


def _group_writable(paths: list[Path], gid: int) -> None:
    for p in paths:
        os.chown(p, -1, gid, follow_symlinks=False)
        os.chmod(p, os.stat(p).st_mode | 0o020)


def _verify(root: Path) -> tuple[int, list[dict]]:
    r = cli("verify", "--json", "--cache-dir", root)
    assert "Traceback" not in out(r), out(r)
    return r.returncode, json.loads(r.stdout)["problems"]


@pytest.mark.needs_root
@pytest.mark.parametrize("what", ["library", "meta.json", "entry directory"])
def test_an_entry_writable_by_another_users_group_is_refused(other_user: pwd.struct_passwd,
                                                             tmp_path: Path, what: str) -> None:
    store, rt = new_store(tmp_path / "cache")
    e = add(store, rt, "k", "a")
    target = {"library": e.path / "kernel.so", "meta.json": e.path / "meta.json",
              "entry directory": e.path}[what]
    _group_writable([target], other_user.pw_gid)
    code, problems = _verify(store.root)
    assert code == 1 and [p["kind"] for p in problems] == ["untrusted"], problems
    assert "writable by group" in problems[0]["detail"], problems
    why = library.untrusted(e.path / "kernel.so")
    assert why and "writable by group" in why and str(other_user.pw_gid) in why, why


@pytest.mark.needs_root
def test_records_writable_by_another_users_group_are_not_believed(other_user: pwd.struct_passwd,
                                                                  tmp_path: Path) -> None:
    store, rt = new_store(tmp_path / "cache")
    add(store, rt, "k", "a")
    add(store, rt, "j", "a")
    store.record_composite(CompositeRecord("both", ("k", "j"), ("x",), ("out",), "m"))
    store.add_stats(hits=5)
    _group_writable([store.layout.composite("both"), store.layout.stats()], other_user.pw_gid)
    view = StoreView(store.root)
    from cutecc import trust

    with pytest.raises(trust.Untrusted, match="writable by group"):
        view.composite("both")
    assert view.read_stats().hits == 0
    code, problems = _verify(store.root)
    assert {Path(p["path"]).name for p in problems if p["kind"] == "bad-record"} == {
        "both.json", "stats.json"}, problems


@pytest.mark.needs_root
def test_a_trusted_key_writable_by_another_users_group_is_refused(other_user: pwd.struct_passwd,
                                                                  tmp_path: Path) -> None:
    _, public = signing.keygen(tmp_path / "deploy")
    signing.read_public_key(public)  # as written: trusted
    _group_writable([public], other_user.pw_gid)
    with pytest.raises(signing.SignatureError, match="writable by group"):
        signing.read_public_key(public)


@pytest.mark.needs_root
def test_a_group_of_this_user_alone_stays_trusted(solo_group: int, tmp_path: Path) -> None:
    """umask 002 with a user-private group: nobody else can be in the group, nothing to refuse."""
    store, rt = new_store(tmp_path / "cache")
    e = add(store, rt, "k", "a")
    _group_writable([e.path, e.path / "kernel.so", e.path / "meta.json", store.root], solo_group)
    assert _verify(store.root) == (0, [])
    assert library.untrusted(e.path / "kernel.so") is None
    _, public = signing.keygen(tmp_path / "deploy")
    _group_writable([public], solo_group)
    signing.read_public_key(public)
