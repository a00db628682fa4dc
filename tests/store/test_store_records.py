"""The store's own record files (index records, generations, manifest records, composites,
stats.json, misses.json) as typed, frozen records, held to the bytes the dict writers wrote
before them: tests/store/data/records/ was written by that code (the same calls as here, at
a fixed time), so the cache's bytes and format are unchanged."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

import cutecc.store.misses as misses_module
import cutecc.store.writer as writer_module
from cutecc.contract.fallbacks import FallbackRef
from cutecc.entry.meta import EntryMeta
from cutecc.store.build_records import CompositeRecord, GenerationRecord, ManifestRecord
from cutecc.store.index_record import IndexRecord
from cutecc.store.stats import Stats
from cutecc.store.view import StoreView
from cutecc.store.writer import Store

DATA = Path(__file__).parent / "data"
RECORDS = DATA / "records"
ENTRY_META = Path(__file__).parents[1] / "entry" / "data" / "entry_meta.json"  # a real build's meta.json
T = "2026-11-27T04:00:00+00:00"  # the fixtures' time
K1 = "1" * 64
MANIFEST = Path("/w/kernels.toml")
FALLBACKS = {"fallback": {"ref": "pkg.mod:fn", "sha256": "ab" * 32},
             "fallback_torch": {"ref": "pkg.t:fn", "sha256": "cd" * 32}}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setattr(writer_module, "now_iso", lambda: T)
    s = Store(tmp_path / "c")
    s.ensure()
    return s


def _meta() -> dict:
    return json.loads(ENTRY_META.read_bytes())


@pytest.mark.parametrize("name, key, stamp", [
    ("index_record", None, [5334, 1234567, 1764216000123456789]),
    ("index_record_unstamped", None, None),
    ("index_record_partial", "0" * 64, [1, 2, 3]),
])
def test_an_index_record_is_written_as_the_dict_writer_wrote_it(name: str, key: str | None,
                                                                stamp: list[int] | None) -> None:
    data = (RECORDS / name).read_bytes()
    meta = _meta()
    if key:  # partial: written from metadata that recorded no library (no longer indexed)
        rec = IndexRecord(key, "k", None, None, None, (stamp[0], stamp[1], stamp[2]) if stamp else None)
    else:
        key = meta["key"]
        rec = IndexRecord.of_meta(key, EntryMeta.parse(meta, key), stamp)
    assert rec.dumps() == data and rec.to_json() == json.loads(data)
    back = IndexRecord.loads(data, rec.kernel, key)
    if rec.facts is None:  # a partial record is not whole: the build reads meta.json
        assert back is None
    else:
        assert back == rec and back.facts is not None
        assert back.facts.library == "kernel.so" and back.facts.runtime_key == meta["runtime"]["key"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.key = "x"  # type: ignore[misc]


def test_the_store_indexes_with_the_stamp_of_the_meta_file(store: Store, tmp_path: Path) -> None:
    meta = _meta()
    f = tmp_path / "meta.json"
    f.write_bytes(ENTRY_META.read_bytes())
    rec = EntryMeta.parse(meta, meta["key"])
    store.index(meta["key"], rec, f)
    data = store.layout.index_record(meta["kernel"], meta["key"]).read_bytes()
    st = os.stat(f)
    assert data == IndexRecord.of_meta(meta["key"], rec, [st.st_size, st.st_ino, st.st_ctime_ns]).dumps()
    got = StoreView(store.root).indexed_facts(meta["kernel"], meta["key"])
    assert got is not None and got.meta_stat == (st.st_size, st.st_ino, st.st_ctime_ns)


def test_generations_are_written_as_the_dict_writer_wrote_them(store: Store) -> None:
    meta = _meta()
    store.record_generation("mul_bwd", "sm_90a", [meta["key"], K1, meta["key"]], str(MANIFEST))
    store.record_generation("mul_bwd", "sm_100a", [K1], str(MANIFEST), fallbacks=FALLBACKS)
    for arch, name in (("sm_90a", "generation.json"), ("sm_100a", "generation_fallbacks.json")):
        data = (RECORDS / name).read_bytes()
        assert store.layout.generation("mul_bwd", arch).read_bytes() == data
        rec = GenerationRecord.from_json(json.loads(data))
        assert rec is not None and rec.dumps() == data and rec.built_at == T
    view = StoreView(store.root)
    assert view.generation("mul_bwd", "sm_90a") == {meta["key"], K1}
    assert view.generation_fallbacks("mul_bwd", "sm_90a") is None  # none declared
    rec = view.generation_fallbacks("mul_bwd", "sm_100a")
    assert rec is not None and rec.fallback("fallback_torch") == FallbackRef("pkg.t:fn", "cd" * 32)
    assert view.generation_manifest("mul_bwd") == MANIFEST


def test_manifest_records_are_written_as_the_dict_writer_wrote_them(store: Store) -> None:
    key = _meta()["key"]
    store.record_manifest(MANIFEST, "ef" * 32, {"mul_bwd": {"sm_90a": [K1, key, K1]},
                                                 "scale": {"sm_90a": ["2" * 64]}}, partial=False)
    path = store.layout.manifest_record(MANIFEST)
    assert path.read_bytes() == (RECORDS / "manifest.json").read_bytes()
    more = {"scale": {"sm_100a": ["3" * 64]}, "mul_bwd": {"sm_90a": [K1]}}
    store.record_manifest(MANIFEST, "ef" * 32, more, partial=True)
    data = (RECORDS / "manifest_partial.json").read_bytes()
    assert path.read_bytes() == data
    rec = StoreView(store.root).manifest_entries(MANIFEST, "ef" * 32)
    assert rec is not None and rec.dumps() == data and rec == ManifestRecord.from_json(json.loads(data))
    assert rec.kernels() == {"mul_bwd", "scale"} and rec.keys_of("scale") == {"2" * 64, "3" * 64}
    assert StoreView(store.root).manifest_entries(MANIFEST, "0" * 64) is None  # other bytes


def test_a_composite_is_written_as_the_dict_writer_wrote_it(store: Store) -> None:
    rec = CompositeRecord("both", ("k", "j"), ("x", "y"), ("out",), str(MANIFEST))
    store.record_composite(rec)
    data = (RECORDS / "composite.json").read_bytes()
    assert store.layout.composite("both").read_bytes() == data
    assert StoreView(store.root).composite("both") == rec == CompositeRecord.from_json(json.loads(data))
    assert rec.line("here").launches == ("k", "j")


def test_stats_are_written_as_the_dict_writer_wrote_them(store: Store) -> None:
    store.add_stats(hits=2, misses=1, seconds_saved=1.23456, remote_seconds=0.1 + 0.2)
    store.add_stats(hits=1, failures=1, remote_bytes_down=4096)
    data = (RECORDS / "stats.json").read_bytes()
    assert store.layout.stats().read_bytes() == data
    s = store.read_stats()
    assert s == Stats.from_json(json.loads(data)) and s.dumps() == data
    assert (s.hits, s.seconds_saved, s.remote_seconds, s.since) == (3, 1.235, 0.3, T)
    # a newer cutecc's counter is kept; a flag or a note is not a counter
    d = json.loads(data)
    d.update(newer_counter=7, flag=True, note="x")
    store.layout.stats().write_text(json.dumps(d))
    store.add_stats(hits=1)
    assert store.layout.stats().read_bytes() == (RECORDS / "stats_newer.json").read_bytes()
    assert store.read_stats().kept == {"newer_counter": 7}


def test_misses_are_written_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(misses_module, "now_iso", lambda: T)
    arrays = [("float16", (3, 64)), ("float32", ("n", 8))]
    first = misses_module.miss_of("scale", "sm_90a", arrays, {"causal": True, "eps": 0.5, "obj": object},
                                  "no built variant fits")
    misses_module.record_miss(tmp_path, first)
    misses_module.record_miss(tmp_path, misses_module.miss_of("k", "sm_100a", [("float32", (7,))], {},
                                                              "no build for sm_100a"))
    misses_module.record_miss(tmp_path, first)
    data = (RECORDS / "misses.json").read_bytes()
    assert (tmp_path / "misses.json").read_bytes() == data
    assert misses_module.MissesFile.from_json(json.loads(data)).dumps() == data
    got = misses_module.read_misses(tmp_path)
    assert [(m.kernel, m.count) for m in got] == [("scale", 2), ("k", 1)]
