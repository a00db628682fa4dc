"""The build pipeline (`cutecc.build.builder`) that `cutecc build` and `cutecc tune` share: tune
parses its manifest once and plans its candidates once, under the keys `build` gives them;
the probe stage tells hits by their index records and the publish stage rewrites a stale
one; both executors are the `Executor` the pipeline takes."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import opts, toy_manifest, write_toy_project

from cutecc.build import builder
from cutecc.build.executors import Executor, choose
from cutecc.build.executors.local import LocalExecutor
from cutecc.build.executors.ray import RayExecutor
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from cutecc.store import Store

# The toy kernel with a tuning space: the default (threads=64) and one candidate.
TUNED = toy_manifest(threads=(64,)).replace('variants = { threads = [64] }\n', '') + """
[kernel.scale.tune]
params = { threads = [64, 128] }
default = { threads = 64 }
buckets = { n = [1024, 65536] }
"""


@contextmanager
def calls(*functions: Callable[..., Any]) -> Iterator[Counter[str]]:
    """Count the calls of `functions` made in this thread meanwhile (by their code objects,
    so however a caller imported them)."""
    codes = {f.__code__: f.__qualname__ for f in functions}
    seen: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            seen[codes[frame.f_code]] += 1

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(old)


@pytest.mark.usefixtures("dsl")
def test_tune_parses_the_manifest_once_and_plans_the_candidates_once(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="compiling needs the build extra")
    from cutecc.commands.build import build
    from cutecc.commands.tune import tune

    manifest = write_toy_project(tmp_path / "proj")
    manifest.write_text(TUNED)
    cache = tmp_path / "c"
    with calls(load_manifest, plan) as seen:
        report = tune(manifest, opts(cache_dir=cache, jobs=2), compile_only=True)
    assert seen == {"load_manifest": 1, "plan": 1}, seen
    assert report.exit_code == 0 and (report.built, report.cached) == (2, 0), report.warnings()
    (item,) = report.plan
    assert [c.variant for c in item.candidates] == ["default", "threads=128"]
    assert not (manifest.parent / "kernels.lock").exists()  # candidates lock nothing
    # `cutecc build` plans the default under the key tune compiled it with: nothing to build.
    again = build(manifest, opts(cache_dir=cache), lock=False)
    assert [(o.status, o.planned.key) for o in again.outcomes] == [("cached", item.base)]


def test_probe_tells_hits_by_their_index_records_and_publish_rewrites_a_stale_one(
        toy_cache, tmp_path: Path) -> None:
    copy = toy_cache.copy(tmp_path)
    store = Store(copy.cache)
    target = builder.target(load_manifest(copy.manifest))
    keys = [p.key for p in target.planned]
    # A copied cache: every meta.json is another file than its index record was taken from,
    # so each is read, and its record marked stale; publishing rewrites the records.
    copied = builder.probe(store, target.planned)
    assert copied.misses == [] and copied.stale == keys
    assert all(o.status == "cached" and o.facts is None and o.meta is not None for o in copied.outcomes)
    builder.publish(store, copied.outcomes, stale=copied.stale)
    fresh = builder.probe(store, target.planned)
    assert fresh.misses == [] and fresh.stale == []
    assert all(o.status == "cached" and o.facts is not None and o.meta is None for o in fresh.outcomes)

    # meta.json rewritten (as verify's repair does): read again, and its record marked stale
    meta = store.layout.entry(keys[0]) / "meta.json"
    st = meta.stat()
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = builder.probe(store, target.planned)
    assert touched.stale == [keys[0]] and touched.misses == []
    assert touched.outcomes[0].meta is not None and touched.outcomes[0].meta.key == keys[0]
    key = keys[0]

    # an entry gone is a miss; a dry run reports it planned instead
    store.remove(key)
    assert [p.key for p in builder.probe(store, target.planned).misses] == [key]
    dry = builder.probe(store, target.planned, dry_run=True)
    assert dry.misses == [] and [o.status for o in dry.outcomes if o.planned.key == key] == ["planned"]


def test_both_executors_are_the_executor_the_pipeline_takes(monkeypatch) -> None:
    monkeypatch.delenv("CUTECC_EXECUTOR", raising=False)
    monkeypatch.delenv("CUTECC_RAY_ADDRESS", raising=False)
    local, ray = choose(), choose("ray", "h:1")
    assert isinstance(local, LocalExecutor) and isinstance(ray, RayExecutor)
    assert isinstance(local, Executor) and isinstance(ray, Executor)
    assert (local.kind, ray.kind, ray.ray_address) == ("local", "ray", "h:1")
