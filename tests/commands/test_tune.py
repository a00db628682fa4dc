# ruff: noqa: E501  (tuning tables as one-line TOML strings read better unwrapped)
"""Build-time autotuning on the CPU side: the tuning space, buckets, the lock's
tuning results, the runtime's lookup and fallback, and `cutecc tune --dry-run/--compile-only`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, run_cli

from cutecc.contract.buckets import bucket_of
from cutecc.contract.pinned import Pin, Tuned
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock, LockEntry, read_lock, record_build
from cutecc.manifest import load_manifest
from cutecc.runtime.tuning import TuningTable

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
    _assert_refused(tmp_path, TOML.format(tune=tune), where, what)


def _assert_refused(tmp_path: Path, text: str, where: str, what: str) -> None:
    """Loading the manifest `text` fails at key path `where`, saying `what`."""
    p = tmp_path / "kernels.toml"
    p.write_text(text)
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
    return LockEntry("mul", variant, "sm_90a", "x86_64", key,
                     Pin("lib.so", key[:1] * 64, 1000, "__tvm_ffi_mul", None, "c" * 64, "d" * 64))


def _tuned(bucket: str, winner: str, device: str = "NVIDIA H100 80GB HBM3") -> Tuned:
    return Tuned("mul", "dtype=float32", "sm_90a", device, "floor", bucket, KEY["a"], winner,
                 "dtype=float32" if winner == KEY["a"] else "dtype=float32,threads=128",
                 Pin("lib.so", winner[:1] * 64, 1000, "__tvm_ffi_mul", None, "c" * 64, "d" * 64))


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


def test_lock_and_tuning_lines_are_flat_in_the_format_order_and_share_one_pin() -> None:
    """A line's pinned fields are one `Pin`, written flat after the line's own fields: the
    file's bytes are the format's, and a tuned winner's lock line pins what its tuning line does."""
    lock = Lock((_entry("dtype=float32", KEY["a"]),), (_tuned("n=65536", KEY["b"]),))
    doc = json.loads(lock.dumps())
    pinned = ["library", "sha256", "size", "symbol", "backward", "contract", "runtime"]
    assert list(doc["entries"][0]) == ["kernel", "variant", "arch", "platform", "key", *pinned]
    assert list(doc["tuning"][0]) == ["kernel", "variant", "arch", "device", "rule", "bucket", "base",
                                      "winner", "winner_variant", *pinned]
    assert doc["tuning"][0]["sha256"] == KEY["b"][:1] * 64 and doc["entries"][0]["size"] == 1000
    (winner,) = lock.winners()
    assert winner.pin == lock.tuning[0].pin and winner.key == KEY["b"]
    assert winner.variant == "dtype=float32,threads=128"
    assert winner.platform == "x86_64"  # a winner's host platform is its default's
    head, tail = lock.dumps().split(b'"tuning"')
    with pytest.raises(CuteccError, match=r"tuning\[0\]\.size"):  # the pin is checked in either line
        Lock.loads(head + b'"tuning"' + tail.replace(b'"size": 1000', b'"size": -1'), "x")


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


def test_compile_only_uses_builds_keys_and_a_rerun_compiles_nothing(compiled: tuple[Path, Path, dict]) -> None:
    proj, cache, d1 = compiled
    # The defaults were built by `cutecc build` under the same keys: only the others compile.
    assert d1["built"] == d1["candidates"] - 7 and d1["failed"] == []
    again = json.loads(run_cli("tune", str(proj / "kernels.toml"), "--compile-only", "--cache-dir",
                               str(cache), "--json").stdout)
    assert again["built"] == 0 and again["cached"] == d1["built"] + d1["cached"]
    assert (proj / "kernels.lock").read_bytes() == (REPO / "kernels.lock").read_bytes()
    assert list((cache / "tuning" / "plans").glob("*.json"))


H100 = "NVIDIA H100 80GB HBM3"


def _results(proj: Path, cache: Path, path: Path) -> dict[str, str]:
    """A results file as `--measure` writes it, with made-up times: threads=128 wins the
    buckets n=65536 and n=1048576 clearly, threads=512 beats the default at n=4096 by less
    than the spread (so the default stays)."""
    from cutecc.plan.tuning_plan import manifest_digest, read_plan
    from cutecc.store import Store
    from cutecc.tuning.measure import _record

    items = read_plan(cache, manifest_digest(proj / "kernels.toml"), "x")
    item = next(it for it in items if it.kernel == "mul" and it.variant == "dtype=float32")
    keys = {c.variant: c.key for c in item.candidates}
    recs = []
    for n in (4096, 65536, 1048576, 16777216):
        times = {k: [19.0, 20.0, 21.0] for k in keys.values()}
        times[keys["dtype=float32"]] = [9.0, 10.0, 11.0]
        if n in (65536, 1048576):
            times[keys["dtype=float32,threads=128"]] = [4.9, 5.0, 5.1]
        if n == 4096:
            times[keys["dtype=float32,threads=512"]] = [9.0, 9.5, 10.0]
        ev = {"times": times, "dropped": {}, "k": 8}
        recs.append(_record(Store(cache), item, f"n={n}", ev, {}, {"device": H100, "driver": "cuda 12080"}))
    path.write_text(json.dumps({"format": 1, "records": [r.to_json() for r in recs]}))
    return keys


def _target(ks, n: int) -> str:  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    s = jax.ShapeDtypeStruct((n,), jnp.float32)
    text = jax.jit(lambda a, b: ks.mul(a, b)).trace(s, s).lower(lowering_platforms=("cuda",)).as_text()
    return text.split("custom_call @cutecc_")[1][:40]


def test_recorded_winners_go_into_the_lock_build_keeps_them_and_dispatch_serves_them(
        compiled: tuple[Path, Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cutecc
    from cutecc.commands.pack import pack

    proj, cache, _ = compiled
    keys = _results(proj, cache, tmp_path / "r.json")
    r = run_cli("tune", str(proj / "kernels.toml"), "--record", str(tmp_path / "r.json"), "--cache-dir",
                str(cache), "--json")
    assert r.returncode == 0, r.stderr
    lock = read_lock(proj / "kernels.lock")
    assert {t.bucket: t.winner_variant for t in lock.tuning} == {
        "n=4096": "dtype=float32", "n=65536": "dtype=float32,threads=128",
        "n=1048576": "dtype=float32,threads=128", "n=16777216": "dtype=float32"}
    recorded = (proj / "kernels.lock").read_bytes()
    # `cutecc build` reproduces the lock, tuning lines included, byte for byte.
    b = run_cli("build", str(proj / "kernels.toml"), "--cache-dir", str(cache))
    assert b.returncode == 0 and (proj / "kernels.lock").read_bytes() == recorded
    default, winner = keys["dtype=float32"][:40], keys["dtype=float32,threads=128"][:40]
    monkeypatch.setenv("CUTECC_DEVICE_KIND", H100)
    for source in ({"lock": proj / "kernels.lock", "allow_unsigned": True}, {}):  # the lock, the cache
        ks = cutecc.load(cache, arch="sm_90a", **source)
        assert [_target(ks, n) for n in (100, 4096, 70000, 65536, 1048576, 5_000_000, 20_000_000)] == [
            default, default, winner, winner, winner, winner, default]
    monkeypatch.setenv("CUTECC_DEVICE_KIND", "NVIDIA H200")  # another device kind: never H100's winners
    ks = cutecc.load(cache, arch="sm_90a", lock=proj / "kernels.lock", allow_unsigned=True)
    assert _target(ks, 70000) == default
    # `list` says what wins where; a pack ships the winner, not the rest of the space.
    listed = json.loads(run_cli("list", "--cache-dir", str(cache), "--json").stdout)
    wins = {e["key"]: e["winner_for"] for e in listed["entries"] if e["winner_for"]}
    assert sorted(wins[keys["dtype=float32,threads=128"]]) == [f"dtype=float32 n=1048576 on {H100}",
                                                               f"dtype=float32 n=65536 on {H100}"]
    rep = pack(name="tuned", version="1.0", lock=proj / "kernels.lock", out=tmp_path, cache_dir=cache,
               fmt="tar")
    import tarfile

    with tarfile.open(rep.path) as tf:
        packed = {n.split("/")[3] for n in tf.getnames() if n.count("/") >= 3}
    assert keys["dtype=float32,threads=128"] in packed
    assert keys["dtype=float32,threads=64"] not in packed and keys["dtype=float32"] in packed
    # Unpacked elsewhere, the winner lands with the defaults and serves its buckets there.
    from cutecc.commands.unpack import unpack

    u = unpack(rep.path, tmp_path / "c2", allow_unsigned=True)
    assert u.ok and any(keys["dtype=float32,threads=128"][:12] in i for i in u.imported), u.imported
    (tmp_path / "lock2").write_bytes((proj / "kernels.lock").read_bytes())
    monkeypatch.setenv("CUTECC_DEVICE_KIND", H100)
    ks = cutecc.load(tmp_path / "c2", arch="sm_90a", lock=tmp_path / "lock2", allow_unsigned=True)
    assert _target(ks, 70000) == winner and _target(ks, 5000) == default


def test_results_naming_a_non_candidate_are_refused(compiled: tuple[Path, Path, dict], tmp_path: Path) -> None:
    proj, cache, _ = compiled
    _results(proj, cache, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["records"][1]["winner"] = doc["records"][1]["base"].replace(doc["records"][1]["base"][0], "0", 1)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    before = (proj / "kernels.lock").read_bytes()
    r = run_cli("tune", str(proj / "kernels.toml"), "--record", str(tmp_path / "bad.json"), "--cache-dir",
                str(cache))
    assert r.returncode == 1 and "not a candidate of the manifest" in r.stderr, r.stderr
    assert (proj / "kernels.lock").read_bytes() == before


def test_a_faulting_or_crashing_candidate_is_dropped_and_measuring_goes_on(
        compiled: tuple[Path, Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's side of the protocol, with a scripted child (the GPU suite runs the real
    one on tests/gpu/faulty_kernels): a fault and a crash each cost a fresh process."""
    from cutecc.plan.tuning_plan import manifest_digest, read_plan
    from cutecc.tuning.measure import measure

    proj, cache, _ = compiled
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    items = [it for it in read_plan(cache, manifest_digest(proj / "kernels.toml"), "x")
             if it.kernel == "mul" and it.variant == "dtype=float32"]
    records, info = measure(cache, items, child="fake_bench_child")
    assert info["device"] == "Fake GPU" and info["failed"] == []
    assert [r.line.bucket for r in records] == ["n=1048576", "n=16777216", "n=4096", "n=65536"]
    for r in records:
        assert set(r.times_us) == {"dtype=float32", "dtype=float32,threads=128"}
        assert r.line.winner_variant == "dtype=float32,threads=128"
        d = r.dropped
        assert d["dtype=float32,threads=64"].startswith("faulted: XlaRuntimeError")
        assert d["dtype=float32,threads=512"].startswith("killed its process (exit -9)")
        assert d["dtype=float32,threads=1024"].startswith("disagrees")
    only = measure(cache, items, child="fake_bench_child", buckets=("n=65536",))[0]
    assert [r.line.bucket for r in only] == ["n=65536"]


def test_a_hang_costs_only_its_candidate_or_bucket_and_a_slow_run_is_not_cut(
        compiled: tuple[Path, Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """The child is killed after CHILD_IDLE_TIMEOUT seconds without a word, not after a
    total: a healthy run longer than that keeps every bucket; a hang while checking drops
    that candidate; a hang while timing drops that bucket (reported), not the others."""
    from cutecc.plan.tuning_plan import manifest_digest, read_plan
    from cutecc.tuning import measure as m

    proj, cache, _ = compiled
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    monkeypatch.setattr(m, "CHILD_IDLE_TIMEOUT", 2.0)
    items = [it for it in read_plan(cache, manifest_digest(proj / "kernels.toml"), "x")
             if it.kernel == "mul" and it.variant == "dtype=float32"]
    monkeypatch.setenv("FAKE_BENCH_SLOW", "1.2")  # 4 buckets: 4.8 s in all, 1.2 s at most silent
    records, info = m.measure(cache, items, child="fake_bench_child")
    assert len(records) == 4 and info["failed"] == []
    monkeypatch.setenv("FAKE_BENCH_SLOW", "0")
    monkeypatch.setenv("FAKE_BENCH_HANG", "threads=128")
    records, info = m.measure(cache, items, child="fake_bench_child")
    assert len(records) == 4 and info["failed"] == []
    assert all(r.dropped["dtype=float32,threads=128"].startswith("killed its process (exit -9): no event for 2 s")
               for r in records)
    monkeypatch.delenv("FAKE_BENCH_HANG")
    monkeypatch.setenv("FAKE_BENCH_HANG_TIMING", "n=65536")
    records, info = m.measure(cache, items, child="fake_bench_child")
    assert [r.line.bucket for r in records] == ["n=1048576", "n=16777216", "n=4096"]
    assert len(info["failed"]) == 1 and "n=65536: not measured (exit -9 while timing" in info["failed"][0]
    monkeypatch.delenv("FAKE_BENCH_HANG_TIMING")
    monkeypatch.setenv("FAKE_BENCH_CHATTY", "n=4096")  # hung, though its library keeps printing
    records, info = m.measure(cache, items, child="fake_bench_child")
    assert [r.line.bucket for r in records] == ["n=1048576", "n=16777216", "n=65536"]
    assert len(info["failed"]) == 1 and "n=4096: not measured (exit -9 while timing" in info["failed"][0]
    monkeypatch.delenv("FAKE_BENCH_CHATTY")
    monkeypatch.setenv("FAKE_BENCH_LINGER", "1")  # says nothing more, exits never: stopped
    events, code, _ = m._run_child([sys.executable, "-m", "fake_bench_child"],
                                   {"item": items[0].to_json(), "buckets": [{"n": 4096}], "exclude": [
                                       c.key for c in items[0].candidates
                                       if c.variant.endswith(("threads=64", "threads=512"))]},
                                   {**os.environ}, 2.0)
    assert code == -9 and [e["event"] for e in events][-1] == "bucket"


def test_the_timing_loop_traces_and_lowers_with_one_call_per_iteration_behind_a_barrier(
        compiled: tuple[Path, Path, dict]) -> None:
    """What the GPU child times, lowered here: K calls of the kernel in a loop whose inputs pass
    through an optimization barrier with the previous outputs (so XLA cannot hoist or merge
    them); inputs made from the contract with the bucket's extents; the agreement check."""
    import numpy as np

    from cutecc.plan.tuning_plan import manifest_digest, read_plan
    from cutecc.runtime.dispatch import Build, KernelFn
    from cutecc.store import Store
    from cutecc.tuning import bench

    proj, cache, _ = compiled
    store = Store(cache)
    for it in read_plan(cache, manifest_digest(proj / "kernels.toml"), "x"):
        if it.variant not in ("dtype=float32", "dtype=bfloat16,d=4096"):
            continue
        c = it.candidates[-1]
        e = store.get(c.key)
        b = Build.of(e.meta, e.path)
        fn = KernelFn(it.kernel, [b], arch="sm_90a")
        extents = {it.buckets[0].extent: 1024}
        xs = bench._inputs(b, extents, {}, seed=3)
        assert all(isinstance(d, int) or d in extents for t in b.conv.inputs for d in t.shape)
        assert len({float(np.asarray(x, np.float32).ravel()[0]) for x in xs}) == len(xs)  # fresh, not zeros
        results = [(tuple(d if isinstance(d, int) else extents[d] for d in t.shape), t.dtype)
                   for t in b.conv.results]
        text = bench._looped(fn, 7, results).trace(*xs).lower(lowering_platforms=("cuda",)).as_text()
        body = text.split("stablehlo.while")[1]
        assert body.count(f"custom_call @cutecc_{c.key[:40]}") == 1 and "optimization_barrier" in body
        got = tuple(x + 1 for x in xs[:1])
        assert bench._agree(tuple(xs[:1]), tuple(xs[:1]), [b.conv.inputs[0].dtype], None, None) is None
        assert "disagrees" in bench._agree(tuple(xs[:1]), got, [b.conv.inputs[0].dtype], None, None)


def test_measure_refuses_an_unknown_bucket_and_an_edited_manifest(compiled: tuple[Path, Path, dict]) -> None:
    proj, cache, _ = compiled
    r = run_cli("tune", str(proj / "kernels.toml"), "--measure", "--cache-dir", str(cache), "--bucket", "n=5")
    assert r.returncode == 2 and "no bucket 'n=5'" in r.stderr and "n=65536" in r.stderr, r.stderr
    edited = proj / "edited" / "kernels.toml"
    edited.parent.mkdir()
    edited.write_text((proj / "kernels.toml").read_text() + "\n# edited\n")
    r = run_cli("tune", str(edited), "--measure", "--cache-dir", str(cache))
    assert r.returncode == 1 and "no tuning plan for the manifest as it is now" in r.stderr, r.stderr


@pytest.mark.usefixtures("dsl")
def test_a_candidate_that_fails_to_compile_is_dropped_and_reported_not_fatal(tmp_path: Path) -> None:
    """tests/gpu/faulty_kernels' tuned_copy: mode=3 raises in the kernel's own code at compile
    time. `--compile-only` compiles the rest, reports the one dropped, exits 0, and stores a
    plan without it (its measured records name it as dropped)."""
    pytest.importorskip("cutlass", reason="compiling needs the build extra")
    from cutecc.plan.tuning_plan import manifest_digest, read_plan

    shutil.copytree(REPO / "tests" / "gpu" / "faulty_kernels", tmp_path / "gpu" / "faulty_kernels")
    m = tmp_path / "gpu" / "faulty_kernels" / "kernels.toml"
    cache = tmp_path / "c"
    r = run_cli("tune", str(m), "--compile-only", "--kernel", "tuned_copy", "--cache-dir", str(cache), "--json",
                timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["failed"] == [] and doc["built"] == 3, doc
    assert len(doc["dropped"]) == 1 and doc["dropped"][0].startswith("tuned_copy[mode=3]@sm_90a: failed to compile")
    assert "mode 3 refuses to compile" in doc["dropped"][0]
    assert "DROPPED tuned_copy[mode=3]" in r.stderr
    (item,) = read_plan(cache, manifest_digest(m), "x")
    assert [c.variant for c in item.candidates] == ["default", "mode=1", "mode=2"]
    assert item.dropped is not None and "mode 3 refuses to compile" in item.dropped["mode=3"]
    from cutecc.store import Store
    from cutecc.tuning.measure import _record

    ev = {"times": {c.key: [1.0, 1.0, 1.0] for c in item.candidates}, "dropped": {}, "k": 1}
    rec = _record(Store(cache), item, "n=1024", ev, {}, {"device": H100, "driver": "x"})
    assert "failed to compile" in rec.dropped["mode=3"] and rec.clock == "host"
    assert "timing_notes" not in rec.to_json()
    # The child's timing notes (lost samples, joined chains) reach the record, bounded.
    ev = {**ev, "clock": "device", "notes": ["chain 3 (abc): 5 kernel launches ..."] * 12 + ["x" * 999]}
    rec = _record(Store(cache), item, "n=1024", ev, {}, {"device": H100, "driver": "x"})
    assert rec.to_json()["timing_notes"] == ["chain 3 (abc): 5 kernel launches ..."] * 10


SCALAR_TOML = """
[kernel.k]
entry = "m:f"
args = [{{ name = "x", dtype = "float32", shape = ["n", "m"] }},
        {{ name = "o", role = "output", dtype = "float32", shape = ["n", "m"] }},
        {{ kind = "scalar", name = "scale", dtype = "float32" }}]
constants = {{ t = "$t" }}
[kernel.k.tune]
params = {{ t = [1, 2] }}
default = {{ t = 1 }}
buckets = {{ n = [8, 64] }}
{extra}
"""


@pytest.mark.parametrize(("extra", "where", "what"), [
    ('sizes = { m = "n" }', "tune", 'the runtime scalar "scale" has no default'),
    ('sizes = { m = "n" }\nscalars = { scale = 0.5, bias = 1.0 }', "tune.scalars.bias", "is not a runtime scalar"),
    ('sizes = { m = "n" }\nscalars = { scale = "half" }', "tune.scalars.scale", "must be a number or bool"),
    ('sizes = { m = "q" }\nscalars = { scale = 0.5 }', "tune.sizes.m", '"q" is not a bucketed extent'),
    ('sizes = { m = 0 }\nscalars = { scale = 0.5 }', "tune.sizes.m", "must be an int in 1..2^31-1"),
])
def test_benchmark_scalars_and_tied_sizes_are_checked(tmp_path: Path, extra: str, where: str, what: str) -> None:
    _assert_refused(tmp_path, SCALAR_TOML.format(extra=extra), where, what)


def test_benchmark_scalars_and_tied_sizes_reach_the_plan(tmp_path: Path) -> None:
    from cutecc.plan.tuning_plan import items

    p = tmp_path / "kernels.toml"
    p.write_text(SCALAR_TOML.format(extra='sizes = { m = "n" }\nscalars = { scale = 0.5 }'))
    (tmp_path / "m.py").write_text("def f(x, o, scale):\n    pass\n")  # planning reads, never imports it
    (item,) = items(load_manifest(p))
    assert item.sizes == {"m": "n"} and item.scalars == {"scale": 0.5}
    from cutecc.tuning import bench

    assert bench._extents({"n": 64}, dict(item.sizes)) == {"n": 64, "m": 64}


DERIVED_TOML = """
[kernel.k]
entry = "m:f"
args = [{{ name = "x", dtype = "float32", shape = ["n"] }},
        {{ name = "o", role = "output", dtype = "float32", shape = ["n"] }},
        {{ kind = "scalar", name = "groups", dtype = "int32", value = "$hw.sm_count // $t" }}]
[kernel.k.tune]
params = {{ t = [1, 2] }}
default = {{ t = 1 }}
buckets = {{ n = [8, 64] }}
{extra}
"""


def test_a_derived_scalar_needs_no_benchmark_value_and_takes_none(tmp_path: Path) -> None:
    """A derived scalar (`value`, quack's max_active_clusters from the profile and the tuned
    cluster shape) is computed by the runtime and never passed: the space needs no benchmark
    value for it, and one given is refused, as a call passing it is."""
    from cutecc.plan.tuning_plan import items

    p = tmp_path / "kernels.toml"
    p.write_text(DERIVED_TOML.format(extra=""))
    (tmp_path / "m.py").write_text("def f(x, o, groups):\n    pass\n")  # planning reads, never imports it
    (item,) = items(load_manifest(p))
    assert item.scalars == {}
    _assert_refused(tmp_path, DERIVED_TOML.format(extra="scalars = { groups = 3 }"), "tune.scalars.groups",
                    "derived")


def test_check_compares_times_only_on_the_same_clock(compiled: tuple[Path, Path, dict], tmp_path: Path) -> None:
    """Winners recorded from the host clock (dispatch included) are not compared with device-
    clock times (kernels only): --check says to record again instead of reporting a speed-up."""
    from cutecc.commands.tune import _drift, read_results

    proj, cache, _ = compiled
    _results(proj, cache, tmp_path / "r.json")
    r = run_cli("tune", str(proj / "kernels.toml"), "--record", str(tmp_path / "r.json"), "--no-lock",
                "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "r.json")
    assert all(x.clock == "host" for x in recs)
    assert _drift(cache, recs, 0.05) == []  # the same measurements: no drift
    faster = [dataclasses.replace(x, clock="device", times_us={k: (v[0] * 0.5, v[1] * 0.5, v[2] * 0.5)
                                                              for k, v in x.times_us.items()})
              for x in recs]
    out = _drift(cache, faster, 0.05)
    assert len(out) == len(recs) and all("recorded on the host clock, measured now on the device clock" in o
                                         for o in out), out


def _record(base: str) -> dict:
    return {"kernel": "mul", "variant": "dtype=float32", "arch": "sm_90a", "device": H100, "rule": "floor",
            "bucket": "n=4096", "base": base, "winner": "b" * 64, "winner_variant": "dtype=float32,threads=128",
            "library": "kernel.so", "sha256": "c" * 64, "size": 1, "symbol": "s", "backward": None,
            "contract": "d" * 64, "runtime": "e" * 64, "times_us": {}}


def test_cached_results_are_read_only_through_trusted_paths(tmp_path: Path) -> None:
    """A tuning record picks which build serves a bucket: like an entry's metadata, it is
    believed only where nobody but this user (or root) could have written it."""
    from cutecc import trust
    from cutecc.runtime.tuning import read_cached, results_path
    from cutecc.store.tuning_records import TuningResult, TuningResults

    base = "a" * 64
    root = tmp_path / "cache"
    path = results_path(root, base)
    assert read_cached(root, base) == []  # none recorded
    path.parent.mkdir(parents=True)
    path.write_bytes(TuningResults((TuningResult.parse(_record(base), "test", "record"),)).dumps())
    assert [r.line.winner for r in read_cached(root, base)] == ["b" * 64]
    os.chmod(path, 0o666)  # a record anyone could rewrite
    with pytest.raises(trust.Untrusted, match="writable by any user"):
        read_cached(root, base)
    os.chmod(path, 0o644)
    # results/ a link into a directory anyone can write: refused, not followed
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (path.parent / f"{base}.json").rename(shared / f"{base}.json")
    path.parent.rmdir()
    path.parent.symlink_to(shared, target_is_directory=True)
    with pytest.raises(trust.Untrusted):
        read_cached(root, base)
    path.write_bytes(b"{" * 10_000)  # damage (through the link's target) loses the tuning only
    path.parent.unlink()
    path.parent.mkdir()
    (path.parent / f"{base}.json").write_bytes(b"{" * 10_000)
    assert read_cached(root, base) == []


def test_a_record_others_could_rewrite_picks_nothing_and_is_named(
        compiled: tuple[Path, Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cutecc
    from cutecc.runtime.tuning import results_path

    proj, cache, _ = compiled
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy, symlinks=True)
    keys = _results(proj, copy, tmp_path / "r.json")
    r = run_cli("tune", str(proj / "kernels.toml"), "--record", str(tmp_path / "r.json"), "--cache-dir",
                str(copy), "--no-lock")
    assert r.returncode == 0, r.stderr
    default, winner = keys["dtype=float32"], keys["dtype=float32,threads=128"]
    monkeypatch.setenv("CUTECC_DEVICE_KIND", H100)
    assert _target(cutecc.load(copy, arch="sm_90a"), 70000) == winner[:40]
    os.chmod(results_path(copy, default), 0o666)
    ks = cutecc.load(copy, arch="sm_90a")
    assert _target(ks, 70000) == default[:40]  # the default serves: the record is not believed
    assert any("tuning records of" in p and "writable by any user" in p for p in ks.problems), ks.problems
    listed = json.loads(run_cli("list", "--cache-dir", str(copy), "--json").stdout)
    assert not any(e["winner_for"] for e in listed["entries"])


def test_a_stored_plan_is_read_through_trusted_paths_and_checked(compiled: tuple[Path, Path, dict],
                                                                  tmp_path: Path) -> None:
    """The plan names what `--measure` runs and how: read like metadata (no link followed,
    nothing others could write), and a field measuring uses that is malformed is refused
    with its item's key path."""
    from cutecc import trust
    from cutecc.plan.tuning_plan import manifest_digest, plan_path, read_plan

    proj, cache, _ = compiled
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy, symlinks=True)
    digest = manifest_digest(proj / "kernels.toml")
    path = plan_path(copy, digest)
    good = json.loads(path.read_text())
    assert read_plan(copy, digest, "x")
    for field, value in (("scalars", {"eps": "1e-6"}), ("sizes", {"m": -1}), ("dropped", {"t=1": 3}),
                         ("buckets", [{"extent": "n", "edges": ["8"]}]), ("inputs", {"x": [0]}),
                         ("sizes", {"m": 10**30}), ("inputs", {"x": [float("nan"), 1.0]}),
                         ("buckets", [{"extent": e, "edges": list(range(1, 40))} for e in "nmk"]),
                         ("rtol", -1.0)):
        doc = json.loads(json.dumps(good))
        doc["items"][0][field] = value
        path.write_text(json.dumps(doc))
        with pytest.raises(CuteccError) as e:
            read_plan(copy, digest, "x")
        assert e.value.key_path == "items[0]" and field in e.value.message, (field, e.value.render())
    path.write_text(json.dumps(good))
    os.chmod(path, 0o666)
    with pytest.raises(trust.Untrusted):
        read_plan(copy, digest, "x")
