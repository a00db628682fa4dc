"""Planning facts where CI machines meet (cutecc/ship/planshare.py) against a real S3-compatible
server: a first machine's planning leaves its sources' parsed facts on the remote, a second
machine (a new cache, the planning memory off, as CI runs) plans parsing none of them, with
the same keys; hostile bundles (altered, oversized, of the wrong shape, facts for other bytes)
are ignored with a warning, and the keys stay what parsing gives."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import obstore
import pytest
from helpers import opts, write_toy_project

import cutecc.plan.sourcefacts
from cutecc.commands.build import Progress, build
from cutecc.ship import planshare
from cutecc.toolchain.hashcache import parser_id

PARSER = parser_id()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files planning parses (`sourcefacts.parse`), in order."""
    seen: list[Path] = []
    real = cutecc.plan.sourcefacts.parse

    def spy(data: bytes, f: Path, check: bool = False):
        seen.append(f)
        return real(data, f, check)

    monkeypatch.setattr(cutecc.plan.sourcefacts, "parse", spy)
    return seen


class Notes(Progress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> bool:
        self.lines.append(text)
        return False


def _plan(manifest: Path, cache: Path, url: str | None, *, write: bool = False,
          notes: Notes | None = None) -> dict[str, str]:
    """A dry run's keys by label, on a "machine" of its own: `cache` new, the memory off."""
    rep = build(manifest, opts(cache_dir=cache, remote=url, remote_write=write), dry_run=True,
                progress=notes or Notes())
    return {o.planned.label: o.planned.key for o in rep.outcomes}


def _bundles(s3, url: str) -> list[str]:
    prefix = url.removeprefix(f"s3://{s3.bucket}/")
    return [p for p in s3.objects(prefix) if p.startswith(f"v1/planning/{PARSER}/")]


def test_a_second_machine_plans_without_parsing_what_the_first_parsed(
        s3, prefix: str, tmp_path: Path, parses: list[Path]) -> None:
    m = write_toy_project(tmp_path / "proj")
    alone = _plan(m, tmp_path / "c0", None)
    n = len(parses)
    assert n == 2  # the toy package (the DSL is keyed as a distribution)

    first = _plan(m, tmp_path / "c1", prefix, write=True)
    assert first == alone and len(parses) == 2 * n  # an empty remote answers nothing
    assert len(_bundles(s3, prefix)) == 1

    second = _plan(m, tmp_path / "c2", prefix)  # read only
    assert second == alone
    assert len(parses) == 2 * n  # nothing parsed
    assert len(_bundles(s3, prefix)) == 1

    # a third machine writing too: nothing new to push
    assert _plan(m, tmp_path / "c3", prefix, write=True) == alone
    assert len(parses) == 2 * n and len(_bundles(s3, prefix)) == 1


def test_a_remote_without_a_file_s_facts_leaves_it_parsed_and_pushes_it(
        s3, prefix: str, tmp_path: Path, parses: list[Path]) -> None:
    m = write_toy_project(tmp_path / "proj")
    _plan(m, tmp_path / "c1", prefix, write=True)
    (tmp_path / "proj/toy/ops.py").write_text((tmp_path / "proj/toy/ops.py").read_text() + "\nimport os\n")
    parses.clear()
    edited = _plan(m, tmp_path / "c2", prefix)
    assert [p.name for p in parses] == ["ops.py"]  # only the edited file
    assert len(_bundles(s3, prefix)) == 1  # a build that does not write to the remote pushes nothing
    parses.clear()
    assert _plan(m, tmp_path / "c2b", prefix, write=True) == edited
    assert [p.name for p in parses] == ["ops.py"]
    assert len(_bundles(s3, prefix)) == 2  # its facts, pushed alone
    parses.clear()
    assert _plan(m, tmp_path / "c3", prefix) == edited and parses == []


def _put(s3, url: str, data: bytes, name: str | None = None) -> str:
    name = name or hashlib.sha256(data).hexdigest()
    obstore.put(s3.store(url.removeprefix(f"s3://{s3.bucket}/")), f"v1/planning/{PARSER}/{name}.json", data)
    return name


def test_hostile_bundles_are_ignored_with_a_warning_and_keys_stay(
        s3, prefix: str, tmp_path: Path, parses: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    m = write_toy_project(tmp_path / "proj")
    alone = _plan(m, tmp_path / "c0", None)
    n = len(parses)
    ops = (tmp_path / "proj/toy/ops.py").read_bytes()
    lie = {"imports": [], "names": None}  # "imports nothing": would drop the DSL from the key
    # facts for other bytes: filed under a SHA-256 planning never reads
    other = hashlib.sha256(ops + b"\n").hexdigest()
    _put(s3, prefix, json.dumps({"format": 1, "parser": PARSER, "parsed": {f"source:{other}": lie}}).encode())
    # a bundle altered after it was named
    good = json.dumps({"format": 1, "parser": PARSER,
                       "parsed": {f"source:{hashlib.sha256(ops).hexdigest()}": lie}}).encode()
    _put(s3, prefix, good.replace(b"null", b"[]"), hashlib.sha256(good).hexdigest())
    # a module name a path could be made of
    climbs = {"imports": [[0, "../../etc", None]], "names": []}
    _put(s3, prefix, json.dumps({"format": 1, "parser": PARSER,
                                 "parsed": {f"source:{hashlib.sha256(ops).hexdigest()}": climbs}}).encode())
    # another parser's, and oversized
    _put(s3, prefix, json.dumps({"format": 1, "parser": "0" * 16, "parsed": {}}).encode())
    monkeypatch.setattr(planshare, "MAX_BUNDLE_BYTES", 4096)
    _put(s3, prefix, json.dumps({"format": 1, "parser": PARSER, "parsed": {}, "pad": "x" * 5000}).encode())
    notes = Notes()
    assert _plan(m, tmp_path / "c1", prefix, notes=notes) == alone
    assert len(parses) == 2 * n  # every file parsed: nothing usable came
    said = "\n".join(notes.lines)
    for why in ("altered", "wrong shape", "another parser", "over the 4096-byte"):
        assert why in said
    assert all(ln.startswith("warning: ") and ln.isprintable() for ln in notes.lines)


def test_an_unreachable_remote_plans_as_without_one(
        tmp_path: Path, parses: list[Path], s3, monkeypatch: pytest.MonkeyPatch) -> None:
    m = write_toy_project(tmp_path / "proj")
    alone = _plan(m, tmp_path / "c0", None)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    notes = Notes()
    assert _plan(m, tmp_path / "c1", f"s3://{s3.bucket}/nowhere", write=True, notes=notes) == alone
    assert len(notes.lines) == 1 and "unavailable for planning facts" in notes.lines[0]  # once
