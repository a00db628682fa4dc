"""One results format both ways (`TuningResults`): the cache's record of a default and the
file `cutecc tune --measure --results FILE` writes and `--record FILE` reads are the same
record, one serializer (one record per line, the cache's bytes as ever) and one bounded,
checked parser. The results files committed before they were one format (indented, the
run's fields always present) read as they are; a hostile file is refused naming the file
and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from cutecc.commands.tune import read_results
from cutecc.errors import CuteccError
from cutecc.runtime.tuning import read_cached, results_path
from cutecc.store.layout import TUNING_FORMAT
from cutecc.store.tuning_records import MAX_RECORD_BYTES, RESULTS_DEPTH, TuningResult, TuningResults

DATA = Path(__file__).parent / "data"
RECORDS = DATA / "tuning_results.json"  # a cache record as an earlier cutecc wrote it
# `--results` files as `cutecc tune --measure` wrote them on an H100 before the formats were one
OLD_RESULTS = sorted((REPO / "benchmarks/results/gemm-tune-h100-noise").glob("*tune-quack_gemm*.json"))
H100 = "NVIDIA H100 80GB HBM3"


def _run(records: tuple[TuningResult, ...]) -> TuningResults:
    return TuningResults(records, H100, "cuda 13000", 27.303)


def test_the_old_results_files_are_there() -> None:
    assert len(OLD_RESULTS) == 3, OLD_RESULTS


@pytest.mark.parametrize("path", OLD_RESULTS, ids=lambda p: p.name)
def test_a_committed_results_file_reads_and_writes_back_as_one_format(path: Path, tmp_path: Path) -> None:
    raw = json.loads(path.read_bytes())
    old = TuningResults.loads(path.read_bytes(), str(path), 64 << 20)
    assert (old.device, old.driver, old.bench_seconds) == (raw["device"], raw["driver"], raw["bench_seconds"])
    assert [r.to_json() for r in old.records] == raw["records"]  # every field kept, as it was
    assert read_results(path) == list(old.records)
    new = old.dumps()
    assert TuningResults.loads(new, "new", 64 << 20) == old
    assert json.loads(new) == raw  # the same document; only the layout is the cache's
    assert new.count(b"\n") == len(old.records) + 8  # one record per line, the run's fields after the format
    assert new.startswith(b'{\n "format": 1,\n "device": "NVIDIA H100 80GB HBM3",\n "driver": "cuda 13000"')


def test_a_cache_record_is_a_results_file_without_the_runs_fields(tmp_path: Path) -> None:
    data = RECORDS.read_bytes()
    rec = TuningResults.loads(data, "r")
    assert (rec.device, rec.driver, rec.bench_seconds) == (None, None, None)
    assert rec.dumps() == data  # the cache's bytes, as ever
    # what --measure writes, installed as a cache record, is read by the runtime as one
    base = rec.records[0].base
    path = results_path(tmp_path, base)
    path.parent.mkdir(parents=True)
    path.write_bytes(_run(rec.records).dumps())
    assert read_cached(tmp_path, base) == [r for r in rec.records if r.base == base]
    # and a cache record is a results file `--record` reads
    shutil.copyfile(RECORDS, tmp_path / "r.json")
    assert read_results(tmp_path / "r.json") == list(rec.records)


def test_round_trip_and_bytes() -> None:
    rec = TuningResults.loads(RECORDS.read_bytes(), "r")
    run = _run(rec.records)
    assert TuningResults.loads(run.dumps(), "x") == run
    assert run.dumps() == _run(rec.records).dumps()  # deterministic
    assert TuningResults(()).dumps() == b'{\n "format": 1,\n "records": []\n}\n'
    assert TuningResults.loads(TuningResults(()).dumps(), "x") == TuningResults(())
    partial = TuningResults(rec.records, device=H100)
    assert b'\n "driver"' not in partial.dumps() and TuningResults.loads(partial.dumps(), "x") == partial


def _doc() -> dict:
    return json.loads(RECORDS.read_text())


@pytest.mark.parametrize(("change", "key_path", "message"), [
    ({"device": 3}, "device", "a string or null"),
    ({"driver": ["cuda"]}, "driver", "a string or null"),
    ({"bench_seconds": -1}, "bench_seconds", "a finite number >= 0"),
    ({"bench_seconds": "1s"}, "bench_seconds", "a finite number >= 0"),
    ({"records": {}}, "records", "a list of records"),
    ({"records": [{"kernel": "k"}]}, "records[0]", ""),
])
def test_a_hostile_field_is_refused_naming_the_file_and_the_field(
        tmp_path: Path, change: dict, key_path: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**_doc(), **change}))
    with pytest.raises(CuteccError) as e:
        read_results(path)
    assert e.value.where == str(path) and (e.value.key_path or "").startswith(key_path), e.value.render()
    assert message in e.value.message


def test_a_hostile_measured_field_is_named_by_its_record(tmp_path: Path) -> None:
    doc = _doc()
    doc["records"][1]["k"] = "many"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CuteccError) as e:
        read_results(path)
    assert e.value.where == str(path) and e.value.key_path == "records[1].k"


@pytest.mark.parametrize(("data", "message"), [
    (b"not json", "not a results file"),
    (json.dumps({"format": TUNING_FORMAT + 1, "records": []}).encode(), "format 1"),
    (json.dumps([1]).encode(), "format 1"),
    (json.dumps({"format": 1, "records": [], "device": [[[[[[[[["deep"]]]]]]]]]}).encode(),
     f"over the limit of {RESULTS_DEPTH}"),
    (b'{"format": 1, "records": [], "x": "' + b"a" * MAX_RECORD_BYTES + b'"}', "limit"),
])
def test_a_file_that_is_no_results_file_is_refused_by_name(data: bytes, message: str) -> None:
    with pytest.raises(CuteccError) as e:
        TuningResults.loads(data, "hostile.json")
    assert e.value.where == "hostile.json" and message in e.value.message, e.value.render()


def test_a_results_file_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    with open(path, "wb") as f:
        f.truncate((64 << 20) + 10)
    with pytest.raises(CuteccError, match="limit") as e:
        read_results(path)
    assert e.value.where == str(path)


def test_an_unreadable_results_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="cannot read the results") as e:
        read_results(tmp_path / "absent.json")
    assert e.value.where == str(tmp_path / "absent.json")
