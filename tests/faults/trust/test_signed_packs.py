"""Packs carry provenance: a self-consistent hostile archive is refused unless signed by a
trusted key.

Seen: a tarball whose entry holds a different ELF under a legitimate key, with meta.json and
the archive's own lock rewritten to match, was imported by `cutecc unpack`; an archive can only
vouch for itself. The fix is provenance: a pack signed by the builder, verified at unpack
against a key the deployer trusts; an unsigned archive is refused unless the deployer opts
out explicitly.

The tests marked `proposed_interface` use the interface NOTES.md proposes (not built yet):
  cutecc keygen --out PREFIX                  -> PREFIX.key (0600), PREFIX.pub
  cutecc build ... --sign-key PREFIX.key      -> kernels.lock + kernels.lock.sig
  cutecc pack ... --sign-key PREFIX.key       -> _cutecc/kernels.lock.sig in the pack
  cutecc unpack ARCHIVE --trusted-key PREFIX.pub   (--allow-unsigned to opt out)
  cutecc.load(..., lock=L | package=P, trusted_keys=[PREFIX.pub])
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import (
    ARCH,
    LIB,
    Cache,
    cli,
    lock_entries,
    marker_runs,
    one_line_error,
    out,
    pack_meta,
    py,
    read_tar,
    record,
    set_pack_meta,
    write_tar,
)

pytestmark = pytest.mark.usefixtures("dsl")


def hostile(files: dict[str, bytes], key: str, lib: bytes) -> dict[str, bytes]:
    """The archive with `key`'s library replaced and its meta.json and lock line rewritten
    to match: self-consistent, so only a signature can tell."""
    files = dict(files)
    base = f"_cutecc/entries/{key[:2]}/{key}/"
    files[base + LIB] = lib
    meta = pack_meta(files, key)
    meta["files"][LIB] = record(lib)
    set_pack_meta(files, key, meta)
    lock = json.loads(files["_cutecc/kernels.lock"])
    for e in lock["entries"]:
        if e["key"] == key:
            e.update(sha256=record(lib)["sha256"], size=len(lib))
    files["_cutecc/kernels.lock"] = json.dumps(lock, indent=1).encode()
    return files


def test_unpack_does_not_import_a_self_consistent_hostile_archive(built: Cache, legit_tar: Path,
                                                                  evil_so: bytes,
                                                                  tmp_path: Path) -> None:
    """With no trusted key given and no explicit opt-out, `cutecc unpack` refuses
    an archive that carries no builder's signature, so a planted ELF never lands and never
    runs (today: "11 imported, 0 refused", then its constructor runs at registration)."""
    key = built.key("mul", "float32")
    archive = write_tar(tmp_path / "hostile.tar.gz", hostile(read_tar(legit_tar), key, evil_so))
    dest = tmp_path / "cache"
    r = cli("unpack", archive, "--cache-dir", dest)
    landed = (dest / "entries" / key[:2] / key / LIB)
    marker = tmp_path / "ran"
    if landed.exists():
        py("import sys, cutecc\nks = cutecc.load(sys.argv[1], arch=sys.argv[2])\n"
           "try:\n    ks.register_all()\nexcept Exception as e:\n    print(e)\n", dest, ARCH,
           env={"CUTECC_TEST_MARKER": str(marker)})
    assert not landed.exists() or landed.read_bytes() != evil_so, (
        f"the hostile library was imported ({r.stdout.strip()}); it then ran "
        f"{marker_runs(marker)} time(s) at registration")
    err = one_line_error(r, (1, 2))
    assert "sign" in err.lower(), err


def test_unpack_refuses_an_unsigned_archive_by_default(legit_tar: Path, tmp_path: Path) -> None:
    """Even a genuine pack is refused when unsigned and no opt-out is given: an
    archive can only vouch for itself."""
    r = cli("unpack", legit_tar, "--cache-dir", tmp_path / "cache")
    err = one_line_error(r, (1, 2))
    assert "sign" in err.lower(), err
    assert not list((tmp_path / "cache").glob("entries/*/*")), "entries landed"


# The proposed signing interface -------------------------------------------------------------


@pytest.fixture
def signed(cache: Cache, tmp_path: Path) -> dict[str, Path]:
    """A key pair, the cache's lock signed by `build --sign-key`, and a signed tar pack."""
    r = cli("keygen", "--out", tmp_path / "ci")
    assert r.returncode == 0, f"`cutecc keygen` (proposed) failed:\n{out(r)}"
    keys = {"key": tmp_path / "ci.key", "pub": tmp_path / "ci.pub"}
    r = cli("build", cache.manifest, "--cache-dir", cache.root, "--lock-file", cache.lock,
            "--sign-key", keys["key"])
    assert r.returncode == 0, out(r)
    assert Path(f"{cache.lock}.sig").is_file(), "build --sign-key wrote no kernels.lock.sig"
    r = cli("pack", "--lock", cache.lock, "--name", "signedk", "--version", "1.0", "--format", "tar",
            "--out", tmp_path / "dist", "--cache-dir", cache.root, "--sign-key", keys["key"])
    assert r.returncode == 0, out(r)
    (archive,) = (tmp_path / "dist").glob("*.tar.gz")
    assert "_cutecc/kernels.lock.sig" in read_tar(archive)
    return {**keys, "archive": archive, "lock": cache.lock}


@pytest.mark.proposed_interface
def test_a_signed_pack_unpacks_with_the_trusted_key(signed: dict[str, Path], tmp_path: Path) -> None:
    """Proposed interface: the round trip works when the key is trusted."""
    r = cli("unpack", signed["archive"], "--cache-dir", tmp_path / "d", "--trusted-key", signed["pub"])
    assert r.returncode == 0 and "11 imported" in r.stdout, out(r)


@pytest.mark.proposed_interface
def test_a_signed_pack_rewritten_after_signing_is_refused(signed: dict[str, Path], evil_so: bytes,
                                                          tmp_path: Path) -> None:
    """Proposed interface: the hostile rewrite of a signed pack (entry, meta.json
    and lock all consistent, old signature kept) is refused, and nothing lands."""
    key = lock_entries(signed["lock"])[0]["key"]
    archive = write_tar(tmp_path / "h.tar.gz", hostile(read_tar(signed["archive"]), key, evil_so))
    r = cli("unpack", archive, "--cache-dir", tmp_path / "d", "--trusted-key", signed["pub"])
    err = one_line_error(r, (1, 2))
    assert "sign" in err.lower(), err
    assert not (tmp_path / "d" / "entries" / key[:2] / key).exists()


@pytest.mark.proposed_interface
def test_a_pack_signed_by_another_key_is_refused(signed: dict[str, Path], tmp_path: Path) -> None:
    """Proposed interface: a valid signature by a key the deployer does not
    trust is no better than none."""
    r = cli("keygen", "--out", tmp_path / "mallory")
    assert r.returncode == 0, out(r)
    r = cli("unpack", signed["archive"], "--cache-dir", tmp_path / "d", "--trusted-key",
            tmp_path / "mallory.pub")
    err = one_line_error(r, (1, 2))
    assert "sign" in err.lower() or "key" in err.lower(), err


@pytest.mark.proposed_interface
def test_load_with_trusted_keys_refuses_a_lock_edited_after_signing(signed: dict[str, Path],
                                                                    cache: Cache) -> None:
    """Proposed interface: `cutecc.load(lock=..., trusted_keys=[...])` verifies
    kernels.lock.sig before trusting any line of the lock."""
    lock = json.loads(signed["lock"].read_text())
    lock["entries"] = lock["entries"][1:]  # any edit: a dropped line
    signed["lock"].write_text(json.dumps(lock, indent=1))
    r = py("import sys, cutecc\nfrom cutecc.errors import CuteccError\n"
           "try:\n    cutecc.load(sys.argv[1], lock=sys.argv[2], arch='sm_90a', trusted_keys=[sys.argv[3]])\n"
           "    print('LOADED')\nexcept CuteccError as e:\n    print('REFUSED', e)\n",
           cache.root, signed["lock"], signed["pub"])
    assert "REFUSED" in r.stdout and "sign" in r.stdout.lower(), out(r)


@pytest.mark.proposed_interface
def test_load_of_a_package_with_trusted_keys_refuses_an_unsigned_pack(legit_wheel: Path,
                                                                      tmp_path: Path) -> None:
    """Proposed interface: `load(package=..., trusted_keys=[...])` refuses a
    wheel without `_cutecc/kernels.lock.sig`."""
    import zipfile

    r = cli("keygen", "--out", tmp_path / "ci")
    assert r.returncode == 0, out(r)
    site = tmp_path / "site"
    with zipfile.ZipFile(legit_wheel) as zf:
        zf.extractall(site)
    r = py("import sys, cutecc\nsys.path.insert(0, sys.argv[1])\nfrom cutecc.errors import CuteccError\n"
           "try:\n    cutecc.load(package='trustkernels', arch='sm_90a', trusted_keys=[sys.argv[2]])\n"
           "    print('LOADED')\nexcept CuteccError as e:\n    print('REFUSED', e)\n",
           site, tmp_path / "ci.pub")
    assert "REFUSED" in r.stdout and "sign" in r.stdout.lower(), out(r)
    shutil.rmtree(site)
