"""meta.json read once into typed, frozen records (`EntryMeta`, `RuntimeMeta`), after the
same checks as before; a damaged file is refused with the reason, never half-typed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cutecc.entry.meta import EntryMeta, RuntimeMeta
from cutecc.entry.rules import META, acted_on, meta_problem, runtime_soname
from cutecc.store.layout import entry_parts, member, member_parts, meta_parts, runtime_parts
from cutecc.store.view import StoreView


def test_an_entrys_record_is_typed_and_equals_its_file(fake_cache, add_entries) -> None:
    e, = add_entries("v1")
    got = StoreView(fake_cache.store.root).get(e.key)
    assert got is not None
    rec = got.meta
    raw = json.loads((e.path / META).read_text())
    assert (rec.key, rec.kernel, rec.variant, rec.arch, rec.symbol) == (
        e.key, "k", "v1", "sm_90a", "__tvm_ffi_fn")
    assert rec.library.name == "kernel.so"
    assert (rec.library.sha256, rec.library.size) == (raw["files"]["kernel.so"]["sha256"],
                                                       raw["files"]["kernel.so"]["size"])
    assert rec.runtime.key == fake_cache.runtime.key
    assert rec.runtime.library == runtime_soname(fake_cache.runtime.key)
    assert rec.build_seconds == 1.5 and rec.backward is None and rec.to_json() == raw
    assert got.meta is rec  # parsed once per entry read
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.kernel = "other"  # type: ignore[misc]


def test_a_runtime_record_is_typed(fake_cache) -> None:
    rt = StoreView(fake_cache.store.root).get_runtime(fake_cache.runtime.key)
    assert rt is not None
    rec = rt.runtime_meta
    assert isinstance(rec, RuntimeMeta) and rec.library.name == runtime_soname(rt.key)
    assert rec.library == next(f for f in rec.files if f.name == rec.library.name)


@pytest.mark.parametrize("damage, why", [
    (lambda m: m.update(kernel="other"), "kernel differs from key_inputs.kernel"),
    (lambda m: m["files"].pop("kernel.so"), "no file records"),
    (lambda m: m.pop("runtime"), "no runtime library record"),
    (lambda m: m.update(key="0" * 64), "records key 0000000000000000"),
])
def test_damaged_metadata_is_refused_with_the_checks_reason(fake_cache, add_entries, damage, why) -> None:
    e, = add_entries("v1")
    meta = json.loads((e.path / META).read_text())
    damage(meta)
    assert why in str(meta_problem(meta, e.key))
    with pytest.raises(ValueError, match=why):
        EntryMeta.parse(meta, e.key)
    (e.path / META).write_text(json.dumps(meta))
    got = StoreView(fake_cache.store.root).get(e.key)
    assert got is not None
    with pytest.raises(ValueError, match=why):
        got.meta  # noqa: B018


def test_a_runtime_entry_is_not_an_entry(fake_cache) -> None:
    rt = fake_cache.runtime
    with pytest.raises(ValueError, match="format"):
        EntryMeta.parse(rt.doc, rt.key)


DATA = Path(__file__).parent / "data"


def _dict_writer(meta: dict) -> bytes:
    """How the store wrote meta.json before the records were typed both ways."""
    return json.dumps(meta, indent=1, sort_keys=True).encode()


@pytest.mark.parametrize("name, cls", [("entry_meta.json", EntryMeta), ("runtime_meta.json", RuntimeMeta)])
def test_the_typed_writer_writes_the_old_dict_writers_bytes(name, cls) -> None:
    # meta.json files of a real build (the repository's kernels.toml, sm_90a), as the old
    # dict writer wrote them: read into the record and written back, byte for byte
    data = (DATA / name).read_bytes()
    meta = json.loads(data)
    rec = cls.parse(meta, meta["key"])
    assert rec.dumps() == _dict_writer(meta) == data
    assert rec.to_json() == meta
    # a record made as a build makes it (no files yet) and recorded by the store
    draft = dataclasses.replace(rec, key="", files=())
    assert draft.recorded(rec.key, tuple(reversed(rec.files))).dumps() == data


def test_a_ptx_entrys_isa_is_written_where_the_dict_writer_put_it() -> None:
    meta = json.loads((DATA / "entry_meta.json").read_bytes())
    meta["ptx_isa"] = "9.4"
    rec = EntryMeta.parse(meta, meta["key"])
    assert rec.ptx_isa == "9.4" and rec.dumps() == _dict_writer(meta)


def test_a_read_set_digest_is_written_where_the_dict_writer_put_it_and_old_entries_have_none() -> None:
    meta = json.loads((DATA / "entry_meta.json").read_bytes())
    assert EntryMeta.parse(meta, meta["key"]).read_set is None  # built before it was recorded
    meta["read_set"] = "ab" * 32
    rec = EntryMeta.parse(meta, meta["key"])
    assert rec.read_set == "ab" * 32 and rec.dumps() == _dict_writer(meta)
    meta["read_set"] = "not a digest"
    assert EntryMeta.parse(meta, meta["key"]).read_set is None


def test_the_store_publishes_a_record_as_its_bytes(fake_cache, add_entries) -> None:
    e, = add_entries("v1")
    data = (e.path / META).read_bytes()
    rec = EntryMeta.parse(json.loads(data), e.key)
    assert rec.dumps() == data == _dict_writer(e.doc)
    rt = fake_cache.runtime
    assert RuntimeMeta.parse(rt.doc, rt.key).dumps() == (rt.path / META).read_bytes()


# the fields the builder wrote as a dict literal before its record was typed
_DICT_WRITERS_FIELDS = {"kernel", "variant", "params", "arch", "platform", "entry", "args", "backward",
                        "library", "symbol", "runtime", "toolchain", "key_inputs", "sources", "artifact",
                        "built_at", "build_seconds", "files", "format", "key", "read_set"}


def test_a_real_build_writes_the_fields_and_bytes_of_the_dict_writer(toy_cache) -> None:
    metas = sorted(toy_cache.cache.glob("entries/*/*/meta.json"))
    assert metas
    for f in metas:
        data = f.read_bytes()
        meta = json.loads(data)
        assert set(meta) == _DICT_WRITERS_FIELDS, f
        assert data == _dict_writer(meta) == EntryMeta.parse(meta, f.parent.name).dumps()
    for f in toy_cache.cache.glob("runtimes/*/*/meta.json"):
        data = f.read_bytes()
        meta = json.loads(data)
        assert set(meta) == set(json.loads((DATA / "runtime_meta.json").read_bytes())), f
        assert data == _dict_writer(meta) == RuntimeMeta.parse(meta, f.parent.name).dumps()


def test_a_lock_pins_the_same_from_the_record_as_from_the_file(fake_cache, add_entries) -> None:
    e, = add_entries("v1")
    got = StoreView(fake_cache.store.root).get(e.key)
    assert got is not None and got.meta.acted_on == acted_on(got.doc)


def test_a_damaged_entry_is_still_named_by_what_it_records(fake_cache, add_entries) -> None:
    e, = add_entries("v1")
    meta = json.loads((e.path / META).read_text())
    meta.update(kernel="other", files=["not", "a", "table"])
    (e.path / META).write_text(json.dumps(meta))
    got = StoreView(fake_cache.store.root).get(e.key)
    assert got is not None
    with pytest.raises(ValueError, match="kernel differs"):
        got.meta  # noqa: B018
    r = got.recorded
    assert (r.kernel, r.variant, r.arch, r.label) == ("other", "v1", "sm_90a", "other[v1]@sm_90a")
    assert (r.files, r.size, got.size, r.runtime) == ({}, 0, 0, fake_cache.runtime.key)


def test_pack_member_names_are_one_function_both_ways() -> None:
    key = "ab" + "c" * 62
    assert member(meta_parts(entry_parts(key))) == f"entries/ab/{key}/meta.json"
    assert member_parts(member((*entry_parts(key), "kernel.so"))) == ("entries", key, "kernel.so")
    assert member_parts(member((*runtime_parts(key), "lib.so"))) == ("runtimes", key, "lib.so")
    for other in ("format", "kernels.lock", f"entries/ab/{key}", f"tmp/ab/{key}/x", f"entries/ab/{key}/x/y"):
        assert member_parts(other) is None
