"""A Ray task's report never becomes a lock line unchecked: the driver reads the entry back.

Seen: a Ray task on the driver's node publishes into the driver's cache
itself, and what it returns (its Result's metadata) became the lock line. A task whose
report names other bytes than the cache holds must fail, and no lock line may name bytes
the cache does not hold: the driver reads the entry back from its own store, checks it
whole (`ingest.check_stored`) and records that."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from distributed.conftest import ray_cluster  # noqa: F401  (the session's real local Ray cluster)
from helpers import opts, write_toy_project

from cutecc.commands.build import build
from cutecc.store import Store

pytestmark = [pytest.mark.usefixtures("dsl"), pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")]


def test_check_stored_reads_the_entry_back_and_refuses_what_does_not_match(toy_cache, tmp_path: Path) -> None:
    from cutecc.ship.ingest import Refused, check_stored

    copy_ = toy_cache.copy(tmp_path)
    store = Store(copy_.cache)
    a, b = list(store.entries())
    assert check_stored(store, a.key) == a.doc
    with pytest.raises(Refused, match="not in the cache"):
        check_stored(store, "0" * 64)
    lib = a.path / a.doc["library"]
    data = lib.read_bytes()
    lib.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(Refused, match="SHA-256"):
        check_stored(store, a.key)
    meta = json.loads((b.path / "meta.json").read_bytes())
    meta["key_inputs"]["arch"] = "sm_80"  # no longer the key's metadata
    (b.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(Refused, match="meta.json"):
        check_stored(store, b.key)


def test_a_same_node_task_reporting_other_bytes_fails_and_is_never_locked(
        ray_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import cutecc.build.executors.ray as ray_executor

    real = ray_executor._task

    def forged(*args):  # the real task, then a report naming bytes nobody published
        result, meta_bytes, files = real(*args)
        if result.meta is not None:
            lib = dataclasses.replace(result.meta.library, sha256=hashlib.sha256(b"forged").hexdigest())
            others = tuple(f for f in result.meta.files if f.name != lib.name)
            result = dataclasses.replace(result, meta=result.meta.recorded(result.meta.key, (*others, lib)))
        return result, meta_bytes, files

    monkeypatch.setattr(ray_executor, "_task", forged)
    manifest = write_toy_project(tmp_path / "p", threads=(64,))
    lock = tmp_path / "kernels.lock"
    rep = build(manifest, opts(cache_dir=tmp_path / "c", executor="ray"), lock_file=lock)
    store = Store(tmp_path / "c")
    held = {e.key: e.doc["files"][e.doc["library"]]["sha256"] for e in store.entries()}
    locked = {e["key"]: e["sha256"] for e in json.loads(lock.read_text())["entries"]} if lock.exists() else {}
    assert all(held.get(k) == sha for k, sha in locked.items()), \
        f"a lock line names bytes the cache does not hold: {locked} vs {held}"
    assert rep.count("failed") == 1, [o.to_json() for o in rep.outcomes]
    (line,) = rep.warnings()
    assert "scale[threads=64]@sm_90a" in line and "differs from the entry" in line, line
