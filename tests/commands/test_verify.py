"""`cutecc verify`: catches every kind of damage and orphan; --fix never touches a healthy entry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import opts

from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.commands.verify import verify
from cutecc.errors import CuteccError
from cutecc.store import touch_used

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("dsl")


def _damage(lib: Path, how: str) -> None:
    data = bytearray(lib.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
        lib.write_bytes(bytes(data))
    elif how == "truncate":
        lib.write_bytes(bytes(data[:-100]))
    else:
        lib.unlink()


def test_a_fresh_build_is_clean_even_after_uses_are_recorded(built) -> None:
    for e in built.store.entries():
        touch_used(e.path)  # the `used` file is a known non-artifact file
    report = verify(built.cache)
    assert report.ok and (report.entries, report.healthy, report.problems) == (2, 2, [])


def test_a_cache_without_locks_is_checked_without_creating_them(built) -> None:
    """A check takes no key lock where the cache has no locks/ (a pack's tree, a copy): it
    would create that directory, and nobody can be building there."""
    import shutil

    shutil.rmtree(built.store.locks_dir)
    e = built.entries()["threads=64"]
    built.store.layout.index_record("scale", e.key).unlink()
    stale = built.store.tmp_dir / f"{e.key}.dead01"
    stale.mkdir()
    before = snapshot(built.cache)
    report = verify(built.cache)
    assert sorted(p.kind for p in report.problems) == ["stale-tmp", "unindexed"], report.problems
    assert snapshot(built.cache) == before and not built.store.locks_dir.exists()


@pytest.mark.parametrize("how, kind", [("flip", "altered"), ("truncate", "truncated"),
                                       ("delete", "missing")])
def test_damage_is_reported_for_that_entry_only(built, how: str, kind: str) -> None:
    bad = built.entries()["threads=64"]
    _damage(bad.path / "kernel.so", how)
    report = verify(built.cache)
    assert not report.ok and report.healthy == 1
    assert [(p.kind, p.key, Path(p.path).name) for p in report.problems] == [(kind, bad.key, "kernel.so")]


def test_malformed_metadata_is_reported(built) -> None:
    bad = built.entries()["threads=128"]
    (bad.path / "meta.json").write_text("{not json")
    [p] = verify(built.cache).problems
    assert (p.kind, p.key) == ("malformed", bad.key)
    meta = dict(bad.doc, files={"../escape": {"size": 1, "sha256": "0" * 64}})
    (bad.path / "meta.json").write_text(json.dumps(meta))
    [p] = verify(built.cache).problems
    assert p.kind == "malformed" and "bad file name" in p.detail


def test_orphans_are_reported_and_a_locked_tmp_dir_is_not(built, hold_lock) -> None:
    store = built.store
    healthy = built.entries()["threads=64"]
    (healthy.path / "stray.o").write_bytes(b"junk")
    no_meta = store.layout.entry("cd" * 32)
    no_meta.mkdir(parents=True)
    (no_meta / "kernel.so").write_bytes(b"half")
    stale = store.tmp_dir / f"{'ef' * 32}.dead01"
    stale.mkdir(parents=True)
    live_key = "12" * 32
    live = store.tmp_dir / f"{live_key}.live01"
    live.mkdir()
    hold_lock(store, live_key)
    report = verify(built.cache)
    assert not report.ok and report.healthy == 2  # a stray file does not make an entry bad
    found = {(p.kind, p.path) for p in report.problems}
    assert found == {("orphan", str(healthy.path / "stray.o")), ("orphan", str(no_meta)),
                     ("stale-tmp", str(stale))}


def test_fix_quarantines_only_the_bad_entry_and_the_next_build_rebuilds_exactly_it(built) -> None:
    entries = built.entries()
    bad, good = entries["threads=64"], entries["threads=128"]
    touch_used(good.path)
    _damage(bad.path / "kernel.so", "flip")
    (good.path / "stray.o").write_bytes(b"junk")
    stale = built.store.tmp_dir / f"{'ef' * 32}.dead01"
    stale.mkdir(parents=True)
    before = snapshot(good.path)
    report = verify(built.cache, fix=True)
    assert report.ok and report.fixed
    assert {p.kind: p.action.split(" ")[0] for p in report.problems} == {
        "altered": "quarantined", "orphan": "removed", "stale-tmp": "removed"}
    # The healthy entry: same files, same inodes, same mtimes (only the stray file is gone).
    after = snapshot(good.path)
    assert {k: v for k, v in before.items() if k != "stray.o"} == after
    # The bad one is in quarantine, whole, with the reason.
    [q] = list(built.store.quarantine_dir.iterdir())
    assert q.name.startswith(bad.key + ".")
    assert sorted(os.listdir(q)) == ["kernel.so", "meta.json", "why.json"]
    why = json.loads((q / "why.json").read_text())
    assert why["format"] == 1 and why["key"] == bad.key and "altered" in why["reason"]
    assert not bad.path.exists() and not stale.exists()
    assert verify(built.cache).ok
    again = build(built.manifest, opts(cache_dir=built.cache))
    assert {o.planned.variant.id: o.status for o in again.outcomes} == {
        "threads=64": "built", "threads=128": "cached"}
    assert built.entries()["threads=64"].key == bad.key
    assert verify(built.cache).ok


def test_fix_leaves_an_entry_whose_lock_is_held(built, hold_lock) -> None:
    bad = built.entries()["threads=64"]
    _damage(bad.path / "kernel.so", "truncate")
    hold_lock(built.store, bad.key)
    report = verify(built.cache, fix=True)
    assert not report.ok and report.problems[0].action.startswith("busy")
    assert (bad.path / "meta.json").exists()


def test_verify_of_a_missing_cache_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="no cutecc cache here") as err:
        verify(tmp_path / "none")
    assert err.value.exit_code == 1


def test_cli_verify_exit_codes(built) -> None:
    args = ["verify", "--cache-dir", str(built.cache)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "2 entries, 2 healthy, 0 problem(s)" in r.stdout
    _damage(built.entries()["threads=64"].path / "kernel.so", "delete")
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["problems"][0]["kind"] == "missing"
    r = CliRunner().invoke(main, [*args, "--fix"])
    assert r.exit_code == 0 and "quarantined to" in r.stdout
    assert CliRunner().invoke(main, args).exit_code == 0


# The index ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["delete", "garbage", "other-bytes", "stray", "misfiled"])
def test_a_damaged_index_is_reported_and_rebuilt_by_fix(built, damage: str) -> None:
    import cutecc

    store = built.store
    e = built.entries()["threads=64"]
    record = store.layout.index_record("scale", e.key)
    good = record.read_bytes()
    if damage == "delete":
        record.unlink()
        kind = "unindexed"
    elif damage == "garbage":
        record.write_bytes(b"{not json")
        kind = "stale-index"
    elif damage == "other-bytes":  # a record vouching for another library
        record.write_bytes(good.replace(e.doc["files"]["kernel.so"]["sha256"].encode(), b"0" * 64))
        kind = "stale-index"
    elif damage == "stray":  # a record of no entry
        store.layout.index_record("scale", "f" * 64).write_bytes(good)
        kind = "stale-index"
    else:  # the entry's record under another kernel's name
        (store.index_dir / "other").mkdir()
        (store.index_dir / "other" / e.key).write_bytes(good)
        kind = "stale-index"
    report = verify(built.cache)
    assert [p.kind for p in report.problems] == [kind] and not report.ok
    fixed = verify(built.cache, fix=True)
    assert fixed.ok and fixed.problems[0].action in ("indexed", "removed")
    assert verify(built.cache).problems == []
    # The same record; one written again is stamped with the meta.json it was taken from.
    got, was = json.loads(record.read_bytes()), json.loads(good)
    assert got.pop("meta_stat") in (was.pop("meta_stat"), store.stamp(e.key)) and got == was
    assert sorted(cutecc.load(built.cache, arch="sm_90a")) == ["scale"]
    assert sorted(cutecc.load(built.cache, arch="sm_90a").scale.variants) == ["threads=128", "threads=64"]


def test_a_missing_runtime_library_is_linked_again_by_fix(built) -> None:
    [rt] = list(built.store.runtimes())
    data = (rt.path / rt.doc["library"]).read_bytes()
    assert built.store.remove(rt.key, runtime=True)
    [p] = verify(built.cache).problems
    assert p.kind == "no-runtime" and p.key == rt.key and "2 entries" in p.detail
    fixed = verify(built.cache, fix=True)
    assert fixed.ok and fixed.problems[0].action == "linked again"
    [again] = list(built.store.runtimes())
    assert (again.path / again.doc["library"]).read_bytes() == data  # reproducible


def test_an_entry_removed_or_published_while_verify_reads_the_index_is_not_unindexed(built) -> None:
    """verify lists the entries, then the index: a removal in between (entry gone, then its
    record) or one still holding the key's lock is in flight, not an unindexed entry (seen
    under churn: `verify: unindexed ... the entry has no index record`)."""
    from cutecc.commands.verify import Store, VerifyReport
    from cutecc.commands.verify_checks import _check_area, _check_index

    store = Store(built.cache)
    gone, held = (built.entries()[v].key for v in ("threads=64", "threads=128"))
    report = VerifyReport(str(store.root))
    kernels = _check_area(store, report, runtime=False)
    assert {gone, held} <= set(kernels)
    store.remove(gone)  # removed after verify listed it
    store.layout.index_record("scale", held).unlink()  # a removal of this one under way:
    with store.lock(held, timeout=0):  # its record is gone, its entry not yet
        _check_index(store, report, kernels)
    assert report.problems == []
    again = VerifyReport(str(store.root))  # and once nobody holds it, it is unindexed
    _check_index(store, again, _check_area(store, again, runtime=False))
    assert [(p.kind, p.key) for p in again.problems] == [("unindexed", held)]
