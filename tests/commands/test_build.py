"""`cutecc build` end to end on a small real kernel: hits, rebuilds, failures, races, kills."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PY, TOY_KERNEL, opts, run_cli, toy_manifest, write_toy_project

from cutecc.commands.build import build
from cutecc.store import Store

pytestmark = pytest.mark.usefixtures("dsl")
pytest.importorskip("cutlass", reason="compiling needs the build extra")


def _entries_verified(cache: Path) -> list[str]:
    """Keys of published entries; asserts each is complete and matches its hashes."""
    keys = []
    for e in Store(cache).entries():
        for name, rec in e.doc["files"].items():
            data = (e.path / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == rec["sha256"], e.key
        keys.append(e.key)
    return keys


def test_build_then_rebuild_is_all_cached_and_imports_no_dsl(toy_project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build(toy_project, opts(cache_dir=cache, jobs=2))
    assert (first.count("built"), first.count("cached"), first.count("failed")) == (2, 0, 0)
    assert len(_entries_verified(cache)) == 2
    code = ("import sys, json; from cutecc.commands.build import build; "
            "from cutecc.settings import BuildOptions; "
            f"r = build({str(toy_project)!r}, BuildOptions(cache_dir={str(cache)!r})); "
            "print(json.dumps([r.count('built'), r.count('cached'), 'cutlass' in sys.modules, "
            "r.runtimes_built]))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    built, cached, dsl_imported, linked = json.loads(out.stdout)
    # Nothing compiled, nothing linked, the DSL never imported (its time: benchmarks/).
    assert (built, cached, dsl_imported, linked) == (0, 2, False, [])


def test_a_hit_reads_its_index_record_not_its_metadata(toy_cache, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import cutecc.store.view

    toy = toy_cache.copy(tmp_path)
    lock = toy.manifest.with_name("kernels.lock")
    first = build(toy.manifest, opts(cache_dir=toy.cache))
    assert first.count("cached") == 2 and lock.is_file()
    locked = lock.read_bytes()
    real = cutecc.store.view.read_meta
    read: list[str] = []
    monkeypatch.setattr(cutecc.store.view, "read_meta",  # an entry's; its runtime library's is read once
                        lambda d: "/entries/" in str(d) and read.append(str(d)) or real(d))
    again = build(toy.manifest, opts(cache_dir=toy.cache))
    assert again.count("cached") == 2 and read == [] and lock.read_bytes() == locked
    store = Store(toy.cache)
    [e, *_] = list(store.entries())
    store.layout.index_record("scale", e.key).write_bytes(b"torn")  # an unreadable record: meta.json
    read.clear()
    third = build(toy.manifest, opts(cache_dir=toy.cache))
    assert third.count("cached") == 2 and read == [store.layout.entry_str(e.key)]
    assert lock.read_bytes() == locked  # the same lock lines either way


def test_a_rewritten_metadata_is_read_not_its_older_index_record(toy_cache, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An index record keeps the stamp of the meta.json it came from: once that file is
    rewritten (a copied cache, a relinked entry), a build reads it instead of the record,
    so it never locks what the entry no longer holds, and writes the record again."""
    import cutecc.store.view
    from cutecc.entry.rules import file_record
    from cutecc.errors import CuteccError

    toy = toy_cache.copy(tmp_path)  # copied: every meta.json has another inode than its record says
    lock = toy.manifest.with_name("kernels.lock")
    store = Store(toy.cache)
    real = cutecc.store.view.read_meta
    read: list[str] = []
    monkeypatch.setattr(cutecc.store.view, "read_meta",
                        lambda d: "/entries/" in str(d) and read.append(str(d)) or real(d))
    assert build(toy.manifest, opts(cache_dir=toy.cache)).count("cached") == 2 and len(set(read)) == 2
    keys = sorted(e.key for e in store.entries())
    for key in keys:  # the records were written again, stamped with the meta.json they read
        assert store.indexed_facts("scale", key).meta_stat == tuple(store.stamp(key))
    read.clear()
    assert build(toy.manifest, opts(cache_dir=toy.cache)).count("cached") == 2 and read == []
    # Relink one entry by hand: other library bytes, its meta.json rewritten to match.
    e = store.get(keys[0])
    lib = e.path / e.doc["library"]
    lib.write_bytes(lib.read_bytes() + b"\0" * 16)
    meta = dict(e.doc, files={**e.doc["files"], e.doc["library"]: file_record(lib)})
    (e.path / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    new_sha = meta["files"][e.doc["library"]]["sha256"]
    assert store.indexed_facts("scale", e.key).facts.sha256 != new_sha  # the record is stale
    with pytest.raises(CuteccError, match="other bytes under a key the lock already names"):
        build(toy.manifest, opts(cache_dir=toy.cache))  # the lock is never made to vouch for them
    assert set(read) == {store.layout.entry_str(e.key)}  # read (and again under its lock) ...
    assert store.indexed_facts("scale", e.key).facts.sha256 == new_sha  # ... to write its record
    lock.unlink()
    read.clear()
    assert build(toy.manifest, opts(cache_dir=toy.cache)).count("cached") == 2 and read == []
    assert new_sha in lock.read_text()


def test_editing_one_kernel_rebuilds_only_it(tmp_path: Path) -> None:
    proj = write_toy_project(tmp_path / "proj").parent
    (proj / "toy" / "ops2.py").write_text(TOY_KERNEL)
    text = toy_manifest(threads=(128,), kernels=("a", "b"))
    text = text.replace('[kernel.b]\nentry = "toy.ops:scale"', '[kernel.b]\nentry = "toy.ops2:scale"')
    assert "toy.ops2:scale" in text
    (proj / "kernels.toml").write_text(text)
    cache = tmp_path / "cache"
    assert build(proj / "kernels.toml", opts(cache_dir=cache)).count("built") == 2
    (proj / "toy" / "ops2.py").write_text(TOY_KERNEL.replace("x[i] * scale", "scale * x[i]"))
    again = build(proj / "kernels.toml", opts(cache_dir=cache))
    status = {o.planned.kernel.name: o.status for o in again.outcomes}
    assert status == {"a": "cached", "b": "built"}


def test_a_failing_kernel_keeps_the_others_and_exits_nonzero(toy_project: Path, tmp_path: Path) -> None:
    text = toy_project.read_text() + toy_manifest(threads=(32,), kernels=("broken",)).split("\n", 1)[1]
    text = text.replace('[kernel.broken]\nentry = "toy.ops:scale"',
                        '[kernel.broken]\nentry = "toy.ops:broken"')
    toy_project.write_text(text)
    cache = tmp_path / "cache"
    r = run_cli("build", str(toy_project), "--cache-dir", str(cache), "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert (report["built"], report["failed"]) == (2, 1)
    failed = [e for e in report["entries"] if e["status"] == "failed"]
    assert failed[0]["kernel"] == "broken" and "no_such_dsl_function" in failed[0]["error"]
    assert len(_entries_verified(cache)) == 2


def test_two_processes_building_one_manifest_build_each_entry_once(tmp_path: Path) -> None:
    proj = write_toy_project(tmp_path / "proj", threads=(32, 64, 128, 256)).parent
    cache = tmp_path / "cache"
    cmd = [PY, "-m", "cutecc.cli", "build", str(proj / "kernels.toml"), "--cache-dir", str(cache),
           "--json", "-j", "2"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    assert sum(r["built"] for r in reports) == 4
    assert sum(r["cached"] for r in reports) == 4
    assert len(_entries_verified(cache)) == 4


def test_a_build_killed_midway_loses_nothing_and_the_next_completes(tmp_path: Path) -> None:
    proj = write_toy_project(tmp_path / "proj", threads=(32, 64, 96, 128, 160, 192)).parent
    cache = tmp_path / "cache"
    cmd = [PY, "-m", "cutecc.cli", "build", str(proj / "kernels.toml"), "--cache-dir", str(cache), "-j", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    tmp = cache / "tmp"
    while time.time() < deadline:  # wait until a compile is under way
        if tmp.is_dir() and any(tmp.iterdir()):
            break
        time.sleep(0.02)
    else:
        pytest.fail("the build never started staging an entry")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    before = _entries_verified(cache)  # whatever was published is whole
    assert len(before) < 6
    report = build(proj / "kernels.toml", opts(cache_dir=cache, jobs=2))
    assert report.ok and report.count("built") == 6 - len(before)
    assert len(_entries_verified(cache)) == 6
    assert list(tmp.iterdir()) == []


def test_root_manifest_builds(example_cache: Path) -> None:
    """The repository's own kernels.toml builds for sm_90a (the README's main job)."""
    entries = list(Store(example_cache).entries())
    kernels = {e.doc["kernel"] for e in entries}
    assert {"mul", "mul_bwd", "rmsnorm", "axpy"} <= kernels
    assert all(e.doc["arch"] == "sm_90a" for e in entries)
    _entries_verified(example_cache)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
