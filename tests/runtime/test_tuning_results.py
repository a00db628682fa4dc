"""Tuning results (the cache's records, a results file's) are typed records parsed once
where they are read: a record file written by an earlier cutecc reads back and writes
again byte for byte; a measured field that is malformed is refused with its key path, and
in the cache it loses the tuning, never the kernel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cutecc.errors import CuteccError
from cutecc.runtime.tuning import read_cached, results_path, winners_in
from cutecc.store.tuning_records import MEASURED, TuningResult, TuningResults

DATA = Path(__file__).parent / "data"
# A record file as `cutecc tune --record` wrote it before results were typed.
RECORDS = DATA / "tuning_results.json"
BASE = "709c2b1225e48c952d7bf6b16afeb34f6229d51ae1db21bfb550344d98e53365"


def _install(root: Path) -> Path:
    path = results_path(root, BASE)
    path.parent.mkdir(parents=True)
    shutil.copyfile(RECORDS, path)
    return path


def test_a_stored_record_file_reads_back_and_writes_again_byte_for_byte(tmp_path: Path) -> None:
    _install(tmp_path)
    records = read_cached(tmp_path, BASE)
    assert len(records) == 4 and all(r.base == BASE for r in records)
    assert TuningResults(tuple(records)).dumps() == RECORDS.read_bytes()


def test_parsed_fields_are_the_files_values(tmp_path: Path) -> None:
    _install(tmp_path)
    raw = json.loads(RECORDS.read_text())["records"]
    records = read_cached(tmp_path, BASE)
    for r, d in zip(records, raw):
        assert r.line.bucket == d["bucket"] and r.line.winner_variant == d["winner_variant"]
        assert r.slot == (d["device"], d["bucket"]) and r.k == d["k"] and r.driver == d["driver"]
        assert r.times_us == {v: tuple(t) for v, t in d["times_us"].items()}
        assert (r.default_us, r.winner_us, r.clock) == (d["default_us"], d["winner_us"], d["clock"])
        # the winner's median is the winner_us the record states
        assert r.times_us[r.line.winner_variant][1] == r.winner_us
    assert winners_in(tmp_path) == {
        raw[i]["winner"]: [f"{d['variant']} {d['bucket']} on {d['device']}" for d in raw
                           if d["winner"] == raw[i]["winner"]] for i in range(len(raw))}


def test_a_record_keeps_exactly_the_measured_fields_it_had() -> None:
    d = json.loads(RECORDS.read_text())["records"][0]
    for drop in (("k", "driver", "toolchain"), tuple(MEASURED)):
        part = {k: v for k, v in d.items() if k not in drop}
        r = TuningResult.parse(part, "x", "records[0]")
        # as text, so an int written back as a float (1 == 1.0) would show
        assert json.dumps(r.to_json(), sort_keys=True) == json.dumps(part, sort_keys=True)
    bare = TuningResult.parse(d, "x", "r").line  # a record may be its line alone
    assert TuningResult.parse(TuningResult(bare).to_json(), "x", "r") == TuningResult(bare)
    assert TuningResult(bare).to_json() == bare.to_json()
    notes = {**d, "driver": None, "clock": "device", "clock_note": "why", "timing_notes": ["a", "b"]}
    assert TuningResult.parse(notes, "x", "r").to_json() == notes


@pytest.mark.parametrize(("field", "value"), [
    ("times_us", {"dtype=float32": [1.0, float("nan"), 2.0]}),
    ("times_us", {"dtype=float32": [1.0, 2.0]}),
    ("k", -1),
    ("k", True),
    ("default_us", "fast"),
    ("dropped", {"t=1": 3}),
    ("timing_notes", ["n"] * 11),
    ("driver", 12080),
    ("spread_us", {"dtype=float32": -0.1}),
    ("samples", {"dtype=float32": 2.5}),
    ("within_noise", "dtype=float32"),
    ("measurement", {"sm_clock_mhz": [{"min": 1}]}),
    ("measurement", {f"f{i}": 1 for i in range(33)}),
])
def test_a_malformed_measured_field_is_refused_and_loses_only_the_tuning(
        tmp_path: Path, field: str, value: object) -> None:
    doc = json.loads(RECORDS.read_text())
    doc["records"][2][field] = value
    with pytest.raises(CuteccError) as e:
        TuningResult.parse(doc["records"][2], "r.json", "records[2]")
    assert e.value.where == "r.json" and e.value.key_path == f"records[2].{field}"
    path = _install(tmp_path)
    path.write_text(json.dumps(doc))
    assert read_cached(tmp_path, BASE) == []
