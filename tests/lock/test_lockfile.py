"""`kernels.lock`: written by real builds, deterministic, and honoured by `cutecc.load(lock=)`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import Toy, opts, run_cli, toy_manifest, write_toy_project

from cutecc.contract.pinned import Pin
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import LOCK_FORMAT, Lock, LockEntry, read_lock, write_lock
from cutecc.store import Store

pytestmark = pytest.mark.usefixtures("dsl")


def make_project(root: Path, text: str) -> Path:
    """The toy kernel package under `root`, with `text` as its kernels.toml."""
    manifest = write_toy_project(root)
    manifest.write_text(text)
    return manifest


@pytest.fixture(scope="module")
def toy(toy_cache: Toy, tmp_path_factory: pytest.TempPathFactory) -> Toy:
    """The session's toy build (threads=64 and 128, its lock written by that build), copied
    into a cache shared by the module."""
    return toy_cache.copy(tmp_path_factory.mktemp("lock"))


def sibling(toy: Toy, tmp_path: Path, text: str | None = None) -> Path:
    """Another project with the toy's sources (so the same keys), sharing its cache."""
    return make_project(tmp_path / "proj", text if text is not None else toy_manifest())


def test_build_locks_every_entry_with_its_library_hash_one_per_line(toy: Toy) -> None:
    data = toy.lock.read_bytes()
    doc = json.loads(data)
    assert doc["format"] == LOCK_FORMAT and set(doc) == {"format", "entries", "environment"}
    assert "nvidia-cutlass-dsl" in doc["environment"]["distributions"]
    rows = doc["entries"]
    assert [(r["kernel"], r["variant"], r["arch"]) for r in rows] == sorted(
        [("scale", "threads=128", "sm_90a"), ("scale", "threads=64", "sm_90a")])
    store = Store(toy.cache)
    for r in rows:
        rec = store.get(r["key"]).doc["files"]["kernel.so"]
        assert (r["library"], r["sha256"], r["size"]) == ("kernel.so", rec["sha256"], rec["size"])
    lines = data.decode().splitlines()
    assert sum('"key": ' in line for line in lines) == 2  # one line each, entries and distributions
    assert len(lines) == 7 + 5 + len(doc["environment"]["distributions"])
    assert read_lock(toy.lock).dumps() == data
    assert b"built_at" not in data and b"seconds" not in data


def test_rebuild_leaves_the_lock_byte_identical_and_unwritten(toy: Toy, tmp_path: Path) -> None:
    from cutecc.commands.build import build

    before, stat = toy.lock.read_bytes(), toy.lock.stat()
    again = build(toy.manifest, opts(cache_dir=toy.cache))
    assert again.count("cached") == 2 and not again.lock_changed
    assert toy.lock.read_bytes() == before and toy.lock.stat().st_mtime_ns == stat.st_mtime_ns
    assert again.to_json()["lock_file"] == str(toy.lock)
    # Another checkout of the same project, built into the same cache: the same bytes.
    other = sibling(toy, tmp_path)
    build(other, opts(cache_dir=toy.cache))
    assert (other.parent / "kernels.lock").read_bytes() == before


def test_the_lock_changes_exactly_where_a_key_changes(toy: Toy, tmp_path: Path) -> None:
    from cutecc.commands.build import build

    other = sibling(toy, tmp_path)
    build(other, opts(cache_dir=toy.cache))
    old = (other.parent / "kernels.lock").read_text().splitlines()
    other.write_text(toy_manifest(threads=(64, 256)))
    report = build(other, opts(cache_dir=toy.cache))
    assert report.count("built") == 1 and report.lock_changed
    new = (other.parent / "kernels.lock").read_text().splitlines()
    gone, added = set(old) - set(new), set(new) - set(old)
    assert len(gone) == len(added) == 1
    assert '"threads=128"' in gone.pop() and '"threads=256"' in added.pop()
    assert any('"threads=64"' in line for line in set(old) & set(new))


def test_no_lock_after_a_dry_run_with_no_lock_or_after_a_failure(toy: Toy, tmp_path: Path) -> None:
    from cutecc.commands.build import build

    other = sibling(toy, tmp_path)
    lock = other.parent / "kernels.lock"
    assert build(other, opts(cache_dir=toy.cache), dry_run=True).lock_file is None and not lock.exists()
    assert build(other, opts(cache_dir=toy.cache), lock=False).lock_file is None and not lock.exists()
    build(other, opts(cache_dir=toy.cache))
    before = lock.read_bytes()
    broken = toy_manifest(threads=(32,), kernels=("broken",)).split("\n", 1)[1].replace(
        'entry = "toy.ops:scale"', 'entry = "toy.ops:broken"')
    other.write_text(toy_manifest() + broken)
    report = build(other, opts(cache_dir=toy.cache))
    assert not report.ok and report.lock_file is None
    assert lock.read_bytes() == before  # the last good lock stays


def test_cli_lock_flags(toy: Toy, tmp_path: Path) -> None:
    other = sibling(toy, tmp_path)
    r = run_cli("build", str(other), "--cache-dir", str(toy.cache), "--no-lock")
    assert r.returncode == 0, r.stderr
    assert not (other.parent / "kernels.lock").exists()
    elsewhere = tmp_path / "locks" / "ci.lock"
    elsewhere.parent.mkdir()
    r = run_cli("build", str(other), "--cache-dir", str(toy.cache), "--lock-file", str(elsewhere),
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lock_file"] == str(elsewhere)
    assert elsewhere.read_bytes() == toy.lock.read_bytes()
    assert not (other.parent / "kernels.lock").exists()


def test_a_kernel_restricted_build_updates_only_its_part(toy: Toy, tmp_path: Path) -> None:
    from cutecc.commands.build import build

    other = sibling(toy, tmp_path, toy_manifest(kernels=("a", "b")))
    lock = other.parent / "kernels.lock"
    build(other, opts(cache_dir=toy.cache))
    full = lock.read_bytes()
    assert {e.kernel for e in read_lock(lock).entries} == {"a", "b"}
    assert not build(other, opts(cache_dir=toy.cache), kernels=("a",)).lock_changed
    assert lock.read_bytes() == full
    other.write_text(toy_manifest(kernels=("a",)))  # b is gone from the manifest
    assert build(other, opts(cache_dir=toy.cache), kernels=("a",)).lock_changed
    assert {e.kernel for e in read_lock(lock).entries} == {"a"}


def test_bad_lock_files_are_input_errors(tmp_path: Path) -> None:
    p = tmp_path / "kernels.lock"
    for text, msg in [("{", "not a lock file"), ('{"format": 9, "entries": []}', "lock format 9"),
                      ('{"format": 3, "entries": [{"kernel": "k"}]}', "expected the fields")]:
        p.write_text(text)
        with pytest.raises(CuteccError, match=msg) as e:
            read_lock(p)
        assert e.value.exit_code == 2
    assert write_lock(p, Lock(())) and not write_lock(p, Lock(()))
    assert read_lock(p).entries == ()


# The runtime -----------------------------------------------------------------------


def _load(cache: Path, lock: Path):
    import cutecc

    return cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)


def test_load_with_a_lock_uses_exactly_its_entries(toy: Toy, tmp_path: Path) -> None:
    full = read_lock(toy.lock)
    assert sorted(_load(toy.cache, toy.lock).scale.variants) == ["threads=128", "threads=64"]
    one = Lock(tuple(e for e in full.entries if e.variant == "threads=64"))
    write_lock(tmp_path / "one.lock", one)
    assert _load(toy.cache, tmp_path / "one.lock").scale.variants == ["threads=64"]
    ghost = LockEntry("scale", "threads=7", "sm_90a", "x86_64", "f" * 64,
                      Pin("kernel.so", "0" * 64, 1, "cutecc_kernel", None, "0" * 64, "0" * 64))
    write_lock(tmp_path / "ghost.lock", Lock((*full.entries, ghost)))
    with pytest.raises(CuteccError, match=r"1 locked entry not in the cache: scale\[threads=7\]"):
        _load(toy.cache, tmp_path / "ghost.lock")


def test_load_refuses_a_kernel_whose_library_differs_from_the_lock(toy: Toy, tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    cache = Path(shutil.copytree(toy.cache, tmp_path / "cache"))
    locked = {e["key"] for e in json.loads(toy.lock.read_text())["entries"]}
    entry = next(e for e in Store(cache).entries() if e.key in locked)  # other tests add entries
    lib = entry.path / "kernel.so"
    data = bytearray(lib.read_bytes())
    data[4096] ^= 0xFF
    lib.write_bytes(bytes(data))  # the library alone altered: caught before it is opened
    ks = _load(cache, toy.lock)
    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    with pytest.raises(CuteccError, match="SHA-256"):
        for b in ks.scale.builds:
            b.register("scale")
    # Metadata rewritten to match the altered library: the lock still refuses the kernel.
    meta = json.loads((entry.path / "meta.json").read_text())
    meta["files"]["kernel.so"]["sha256"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    (entry.path / "meta.json").write_text(json.dumps(meta))
    ks = _load(cache, toy.lock)
    assert ks.scale.builds == [] and "differs from the lock" in ks.problems[0]
    with pytest.raises(CuteccError, match="differs from the lock"):
        jax.jit(ks.scale).trace(spec).lower(lowering_platforms=("cuda",))
    with pytest.raises(CuteccError, match="differs from the lock"):
        import cutecc

        cutecc.load(cache, arch="sm_90a", lock=toy.lock, strict=True, allow_unsigned=True)
    # Without the lock, the entry's own (rewritten) record is all there is to check against.
    # (This module's other tests build sibling projects of `scale` into the cache: their
    # manifest records go, or the name, built by several manifests, would be an error.)
    shutil.rmtree(cache / "manifests", ignore_errors=True)
    assert entry.key in {b.key for b in cutecc.load(cache, arch="sm_90a").scale.builds}


def test_the_lock_pins_the_runtime_library(toy: Toy, tmp_path: Path) -> None:
    """A line holds the SHA-256 of the runtime library its kernel links against: metadata
    rewritten to name other runtime bytes is refused like another library."""
    cache = Path(shutil.copytree(toy.cache, tmp_path / "cache"))
    [rt] = list(Store(cache).runtimes())
    rows = json.loads(toy.lock.read_text())["entries"]
    assert {r["runtime"] for r in rows} == {rt.doc["files"][rt.doc["library"]]["sha256"]}
    entry = Store(cache).get(rows[0]["key"])
    meta = json.loads((entry.path / "meta.json").read_text())
    meta["runtime"]["sha256"] = "1" * 64
    (entry.path / "meta.json").write_text(json.dumps(meta))
    ks = _load(cache, toy.lock)
    assert any("runtime library SHA-256 1111111111111111... differs from the lock's" in p
               for p in ks.problems), ks.problems
