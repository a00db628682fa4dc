"""Every parser of foreign input, fed 1,000 hostile inputs each: a clean error or a value,
never another exception, and each in bounded time. The record areas of a cache (index
records, stats.json, composite records, planning facts) are fed the same way, through the
files their readers open (issue 32: a 1,100-deep index record ended verify in a
RecursionError).

The parsers are the ones a deployer's process runs on what it did not write: an entry's
meta.json (`ingest.check_meta`, for remote objects, pack members, Ray results and the
cache), a lock (`Lock.loads`), a lock's signature file (`signing.verify`), a tuning record
or `--results` file (`TuningResults.loads`), a tuning plan (`TuningPlan.loads`) and a
manifest (`load_manifest`).
Inputs are mutations of a valid document (byte flips, cuts, splices of hostile fragments,
JSON values swapped for hostile ones) plus the worst shapes at each parser's byte cap.
The worst parse time of each is recorded in the fault report (docs/faults.md).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cutecc.entry.rules import MAX_META_BYTES, compute_key
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock
from cutecc.ship.ingest import Refused, check_meta

from .conftest import SEED, soak

N = soak(1000, 5000)
PLAN = Path(__file__).parents[1] / "tuning" / "data" / "plan.json"  # a stored tuning plan
LIMIT_S = 1.0  # any one input, on the 2-core host with other work running
FRAGMENTS = [b'"' + b'\\"' * 4000, b"[" * 3000, b'{"a":' * 2000, b"\\u0000" * 500, b"\xff\xfe",
             b"9" * 5000, b"1e999999", b"-0.0e-400", b"NaN", b"Infinity", b'"\\ud800"', b"\x00" * 64,
             b"null", b"true", b"[]", b"{}", b'"' + b"x" * 100_000 + b'"']
HOSTILE_VALUES: list[Any] = [None, True, -1, 2**70, 1.5, float("inf"), "", "x" * 5000, [], {}, [[[]]],
                             {"a": {"b": {}}}, "../../etc/passwd", "ab" * 32, "\x00", -(2**63)]


def _json_mutation(rng: random.Random, doc: Any) -> bytes:
    """`doc` with one value somewhere replaced by a hostile one, dumped."""
    doc = json.loads(json.dumps(doc))
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        k = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, k))
        node = node[k]
    if path:
        parent, k = path[-1]
        parent[k] = rng.choice(HOSTILE_VALUES)
    if isinstance(doc, dict) and rng.random() < 0.2:
        doc[rng.choice(["extra", "format", "key", "files", "library"])] = rng.choice(HOSTILE_VALUES)
    return json.dumps(doc, allow_nan=True).encode()


def _byte_mutation(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:  # cut
        b = b[:rng.randrange(len(b) + 1)]
    elif kind == 2:  # splice a hostile fragment
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.choice(FRAGMENTS)
    else:  # duplicate a slice
        i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
        b[i:i] = b[i:j] * rng.randint(1, 50)
    return bytes(b)


def _inputs(seed_doc: Any, seed_bytes: bytes, cap: int, rng: random.Random) -> list[bytes]:
    worst = [b'"' + b'\\"' * ((cap - 1) // 2), b"[" * cap, b'"' * cap, b"[]," * (cap // 3)]
    out = [w[:cap] for w in worst]
    while len(out) < N:
        out.append(_json_mutation(rng, seed_doc) if rng.random() < 0.5 else _byte_mutation(rng, seed_bytes))
    return out


def _meta_doc() -> tuple[str, dict[str, Any]]:
    inputs = {"arch": "sm_90a", "args": [], "entry": "m:k", "kernel": "k",
              "toolchain": {"runtime": "ab" * 32}}
    key = compute_key(inputs)
    meta = {"format": 2, "key": key, "kernel": "k", "variant": "default", "arch": "sm_90a", "entry": "m:k",
            "args": [], "toolchain": {"runtime": "ab" * 32}, "symbol": "s", "library": "kernel.so",
            "files": {"kernel.so": {"sha256": "cd" * 32, "size": 10}}, "key_inputs": inputs,
            "runtime": {"key": "ab" * 32, "library": f"libcutecc_rt_{'ab' * 8}.so", "sha256": "ef" * 32,
                        "size": 5}}
    return key, meta


def _lock_doc() -> dict[str, Any]:
    line = {"kernel": "k", "variant": "default", "arch": "sm_90a", "platform": "x86_64", "key": "ab" * 32,
            "library": "kernel.so",
            "sha256": "cd" * 32, "size": 10, "symbol": "s", "backward": None, "contract": "ef" * 32,
            "runtime": "12" * 32}
    tuned = {"kernel": "k", "variant": "default", "arch": "sm_90a", "device": "H100", "rule": "floor",
             "bucket": "n=4096", "base": "ab" * 32, "winner": "34" * 32, "winner_variant": "t=1",
             **{f: line[f] for f in ("library", "sha256", "size", "symbol", "backward", "contract",
                                     "runtime")}}
    return {"format": 3, "entries": [line], "tuning": [tuned]}


Parser = tuple[Callable[[bytes], Any], tuple[type[BaseException], ...], Any, int]


def _parsers(tmp: Path) -> tuple[dict[str, Parser], bytes]:
    """name -> (parse, the errors it may raise, a valid document, its byte cap)."""
    from cutecc.lock import signing
    from cutecc.manifest import load_manifest

    key, meta = _meta_doc()
    priv = signing.generate()
    lock = Lock.loads(json.dumps(_lock_doc()).encode(), "lock")
    sig = json.loads(signing.sign(lock.dumps(), priv, "lock"))
    manifest = tmp / "kernels.toml"

    def parse_manifest(data: bytes) -> Any:
        manifest.write_bytes(data)
        return load_manifest(manifest)

    def parse_sig(data: bytes) -> Any:
        return signing.verify(lock.dumps(), data, [priv.public()], "lock")

    def parse_record(data: bytes) -> Any:
        from cutecc.store.tuning_records import TuningResults

        return TuningResults.loads(data, "record")  # the cache's record and a --results file alike

    def parse_plan(data: bytes) -> Any:
        from cutecc.plan.tuning_plan import TuningPlan

        return TuningPlan.loads(data, "plan")

    toml = (b'archs = ["sm_90a"]\n[kernel.k]\nentry = "m:k"\nargs = [\n  { kind = "stream" },\n'
            b'  { name = "x", dtype = "float32", shape = ["n"] },\n'
            b'  { name = "out", role = "output", dtype = "float32", shape = ["n"] },\n]\n')
    return {
        "meta.json": (lambda d: check_meta(key, d, 1 << 30), (Refused,), meta, MAX_META_BYTES),
        "kernels.lock": (lambda d: Lock.loads(d, "lock"), (CuteccError,), _lock_doc(), 1 << 20),
        "kernels.lock.sig": (parse_sig, (CuteccError,), sig, signing.MAX_SIG_BYTES),
        "tuning record": (parse_record, (CuteccError,),
                          {"format": 1, "device": "H100", "driver": "cuda 13000", "bench_seconds": 1.5,
                           "records": [{**_lock_doc()["tuning"][0], "k": 8, "winner_us": 2.0, "dropped": {},
                                        "times_us": {"t=1": [1.0, 2.0, 3.0]}}]}, 1 << 20),
        "tuning plan": (parse_plan, (CuteccError,), json.loads(PLAN.read_bytes()), 1 << 20),
        "kernels.toml": (parse_manifest, (CuteccError,), None, 1 << 16),
    }, toml


@pytest.mark.parametrize("name", ["meta.json", "kernels.lock", "kernels.lock.sig", "tuning record",
                                  "tuning plan", "kernels.toml"])
def test_hostile_inputs_fail_cleanly_and_quickly(name: str, tmp_path: Path, tally: Any) -> None:
    pytest.importorskip("cryptography")
    parsers, toml = _parsers(tmp_path)
    parse, errors, doc, cap = parsers[name]
    rng = random.Random(f"{SEED}:{name}")
    seed_bytes = toml if doc is None else json.dumps(doc, indent=1).encode()
    if doc is None:  # TOML: byte mutations only (a JSON mutation would not be TOML)
        inputs = [_byte_mutation(rng, seed_bytes) for _ in range(N)]
        inputs[:2] = [b'a = "' + b'\\"' * (cap // 2), b"a = " + b"[" * (cap - 4)]
    else:
        inputs = _inputs(doc, seed_bytes, cap, rng)
    worst, accepted = 0.0, 0
    for i, data in enumerate(inputs):
        t0 = time.perf_counter()
        try:
            parse(data)
            accepted += 1
        except errors:
            pass
        except Exception as e:  # noqa: BLE001 - any other exception is the finding
            raise AssertionError(f"{name} input {i} ({len(data)} bytes, seed {SEED}): "
                                 f"{type(e).__name__}: {e}"[:500]) from e
        took = time.perf_counter() - t0
        worst = max(worst, took)
        assert took < LIMIT_S, f"{name} input {i} ({len(data)} bytes): {took:.2f} s"
    tally.add("parsers", **{f"{name} inputs": len(inputs), f"{name} accepted": accepted})
    tally.peak("parsers", f"{name} worst ms", int(worst * 1000))
    print(f"{name}: {len(inputs)} inputs, {accepted} accepted, worst {worst * 1000:.0f} ms")


# The record areas of a cache (issue 32): every reader of a record someone may have damaged
# (the index a no-op build and verify read, stats.json every build updates, a composite
# record `load` exposes, the planning facts a no-op build trusts) fed the same mutations,
# through the file itself: a value or a clean error, never another exception, never slow.


def _areas(tmp: Path) -> dict[str, Parser]:
    """name -> (read the bytes as that record, the errors it may raise, a valid doc, its cap)."""
    from cutecc.entry.rules import MAX_INDEX_BYTES
    from cutecc.store.index_record import IndexRecord, record_differs
    from cutecc.store.stats import MAX_STATS_BYTES
    from cutecc.store.view import StoreView
    from cutecc.toolchain.hashcache import FACTS, HashCache

    from .fake_store import add, new_store

    store, rt = new_store(tmp / "cache")
    entry = add(store, rt, "k", "a")
    view = StoreView(store.root)
    record = view.layout.index_record("k", entry.key)
    facts = IndexRecord.of_meta(entry.key, entry.meta).to_json()
    composite = {"format": 1, "name": "both", "launches": ["k", "j"], "inputs": ["x"], "outputs": ["out"],
                 "manifest": "/m/kernels.toml"}
    store.composites_dir.mkdir(exist_ok=True)
    hashes = store.layout.hash_cache()
    planfacts = {"format": 2, "parser": "p", "dists": {"d": ["f", "ab" * 32]},
                 "sources": {"/s.py": [[1, 2, 3], "ab" * 32, {"imports": ["os"]}]},
                 "closures": {"k": ["ab" * 32, "cd" * 32]},
                 "closure_bodies": {"cd" * 32: [["/s.py", "x", True]]}}

    def index(data: bytes) -> Any:
        record.write_bytes(data)
        view.indexed_facts("k", entry.key)
        return record_differs(data, entry.key, entry.meta)

    def stats(data: bytes) -> Any:
        store.layout.stats().write_bytes(data)
        got = view.read_stats()
        store.add_stats(hits=1)
        return got

    def comp(data: bytes) -> Any:
        store.layout.composite("both").write_bytes(data)
        doc = view.composite("both")
        return None if doc is None else doc.line("both")

    def plan_facts(data: bytes) -> Any:
        hashes.with_name(FACTS).write_bytes(data)
        cache = HashCache(hashes)
        cache.dist_digest("d", "f")
        return cache.closure("k", "")

    return {
        "index record": (index, (), facts, MAX_INDEX_BYTES),
        "stats.json": (stats, (), {"format": 1, "hits": 3, "misses": 1}, MAX_STATS_BYTES),
        "composite record": (comp, (CuteccError,), composite, MAX_META_BYTES),
        "planning facts": (plan_facts, (), planfacts, 1 << 20),
    }


@pytest.mark.parametrize("name", ["index record", "stats.json", "composite record", "planning facts"])
def test_hostile_records_fail_cleanly_and_quickly(name: str, tmp_path: Path, tally: Any) -> None:
    parse, errors, doc, cap = _areas(tmp_path)[name]
    rng = random.Random(f"{SEED}:{name}")
    seed_bytes = json.dumps(doc, indent=1).encode()
    inputs = _inputs(doc, seed_bytes, cap, rng)
    inputs += [b"[" * 1100 + b"]" * 1100, b" " * (cap + 1)]  # 2.2 KB deep; one byte over the cap
    worst, accepted = 0.0, 0
    for i, data in enumerate(inputs):
        t0 = time.perf_counter()
        try:
            parse(data)
            accepted += 1
        except errors:
            pass
        except Exception as e:  # noqa: BLE001 - any other exception is the finding
            raise AssertionError(f"{name} input {i} ({len(data)} bytes, seed {SEED}): "
                                 f"{type(e).__name__}: {e}"[:500]) from e
        took = time.perf_counter() - t0
        worst = max(worst, took)
        assert took < LIMIT_S, f"{name} input {i} ({len(data)} bytes): {took:.2f} s"
    tally.add("parsers", **{f"{name} inputs": len(inputs), f"{name} accepted": accepted})
    tally.peak("parsers", f"{name} worst ms", int(worst * 1000))
    print(f"{name}: {len(inputs)} inputs, {accepted} accepted, worst {worst * 1000:.0f} ms")
