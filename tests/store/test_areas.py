"""`cutecc gc`, `rm` and `verify` know every area of the cache (`cutecc.store.layout`): gc
evicts by reachability as well as by age and size, a removed default takes its tuning
record along, and verify reports (and `--fix` removes) what does not belong anywhere."""

from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutecc.cli import main
from cutecc.commands.gc import RUNTIME_GRACE_S, gc
from cutecc.commands.rm import rm
from cutecc.commands.verify import verify
from cutecc.contract.pinned import Pin, Tuned
from cutecc.lock.lockfile import lock_for, write_lock
from cutecc.plan.tuning_plan import BucketEdges, Candidate, PlanItem, TuningPlan
from cutecc.store import layout
from cutecc.store.layout import Layout
from cutecc.store.tuning_records import TuningResult, TuningResults
from cutecc.units import now_iso

KEY = "ab" * 32


def _cli(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(main, list(args))
    try:
        doc = json.loads(r.output) if "--json" in args else {}
    except ValueError:
        doc = {}
    return r.exit_code, doc


def _result(base: str, winner: str) -> bytes:
    """A tuning record of `base` naming `winner`, as `cutecc tune` writes it (only the fields
    gc reads matter here: the rest made up)."""
    pin = Pin("kernel.so", "c" * 64, 1, "s", None, "d" * 64, "e" * 64)
    line = Tuned("k", "v", "sm_90a", "GPU", "floor", "n=8", base, winner, "v", pin)
    return TuningResults((TuningResult(line),)).dumps()


def _plan(candidates: list[str]) -> bytes:
    """A tuning plan file's bytes, as `cutecc tune --compile-only` writes them, whose one item
    has `candidates` (the first the default; only their keys matter to gc)."""
    cands = tuple(Candidate(f"v{i}", k, i == 0) for i, k in enumerate(candidates))
    items = (PlanItem("k", "v", "sm_90a", candidates[0], cands, "floor", (BucketEdges("n", (8,)),), {}, {},
                      None, None, None, None, {}),) if candidates else ()
    return TuningPlan("1" * 64, items).dumps()


def test_every_path_of_the_layout_is_under_a_known_area(tmp_path: Path) -> None:
    """The layout's areas list (what verify accepts at the top) covers every path it names."""
    lay = Layout(tmp_path)
    args = {"key": KEY, "kernel": "k", "arch": "sm_90a", "name": "k", "digest": KEY, "base": KEY,
            "stamp": "20200101T000000.000000Z", "manifest": tmp_path / "m.toml",
            "soname": "libcutecc_rt_x.so", "entry_dir": lay.entry(KEY)}
    named = 0
    for name, fn in inspect.getmembers(lay, inspect.ismethod):
        if name.startswith("_") or name == "of_entry":
            continue
        params = list(inspect.signature(fn).parameters)
        got = fn(*(args[p] for p in params))
        parts = got if isinstance(got, tuple) else Path(got).relative_to(tmp_path).parts
        assert parts[0] in layout.AREAS, (name, got)
        named += 1
    assert named >= 30
    assert Layout.of_entry(lay.entry(KEY)) == lay and Layout.of_entry(lay.runtime(KEY)) == lay


def test_gc_unreachable_keeps_what_records_and_locks_name(fake_cache, add_entries, tmp_path: Path) -> None:
    store = fake_cache.store
    gen, man, planned, winner, base, locked, lost = add_entries(
        "gen", "man", "planned", "winner", "base", "locked", "lost")
    store.record_generation("k", "sm_90a", [gen.key], str(tmp_path / "m.toml"))
    store.record_manifest(tmp_path / "m.toml", "0" * 64, {"k": {"sm_90a": [man.key]}}, partial=False)
    store.write_tuning_plan("1" * 64, _plan([planned.key]))
    store.write_tuning_results(base.key, _result(base.key, winner.key))
    lock = tmp_path / "kernels.lock"
    write_lock(lock, lock_for([("k", "locked", "sm_90a", locked.key)], store))

    code, doc = _cli("gc", "--unreachable", "--keep-lock", str(lock), "--dry-run",
                     "--cache-dir", str(store.root), "--json")
    assert code == 0 and [r["key"] for r in doc["removed"]] == [lost.key]
    assert store.has(lost.key)  # a dry run

    code, doc = _cli("gc", "--unreachable", "--keep-lock", str(lock), "--cache-dir", str(store.root),
                     "--json")
    assert code == 0 and [r["key"] for r in doc["removed"]] == [lost.key] and doc["removed"][0]["unreachable"]
    assert not store.has(lost.key)
    assert all(store.has(e.key) for e in (gen, man, planned, winner, base, locked))
    assert store.get_runtime(fake_cache.runtime.key) is not None  # still linked against

    # Without the lock, its entry is unreachable too.
    report = gc(store.root, unreachable=True)
    assert [r["key"] for r in report.removed] == [locked.key]


def test_gc_unreachable_spares_what_was_used_within_the_grace(fake_cache, add_entries) -> None:
    """A build records its generation when it ends: its fresh entries are not evicted meanwhile."""
    store = fake_cache.store
    fresh, = add_entries("fresh", built_at=now_iso())
    old, = add_entries("old")
    report = gc(store.root, unreachable=True)
    assert [r["key"] for r in report.removed] == [old.key] and store.has(fresh.key)
    report = gc(store.root, unreachable=True, now=time.time() + RUNTIME_GRACE_S + 60)
    assert [r["key"] for r in report.removed] == [fresh.key]
    # No entry left: the runtime library goes once unused for the grace period too.
    assert [r["key"] for r in report.removed_runtimes] == [fake_cache.runtime.key]


def test_keep_lock_without_unreachable_is_bad_input(fake_cache, tmp_path: Path) -> None:
    code, _ = _cli("gc", "--keep-lock", str(tmp_path / "kernels.lock"), "--cache-dir",
                   str(fake_cache.store.root))
    assert code == 2


def test_a_removed_defaults_tuning_record_goes_with_it(fake_cache, add_entries) -> None:
    store = fake_cache.store
    a, b, w = add_entries("a", "b", "w")
    for base in (a, b):
        store.write_tuning_results(base.key, _result(base.key, w.key))
    report = rm(store.root, keys=(a.key,))
    assert report.removed_tuning == [a.key]
    assert not store.layout.tuning_result(a.key).exists() and store.layout.tuning_result(b.key).exists()
    report = gc(store.root, older_than="1d")  # everything is years old
    assert b.key in report.removed_tuning and not store.layout.tuning_result(b.key).exists()


def test_gc_older_than_prunes_old_plans_and_received_sources(fake_cache) -> None:
    store = fake_cache.store
    lay = store.layout
    old_plan = store.write_tuning_plan("1" * 64, _plan([]))
    new_plan = store.write_tuning_plan("2" * 64, _plan([]))
    old_src, new_src = lay.source_tree("3" * 64), lay.source_tree("4" * 64)
    for d in (old_src, new_src):
        (d / "pkg").mkdir(parents=True)
        (d / "pkg" / "k.py").write_text("x = 1\n")
    week_ago = time.time() - 7 * 86400
    for p in (old_plan, old_src):
        os.utime(p, (week_ago, week_ago))
    report = gc(store.root, older_than="1d", dry_run=True)
    assert (report.removed_plans, report.removed_sources) == (1, 1) and old_plan.exists()
    report = gc(store.root, older_than="1d")
    assert (report.removed_plans, report.removed_sources) == (1, 1)
    assert not old_plan.exists() and not old_src.exists() and new_plan.exists() and new_src.exists()


def test_verify_reports_and_fixes_what_belongs_to_no_area(fake_cache, add_entries) -> None:
    store = fake_cache.store
    e, = add_entries("v")
    lay = store.layout
    store.record_generation("k", "sm_90a", [e.key], "m.toml")
    store.write_tuning_plan("1" * 64, _plan([]))
    (store.root / "notes.txt").write_text("mine")
    lay.generation("k", "sm_80").write_text("{not json")
    (lay.generations() / "README").write_text("?")
    lay.sources().mkdir()
    (lay.sources() / "stray").write_text("?")
    (lay.tuning() / "other").mkdir()
    report = verify(store.root)
    got = {(p.kind, Path(p.path).relative_to(store.root).as_posix()) for p in report.problems}
    assert got == {("orphan", "notes.txt"), ("bad-record", "generations/k@sm_80.json"),
                   ("orphan", "generations/README"), ("orphan", "src/stray"), ("orphan", "tuning/other")}
    assert not report.ok
    fixed = verify(store.root, fix=True)
    assert fixed.ok and all(p.action == "removed" for p in fixed.problems)
    assert verify(store.root).problems == []
    assert lay.generation("k", "sm_90a").is_file() and lay.tuning_plan("1" * 64).is_file()
    assert store.has(e.key)


@pytest.mark.parametrize("area", ["manifests", "composites", "tuning/plans"])
def test_verify_names_a_damaged_record_in_each_record_area(fake_cache, area: str) -> None:
    store = fake_cache.store
    d = store.root / area
    d.mkdir(parents=True, exist_ok=True)
    name = "k.json" if area == "composites" else f"{'5' * 64}.json"
    (d / name).write_bytes(b"[]")
    report = verify(store.root)
    assert [(p.kind, p.path) for p in report.problems] == [("bad-record", str(d / name))]
