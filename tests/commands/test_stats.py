"""`cutecc stats`: entries, bytes and the counters builds record in stats.json."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import opts, toy_manifest

from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.commands.stats import stats
from cutecc.errors import CuteccError
from cutecc.store import Store

pytestmark = pytest.mark.usefixtures("dsl")


def test_builds_record_hits_misses_and_seconds_saved(built) -> None:
    s = stats(built.cache)  # the fixture's build: two compiles
    assert (s["entries"], s["hits"], s["misses"], s["failures"]) == (2, 0, 2, 0)
    assert s["bytes"] == sum(e.disk_bytes() for e in built.store.entries())
    build(built.manifest, opts(cache_dir=built.cache))
    build(built.manifest, opts(cache_dir=built.cache), dry_run=True)  # records nothing
    s = stats(built.cache)
    assert (s["hits"], s["misses"], s["failures"], s["hit_rate"]) == (2, 2, 0, 0.5)
    saved = sum(e.doc["build_seconds"] for e in built.store.entries())
    assert s["seconds_saved"] == pytest.approx(saved, abs=0.01) and saved > 0
    doc = json.loads((built.cache / "stats.json").read_text())
    assert doc["format"] == 1 and doc["hits"] == 2


def test_the_record_areas_are_counted(built) -> None:
    """Beside entries: each build's generation records and its manifest's record, counted
    with their bytes (and shown by the CLI); areas the build did not write count 0."""
    s = stats(built.cache)
    gens = list((built.cache / "generations").iterdir())
    assert s["records"]["generations"] == {
        "count": len(gens), "bytes": sum(p.stat().st_size for p in gens)} and gens
    assert s["records"]["manifests"]["count"] == 1
    assert s["records"]["tuning_plans"] == s["records"]["sources"] == {"count": 0, "bytes": 0}
    r = CliRunner().invoke(main, ["stats", "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and f"records        {len(gens)} generations, 1 manifests" in r.output, r.output


def test_failures_are_counted(built) -> None:
    text = built.manifest.read_text() + toy_manifest(threads=(32,), kernels=("broken",)).split("\n", 1)[1]
    built.manifest.write_text(text.replace('[kernel.broken]\nentry = "toy.ops:scale"',
                                           '[kernel.broken]\nentry = "toy.ops:broken"'))
    report = build(built.manifest, opts(cache_dir=built.cache))
    assert report.count("failed") == 1
    s = stats(built.cache)
    assert (s["hits"], s["misses"], s["failures"]) == (2, 2, 1)


def test_a_stats_file_of_another_format_is_left_alone(built) -> None:
    other = json.dumps({"format": 99, "whatever": 1})
    (built.cache / "stats.json").write_text(other)
    build(built.manifest, opts(cache_dir=built.cache))
    assert (built.cache / "stats.json").read_text() == other
    assert stats(built.cache)["hits"] == 0


def _add(root: str) -> None:
    store = Store(root)
    for _ in range(25):
        store.add_stats(hits=1, seconds_saved=0.5)


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    Store(tmp_path).ensure()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add, args=(str(tmp_path),)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = Store(tmp_path).read_stats()
    assert (s.hits, s.seconds_saved) == (100, 50.0)


def test_stats_of_a_missing_cache_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="no cutecc cache here"):
        stats(tmp_path / "none")


def test_cli_stats(built) -> None:
    r = CliRunner().invoke(main, ["stats", "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and "entries        2" in r.stdout and "misses         2" in r.stdout
    r = CliRunner().invoke(main, ["stats", "--json", "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and json.loads(r.stdout)["entries"] == 2
