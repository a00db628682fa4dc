"""Trust anchors (signing and trusted public keys) are held to the cache's ownership policy,
and trusted keys given where they check nothing are an error.

Seen: a trusted public key owned by another uid with mode 666
was accepted by `load` and `unpack`, and a signing key owned by another uid was used to
sign, though the cache itself would be refused for the same ownership; and
`cutecc.load(cache, trusted_keys=[...])` (or `$CUTECC_TRUSTED_KEYS` with `load(cache)`)
loaded and lowered with no check and no warning.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

import cutecc
from cutecc.errors import CuteccError
from cutecc.lock import signing

from .conftest import ARCH, Cache, cli, one_line_error, out, unpack_cmd


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    return signing.keygen(d / "ci")


def _give_away(path: Path, pw: pwd.struct_passwd, mode: int) -> None:
    os.chown(path, pw.pw_uid, pw.pw_gid)
    os.chmod(path, mode)


def test_a_world_writable_trusted_key_is_refused(keys: tuple[Path, Path]) -> None:
    _, pub = keys
    os.chmod(pub, 0o666)
    with pytest.raises(signing.SignatureError, match="writable by any user"):
        signing.read_public_key(pub)


def test_a_trusted_key_in_a_world_writable_directory_is_refused(tmp_path: Path,
                                                                keys: tuple[Path, Path]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not sticky: anyone may replace the file
    shutil.copyfile(keys[1], shared / "ci.pub")
    with pytest.raises(signing.SignatureError, match="writable by any user"):
        signing.read_public_key(shared / "ci.pub")


def test_a_trusted_key_behind_a_link_is_refused(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    (tmp_path / "link.pub").symlink_to(keys[1])
    with pytest.raises(signing.SignatureError, match="symbolic link"):
        signing.read_public_key(tmp_path / "link.pub")


def test_keys_of_another_user_are_refused_by_load_unpack_and_build(
        cache: Cache, legit_tar: Path, keys: tuple[Path, Path], other_user: pwd.struct_passwd,
        tmp_path: Path) -> None:
    priv, pub = keys
    r = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", cache.lock,
            "--sign-key", priv)
    assert r.returncode == 0, out(r)
    _give_away(pub, other_user, 0o666)
    with pytest.raises(CuteccError, match=f"owned by uid {other_user.pw_uid}"):
        cutecc.load(cache.root, arch=ARCH, lock=cache.lock, trusted_keys=[pub])
    err = one_line_error(cli(*unpack_cmd(legit_tar, tmp_path / "c2")[:4], "--trusted-key", pub))
    assert f"owned by uid {other_user.pw_uid}" in err
    _give_away(priv, other_user, 0o600)
    err = one_line_error(cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file",
                             tmp_path / "k.lock", "--sign-key", priv))
    assert f"owned by uid {other_user.pw_uid}" in err


def test_trusted_keys_without_a_lock_are_an_error_naming_what_to_pass(
        cache: Cache, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CuteccError, match="trusted_keys= is set, but nothing loaded here is signed: "
                                          "pass lock="):
        cutecc.load(cache.root, arch=ARCH, trusted_keys=[keys[1]])
    monkeypatch.setenv("CUTECC_TRUSTED_KEYS", str(keys[1]))
    with pytest.raises(CuteccError, match=r"\$CUTECC_TRUSTED_KEYS is set, but nothing loaded here"):
        cutecc.load(cache.root, arch=ARCH)
    monkeypatch.delenv("CUTECC_TRUSTED_KEYS")
    assert cutecc.load(cache.root, arch=ARCH).mul is not None  # no keys: the cache as it is


def test_the_shared_cache_opt_in_does_not_reach_trust_anchors(keys: tuple[Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`$CUTECC_ALLOW_SHARED_CACHE=1` accepts a cache others can write; a key they can write
    is still refused (a shared cache is an opt-in for caches, never for what vouches)."""
    monkeypatch.setenv("CUTECC_ALLOW_SHARED_CACHE", "1")
    os.chmod(keys[1], 0o666)
    with pytest.raises(signing.SignatureError, match="writable by any user"):
        signing.read_public_key(keys[1])
