"""A no-op build (every entry cached, nothing changed) writes nothing in the cache but its
counters (`stats.json`) and the hits' `used` marks: no generation, manifest record,
composite, index record, planning cache or lock is rewritten; a real change still is."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import opts, toy_manifest

from cutecc.commands.build import build
from cutecc.store.build_records import GenerationRecord, ManifestRecord

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("dsl")


def _changed(before: dict, after: dict) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def test_a_second_no_op_build_writes_only_its_counters_and_used_marks(built) -> None:
    assert build(built.manifest, opts(cache_dir=built.cache)).ok  # the copy's records, its planning
    cache, project = snapshot(built.cache), snapshot(built.manifest.parent)
    report = build(built.manifest, opts(cache_dir=built.cache))
    assert report.ok and report.count("cached") == 2 and not report.lock_changed
    after = snapshot(built.cache)
    changed = _changed(cache, after)
    used = {p for p in changed if Path(p).name == "used"}
    assert changed - used == {"stats.json"}, sorted(changed)
    assert len(used) == 2 and all(cache[p][:2] == after[p][:2] for p in used)  # their mtimes alone
    assert snapshot(built.manifest.parent) == project  # kernels.lock untouched
    stats = json.loads((built.cache / "stats.json").read_bytes())
    assert stats["hits"] >= 4  # both no-op builds counted


def test_a_changed_manifest_still_writes_its_records(built) -> None:
    assert build(built.manifest, opts(cache_dir=built.cache)).ok
    store = built.store
    gen = store.layout.generation("scale", "sm_90a")
    record = store.layout.manifest_record(built.manifest)
    before = snapshot(built.cache)
    built.manifest.write_text(toy_manifest(threads=(64,)))  # one variant
    report = build(built.manifest, opts(cache_dir=built.cache))
    assert report.ok and len(report.outcomes) == 1 and report.lock_changed
    changed = _changed(before, snapshot(built.cache))
    assert {"generations/scale@sm_90a.json", str(record.relative_to(built.cache))} <= changed
    rec = GenerationRecord.from_json(json.loads(gen.read_bytes()))
    assert rec is not None and rec.keys is not None and len(rec.keys) == 1
    man = ManifestRecord.from_json(json.loads(record.read_bytes()))
    assert man is not None and man.sha256 == hashlib.sha256(built.manifest.read_bytes()).hexdigest()
    assert man.all_keys() == set(rec.keys)
