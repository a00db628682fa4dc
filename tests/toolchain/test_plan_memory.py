"""The user's planning memory (cutecc/toolchain/planmemory.py) behind every cache's own planning
facts: a new cache plans from it without parsing what was parsed before, yet it serves a
source file's facts only for the same bytes (content-addressed) and an installed
distribution's only under the same stamps, so an edit is parsed and hashed afresh; a damaged,
hostile or oversized memory file is ignored or refused, never trusted.

Pure Python: fake distributions in a temporary site directory, no DSL import, no compile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import opts

import cutecc.plan.key
import cutecc.toolchain.dists
from cutecc.toolchain import hashcache, planmemory
from cutecc.toolchain.hashcache import HashCache, parser_id
from cutecc.toolchain.planfacts import DIGEST, LISTED, Listed, SourceFacts
from cutecc.toolchain.planmemory import FILE, PlanMemory
from tests.toolchain.test_installed_code import (
    BOTH,
    LIB,
    _walks,
    forget,
    install,
    parsed_files,
    planned,
    project,
)

SOURCE = SourceFacts([[0, "os", None]], ["f"])


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty site directory ahead of everything on sys.path (as test_installed_code.py's)."""
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.setattr(hashcache, "SETTLE_NS", 0)
    forget()
    yield d
    forget()


@pytest.fixture
def memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The memory on, in a directory of the test's (tests run with it off: conftest)."""
    d = tmp_path / "memory"
    monkeypatch.setenv(planmemory.ENV, str(d))
    monkeypatch.setattr(hashcache, "SETTLE_NS", 0)
    return d


def _counting() -> tuple[list[int], object]:
    calls: list[int] = []

    def parse(data: bytes) -> SourceFacts:
        calls.append(1)
        return SOURCE

    return calls, parse


def test_a_new_cache_is_served_parsed_facts_by_content_and_an_edit_is_parsed(
        tmp_path: Path, memory: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    calls, parse = _counting()
    first = HashCache(tmp_path / "a/filehashes.json")
    got = first.source(str(src), SourceFacts, parse)
    first.save()
    assert len(calls) == 1 and (memory / FILE).is_file()
    # another, empty cache
    again = HashCache(tmp_path / "b/filehashes.json").source(str(src), SourceFacts, parse)
    assert len(calls) == 1 and again == got  # served from the memory, the SHA-256 read anew
    copy = tmp_path / "elsewhere.py"  # the same bytes anywhere: the same facts
    copy.write_bytes(src.read_bytes())
    HashCache(tmp_path / "c/filehashes.json").source(str(copy), SourceFacts, parse)
    assert len(calls) == 1
    src.write_text("import sys\n")  # an edit: new bytes, parsed whatever the memory holds
    edited = HashCache(tmp_path / "d/filehashes.json").source(str(src), SourceFacts, parse)
    assert len(calls) == 2 and edited.sha256 != got.sha256


def test_another_parser_facts_are_not_served(tmp_path: Path, memory: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    calls, parse = _counting()
    first = HashCache(tmp_path / "a/filehashes.json", memory=PlanMemory(memory, "0" * 16))
    first.source(str(src), SourceFacts, parse)
    first.save()
    HashCache(tmp_path / "b/filehashes.json").source(str(src), SourceFacts, parse)  # this cutecc's parser
    assert len(calls) == 2


@pytest.mark.parametrize("damage", ["garbage", "wrong shape", "oversized", "deep"])
def test_a_damaged_memory_is_ignored_and_written_anew(
        tmp_path: Path, memory: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    sha = hashcache._read_stamped(str(src))[1]
    memory.mkdir()
    if damage == "garbage":
        (memory / FILE).write_bytes(b"\x00{not json")
    elif damage == "wrong shape":  # a hostile record: imports that are not import statements
        (memory / FILE).write_text(json.dumps({"format": 1, "parsers": {parser_id(): {
            "parsed": {f"source:{sha}": {"imports": [[0, {"x": 1}, None]], "names": ["evil"]}},
            "dists": {"x": "not a record"}}}}))
    elif damage == "oversized":
        monkeypatch.setattr(planmemory, "MAX_BYTES", 64)
        (memory / FILE).write_text(json.dumps({"format": 1, "parsers": {}, "pad": "x" * 200}))
    else:
        (memory / FILE).write_text("[" * 100_000 + "]" * 100_000)
    calls, parse = _counting()
    cache = HashCache(tmp_path / "a/filehashes.json")
    assert cache.source(str(src), SourceFacts, parse).parsed == SOURCE
    assert cache.recall("x", "fp", DIGEST) is None
    assert len(calls) == 1
    monkeypatch.setattr(planmemory, "MAX_BYTES", 96 << 20)
    cache.save()
    doc = json.loads((memory / FILE).read_text())
    assert doc["parsers"][parser_id()]["parsed"][f"source:{sha}"] == SOURCE.to_json()


def test_a_memory_file_that_is_a_link_is_refused_never_written(tmp_path: Path, memory: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    memory.mkdir()
    target = tmp_path / "target.json"
    target.write_text("{}")
    (memory / FILE).symlink_to(target)
    calls, parse = _counting()
    cache = HashCache(tmp_path / "a/filehashes.json")
    cache.source(str(src), SourceFacts, parse)
    cache.save()
    assert len(calls) == 1 and target.read_text() == "{}" and (memory / FILE).is_symlink()


def test_off_remembers_nothing_outside_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(planmemory.ENV, "off")
    assert planmemory.directory() is None
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    calls, parse = _counting()
    for name in ("a", "b"):
        c = HashCache(tmp_path / name / "filehashes.json")
        c.source(str(src), SourceFacts, parse)
        c.save()
    assert len(calls) == 2


def test_distribution_facts_are_served_only_under_their_fingerprint(tmp_path: Path, memory: Path) -> None:
    first = HashCache(tmp_path / "a/filehashes.json")
    listed = Listed("x/__init__.py", {})
    first.remember("/site/x.dist-info\0listed", "stamps-1", LISTED, listed)
    first.save()
    other = HashCache(tmp_path / "b/filehashes.json")
    assert other.recall("/site/x.dist-info\0listed", "stamps-2", LISTED) is None
    assert other.recall("/site/x.dist-info\0listed", "stamps-1", LISTED) == listed
    assert other.recall("/site/x.dist-info\0listed", "stamps-1", DIGEST) is None  # of another shape


def test_a_new_cache_plans_from_the_memory_and_an_installed_edit_still_rekeys(
        tmp_path: Path, site: Path, memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the same keys as planning without it, nothing parsed the second time, and
    an edited installed file (a new stamp, new bytes) changes the key through a new cache."""
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    monkeypatch.setenv(planmemory.ENV, "off")
    (tmp_path / "off").mkdir()
    alone = planned(m, tmp_path / "off/filehashes.json")
    monkeypatch.setenv(planmemory.ENV, str(memory))
    (tmp_path / "c1").mkdir()
    cold = planned(m, tmp_path / "c1/filehashes.json")
    assert {n: p.key for n, p in cold.items()} == {n: p.key for n, p in alone.items()}
    parsed = parsed_files(monkeypatch)
    walked = _walks(monkeypatch)
    (tmp_path / "c2").mkdir()
    warm = planned(m, tmp_path / "c2/filehashes.json")
    assert {n: p.key for n, p in warm.items()} == {n: p.key for n, p in cold.items()}
    assert parsed == [] and walked == []  # nothing parsed, no closure walked: all remembered
    uses = m.parent / "kp/uses_lib.py"  # a project file edited: walked and parsed again
    uses.write_text("import json\n" + uses.read_text())
    (tmp_path / "c2b").mkdir()
    changed = planned(m, tmp_path / "c2b/filehashes.json")
    assert changed["imports_lib"].key != cold["imports_lib"].key and walked and parsed == [str(uses)]
    util = site / "fakelib/util.py"
    util.write_text("K = 2\n")
    os.utime(util, ns=(util.stat().st_atime_ns, util.stat().st_mtime_ns))
    (tmp_path / "c3").mkdir()
    edited = planned(m, tmp_path / "c3/filehashes.json")
    assert edited["imports_lib"].key != cold["imports_lib"].key
    assert edited["in_lib"].key != cold["in_lib"].key


def test_a_dry_run_into_a_new_cache_plans_from_the_memory_and_writes_no_cache(
        tmp_path: Path, site: Path, memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dry-run` uses the planning caches, the user's memory included: a dry run into a new
    cache after a build elsewhere walks no closure and parses nothing, and creates no cache."""
    import cutecc.build.builder
    import cutecc.build.executors.local
    import cutecc.commands.build as b

    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    monkeypatch.setattr(cutecc.build.executors.local, "compile_all", lambda *a, **k: None)  # planning only
    monkeypatch.setattr(cutecc.build.builder, "_ensure_runtimes", lambda *a, **k: [])
    forget()
    b.build(m, opts(cache_dir=tmp_path / "cache"), lock=False)
    walked = _walks(monkeypatch)
    forget()
    rep = b.build(m, opts(cache_dir=tmp_path / "fresh"), lock=False, dry_run=True)
    assert rep.count("planned") == 2 and walked == []
    assert not (tmp_path / "fresh").exists()


def test_what_is_read_of_installed_metadata_is_remembered_under_its_stamps(
        tmp_path: Path, site: Path, memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution's METADATA is parsed once (`dists._facts`); edited in place (a new
    requirement, a new version), it is read again and the keys change."""
    info = install(site, "fakelib", "1.0", LIB)
    install(site, "fakedep", "2.0", {"fakedep/__init__.py": ""})
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    first = planned(m, cache)
    reads: list[str] = []
    real = cutecc.toolchain.dists._read_facts

    def spy(d):
        reads.append(str(d._path))
        return real(d)

    monkeypatch.setattr(cutecc.toolchain.dists, "_read_facts", spy)
    assert {n: p.key for n, p in planned(m, cache).items()} == {n: p.key for n, p in first.items()}
    assert reads == []
    meta = info / "METADATA"
    meta.write_text(meta.read_text() + "Requires-Dist: fakedep\n")
    again = planned(m, cache)
    assert reads == [str(info)]
    assert "fakedep" in again["imports_lib"].inputs["distributions"] and again["imports_lib"].key != first[
        "imports_lib"].key


def test_an_edit_rebuilt_in_the_same_cache_neither_reads_nor_writes_the_memory(
        tmp_path: Path, site: Path, memory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit-and-rebuild loop: what the cache knew and an edit changed is computed afresh
    (as without the memory); the memory, read and written only for what a cache never knew,
    is neither loaded nor rewritten."""
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    first = planned(m, cache)
    before = (memory / FILE).read_bytes()
    reads: list[int] = []
    real = PlanMemory._read

    def spy(self):
        reads.append(1)
        return real(self)

    monkeypatch.setattr(PlanMemory, "_read", spy)
    uses = m.parent / "kp/uses_lib.py"
    uses.write_text("import json\n" + uses.read_text())
    (site / "fakelib/util.py").write_text("K = 3\n")
    again = planned(m, cache)
    assert again["imports_lib"].key != first["imports_lib"].key
    assert reads == [] and (memory / FILE).read_bytes() == before
