"""Archive and signature edges: an `alg: none` signature, duplicate members in a wheel, and
members outside the pack's tree are refused with their name (the remote's 403 warning is
tested against a real S3 server in tests/distributed/test_remote.py).

(a) a signature with `alg: none` was refused as "signed by key X, none of them trusted
(trusted: X)"; (b) a wheel silently took the last of two members of one name where a
tarball refused the entry; (c) members outside the pack's `_cutecc/` tree were ignored.
Both archive kinds now refuse (b) and (c) the same way, naming the member.
"""

from __future__ import annotations

import io
import json
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest

from cutecc.lock import signing

from .conftest import Cache, cli, lock_entries, one_line_error, read_tar, unpack_cmd, write_tar

TWICE = "appears twice in the archive"
OUTSIDE = "not part of a cutecc pack"


# (a) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "ES256", None])
def test_a_signature_with_another_algorithm_says_so(tmp_path: Path, alg: str | None) -> None:
    """A signature by a trusted key in an algorithm other than ed25519 is refused, saying
    which algorithm it used and which one is accepted."""
    private, public = signing.keygen(tmp_path / "ci")
    data = b'{"entries": []}\n'
    doc = json.loads(signing.sign(data, signing.read_private_key(private), "lock"))
    doc["signatures"][0]["alg"] = alg
    with pytest.raises(signing.SignatureError) as e:
        signing.verify(data, json.dumps(doc).encode(), [signing.read_public_key(public)], "lock",
                       "kernels.lock")
    msg = e.value.message
    assert "algorithm" in msg and repr(alg) in msg and "ed25519" in msg, msg
    assert "none of them trusted" not in msg, msg


# (b), (c) ----------------------------------------------------------------------------------


def _read_zip(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _write_zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name: meant here
        for name, data in members:
            zf.writestr(name, data)
    return path


def _archive(kind: str, legit_tar: Path, legit_wheel: Path, tmp_path: Path,
             extra: list[tuple[str, bytes]]) -> Path:
    """The legit pack of `kind` with `extra` members appended (names relative to the pack's
    `_cutecc/` when they start with "_cutecc/", else to the archive's root)."""
    if kind == "tar":
        files = list(read_tar(legit_tar).items())
        path = tmp_path / "p.tar.gz"
        with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
            for name, data in files + extra:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
        return path
    members = _read_zip(legit_wheel)
    pkg = next(n for n, _ in members if n.endswith("/_cutecc/kernels.lock")).split("/")[0]
    extra = [(f"{pkg}/{n}" if n.startswith("_cutecc/") else n, d) for n, d in extra]
    return _write_zip(tmp_path / legit_wheel.name, members + extra)


def _victim(built: Cache) -> tuple[str, str]:
    """(key, the `_cutecc/`-relative name of its library) of the lock's first entry."""
    key = lock_entries(built.lock)[0]["key"]
    return key, f"_cutecc/entries/{key[:2]}/{key}/kernel.so"


@pytest.mark.parametrize("kind", ["tar", "wheel"])
def test_a_duplicate_member_refuses_its_entry_in_both_kinds(built: Cache, legit_tar: Path,
                                                            legit_wheel: Path, tmp_path: Path,
                                                            kind: str) -> None:
    """(b) Two members of one name: the entry is refused, naming why, in a wheel as in a
    tarball (a wheel took the last one), and the other entries land."""
    key, lib = _victim(built)
    archive = _archive(kind, legit_tar, legit_wheel, tmp_path, [(lib, b"\x7fELF planted")])
    r = cli(*unpack_cmd(archive, tmp_path / "c"))
    err = one_line_error(r, (1,))
    assert TWICE in err and key[:12] in err, err
    assert not (tmp_path / "c" / "entries" / key[:2] / key).exists()
    assert "10 imported" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["tar", "wheel"])
@pytest.mark.parametrize("member", ["evil.txt", "other/_cutecc_not/x", "_cutecc-other/kernel.so"])
def test_a_member_outside_the_pack_tree_is_refused_in_both_kinds(legit_tar: Path, legit_wheel: Path,
                                                                 tmp_path: Path, kind: str,
                                                                 member: str) -> None:
    """(c) A member outside `_cutecc/` (and, in a wheel, not its own dist-info or
    `__init__.py`) is refused by name (exit 1), as an unknown member inside the tree is;
    the entries still land."""
    archive = _archive(kind, legit_tar, legit_wheel, tmp_path, [(member, b"x")])
    r = cli(*unpack_cmd(archive, tmp_path / "c"))
    err = one_line_error(r, (1,))
    assert OUTSIDE in err and member in err, err
    assert "11 imported" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["tar", "wheel"])
def test_the_legit_packs_unpack_with_nothing_refused(legit_tar: Path, legit_wheel: Path,
                                                     tmp_path: Path, kind: str) -> None:
    """(Control: a wheel's dist-info and __init__.py are its own, not refused.)"""
    archive = legit_tar if kind == "tar" else legit_wheel
    r = cli(*unpack_cmd(archive, tmp_path / "c"))
    assert r.returncode == 0 and "11 imported" in r.stdout and not r.stderr.strip(), r.stdout + r.stderr


def test_a_tar_written_by_the_helper_still_unpacks(legit_tar: Path, tmp_path: Path) -> None:
    """(Control for the helper: rewriting the tarball member by member changes nothing.)"""
    path = write_tar(tmp_path / "same.tar.gz", read_tar(legit_tar))
    r = cli(*unpack_cmd(path, tmp_path / "c"))
    assert r.returncode == 0 and "11 imported" in r.stdout, r.stdout + r.stderr
