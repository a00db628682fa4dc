"""Hostile archives: generated mutations of a real, signed pack, as tarballs and
wheels, each unpacked into a fresh cache. Whatever the mutation, `unpack` ends in a report
or a CuteccError (never another exception), writes nothing outside the cache, never
imports an entry the signed lock does not vouch for when a trusted key is given, leaves
only whole, verifiable entries, and its memory stays bounded.

CI runs `soak(150, 1000)` archives of each format; `CUTECC_SOAK=1` runs 1,000 of each.
"""

from __future__ import annotations

import io
import json
import random
import resource
import tarfile
import zipfile
from pathlib import Path

import pytest

from cutecc.commands.unpack import unpack
from cutecc.commands.verify import BAD, check_entry
from cutecc.entry.rules import META, compute_key
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import LOCK_NAME, lock_for
from cutecc.lock.signing import keygen, read_private_key, sign
from cutecc.runtime.package import PACK_DIR
from cutecc.ship.archive import Limits, tar_bytes

from .conftest import SEED, Toy, soak

LIMITS = Limits(members=400, member_bytes=4 << 20, total_bytes=64 << 20)


@pytest.fixture(scope="module")
def legit(toy8: Toy, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A signed pack's `_cutecc/` tree of the toy cache, and the keys."""
    base = tmp_path_factory.mktemp("hostile")
    store = toy8.store
    chosen = sorted(store.entries(), key=lambda e: e.key)[:3]  # small archives: fast rounds
    lock = lock_for([(e.doc["kernel"], e.doc["variant"], e.doc["arch"], e.key) for e in chosen], store)
    files = {"format": b"1\n", LOCK_NAME: lock.dumps()}
    for e in chosen:
        base_dir = f"entries/{e.key[:2]}/{e.key}"
        files[f"{base_dir}/{META}"] = (e.path / META).read_bytes()
        files[f"{base_dir}/kernel.so"] = (e.path / "kernel.so").read_bytes()
    private, public = keygen(base / "ci")
    files[LOCK_NAME + ".sig"] = sign(files[LOCK_NAME], read_private_key(private), "lock")
    return {"files": files, "public": public, "lock": lock, "base": base}


def _mutate(files: dict[str, bytes], rng: random.Random, private_other: Path) -> tuple[str, dict, list]:
    """One random mutation: (its name, the new tree, extra raw tar members to add)."""
    f = dict(files)
    extra: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = []
    keys = sorted({n.split("/")[2] for n in f if n.startswith("entries/")})
    key = rng.choice(keys)
    base = f"entries/{key[:2]}/{key}"
    kind = rng.choice(["flip-library", "flip-meta", "swap-library", "self-consistent", "deep-json",
                       "garbage-meta", "record-type", "extra-file", "listed-extra", "traversal",
                       "absolute", "wrong-shard", "lock-garbage", "lock-duplicate", "drop-sig",
                       "other-signer", "symlink", "hardlink", "fifo", "huge-declared",
                       "many-members", "drop-meta", "unknown-top", "format"])
    meta = json.loads(f[f"{base}/{META}"])
    if kind == "flip-library":
        data = bytearray(f[f"{base}/kernel.so"])
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        f[f"{base}/kernel.so"] = bytes(data)
    elif kind == "flip-meta":
        data = bytearray(f[f"{base}/{META}"])
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(7)
        f[f"{base}/{META}"] = bytes(data)
    elif kind == "swap-library":
        other = rng.choice([k for k in keys if k != key])
        f[f"{base}/kernel.so"] = f[f"entries/{other[:2]}/{other}/kernel.so"]
    elif kind == "self-consistent":  # another library, meta.json and the pack's lock rewritten
        import hashlib

        evil = f[f"{base}/kernel.so"] + b"\0planted"
        meta["files"]["kernel.so"] = {"sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)}
        f[f"{base}/kernel.so"] = evil
        f[f"{base}/{META}"] = json.dumps(meta).encode()
        lock = json.loads(f[LOCK_NAME])
        for e in lock["entries"]:
            if e["key"] == key:
                e["sha256"], e["size"] = meta["files"]["kernel.so"]["sha256"], len(evil)
        f[LOCK_NAME] = json.dumps(lock).encode()
    elif kind == "deep-json":
        f[f"{base}/{META}"] = b"[" * 1100 + b"]" * 1100
    elif kind == "garbage-meta":
        f[f"{base}/{META}"] = rng.randbytes(rng.randrange(1, 400))
    elif kind == "record-type":
        meta["files"]["kernel.so"] = rng.choice([5, None, "x", [], {"sha256": 1, "size": "2"}])
        f[f"{base}/{META}"] = json.dumps(meta).encode()
    elif kind == "extra-file":
        f[f"{base}/payload.sh"] = b"#!/bin/sh\necho pwned\n"
    elif kind == "listed-extra":
        import hashlib

        f[f"{base}/payload.sh"] = b"echo pwned\n"
        meta["files"]["payload.sh"] = {"sha256": hashlib.sha256(b"echo pwned\n").hexdigest(), "size": 11}
        f[f"{base}/{META}"] = json.dumps(meta).encode()
    elif kind == "traversal":
        f[f"entries/{key[:2]}/../../../../escaped-{rng.randrange(99)}"] = b"x"
    elif kind == "absolute":
        extra.append((tarfile.TarInfo(f"/tmp/cutecc-escaped-{rng.randrange(99)}"), b"x"))
    elif kind == "wrong-shard":
        f[f"entries/zz/{key}/{META}"] = f.pop(f"{base}/{META}")
        f[f"entries/zz/{key}/kernel.so"] = f.pop(f"{base}/kernel.so")
    elif kind == "lock-garbage":
        f[LOCK_NAME] = rng.choice([b"{", b"[]", b'{"format": 3, "entries": 7}', rng.randbytes(50)])
    elif kind == "lock-duplicate":
        lock = json.loads(f[LOCK_NAME])
        lock["entries"].append(dict(lock["entries"][0], kernel="other"))
        f[LOCK_NAME] = json.dumps(lock).encode()
    elif kind == "drop-sig":
        f.pop(LOCK_NAME + ".sig")
    elif kind == "other-signer":
        f[LOCK_NAME + ".sig"] = sign(f[LOCK_NAME], read_private_key(private_other), "lock")
    elif kind in ("symlink", "hardlink"):
        t = tarfile.TarInfo(f"{PACK_DIR}/{base}/kernel.so" if rng.random() < 0.5 else f"{PACK_DIR}/link")
        t.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
        t.linkname = "/etc/passwd"
        f.pop(f"{base}/kernel.so", None)
        extra.append(t)
    elif kind == "fifo":
        t = tarfile.TarInfo(f"{PACK_DIR}/{base}/kernel.so")
        t.type = tarfile.FIFOTYPE
        f.pop(f"{base}/kernel.so")
        extra.append(t)
    elif kind == "huge-declared":
        f[f"{base}/kernel.so"] = b"\0" * (LIMITS.member_bytes + 1)
    elif kind == "many-members":
        for i in range(LIMITS.members + 1):
            f[f"junk/{i}"] = b""
    elif kind == "drop-meta":
        f.pop(f"{base}/{META}")
    elif kind == "unknown-top":
        f["../outside"] = b"x"
    elif kind == "format":
        f["format"] = rng.choice([b"2\n", b"", rng.randbytes(10)])
    return kind, f, extra


def _write(path: Path, fmt: str, files: dict[str, bytes], extra: list, compress: bool) -> None:
    """The tree as a wheel-shaped zip or a tarball (compressed or not: both are read)."""
    tree = {f"{PACK_DIR}/{k}": v for k, v in files.items()}
    if fmt == "wheel":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
            for n, d in sorted(tree.items()):
                zf.writestr(f"k/{n}", d)
            for item in extra:
                info = item[0] if isinstance(item, tuple) else item
                zf.writestr(info.name.lstrip("/"), item[1] if isinstance(item, tuple) else b"")
        return
    if not extra and compress:
        path.write_bytes(tar_bytes(tree))
        return
    with tarfile.open(path, "w:gz" if compress else "w") as tf:
        for n in sorted(tree):
            ti = tarfile.TarInfo(n)
            ti.size = len(tree[n])
            tf.addfile(ti, io.BytesIO(tree[n]))
        for item in extra:
            if isinstance(item, tuple):
                item[0].size = len(item[1])
                tf.addfile(item[0], io.BytesIO(item[1]))
            else:
                tf.addfile(item)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("fmt", ["tar", "wheel"])
def test_hostile_archives_never_land_unverified_bytes(legit: dict, fmt: str, tmp_path: Path,
                                                       tally) -> None:
    rng = random.Random(SEED + (fmt == "wheel"))
    print(f"CUTECC_FAULT_SEED={SEED}")
    other_private, _ = keygen(tmp_path / "mallory")
    work = tmp_path / "w"
    work.mkdir()
    sentinel = tmp_path / "outside"
    sentinel.mkdir()
    (sentinel / "keep").write_text("untouched")
    before_tmp = set(Path("/tmp").iterdir())
    locked = {e.key: e for e in legit["lock"].entries}
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kinds: dict[str, int] = {}
    for i in range(soak(150, 1000)):
        kind, files, extra = _mutate(legit["files"], rng, other_private)
        kinds[kind] = kinds.get(kind, 0) + 1
        archive = work / f"a{i}.{'whl' if fmt == 'wheel' else 'tar.gz'}"
        _write(archive, fmt, files, extra, compress=rng.random() < 0.1)
        cache = work / f"c{i}"
        signed = rng.random() < 0.7  # the deployer's way; else opted out, checks still hold
        try:
            report = unpack(archive, cache, limits=LIMITS,
                            trusted_keys=[legit["public"]] if signed else None,
                            allow_unsigned=not signed)
            imported = report.imported + report.present
        except CuteccError:
            imported = []
        # Every entry in the cache is whole and matches its own metadata; with a trusted key,
        # exactly what the signed lock vouches for.
        for d in (cache / "entries").glob("*/*"):
            assert not [p for p in check_entry(d, d.name) if p.kind in BAD], (kind, i)
            meta = json.loads((d / META).read_text())
            assert compute_key(meta["key_inputs"]) == d.name, (kind, i)
            if signed:
                sha = meta["files"]["kernel.so"]["sha256"]
                assert d.name in locked and locked[d.name].pin.sha256 == sha, (kind, i)
        assert len(imported) == len(list((cache / "entries").glob("*/*"))) or not imported, (kind, i)
        archive.unlink()
    assert _tree(sentinel) == {"keep"} and (sentinel / "keep").read_text() == "untouched"
    assert not [p for p in set(Path("/tmp").iterdir()) - before_tmp if "escaped" in p.name]
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path.parent / "outside").exists()
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) // 1024
    assert grew_mb < 256, f"unpacking grew the process by {grew_mb} MB"
    tally.add("hostile archives", **{f"{fmt}_archives": sum(kinds.values()),
                                    f"{fmt}_kinds": len(kinds)})
    tally.peak("hostile archives", f"{fmt}_rss_growth_mb", grew_mb)
