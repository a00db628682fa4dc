"""Sources' parsed facts from a remote cache (cutecc/ship/planshare.py, checked by
cutecc/ship/ingest.py's `check_planning`): a bundle is taken only whole, named by its bytes'
SHA-256, bounded, of this parser and with every record of a source's shape; the planning
memory asks for it only for bytes it does not know, and a fact serves only the bytes it is
filed under. The real server's round trip: tests/distributed/test_planshare.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from cutecc.ship import planshare
from cutecc.ship.ingest import Refused, check_planning
from cutecc.toolchain.planfacts import PathEffect, SourceFacts
from cutecc.toolchain.planmemory import PlanMemory

PARSER = "0123456789abcdef"
SHA = hashlib.sha256(b"import os\n").hexdigest()
FACTS = SourceFacts([[0, "a.b", ["c"]], [0, "os", None], [1, "", ["sib", "*"]]], ["C", "f"])


def _named(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


def _doc(parsed: object, **extra: object) -> bytes:
    return json.dumps({"format": 1, "parser": PARSER, "parsed": parsed, **extra}).encode()


def test_a_well_formed_bundle_is_read_back_as_written() -> None:
    data = planshare.bundle(PARSER, {f"source:{SHA}": FACTS})
    assert check_planning(*_named(data), PARSER, 1 << 20) == {f"source:{SHA}": FACTS}


@pytest.mark.parametrize("record", [
    {"imports": [[0, "../etc", None]], "defs": []},  # a module a path could be made of
    {"imports": [[0, "a/b", None]], "defs": []},
    {"imports": [[0, "", None]], "defs": []},  # no module at level 0
    {"imports": [[-1, "os", None]], "defs": []},
    {"imports": [[0, "os", ["x y"]]], "defs": []},
    {"imports": [[0, "os", None]], "names": []},  # a member the record does not have
    {"imports": [[0, "os"]], "defs": []},  # of another shape
    {"imports": [], "defs": [], "extra": 1},
    {"imports": [], "defs": ["not a name"]},
    {"imports": [], "defs": None},
    "source",
])
def test_a_record_of_the_wrong_shape_refuses_the_whole_bundle(record: object) -> None:
    data = _doc({f"source:{SHA}": {"imports": [], "defs": []}, f"source:{'0' * 64}": record})
    with pytest.raises(Refused, match="wrong shape"):
        check_planning(*_named(data), PARSER, 1 << 20)


@pytest.mark.parametrize("name", [f"path_effect:{SHA}", f"source:{SHA.upper()}", f"source:{SHA[:-1]}",
                                  "source:/etc/passwd", SHA])
def test_only_a_source_s_facts_under_a_sha256_are_carried(name: str) -> None:
    with pytest.raises(Refused, match="wrong shape"):
        check_planning(*_named(_doc({name: {"imports": [], "defs": []}})), PARSER, 1 << 20)


def test_a_bundle_not_of_its_name_of_another_parser_or_oversized_is_refused() -> None:
    data = planshare.bundle(PARSER, {f"source:{SHA}": FACTS})
    name = hashlib.sha256(data).hexdigest()
    with pytest.raises(Refused, match="altered"):
        check_planning(name, data.replace(b'"os"', b'"io"'), PARSER, 1 << 20)
    with pytest.raises(Refused, match="not a SHA-256"):
        check_planning("../" + name[3:], data, PARSER, 1 << 20)
    with pytest.raises(Refused, match="another parser"):
        check_planning(name, data, "f" * 16, 1 << 20)
    with pytest.raises(Refused, match="over the 100-byte limit"):
        check_planning(name, data, PARSER, 100)
    for bad in (b"[]", b"{", _doc({}, format=2).replace(b'"format": 1, ', b""), b'{"format": 1}'):
        with pytest.raises(Refused):
            check_planning(*_named(bad), PARSER, 1 << 20)


def test_the_memory_asks_the_remote_once_and_only_for_bytes_it_does_not_know() -> None:
    asked: list[int] = []
    other = hashlib.sha256(b"import io\n").hexdigest()

    def fetch() -> dict[str, SourceFacts]:
        asked.append(1)
        return {f"source:{SHA}": FACTS}

    mem = PlanMemory(None, PARSER)
    mem.remember_parsed(other, SourceFacts([], []))
    mem.share(fetch)
    assert mem.parsed(SourceFacts, other) == SourceFacts([], []) and asked == []  # known here
    assert mem.parsed(PathEffect, SHA) is None and asked == []  # never carried
    assert mem.parsed(SourceFacts, SHA) == FACTS and mem.served_shared == 1
    assert mem.parsed(SourceFacts, "0" * 64) is None  # facts of other bytes serve no file
    assert asked == [1]
    # what the remote lacks of what this run used, for the push
    assert mem.unshared() == {f"source:{other}": SourceFacts([], [])} and asked == [1]


def test_a_run_that_used_no_fact_fetches_nothing_to_push() -> None:
    mem = PlanMemory(None, PARSER)
    mem.share(lambda: pytest.fail("fetched"))  # type: ignore[arg-type,return-value]
    assert mem.unshared() == {}
