"""The cache store: atomic publish, one build per key across processes, crash leftovers."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from meta_records import entry_record, runtime_record

from cutecc.atomic import atomic_write
from cutecc.entry.meta import EntryMeta, RuntimeMeta
from cutecc.entry.rules import ENTRY_FORMAT, META, RUNTIME_ENTRY_FORMAT, STORE_FORMAT
from cutecc.errors import CuteccError
from cutecc.store import Store, default_cache_dir
from cutecc.store.quarantine_note import QuarantineNote

KEY = "ab" * 32


def _write_lib(staging: Path, payload: bytes = b"library bytes") -> EntryMeta:
    (staging / "kernel.so").write_bytes(payload)
    return entry_record({"kernel": "k", "variant": "default", "arch": "sm_90a"})


def test_publish_writes_complete_entry_with_hashes(tmp_path: Path) -> None:
    store = Store(tmp_path / "c")
    store.ensure()
    entry, built = store.publish(KEY, _write_lib)
    assert built
    assert entry.path == tmp_path / "c" / "entries" / "ab" / KEY
    meta = json.loads((entry.path / META).read_text())
    assert meta["key"] == KEY and meta["format"] == ENTRY_FORMAT
    assert store.kernel_names() == ["k"] and store.kernel_keys("k") == [KEY]  # indexed
    rec = meta["files"]["kernel.so"]
    import hashlib
    assert rec == {"sha256": hashlib.sha256(b"library bytes").hexdigest(), "size": 13}
    assert list((tmp_path / "c" / "tmp").iterdir()) == []
    # The store explains itself.
    assert "cutecc" in (tmp_path / "c" / "README").read_text()
    assert (tmp_path / "c" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172")


def test_publish_second_time_is_a_hit_and_builds_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    store.publish(KEY, _write_lib)
    calls = []
    entry, built = store.publish(KEY, lambda s: calls.append(s) or _write_lib(s))
    assert not built and calls == [] and entry.doc["kernel"] == "k"


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()

    def boom(staging: Path) -> EntryMeta:
        (staging / "kernel.so").write_bytes(b"half")
        raise RuntimeError("compile failed")

    with pytest.raises(RuntimeError, match="compile failed"):
        store.publish(KEY, boom)
    assert not store.has(KEY)
    assert not store.layout.entry(KEY).exists()
    assert list(store.tmp_dir.iterdir()) == []


def _racer(root: str, key: str, counter: str) -> None:
    store = Store(root)
    store.ensure()

    def slow(staging: Path) -> EntryMeta:
        with open(counter, "a") as f:
            f.write("x")
        time.sleep(0.3)
        return _write_lib(staging)

    store.publish(key, slow)


def test_concurrent_publish_builds_each_key_once(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    counter.write_text("")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_racer, args=(str(tmp_path / "c"), KEY, str(counter)))
             for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counter.read_text() == "x"
    assert Store(tmp_path / "c").has(KEY)


def test_sweep_removes_only_unlocked_leftovers(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    stale = store.tmp_dir / f"{KEY}.dead01"
    stale.mkdir()
    (stale / "kernel.so").write_bytes(b"partial")
    live_key = "cd" * 32
    live = store.tmp_dir / f"{live_key}.live01"
    live.mkdir()
    with store.lock(live_key):
        assert store.sweep_tmp() == 1
    assert not stale.exists() and live.exists()


def test_store_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "format").write_text("99\n")
    with pytest.raises(CuteccError, match="cache format '99'"):
        Store(tmp_path).ensure()


def test_default_dir_env_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUTECC_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    monkeypatch.delenv("CUTECC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cutecc" / f"v{STORE_FORMAT}"


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert [x.name for x in tmp_path.iterdir()] == ["f"]


def test_entries_skip_unreadable_metadata(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    store.publish(KEY, _write_lib)
    bad = store.layout.entry("ef" * 32)
    bad.mkdir(parents=True)
    (bad / META).write_text("{not json")
    assert [e.key for e in store.entries()] == [KEY]
    os.chmod(tmp_path, 0o755)


# Lifecycle: use records, removal, quarantine, stats ---------------------------------


def test_touch_used_creates_then_updates_and_never_fails(tmp_path: Path) -> None:
    from cutecc.entry.rules import USED
    from cutecc.store import touch_used

    store = Store(tmp_path)
    store.ensure()
    entry, _ = store.publish(KEY, _write_lib)
    built_at = entry.last_used()
    touch_used(entry.path)
    os.utime(entry.path / USED, (built_at + 500, built_at + 500))
    assert entry.last_used() == built_at + 500  # later of `used` and built_at
    touch_used(entry.path)
    assert abs((entry.path / USED).stat().st_mtime - time.time()) < 5  # set back to now
    touch_used(tmp_path / "gone")  # a removed entry: silently nothing
    assert not (tmp_path / "gone").exists()
    assert store.get(KEY).doc["files"].keys() == {"kernel.so"}


def test_remove_renames_out_then_deletes_and_respects_the_lock(tmp_path: Path) -> None:
    from cutecc.locks import Busy

    store = Store(tmp_path)
    store.ensure()
    store.publish(KEY, _write_lib)
    with store.lock(KEY), pytest.raises(Busy):
        store.remove(KEY, timeout=0.1)
    assert store.has(KEY)
    assert store.remove(KEY) is True
    assert not store.layout.entry(KEY).exists() and list(store.tmp_dir.iterdir()) == []
    assert store.remove(KEY) is False


def test_quarantine_moves_a_bad_entry_and_keeps_one_found_healthy(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    store.publish(KEY, _write_lib)
    assert store.quarantine(KEY, "looked bad", still_bad=lambda d: False) is None
    assert store.has(KEY)
    dest = store.quarantine(KEY, "altered")
    assert dest is not None and dest.parent == store.quarantine_dir and dest.name.startswith(KEY + ".")
    assert json.loads((dest / "why.json").read_text())["reason"] == "altered"
    note = QuarantineNote.read(dest)  # the note, read back as its record
    assert note is not None and (note.key, note.reason) == (KEY, "altered")
    assert QuarantineNote.loads(note.dumps()) == note and QuarantineNote.loads(b"{}") is None
    assert not store.has(KEY) and (dest / "kernel.so").read_bytes() == b"library bytes"


def test_match_and_require(tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="no cutecc cache here"):
        Store(tmp_path / "none").require()
    store = Store(tmp_path)
    store.ensure()
    other = "ab" + "0" * 62
    store.publish(KEY, _write_lib)
    store.publish(other, _write_lib)
    assert store.match("a") == store.match("ab") == sorted([KEY, other])
    assert store.match("aba") == [KEY] and store.match("c") == []


def test_stats_add_up_and_survive_a_corrupt_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    store.add_stats(hits=2, misses=1, seconds_saved=1.25)
    store.add_stats(hits=1, failures=1)
    s = store.read_stats()
    assert (s.hits, s.misses, s.failures, s.seconds_saved) == (3, 1, 1, 1.25)
    (tmp_path / "stats.json").write_text("{torn")
    assert store.read_stats().hits == 0
    store.add_stats(hits=1)
    assert json.loads((tmp_path / "stats.json").read_text())["hits"] == 1


# The index and runtime libraries ------------------------------------------------------------


def test_the_index_follows_publish_remove_and_quarantine(tmp_path: Path) -> None:
    store = Store(tmp_path / "c")
    store.ensure()
    other = "cd" * 32
    store.publish(KEY, _write_lib)
    store.publish(other, _write_lib)
    assert store.kernel_names() == ["k"] and store.kernel_keys("k") == sorted([KEY, other])
    assert store.remove(KEY)
    assert store.kernel_keys("k") == [other]
    assert store.quarantine(other, "test") is not None
    assert store.kernel_keys("k") == [] and store.kernel_names() == []  # its directory went too
    with pytest.raises(CuteccError, match="not an identifier"):
        store.publish(KEY, lambda d: dataclasses.replace(_write_lib(d), kernel="../x"))
    assert not store.has(KEY) and list(store.tmp_dir.iterdir()) == []


def test_a_killed_publish_leaves_a_record_the_next_sweep_takes(tmp_path: Path) -> None:
    store = Store(tmp_path / "c")
    store.ensure()
    staging = store.tmp_dir / f"{KEY}.dead"  # killed after its record, before the rename
    staging.mkdir()
    atomic_write(staging / META, json.dumps({"kernel": "k"}).encode())
    store.index(KEY, _write_lib(staging), staging / META)
    assert store.kernel_keys("k") == [KEY] and store.get(KEY) is None  # readers skip it
    assert store.sweep_tmp() == 1
    assert store.kernel_names() == [] and not staging.exists()


def test_runtime_libraries_are_entries_of_their_own(tmp_path: Path) -> None:
    store = Store(tmp_path / "c")
    store.ensure()

    def runtime(staging: Path) -> RuntimeMeta:
        (staging / "libcutecc_rt_abababababababab.so").write_bytes(b"rt")
        return runtime_record({"library": "libcutecc_rt_abababababababab.so"})

    rt, built = store.publish(KEY, runtime, runtime=True)
    assert built and rt.path == store.runtimes_dir / "ab" / KEY and rt.doc["format"] == RUNTIME_ENTRY_FORMAT
    assert store.get(KEY) is None and store.kernel_names() == []  # not a kernel entry, not indexed
    assert [e.key for e in store.runtimes()] == [KEY] and store.get_runtime(KEY).doc == rt.doc
    assert store.remove(KEY, runtime=True) and store.get_runtime(KEY) is None


def test_an_older_store_format_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "format").write_text("1\n")
    with pytest.raises(CuteccError, match="an older cutecc's.*older artifact format.*remove it"):
        Store(tmp_path).require()
