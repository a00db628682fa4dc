"""Which entry the loader picks when the cache holds several for one kernel variant."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cutecc
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import compute_key
from cutecc.store import Store


def _restamp(store: Store, key: str, source: str, built_at: str) -> str:
    """Copy entry `key` as if its kernel's source had been `source`, built at `built_at`."""
    meta = json.loads((store.layout.entry(key) / "meta.json").read_text())
    meta["key_inputs"]["source"] = source
    meta["built_at"] = built_at
    new = meta["key"] = compute_key(meta["key_inputs"])
    dest = store.layout.entry(new)
    shutil.copytree(store.layout.entry(key), dest)
    (dest / "meta.json").write_text(json.dumps(meta))
    store.index(new, EntryMeta.parse(meta, new), dest / "meta.json")  # as publishing does
    return new


def test_newest_of_several_builds_of_one_variant_wins(example_cache: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(shutil.copytree(example_cache, tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # in no project: the repository's would serve its lock's entries
    # Entries made by hand belong to no recorded build generation: drop the records, as
    # in a cache from before them, where every entry of a kernel counts.
    shutil.rmtree(store.generations_dir)
    e = next(e for e in store.entries()
             if e.doc["kernel"] == "mul" and e.doc["variant"] == "dtype=float32")
    # An edited kernel leaves its old entry behind until gc. Both orders of the two
    # timestamps are tried, so the order entries are listed in cannot decide.
    a = _restamp(store, e.key, "0" * 64, "2020-01-01T00:00:00+00:00")
    b = _restamp(store, e.key, "f" * 64, "2099-01-01T00:00:00+00:00")
    for newest, oldest in ((b, a), (a, b)):
        for key, when in ((newest, "2099-01-01T00:00:00+00:00"), (oldest, "2020-01-01T00:00:00+00:00")):
            meta_file = store.layout.entry(key) / "meta.json"
            meta = json.loads(meta_file.read_text())
            meta["built_at"] = when
            meta_file.write_text(json.dumps(meta))
        ks = cutecc.load(store.root, arch="sm_90a")
        chosen = {build.variant: build.key for build in ks.mul.builds}
        assert chosen["dtype=float32"] == newest
        assert len(ks.mul.builds) == 3  # one per variant, not one per entry


def test_a_kernel_is_checked_at_first_use_only(example_cache: Path, monkeypatch) -> None:
    """Loading reads no metadata; a kernel's entries are read and checked at its first use."""
    import cutecc.entry.meta as entry_meta  # the runtime checks through EntryMeta.parse (meta_problem)

    checked: list[str] = []
    real = entry_meta.meta_problem
    monkeypatch.setattr(entry_meta, "meta_problem",
                        lambda m, key: checked.append(m["kernel"]) or real(m, key))
    ks = cutecc.load(example_cache, arch="sm_90a")
    assert checked == [] and set(ks) == {"mul", "mul_bwd", "rmsnorm", "axpy"}
    assert len(ks.mul.variants) == 3
    assert checked == ["mul"] * 3
    ks.mul  # noqa: B018  (resolved once)
    assert checked == ["mul"] * 3
    assert ks.problems == [] and sorted(set(checked)) == sorted(ks)


def test_load_reads_one_kernels_records_only(example_cache: Path, tmp_path: Path, monkeypatch) -> None:
    """Loading lists nothing and reads no metadata; a kernel's first use reads its own index
    records and entries, never another kernel's, so the cost does not grow with the cache."""
    import cutecc.store.view

    store = Store(shutil.copytree(example_cache, tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # in no project: the repository's would read its lock
    listed: list[str] = []
    read: list[str] = []
    view = cutecc.store.view.StoreView  # what the runtime reads through
    real_keys, real_meta = view.kernel_keys, cutecc.store.view.read_meta
    monkeypatch.setattr(view, "kernel_names", lambda self: listed.append("all") or [])
    monkeypatch.setattr(view, "kernel_keys", lambda self, k: listed.append(k) or real_keys(self, k))
    monkeypatch.setattr(cutecc.store.view, "read_meta", lambda d: read.append(d.name) or real_meta(d))
    ks = cutecc.load(store.root, arch="sm_90a")
    assert listed == [] and read == []
    assert len(ks.axpy.variants) == 1
    axpy = [e.key for e in store.entries() if e.doc["kernel"] == "axpy"]
    read.clear()  # (store.entries() above read them all)
    assert "axpy" in listed and "all" not in listed
    assert "mul" in ks and "nope" not in ks and ks.get("nope") is None
    assert "all" not in listed  # whether a name exists is asked of its own records
    ks.mul  # noqa: B018
    assert len(read) == 3 and not set(read) & set(axpy)
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        ks.nope  # noqa: B018
    assert "all" in listed  # the error lists the kernels: only now is the index listed
