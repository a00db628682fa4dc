"""Unpack is bounded (memory, time, members) and checks each entry on its own.

Seen: `cutecc unpack` read every regular member of an archive into memory before looking at
it: a small archive holding a 1 GiB member (gz, xz, a sparse tar member, a zip) costs
over 1 GB; 200,000 members cost 160 MB and are accepted. A malformed file record aborts
the whole unpack with AttributeError; an entry whose meta.json disagrees with its key
inputs, or lists extra files, lands.

Each bomb is a genuine pack with one thing changed (bombs.py), so a bounded,
per-entry unpack refuses that thing (exit 1, one line per refusal) and imports the other
ten entries. Peak memory (ru_maxrss of the unpack process) must stay under
$CUTECC_TEST_UNPACK_MAX_RSS_MB (default 128; a genuine 11-entry pack peaks at 40 MB today).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from . import bombs
from .conftest import (
    CLI,
    LIB,
    Cache,
    cli,
    compute_key,
    one_line_error,
    pack_meta,
    read_tar,
    record,
    run_measured,
    set_pack_meta,
    unpack_cmd,
    write_tar,
)

pytestmark = pytest.mark.usefixtures("dsl")
MAX_RSS_MB = int(os.environ.get("CUTECC_TEST_UNPACK_MAX_RSS_MB", "128"))
MAX_SECONDS = float(os.environ.get("CUTECC_TEST_UNPACK_MAX_SECONDS", "30"))


@pytest.fixture(scope="session")
def bomb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bombs")


@pytest.fixture(scope="session")
def bomb(bomb_dir: Path, legit_tar: Path, legit_wheel: Path):
    """bomb(name) -> the archive, built on first use (1-4 s each)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            legit = read_tar(legit_tar)
            made[name] = {
                "gz-1GiB": lambda: bombs.tar_with_big_member(legit, bomb_dir / "gz.tar.gz", "w:gz"),
                "xz-1GiB": lambda: bombs.tar_with_big_member(legit, bomb_dir / "xz.tar.xz", "w:xz"),
                "sparse-1GiB": lambda: bombs.tar_with_sparse_member(legit, bomb_dir / "sparse.tar.gz"),
                "zip-1GiB": lambda: bombs.zip_with_big_member(legit_wheel, bomb_dir / "bomb.whl"),
                "members-200k": lambda: bombs.tar_with_many_members(legit, bomb_dir / "many.tar.gz"),
                "reversed+1GiB-pad": lambda: bombs.tar_reversed_with_pad(legit, bomb_dir / "rev.tar.gz"),
            }[name]()
        return made[name]

    return get


@pytest.mark.parametrize("name", ["gz-1GiB", "xz-1GiB", "sparse-1GiB", "zip-1GiB"])
def test_a_1gib_member_is_refused_in_bounded_memory_and_the_rest_land(bomb, name: str,
                                                                      tmp_path: Path) -> None:
    """A member over the size cap refuses its entry without being read whole;
    the ten other entries land; peak RSS stays under the bound."""
    archive = bomb(name)
    code, text, rss_kb = run_measured([*CLI, *unpack_cmd(archive, tmp_path / "cache")])
    assert "Traceback" not in text, text[-2000:]
    assert rss_kb // 1024 <= MAX_RSS_MB, (
        f"unpack of {name} ({archive.stat().st_size // 1024} KB) peaked at {rss_kb // 1024} MB "
        f"(bound {MAX_RSS_MB} MB)")
    assert code == 1 and "10 imported" in text, text[-2000:]


def test_an_archive_of_200000_members_is_refused_in_bounded_memory(bomb, tmp_path: Path) -> None:
    """A member-count cap refuses the archive (exit 1 or 2, one line), early."""
    archive = bomb("members-200k")
    code, text, rss_kb = run_measured([*CLI, *unpack_cmd(archive, tmp_path / "cache")])
    assert "Traceback" not in text, text[-2000:]
    assert code in (1, 2), f"accepted an archive of 200,011 members (peak {rss_kb // 1024} MB): {text[-500:]}"
    assert "member" in text.lower(), text[-2000:]
    assert not list((tmp_path / "cache").glob("entries/*/*")), "entries landed"
    assert rss_kb // 1024 <= MAX_RSS_MB, f"peaked at {rss_kb // 1024} MB"


def _unpack_edited(legit_tar: Path, tmp_path: Path, key: str, edit) -> tuple:
    files = read_tar(legit_tar)
    edit(files)
    archive = write_tar(tmp_path / "edited.tar.gz", files)
    r = cli(*unpack_cmd(archive, tmp_path / "cache"))
    return r, tmp_path / "cache" / "entries" / key[:2] / key


def test_a_malformed_file_record_refuses_only_that_entry(built: Cache, legit_tar: Path,
                                                         tmp_path: Path) -> None:
    """`"files": {"kernel.so": 5}` in one entry's meta.json refuses that entry by
    name (exit 1, no AttributeError traceback); the ten others land, as the README says."""
    key = built.key("axpy")

    def edit(files):
        meta = pack_meta(files, key)
        meta["files"][LIB] = 5
        set_pack_meta(files, key, meta)

    r, landed = _unpack_edited(legit_tar, tmp_path, key, edit)
    err = one_line_error(r, (1,))
    assert key[:12] in err, err
    assert "10 imported" in r.stdout, r.stdout
    assert not landed.exists()


def test_an_entry_whose_meta_json_disagrees_with_its_key_inputs_is_refused(built: Cache,
                                                                           legit_tar: Path,
                                                                           tmp_path: Path) -> None:
    """The contract the runtime acts on (`args`) edited, key_inputs left alone
    (so the key still checks): the entry is refused before it lands."""
    key = built.key("mul", "float32")

    def edit(files):
        meta = pack_meta(files, key)
        meta["args"][1]["dtype"] = "float16"
        set_pack_meta(files, key, meta)

    r, landed = _unpack_edited(legit_tar, tmp_path, key, edit)
    assert not landed.exists(), f"an entry whose contract disagrees with its key landed: {r.stdout}"
    err = one_line_error(r, (1,))
    assert key[:12] in err, err


def test_an_entry_listing_extra_files_is_refused(built: Cache, legit_tar: Path,
                                                 tmp_path: Path) -> None:
    """An entry carrying a `payload.sh` it lists in meta.json (with the right
    hash) is not what a build publishes: refused, and the file never lands."""
    key = built.key("axpy")
    payload = b"#!/bin/sh\necho owned\n"

    def edit(files):
        files[f"_cutecc/entries/{key[:2]}/{key}/payload.sh"] = payload
        meta = pack_meta(files, key)
        meta["files"]["payload.sh"] = record(payload)
        set_pack_meta(files, key, meta)

    r, landed = _unpack_edited(legit_tar, tmp_path, key, edit)
    assert not (landed / "payload.sh").exists(), f"payload.sh landed in the cache: {r.stdout}"
    err = one_line_error(r, (1,))
    assert key[:12] in err, err


def test_members_out_of_order_behind_a_large_pad_unpack_in_bounded_time(bomb, tmp_path: Path) -> None:
    """Time, not memory: a 1 GiB member of zeros first, then the pack's members in
    reverse order (5 MB). A reader that lists the members, then seeks back to each one in name
    order, re-inflates the pad per member (an 11-entry pack: 89 s on 0602d35; 25,000 entries
    behind a 4 GiB pad: days). One forward pass (tarfile "r|*", staging each entry) costs one
    inflate; refusing out-of-order members is fine too. Bound: $CUTECC_TEST_UNPACK_MAX_SECONDS (30)."""
    archive = bomb("reversed+1GiB-pad")
    t0 = time.monotonic()
    code, text, rss_kb = run_measured([*CLI, *unpack_cmd(archive, tmp_path / "cache")],
                                      timeout=MAX_SECONDS)
    took = time.monotonic() - t0
    assert code != -9, f"unpack of a {archive.stat().st_size // 1024} KB archive ran over {MAX_SECONDS:.0f} s"
    assert "Traceback" not in text, text[-2000:]
    assert rss_kb // 1024 <= MAX_RSS_MB, f"peaked at {rss_kb // 1024} MB in {took:.1f} s"
    assert code in (1, 2), text[-1000:]  # the pad is no part of a pack: refused


@pytest.fixture(scope="session")
def big_pack(built: Cache, legit_tar: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The genuine pack plus 300 fabricated, valid entries (axpy's contract and lock line
    under kernel names k0000..k0299, each a 1 MB random library): a 300 MB, 311-entry pack
    in cutecc's own member order."""
    import copy
    import random

    files = read_tar(legit_tar)
    lock = json.loads(files["_cutecc/kernels.lock"])
    line0 = next(e for e in lock["entries"] if e["kernel"] == "axpy")
    meta0 = pack_meta(files, line0["key"])
    rng = random.Random(11)
    for i in range(300):
        lib, name = rng.randbytes(1 << 20), f"k{i:04d}"
        meta = copy.deepcopy(meta0)
        meta["kernel"] = meta["key_inputs"]["kernel"] = name
        key = compute_key(meta["key_inputs"])
        meta.update(key=key, files={LIB: record(lib)})
        files[f"_cutecc/entries/{key[:2]}/{key}/{LIB}"] = lib
        set_pack_meta(files, key, meta)
        lock["entries"].append({**line0, "kernel": name, "key": key, **record(lib)})
    lock["entries"].sort(key=lambda e: (e["kernel"], e["variant"], e["arch"]))
    files["_cutecc/kernels.lock"] = json.dumps(lock, indent=1).encode()
    return write_tar(tmp_path_factory.mktemp("big") / "big.tar.gz", files)


def test_a_pack_of_311_entries_unpacks_in_linear_time_and_bounded_memory(big_pack: Path,
                                                                         tmp_path: Path) -> None:
    """Bounded, not quadratic: a genuine-looking 311-entry pack (300 MB). Reading
    all of it into memory (485460e) costs its size; reading each entry by seeking back into a
    .tar.gz (0602d35: meta.json is read before kernel.so, which precedes it in the archive)
    re-inflates the archive from the start for every entry: time grows with N^2 (200 entries
    25 s, 100 entries 8 s on this host). Bound: $CUTECC_TEST_UNPACK_MAX_SECONDS (30)."""
    t0 = time.monotonic()
    code, text, rss_kb = run_measured([*CLI, *unpack_cmd(big_pack, tmp_path / "cache")],
                                      timeout=MAX_SECONDS)
    took = time.monotonic() - t0
    assert code != -9, f"unpack of a 311-entry pack ran over {MAX_SECONDS:.0f} s"
    assert "Traceback" not in text, text[-2000:]
    assert code == 0 and "311 imported" in text, text[-1500:]
    assert rss_kb // 1024 <= MAX_RSS_MB, f"peaked at {rss_kb // 1024} MB (in {took:.1f} s)"
