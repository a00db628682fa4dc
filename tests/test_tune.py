# ruff: noqa: E501  (tuning tables as one-line TOML strings read better unwrapped)
"""Build-time autotuning on the CPU side (issue 13): the tuning space, buckets, the lock's
tuning results, the runtime's lookup and fallback, and `cutecc tune --dry-run/--compile-only`."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, run_cli

from cutecc.errors import CuteccError
from cutecc.lockfile import Lock, LockEntry, read_lock, record_build
from cutecc.manifest import load_manifest
from cutecc.runtime.tuning import Tuned, TuningTable, bucket_of

KEY = {c: c * 64 for c in "abcdef"}


def test_the_example_space_expands_as_declared_with_constraints() -> None:
    m = load_manifest(REPO / "kernels.toml")
    mul = m.kernel("mul")
    assert [v.id for v in mul.variants] == ["dtype=float32", "dtype=float16", "dtype=bfloat16"]
    cands = dict(mul.candidates)
    assert [c.id for c in cands["dtype=float32"]] == [f"dtype=float32,threads={t}" for t in (64, 128, 512, 1024)]
    assert dict(mul.variants[0].constants) == {"threads": 256}  # the default: what `build` builds
    assert [dict(c.constants)["threads"] for c in cands["dtype=float32"]] == [64, 128, 512, 1024]
    rms = dict(m.kernel("rmsnorm").candidates)
    # "block <= d // 4": d = 1024 allows 64, 128 (and the default 256); d = 4096 all five.
    assert [dict(c.factory_args)["block_size"] for c in rms["dtype=float32,d=1024"]] == [64, 128]
    assert [dict(c.factory_args)["block_size"] for c in rms["dtype=float32,d=4096"]] == [64, 128, 512, 1024]
    assert m.kernel("axpy").tuning is None and m.kernel("axpy").candidates == ()


TOML = """
[kernel.k]
entry = "m:f"
args = [{{ name = "x", dtype = "float32", shape = ["n"] }},
        {{ name = "o", role = "output", dtype = "float32", shape = ["n"] }}]
constants = {{ t = "$t", v = "$v" }}
[kernel.k.tune]
{tune}
"""


@pytest.mark.parametrize(("tune", "where", "what"), [
    ('params = { t = [1, 2] }\ndefault = { t = 3 }\nbuckets = { n = [8] }', "tune.default.t",
     "is not one of params.t"),
    ('params = { t = [1, 2], v = [1] }\ndefault = { t = 1, v = 1 }\nbuckets = { n = [8] }\nconstraints = ["__import__(1)"]',
     "tune.constraints[0]", "Call is not allowed"),
    ('params = { t = [1, 2], v = [1] }\ndefault = { t = 1, v = 1 }\nbuckets = { m = [8] }', "tune.buckets.m",
     "is not a symbolic extent"),
    ('params = { t = [1, 2], v = [1] }\ndefault = { t = 1, v = 1 }\nbuckets = { n = [8, 4] }', "tune.buckets.n",
     "strictly ascending"),
    ('params = { t = [1, 2], v = [1] }\ndefault = { t = 2, v = 1 }\nbuckets = { n = [8] }\nconstraints = ["t < 2"]',
     "tune.default", "does not satisfy the constraints"),
    ('params = { t = [1, 2], v = [1] }\ndefault = { t = 1, v = 1 }\nbuckets = { n = { pow2 = [8, 12] } }',
     "tune.buckets.n.pow2", "powers of two"),
    ('params = { t = [1], v = [1] }\ndefault = { t = 1, v = 1 }\nbuckets = { n = [8] }\nspeed = 1', "tune",
     'unknown key "speed"'),
])
def test_a_bad_tuning_space_is_refused_with_its_key_path(tmp_path: Path, tune: str, where: str, what: str) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(TOML.format(tune=tune))
    with pytest.raises(CuteccError) as e:
        load_manifest(p)
    assert where in (e.value.key_path or "") and what in e.value.message, e.value.render()


def test_constraints_filter_points_and_pow2_buckets_expand(tmp_path: Path) -> None:
    p = tmp_path / "kernels.toml"
    p.write_text(TOML.format(tune='params = { t = [1, 2, 4], v = [1, 3] }\ndefault = { t = 1, v = 1 }\n'
                                  'buckets = { n = { pow2 = [8, 64] } }\nconstraints = ["t * v <= 4", "not t == 2"]'))
    k = load_manifest(p).kernel("k")
    assert [c.id for c in dict(k.candidates)["default"]] == ["t=1,v=3", "t=4,v=1"]
    assert k.tuning is not None and k.tuning.buckets[0].edges == (8, 16, 32, 64)


@pytest.mark.parametrize(("value", "floor", "nearest"), [
    (1, 4096, 4096), (4096, 4096, 4096), (4097, 4096, 4096), (40000, 4096, 65536),
    (65535, 4096, 65536), (65536, 65536, 65536), (10**9, 16777216, 16777216)])
def test_bucket_lookup_at_and_between_edges(value: int, floor: int, nearest: int) -> None:
    edges = (4096, 65536, 1048576, 16777216)
    assert bucket_of(value, edges, "floor") == floor
    assert bucket_of(value, edges, "nearest") == nearest


def _entry(variant: str, key: str) -> LockEntry:
    return LockEntry("mul", variant, "sm_90a", key, "lib.so", key[:1] * 64, 1000, "__tvm_ffi_mul", None, "c" * 64)


def _tuned(bucket: str, winner: str, device: str = "NVIDIA H100 80GB HBM3") -> Tuned:
    return Tuned("mul", "dtype=float32", "sm_90a", device, "floor", bucket, KEY["a"], winner,
                 "dtype=float32" if winner == KEY["a"] else "dtype=float32,threads=128", "lib.so",
                 winner[:1] * 64, 1000, "__tvm_ffi_mul", None, "c" * 64)


def test_lock_round_trip_keeps_tuning_and_a_build_preserves_it(tmp_path: Path) -> None:
    lock = Lock((_entry("dtype=float32", KEY["a"]),),
                (_tuned("n=65536", KEY["b"]), _tuned("n=4096", KEY["a"])))
    data = lock.dumps()
    assert Lock.loads(data, "x") == lock and Lock.loads(data, "x").dumps() == data
    assert b'"tuning": [' in data and [e.key for e in lock.winners()] == [KEY["b"]]
    assert b"tuning" not in Lock(lock.entries).dumps()  # untuned locks keep their bytes
    path = tmp_path / "kernels.lock"
    path.write_bytes(data)
    # A build that locks the same default keeps the results, byte for byte.
    assert not record_build(path, [_entry("dtype=float32", KEY["a"])], partial=False, covered=set(),
                            defined={"mul"})
    assert path.read_bytes() == data
    # A rebuilt default (new key) makes its results stale: they go.
    record_build(path, [_entry("dtype=float32", KEY["c"])], partial=False, covered=set(), defined={"mul"})
    assert read_lock(path).tuning == ()


@dataclass(frozen=True)
class _B:
    key: str
    variant: str = "dtype=float32"


def test_dispatch_picks_the_bucket_winner_and_falls_back_on_an_untuned_device(
        caplog: pytest.LogCaptureFixture) -> None:
    lines = [_tuned("n=4096", KEY["a"]), _tuned("n=65536", KEY["b"]), _tuned("n=1048576", KEY["a"])]
    winner = _B(KEY["b"], "dtype=float32,threads=128")
    default = _B(KEY["a"])
    h100 = TuningTable("mul", lines, lambda t: winner, kind=lambda: "NVIDIA H100 80GB HBM3")
    assert h100.pick(default, {"n": 100}) is default            # below the first edge: its bucket
    assert h100.pick(default, {"n": 65536}) is winner           # at an edge
    assert h100.pick(default, {"n": 300000}) is winner          # between edges: the lower one
    assert h100.pick(default, {"n": 1048576}) is default        # the default won there
    h200 = TuningTable("mul", lines, lambda t: winner, kind=lambda: "NVIDIA H200")
    with caplog.at_level(logging.WARNING, logger="cutecc"):
        assert h200.pick(default, {"n": 65536}) is default
        assert h200.pick(default, {"n": 65536}) is default
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "no tuning results for device kind NVIDIA H200" in notes[0]
    unusable = TuningTable("mul", lines, lambda t: None, kind=lambda: "NVIDIA H100 80GB HBM3")
    assert unusable.pick(default, {"n": 65536}) is default


def test_dry_run_json_lists_each_kernels_candidates() -> None:
    r = run_cli("tune", str(REPO / "kernels.toml"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "dry-run" and set(doc["kernels"]) == {"mul", "rmsnorm"}
    mul = doc["kernels"]["mul"]
    assert len(mul) == 15 and sum(c["default"] for c in mul) == 3
    assert {c["variant"] for c in mul if c["base"] == "dtype=float16"} == {
        "dtype=float16"} | {f"dtype=float16,threads={t}" for t in (64, 128, 512, 1024)}
    assert doc["candidates"] == 15 + 3 * 2 + 5 * 2 and doc["built"] == 0


def test_tune_of_a_kernel_without_a_space_is_an_error() -> None:
    r = run_cli("tune", str(REPO / "kernels.toml"), "--dry-run", "--kernel", "axpy")
    assert r.returncode == 2 and 'kernel "axpy" declares no tuning space' in r.stderr


def test_compile_only_uses_builds_keys_and_a_rerun_compiles_nothing(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="compiling needs the build extra")
    proj = tmp_path / "proj"
    shutil.copytree(REPO / "kernels", proj / "kernels")
    shutil.copy(REPO / "kernels.toml", proj / "kernels.toml")
    shutil.copy(REPO / "kernels.lock", proj / "kernels.lock")
    cache = tmp_path / "c"
    b = run_cli("build", str(proj / "kernels.toml"), "--cache-dir", str(cache), "--json", timeout=900)
    assert b.returncode == 0, b.stderr
    assert (proj / "kernels.lock").read_bytes() == (REPO / "kernels.lock").read_bytes()
    first = run_cli("tune", str(proj / "kernels.toml"), "--compile-only", "--cache-dir", str(cache), "--json",
                    timeout=900)
    assert first.returncode == 0, first.stderr
    d1 = json.loads(first.stdout)
    # The defaults were built by `cutecc build` under the same keys: only the others compile.
    assert d1["built"] == d1["candidates"] - 7 and d1["failed"] == []
    again = json.loads(run_cli("tune", str(proj / "kernels.toml"), "--compile-only", "--cache-dir",
                               str(cache), "--json").stdout)
    assert again["built"] == 0 and again["cached"] == d1["built"] + d1["cached"]
    assert (proj / "kernels.lock").read_bytes() == (REPO / "kernels.lock").read_bytes()
    assert list((cache / "tuning" / "plans").glob("*.json"))
