"""A lock's tuning lines with and without their measurement policy: lines recorded before
policies existed (the committed examples' locks) read and write back byte for byte, new
lines carry `policy` and `built_with` after the pin, and bad values are refused by key path."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import REPO

from cutecc.contract.pinned import Pin, Tuned
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock, LockEntry

KEY = {c: c * 64 for c in "ab"}
PIN = Pin("lib.so", "e" * 64, 1000, "__tvm_ffi_mul", None, "c" * 64, "d" * 64)
METHOD = "eager launches, device clock, warmup 3, rounds 30..120, median-ci95+0.01"


def _lock(**extra: str) -> Lock:
    line = Tuned("mul", "dtype=float32", "sm_90a", "NVIDIA H100 80GB HBM3", "floor", "n=4096", KEY["a"],
                 KEY["b"], "dtype=float32,threads=128", PIN, **extra)  # type: ignore[arg-type]
    return Lock((LockEntry("mul", "dtype=float32", "sm_90a", "x86_64", KEY["a"], PIN),), (line,))


@pytest.mark.parametrize("path", ["examples/gemm/kernels.lock", "kernels.lock"])
def test_committed_locks_read_and_write_back_byte_for_byte(path: str) -> None:
    data = (REPO / path).read_bytes()
    lock = Lock.loads(data, path)
    assert lock.dumps() == data
    # one lock, one policy (`tune --record` refuses to mix them), and the DSL named with it
    assert len({t.policy for t in lock.tuning}) <= 1
    assert all((t.policy is None) == (t.built_with is None) for t in lock.tuning)


def test_a_line_without_a_policy_keeps_its_fields_and_one_with_it_adds_two_after_the_pin() -> None:
    old = json.loads(_lock().dumps())["tuning"][0]
    assert "policy" not in old and "built_with" not in old
    new = _lock(policy=METHOD, built_with="nvidia-cutlass-dsl 4.3.1")
    doc = json.loads(new.dumps())["tuning"][0]
    assert list(doc)[: len(old)] == list(old) and list(doc)[len(old):] == ["policy", "built_with"]
    assert doc["policy"] == METHOD and doc["built_with"] == "nvidia-cutlass-dsl 4.3.1"
    again = Lock.loads(new.dumps(), "x")
    assert again == new and again.tuning[0].policy == METHOD
    # The policy is part of the line: the same winner measured by another method is another line.
    assert dataclasses.replace(new.tuning[0], policy="other") != new.tuning[0]


@pytest.mark.parametrize(("field", "value"), [("policy", ""), ("policy", 3), ("built_with", "x" * 301),
                                              ("built_with", ["a"])])
def test_a_bad_policy_or_toolchain_is_refused_with_its_key_path(field: str, value: object) -> None:
    doc = json.loads(_lock(policy=METHOD).dumps())
    doc["tuning"][0][field] = value
    with pytest.raises(CuteccError) as e:
        Lock.loads(json.dumps(doc).encode(), "x")
    assert e.value.key_path == f"tuning[0].{field}", e.value.render()


def test_a_line_records_the_winners_spread_and_the_defaults_time() -> None:
    """`timing` (after the policy): the winner's median and spread and the default's, so a
    reader of the lock can check the winner beat the default by more than the noise."""
    from cutecc.contract.pinned import TunedTiming
    from cutecc.tuning.decide import MIN_GAIN

    t = TunedTiming(8.0, 0.05, 10.0, 0.05)
    new = _lock(policy=METHOD, built_with="nvidia-cutlass-dsl 4.3.1", timing=t)  # type: ignore[arg-type]
    doc = json.loads(new.dumps())["tuning"][0]
    assert list(doc)[-3:] == ["policy", "built_with", "timing"]
    assert doc["timing"] == {"winner_us": 8.0, "winner_spread_us": 0.05, "default_us": 10.0,
                             "default_spread_us": 0.05}
    again = Lock.loads(new.dumps(), "x")
    assert again == new and again.tuning[0].timing == t
    got = again.tuning[0].timing
    assert got is not None
    noise = got.winner_spread_us + got.default_spread_us + MIN_GAIN * got.default_us
    assert got.default_us - got.winner_us > noise  # checkable from the lock alone
    # a line without it (recorded before) keeps its bytes
    assert "timing" not in json.loads(_lock(policy=METHOD).dumps())["tuning"][0]


@pytest.mark.parametrize("value", [{"winner_us": 1.0}, [1, 2, 3, 4], "fast",
                                   {"winner_us": 1.0, "winner_spread_us": -1.0, "default_us": 2.0,
                                    "default_spread_us": 0.0},
                                   {"winner_us": True, "winner_spread_us": 0.0, "default_us": 2.0,
                                    "default_spread_us": 0.0}])
def test_a_bad_timing_is_refused_with_its_key_path(value: object) -> None:
    doc = json.loads(_lock(policy=METHOD).dumps())
    doc["tuning"][0]["timing"] = value
    with pytest.raises(CuteccError, match="must be a table of winner_us") as e:
        Lock.loads(json.dumps(doc).encode(), "x")
    assert e.value.key_path == "tuning[0].timing", e.value.render()
