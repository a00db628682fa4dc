"""Tuning plan items are typed records parsed once where they are read: a plan written by
an earlier cutecc reads back and writes again byte for byte, a fresh plan survives the
same round trip, and a malformed field is refused naming the file and the item."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.tuning_plan import (
    PLAN_DEPTH,
    BucketEdges,
    Candidate,
    PlanItem,
    TuningPlan,
    items,
    read_plan,
    write_plan,
)
from cutecc.store.layout import Layout

DATA = Path(__file__).parent / "data"
# Plans as `cutecc tune --compile-only` wrote them before plan items were typed: one with a
# candidate dropped (it failed to compile), one with tolerances and several kernels.
PLANS = ("plan.json", "plan_tolerances.json")


def _install(root: Path, name: str) -> tuple[str, bytes]:
    data = (DATA / name).read_bytes()
    digest = json.loads(data)["manifest_sha256"]
    path = Layout(root).tuning_plan(digest)
    path.parent.mkdir(parents=True)
    shutil.copyfile(DATA / name, path)
    return digest, data


@pytest.mark.parametrize("name", PLANS)
def test_a_stored_plan_reads_back_and_writes_again_byte_for_byte(tmp_path: Path, name: str) -> None:
    digest, data = _install(tmp_path / "old", name)
    plan = read_plan(tmp_path / "old", digest, "x")
    assert plan and all(isinstance(it, PlanItem) for it in plan)
    written = write_plan(tmp_path / "new", digest, plan)
    assert written.read_bytes() == data


def test_parsed_fields_are_the_files_values(tmp_path: Path) -> None:
    digest, data = _install(tmp_path, "plan.json")
    (it,) = read_plan(tmp_path, digest, "x")
    raw = json.loads(data)["items"][0]
    assert (it.kernel, it.variant, it.arch, it.rule) == ("tuned_copy", "default", "sm_90a", "floor")
    assert it.base == raw["base"] == it.candidates[0].key and it.candidates[0].default
    assert [c.variant for c in it.candidates] == ["default", "mode=1", "mode=2"]
    assert not any(c.default for c in it.candidates[1:])
    assert it.buckets == (BucketEdges("n", (1024, 65536, 1048576, 4194304)),)
    assert [p["n"] for p in it.points()] == [1024, 65536, 1048576, 4194304]
    assert it.dropped is not None and it.dropped["mode=3"].startswith("failed to compile")
    assert it.rtol is None and it.atol is None and it.params == {"mode": [0, 1, 2, 3]}
    assert it.label == "tuned_copy[default]@sm_90a"


def test_an_item_without_dropped_candidates_writes_no_dropped_field() -> None:
    it = PlanItem("k", "v", "sm_90a", "a" * 64, (Candidate("v", "a" * 64, True),), "floor",
                  (BucketEdges("n", (8, 64)),), {}, {}, None, None, {}, {}, {})
    assert "dropped" not in it.to_json()
    assert PlanItem.parse(it.to_json(), "x", "items[0]") == it


SCALAR_TOML = """
[kernel.k]
entry = "m:f"
args = [{ name = "x", dtype = "float32", shape = ["n", "m"] },
        { name = "o", role = "output", dtype = "float32", shape = ["n", "m"] },
        { kind = "scalar", name = "scale", dtype = "float32" }]
constants = { t = "$t" }
[kernel.k.tune]
params = { t = [1, 2] }
default = { t = 1 }
buckets = { n = [8, 64] }
sizes = { m = "n" }
scalars = { scale = 0.5 }
inputs = { x = { low = -2.0, high = 3 } }
tolerance = { rtol = 0.01, atol = 0 }
"""


def test_a_fresh_plan_with_every_setting_round_trips_byte_for_byte(tmp_path: Path) -> None:
    """Sizes, scalars, input ranges and tolerances, as planned from a manifest, read back as
    they were written (ints stay ints: an input range's 3 is not written back as 3.0)."""
    p = tmp_path / "kernels.toml"
    p.write_text(SCALAR_TOML)
    (tmp_path / "m.py").write_text("def f(x, o, scale):\n    pass\n")  # planning never imports it
    planned = items(load_manifest(p))
    (it,) = planned
    assert it.sizes == {"m": "n"} and it.scalars == {"scale": 0.5}
    assert it.inputs == {"x": (-2.0, 3)} and (it.rtol, it.atol) == (0.01, 0)
    assert [c.default for c in it.candidates] == [True, False]
    first = write_plan(tmp_path / "a", "b" * 64, planned).read_bytes()
    assert b'"x": [\n     -2.0,\n     3\n    ]' in first
    again = write_plan(tmp_path / "b", "b" * 64, read_plan(tmp_path / "a", "b" * 64, "x")).read_bytes()
    assert again == first


@pytest.mark.parametrize(("field", "value", "what"), [
    ("kernel", 3, "kernel is not a string"),
    ("base", "zz", "base or rule"),
    ("rule", "ceil", "base or rule"),
    ("candidates", [{"variant": "v", "key": "a" * 64, "default": "yes"}], "candidates"),
    ("buckets", [{"extent": "n", "edges": [0]}], "buckets"),
    ("inputs", {"x": [1.0]}, "inputs"),
    ("dropped", None, "dropped"),
    ("atol", float("inf"), "rtol or atol"),
])
def test_a_malformed_field_is_refused_naming_the_file_and_item(field: str, value: object, what: str) -> None:
    doc = json.loads((DATA / "plan.json").read_text())["items"][0]
    doc[field] = value
    with pytest.raises(CuteccError) as e:
        PlanItem.parse(doc, "plan.json", "items[3]")
    assert e.value.where == "plan.json" and e.value.key_path == "items[3]"
    assert e.value.message == f"malformed plan item: {what}" and e.value.exit_code == 1


@pytest.mark.parametrize("name", PLANS)
def test_the_plan_file_is_one_record_both_ways(name: str) -> None:
    """`TuningPlan` reads a stored plan and writes its bytes again (what `write_plan` stores)."""
    data = (DATA / name).read_bytes()
    plan = TuningPlan.loads(data, name, json.loads(data)["manifest_sha256"])
    assert plan.dumps() == data and TuningPlan.loads(plan.dumps(), name) == plan


@pytest.mark.parametrize(("change", "key_path", "message"), [
    ({"manifest_sha256": "f" * 64}, "manifest_sha256", "the SHA-256 of the manifest it plans"),
    ({"manifest_sha256": 3}, "manifest_sha256", "the SHA-256 of the manifest it plans"),
    ({"format": 2}, None, "not a tuning plan of format 1"),
    ({"items": {}}, None, "not a tuning plan of format 1"),
    ({"items": [{"kernel": "k"}]}, "items[0]", "malformed plan item"),
])
def test_a_hostile_plan_is_refused_naming_the_file_and_the_field(
        tmp_path: Path, change: dict, key_path: str | None, message: str) -> None:
    """Under the digest it is stored by, a plan must name that manifest, be of this format
    and hold well-formed items; read_plan names the file and the field."""
    digest, data = _install(tmp_path, "plan.json")
    path = Layout(tmp_path).tuning_plan(digest)
    path.write_text(json.dumps({**json.loads(data), **change}))
    with pytest.raises(CuteccError) as e:
        read_plan(tmp_path, digest, "x")
    assert e.value.where == str(path) and e.value.key_path == key_path and message in e.value.message


@pytest.mark.parametrize(("data", "message"), [
    (b"{", "not a tuning plan"),
    (json.dumps({"format": 1, "items": [], "x": [[[[[[[[[1]]]]]]]]]}).encode(), f"limit of {PLAN_DEPTH}"),
    (b'{"format": 1, "items": [], "x": "' + b"a" * (16 << 20) + b'"}', "limit"),
])
def test_a_file_that_is_no_plan_is_refused_bounded(data: bytes, message: str) -> None:
    with pytest.raises(CuteccError) as e:
        TuningPlan.loads(data, "hostile.json")
    assert e.value.where == "hostile.json" and message in e.value.message, e.value.render()

