"""The lock covers everything the runtime acts on, and names each key once.

Seen: meta.json's `backward` and `variant` are neither key inputs nor lock fields, so editing
them goes unnoticed by `load(lock=...)`: `jax.grad` of `mul` dispatched to `axpy`, and a
variant vanished with `problems: []`. A second lock line with the same key under another
kernel name is accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import ARCH, UNSIGNED_OK, Cache, cli, lock_entries, one_line_error, out, py

pytestmark = pytest.mark.usefixtures("dsl")

PROBE = r'''
import json, re, sys
import jax, jax.numpy as jnp
import cutecc
from cutecc.errors import CuteccError
cache, lock, arch = sys.argv[1:4]
res = {}
try:
    ks = cutecc.load(cache, lock=lock, arch=arch)
except CuteccError as e:
    print(json.dumps({"load_error": str(e)}))
    raise SystemExit
res["problems"] = ks.problems
res["variants"] = sorted(ks.mul.variants)
x = jax.ShapeDtypeStruct((1024,), jnp.float32)
try:
    hlo = jax.jit(jax.grad(lambda a, b: ks.mul(a, b).sum())).trace(x, x).lower(
        lowering_platforms=("cuda",)).as_text()
    res["targets"] = sorted(set(re.findall(r"cutecc_[0-9a-f]{40}", hlo)))
except CuteccError as e:
    res["grad_error"] = str(e)
print(json.dumps(res))
'''


def probe(cache: Cache) -> dict:
    r = py(PROBE, cache.root, cache.lock, ARCH, env=UNSIGNED_OK)  # the lock is unsigned here
    assert r.returncode == 0, out(r)
    return json.loads(r.stdout.strip().splitlines()[-1])


def target(key: str) -> str:
    return f"cutecc_{key[:40]}"


def test_editing_backward_in_meta_json_is_caught_by_the_lock(cache: Cache) -> None:
    """With `load(lock=...)`, a meta.json whose `backward` was edited (mul ->
    axpy) is refused (named in problems, or load raises), or the lock's pairing is used:
    `jax.grad` of mul must lower to mul_bwd, never reach axpy."""
    mul = cache.keys_of("mul")
    for k in mul:
        meta = cache.meta(k)
        assert meta["backward"] == "mul_bwd"
        meta["backward"] = "axpy"
        cache.write_meta(k, meta)
    got = probe(cache)
    if "load_error" in got:  # refused at load: it must be for the edit
        assert any(k[:12] in got["load_error"] for k in mul) or "backward" in got["load_error"], got
        return
    if any(k[:12] in p for p in got["problems"] for k in mul):
        return  # the edited entries were set aside
    assert "grad_error" not in got, f"jax.grad of mul dispatched to axpy: {got['grad_error'][:300]}"
    assert target(cache.key("mul_bwd", "float32")) in got["targets"], got
    assert target(cache.key("axpy")) not in got["targets"], got


def test_editing_variant_in_meta_json_is_caught_by_the_lock(cache: Cache) -> None:
    """With `load(lock=...)`, a meta.json whose `variant` was edited to another
    variant's id must not make a variant vanish silently: the entry is refused by name, or
    the lock's variant is used."""
    f16 = cache.key("mul", "float16")
    meta = cache.meta(f16)
    meta["variant"] = "dtype=float32"
    cache.write_meta(f16, meta)
    got = probe(cache)
    if "load_error" in got:
        assert f16[:12] in got["load_error"] or "variant" in got["load_error"], got
        return
    if any(f16[:12] in p for p in got["problems"]):
        return
    assert got["variants"] == ["dtype=bfloat16", "dtype=float16", "dtype=float32"], (
        f"a variant vanished with problems {got['problems']}: {got['variants']}")


def _with_duplicate_line(cache: Cache) -> Path:
    """The lock plus a second line for mul[float32]'s key under the name `axpy`."""
    doc = json.loads(cache.lock.read_text())
    line = next(e for e in doc["entries"] if e["key"] == cache.key("mul", "float32"))
    doc["entries"].append({**line, "kernel": "axpy", "variant": "default"})
    doc["entries"].sort(key=lambda e: (e["kernel"], e["variant"], e["arch"]))
    cache.lock.write_text(json.dumps(doc, indent=1))
    return cache.lock


def test_load_refuses_a_lock_naming_one_key_twice(cache: Cache) -> None:
    """One line per key; a lock naming a key under two kernels is refused."""
    _with_duplicate_line(cache)
    got = probe(cache)
    assert "load_error" in got, f"a lock naming one key twice was accepted: {got}"
    assert cache.key("mul", "float32")[:12] in got["load_error"] or "twice" in got["load_error"] \
        or "duplicate" in got["load_error"].lower(), got


def test_pack_refuses_a_lock_naming_one_key_twice(cache: Cache, tmp_path: Path) -> None:
    """`cutecc pack --lock` refuses a lock with a duplicated key (exit 2, input)."""
    _with_duplicate_line(cache)
    r = cli("pack", "--lock", cache.lock, "--name", "k", "--version", "1.0", "--kernel", "axpy",
            "--out", tmp_path / "d", "--cache-dir", cache.root)
    assert not list((tmp_path / "d").glob("*.whl")), (
        "packed a wheel whose `axpy` includes mul's library: " + r.stdout.strip())
    one_line_error(r, (2,))


def test_the_lock_records_every_field_the_runtime_acts_on(built: Cache) -> None:
    """Each lock line carries the fields the runtime acts on besides the key and
    library hash: the backward pairing, the symbol and the contract (as `args` or a
    `contract...` digest); kernel and variant are there already."""
    line = lock_entries(built.lock)[0]
    missing = [f for f in ("kernel", "variant", "backward", "symbol") if f not in line]
    if not any(f == "args" or f.startswith("contract") for f in line):
        missing.append("contract")
    assert not missing, f"lock lines lack {missing}: {sorted(line)}"
