"""The planning files' typed records (cutecc/toolchain/planfacts.py) read and write the bytes
the untyped writers wrote: tests/toolchain/data holds a planfacts.json, a filehashes.json and a
planmemory.json from a no-op build of examples/kernels.toml by those writers (trimmed to a few
records of each kind, as they would have written those), captured before the records were typed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cutecc.toolchain import hashcache, planfacts
from cutecc.toolchain.hashcache import FACTS, HashCache
from cutecc.toolchain.planfacts import (
    DIGEST,
    FLAG,
    INSTALLED,
    LISTED,
    ClosureBody,
    Fact,
    HashesFile,
    InstalledFacts,
    Listed,
    MemoryFile,
    PathEffect,
    PlanFacts,
    SourceFacts,
    TopNames,
)
from cutecc.toolchain.planmemory import FILE, PARSERS, PlanMemory

DATA = Path(__file__).parent / "data"
FACTS_BYTES = (DATA / "planfacts.json").read_bytes()
PARSER = json.loads(FACTS_BYTES)["parser"]


def _kind(where: str) -> Fact[Any]:
    """The kind of fact `dists` remembers under `where` (a path, then what was computed)."""
    what = where.split("\0")[1] if "\0" in where else "digest"
    return {"installed": INSTALLED, "listed": LISTED, "reaches": FLAG}.get(what, DIGEST)


def test_planfacts_reads_every_record_and_writes_the_same_bytes() -> None:
    facts = PlanFacts.loads(FACTS_BYTES, 1 << 20, PARSER)
    assert facts is not None and facts.dumps() == FACTS_BYTES
    raw = json.loads(FACTS_BYTES)
    kinds = set()
    for where, v in raw["dists"].items():
        rec = facts.dists.get(where)
        value = rec and _kind(where).load(rec.value)
        assert rec is not None and value is not None and rec.to_json() == v
        kinds.add(type(value))
        assert _kind(where).dump(value) == v[1]
    assert kinds == {str, bool, InstalledFacts, Listed}
    for name, v in raw["sources"].items():
        src = facts.sources.get(name)
        assert src is not None and src.to_json() == v and src.sha256 == v[1]["sha256"]
        assert isinstance(src.parsed, SourceFacts if name.startswith("source:") else PathEffect)
    for name, v in raw["closures"].items():
        ref = facts.closures.get(name)
        assert ref is not None and ref.to_json() == v
        body = facts.bodies.get(ref.digest)
        assert body is not None and body.digest() == ref.digest
        assert body.to_json() == raw["closure_bodies"][ref.digest]
    assert PlanFacts.loads(FACTS_BYTES, 1 << 20, "another parser") is None


def test_filehashes_and_the_memory_write_the_same_bytes() -> None:
    data = (DATA / "filehashes.json").read_bytes()
    hashes = HashesFile.loads(data, 1 << 20)
    assert hashes is not None and hashes.dumps() == data
    for name in hashes.files.names():
        assert hashes.files.get(name) is not None
    mem = (DATA / "planmemory.json").read_bytes()
    doc = MemoryFile.loads(mem, 1 << 20)
    assert doc is not None and list(doc.parsers)[-1] == PARSER
    mine = doc.facts(PARSER)
    assert mine.closures is not None and mine.bodies is not None
    assert doc.dumps(PARSER, mine, PARSERS) == mem
    for name in mine.parsed.names():
        assert mine.parsed.get(name) is not None
    for name in mine.closures.names():
        ref = mine.closures.get(name)
        body = None if ref is None else mine.bodies.get(ref.digest)
        assert ref is not None and body is not None and body.digest() == ref.digest


def test_the_cache_and_the_memory_carry_their_files_through_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run that learned nothing new writes back (each record told again) is what it read."""
    monkeypatch.setattr(hashcache, "parser_id", lambda: PARSER)
    shutil.copy(DATA / "planfacts.json", tmp_path / FACTS)
    shutil.copy(DATA / "filehashes.json", tmp_path / "filehashes.json")
    (tmp_path / "mem").mkdir()
    shutil.copy(DATA / "planmemory.json", tmp_path / "mem" / FILE)
    memory = PlanMemory(tmp_path / "mem", PARSER)
    cache = HashCache(tmp_path / "filehashes.json", memory=memory)
    raw = json.loads(FACTS_BYTES)
    for where, (fp, _) in raw["dists"].items():
        value = cache.recall(where, fp, _kind(where))
        assert value is not None
        cache.remember(where, fp, _kind(where), value)
        memory.remember(where, planfacts.DistRecord(fp, _kind(where).dump(value)))
    cache.save()
    assert (tmp_path / FACTS).read_bytes() == FACTS_BYTES
    assert (tmp_path / "mem" / FILE).read_bytes() == (DATA / "planmemory.json").read_bytes()


@pytest.mark.parametrize("damage", [
    lambda b: b[0][0].__setitem__(0, "relative/path.py"),  # a member that is no absolute path
    lambda b: b[0][0].__setitem__(2, 1),  # whether it is a package: not a bool
    lambda b: b[1][0].__setitem__(2, "not a list"),  # a directory's lookups
    lambda b: b[0].append([]),
])
def test_a_damaged_closure_body_is_not_served(damage: Any) -> None:
    body = next(iter(json.loads(FACTS_BYTES)["closure_bodies"].values()))
    assert ClosureBody.of_json("", body) is not None
    damage(body)
    assert ClosureBody.of_json("", body) is None


@pytest.mark.parametrize("bad", [{"imports": [[0, {"x": 1}, None]], "defs": []},
                                 {"imports": [], "names": None}, {"imports": [], "defs": [1]},
                                 {"imports": [], "defs": None}, {"imports": [[0, "os"]], "defs": []},
                                 {"imports": None, "defs": []}, {"defs": []}])
def test_source_facts_of_another_shape_are_refused(bad: Any) -> None:
    assert SourceFacts.of_json(bad) is None
    assert SourceFacts.of_json({"imports": [[1, "", ["a"]], [0, "os", None]], "defs": ["f"]}) is not None


@pytest.mark.parametrize("bad", [{"names": [1]}, {"names": "os"}, {"names": None, "x": 1}, {"imports": []}])
def test_top_names_of_another_shape_are_refused(bad: Any) -> None:
    assert TopNames.of_json(bad) is None
    assert TopNames.of_json({"names": None}) == TopNames(None)
    assert TopNames.of_json({"names": ["a", "b"]}) == TopNames(["a", "b"])
