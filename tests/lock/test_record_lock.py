"""`record_lock`, the one road by which `build` and `tune` write and sign kernels.lock: the
file written only when its bytes change, the signature of exactly those bytes, and a lock
already signed by the key left as it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cutecc.contract.pinned import Pin
from cutecc.lock import signing
from cutecc.lock.lines import LockEntry
from cutecc.lock.lockfile import Lock, Recorded, read_lock, record_lock

pytest.importorskip("cryptography")


def _lock(key: str) -> Lock:
    pin = Pin("kernel.so", "c" * 64, 1, "s", None, "d" * 64, "e" * 64)
    return Lock((LockEntry("k", "v", "sm_90a", "x86_64", key, pin),))


def _keys(tmp_path: Path, name: str) -> tuple[signing.PrivateKey, signing.PublicKey]:
    private, public = signing.keygen(tmp_path / name)
    return signing.read_private_key(private), signing.read_public_key(public)


def test_unsigned_the_lock_is_written_when_its_bytes_change(tmp_path: Path) -> None:
    path = tmp_path / "kernels.lock"
    assert record_lock(path, _lock("a" * 64)) == Recorded(True, None)
    assert read_lock(path) == _lock("a" * 64)
    before = os.stat(path).st_mtime_ns
    assert record_lock(path, _lock("a" * 64)) == Recorded(False, None)
    assert os.stat(path).st_mtime_ns == before
    assert not Path(f"{path}{signing.SIG_SUFFIX}").exists()
    assert record_lock(path, _lock("b" * 64)).changed


def test_a_key_signs_exactly_the_bytes_written_and_only_when_needed(tmp_path: Path) -> None:
    ci, ci_pub = _keys(tmp_path, "ci")
    other, other_pub = _keys(tmp_path, "other")
    path = tmp_path / "kernels.lock"
    sig = Path(f"{path}{signing.SIG_SUFFIX}")
    got = record_lock(path, _lock("a" * 64), ci)
    assert got == Recorded(True, sig)
    assert signing.verify_file(path, [ci_pub], "lock") == _lock("a" * 64).dumps()
    # unchanged and already signed by this key: neither file is rewritten
    stamps = os.stat(path).st_mtime_ns, os.stat(sig).st_mtime_ns, sig.read_bytes()
    assert record_lock(path, _lock("a" * 64), ci) == Recorded(False, sig)
    assert (os.stat(path).st_mtime_ns, os.stat(sig).st_mtime_ns, sig.read_bytes()) == stamps
    # unchanged, but not yet signed by this key: its signature is added to the other's
    assert record_lock(path, _lock("a" * 64), other) == Recorded(False, sig)
    for pub in (ci_pub, other_pub):
        assert signing.verify_file(path, [pub], "lock")
    # changed: signed anew, the old signatures (of other bytes) gone
    assert record_lock(path, _lock("b" * 64), ci) == Recorded(True, sig)
    assert signing.verify_file(path, [ci_pub], "lock") == _lock("b" * 64).dumps()
    with pytest.raises(signing.SignatureError):
        signing.verify_file(path, [other_pub], "lock")


def test_unsigned_rewrite_removes_the_stale_signature(tmp_path: Path) -> None:
    """No key, no signing: a signature of the lock's old bytes is removed, never left
    beside the changed lock (on 1518079 it stayed, vouching for nothing) nor silently
    refreshed; one of the bytes written stays, whoever signed them."""
    ci, ci_pub = _keys(tmp_path, "ci")
    path = tmp_path / "kernels.lock"
    sig = Path(f"{path}{signing.SIG_SUFFIX}")
    record_lock(path, _lock("a" * 64), ci)
    assert record_lock(path, _lock("a" * 64)) == Recorded(False, None)  # unchanged: still signed
    assert signing.verify_file(path, [ci_pub], "lock")
    assert record_lock(path, _lock("b" * 64)) == Recorded(True, None, removed=sig)
    assert not sig.exists()
    with pytest.raises(signing.SignatureError, match="is not signed"):
        signing.verify_file(path, [ci_pub], "lock")
    # a signature written beside the lock by hand, of other bytes, goes too
    sig.write_bytes(signing.sign(_lock("c" * 64).dumps(), ci, "lock"))
    assert record_lock(path, _lock("b" * 64)) == Recorded(False, None, removed=sig)
    assert not sig.exists()


def test_the_load_error_of_a_stale_or_missing_signature_says_how_to_sign_again(tmp_path: Path) -> None:
    ci, ci_pub = _keys(tmp_path, "ci")
    path = tmp_path / "kernels.lock"
    record_lock(path, _lock("a" * 64), ci)
    path.write_bytes(_lock("b" * 64).dumps())  # changed after it was signed
    with pytest.raises(signing.SignatureError, match="changed after it was signed") as e:
        signing.verify_file(path, [ci_pub], "lock")
    assert "cutecc build --sign-key" in e.value.message
    Path(f"{path}{signing.SIG_SUFFIX}").unlink()
    with pytest.raises(signing.SignatureError, match="is not signed") as e:
        signing.verify_file(path, [ci_pub], "lock")
    assert "cutecc build --sign-key" in e.value.message
