"""Damaged caches: every planted fault is reported, and no damaged library is ever opened.

Damage planted into copies of a built cache (eight entries of a small kernel): libraries
truncated, bit-flipped, deleted, swapped between two entries, replaced by a directory or by
symbolic links (to identical bytes outside the cache, to another entry's library, to
nothing); metadata truncated, bit-flipped inside the fields the runtime trusts, garbage,
deleted, swapped, symlinked; an entry directory replaced by a symlink. For each: `cutecc
verify` names the entry, the runtime refuses it (a CuteccError naming it, or it is set
aside at load) and a subprocess's /proc/self/maps proves its library was never mapped,
no command prints a traceback, and `verify --fix` + `build` rebuild exactly what was lost.
A cache writable by other users is refused by the runtime unless the user opts in.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import PY

from cutecc.commands.verify import verify
from cutecc.entry.rules import META
from cutecc.errors import CuteccError
from cutecc.store import Store

from .conftest import SEED, SOAK, Toy, cli, soak

pytestmark = pytest.mark.usefixtures("dsl")
LIB = "kernel.so"

# Fields of meta.json the runtime acts on or that tie it to its key: a flip in any of them
# must be caught. (A flip in `built_at` or `variant` changes only what `cutecc list` shows.)
TRUSTED_FIELDS = ("args", "arch", "entry", "toolchain", "key_inputs", "files", "key", "library",
                  "format")


def _flip(data: bytes, rng: random.Random, lo: int = 0, hi: int | None = None) -> bytes:
    b = bytearray(data)
    i = rng.randrange(lo, len(b) if hi is None else hi)
    b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _field_span(text: bytes, name: str) -> tuple[int, int]:
    """Byte span of a top-level field's value in meta.json as the store writes it
    (`json.dumps(indent=1, sort_keys=True)`: top-level keys are indented by one space)."""
    head = f'\n "{name}": '.encode()
    start = text.index(head) + len(head)
    ends = [i for i in (text.find(b',\n "', start), text.rfind(b"\n}")) if i != -1]
    return start, min(ends)


Plant = Callable[[Path, Path, Path, random.Random], str]


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def _lib_truncated(e: Path, _: Path, __: Path, rng: random.Random) -> str:
    data = (e / LIB).read_bytes()
    (e / LIB).write_bytes(data[:rng.randrange(len(data))])
    return "truncated"


def _lib_bitflip(e: Path, _: Path, __: Path, rng: random.Random) -> str:
    (e / LIB).write_bytes(_flip((e / LIB).read_bytes(), rng))
    return "altered"


def _lib_deleted(e: Path, *_: object) -> str:
    (e / LIB).unlink()
    return "missing"


def _lib_swapped(e: Path, other: Path, *_: object) -> str:
    _swap(e / LIB, other / LIB)
    return "truncated|altered"


def _lib_is_a_directory(e: Path, *_: object) -> str:
    (e / LIB).unlink()
    (e / LIB).mkdir()
    return "missing"


def _lib_symlink_same_bytes(e: Path, _: Path, outside: Path, __: random.Random) -> str:
    copy = outside / f"{e.name}.so"
    shutil.copyfile(e / LIB, copy)
    (e / LIB).unlink()
    (e / LIB).symlink_to(copy)
    return "altered"


def _lib_symlink_other(e: Path, other: Path, *_: object) -> str:
    (e / LIB).unlink()
    (e / LIB).symlink_to(other / LIB)
    return "altered"


def _lib_symlink_dangling(e: Path, _: Path, outside: Path, __: random.Random) -> str:
    (e / LIB).unlink()
    (e / LIB).symlink_to(outside / "nothing-here.so")
    return "altered"


def _meta_truncated(e: Path, _: Path, __: Path, rng: random.Random) -> str:
    data = (e / META).read_bytes()
    (e / META).write_bytes(data[:rng.randrange(len(data))])
    return "malformed"


def _meta_bitflip(e: Path, _: Path, __: Path, rng: random.Random) -> str:
    data = (e / META).read_bytes()
    lo, hi = _field_span(data, rng.choice(TRUSTED_FIELDS))
    (e / META).write_bytes(_flip(data, rng, lo, hi))
    return "malformed|missing|altered|truncated"


def _meta_garbage(e: Path, _: Path, __: Path, rng: random.Random) -> str:
    (e / META).write_bytes(rng.randbytes(rng.randrange(1, 4096)) + b"\xff\xfe")
    return "malformed"


def _meta_not_an_object(e: Path, *_: object) -> str:
    (e / META).write_text(json.dumps([json.loads((e / META).read_text())]))
    return "malformed"


def _meta_deleted(e: Path, *_: object) -> str:
    (e / META).unlink()
    return "orphan"


def _meta_swapped(e: Path, other: Path, *_: object) -> str:
    _swap(e / META, other / META)
    return "malformed"


def _meta_symlink(e: Path, _: Path, outside: Path, __: random.Random) -> str:
    copy = outside / f"{e.name}.json"
    shutil.copyfile(e / META, copy)
    (e / META).unlink()
    (e / META).symlink_to(copy)
    return "malformed"


def _entry_dir_symlink(e: Path, _: Path, outside: Path, __: random.Random) -> str:
    copy = outside / e.name
    shutil.copytree(e, copy)
    shutil.rmtree(e)
    e.symlink_to(copy, target_is_directory=True)
    return "malformed"


# name -> (plant, whether it damages a second entry too)
DAMAGE: dict[str, tuple[Plant, bool]] = {
    "lib-truncated": (_lib_truncated, False),
    "lib-bit-flipped": (_lib_bitflip, False),
    "lib-deleted": (_lib_deleted, False),
    "lib-swapped": (_lib_swapped, True),
    "lib-is-a-directory": (_lib_is_a_directory, False),
    "lib-symlink-to-same-bytes": (_lib_symlink_same_bytes, False),
    "lib-symlink-to-other-entry": (_lib_symlink_other, False),
    "lib-symlink-dangling": (_lib_symlink_dangling, False),
    "meta-truncated": (_meta_truncated, False),
    "meta-bit-flipped": (_meta_bitflip, False),
    "meta-garbage": (_meta_garbage, False),
    "meta-not-an-object": (_meta_not_an_object, False),
    "meta-deleted": (_meta_deleted, False),
    "meta-swapped": (_meta_swapped, True),
    "meta-symlink": (_meta_symlink, False),
    "entry-dir-symlink": (_entry_dir_symlink, False),
}

PROBE = r'''
import json, sys
import cutecc
from cutecc.errors import CuteccError
cache, keys = sys.argv[1], json.loads(sys.argv[2])
out = {}
ks = cutecc.load(cache, arch="sm_90a")
builds = {b.key: b for b in (ks.scale.builds if "scale" in ks else [])}
problems = "\n".join(ks.problems)
for key in keys:
    b = builds.get(key)
    if b is None:
        out[key] = {"state": "set aside" if key[:12] in problems else "absent"}
        continue
    try:
        b.register("scale")
        out[key] = {"state": "registered"}
    except CuteccError as e:
        out[key] = {"state": "refused", "message": str(e)}
maps = open("/proc/self/maps").read()
for key in keys:
    out[key]["mapped"] = f"cutecc_{key[:40]}" in maps
print(json.dumps({"keys": out, "problems": ks.problems}))
'''


def probe(cache: Path, keys: list[str], env: dict[str, str] | None = None) -> dict:
    """Load `cache` in a fresh process, try to register each key; report state and mapping."""
    r = subprocess.run([PY, "-c", PROBE, str(cache), json.dumps(keys)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _batches(rng: random.Random, slots: int) -> list[list[str]]:
    """Every kind of damage once, in random order, packed into caches of `slots` entries."""
    names = rng.sample(list(DAMAGE), len(DAMAGE))
    out: list[list[str]] = [[]]
    used = 0
    for n in names:
        need = 2 if DAMAGE[n][1] else 1
        if used + need > slots:
            out.append([])
            used = 0
        out[-1].append(n)
        used += need
    return out


def _no_traceback_anywhere(toy: Toy, keys: list[str]) -> None:
    for args in (["list"], ["list", "--json"], ["stats"], ["gc", "--dry-run", "--max-size", "0"],
                 *(["show", k] for k in keys)):
        r = cli(*args, "--cache-dir", str(toy.cache))
        assert r.returncode in (0, 1) and "Traceback" not in r.stdout + r.stderr, (args, r.stderr)


@pytest.mark.parametrize("batch_round", range(soak(1, 10)))
def test_planted_damage_is_reported_refused_never_mapped_and_rebuilt(toy8, tmp_path: Path, tally,
                                                                     batch_round: int) -> None:
    rng = random.Random(SEED + batch_round)
    print(f"CUTECC_FAULT_SEED={SEED}")
    for n, batch in enumerate(_batches(rng, 8)):
        _one_batch(toy8.copy(tmp_path / f"b{n}"), batch, rng, tmp_path / f"outside{n}", tally)


def _one_batch(toy: Toy, batch: list[str], rng: random.Random, outside: Path, tally) -> None:
    outside.mkdir()
    store = toy.store
    entries = {e.key: e.path for e in store.entries()}
    free = rng.sample(sorted(entries), len(entries))
    planted: dict[str, tuple[str, str]] = {}  # key -> (damage, verify kinds expected)
    for name in batch:
        plant, pair = DAMAGE[name]
        key = free.pop()
        other = free.pop() if pair else rng.choice([k for k in entries if k != key])
        kinds = plant(entries[key], entries[other], outside, rng)
        planted[key] = (name, kinds)
        if pair:
            planted[other] = (name, kinds)
    healthy = sorted(set(entries) - set(planted))

    # verify names every damaged entry, with the right kind, and nothing else.
    r = cli("verify", "--json", "--cache-dir", str(toy.cache))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    found: dict[str, set[str]] = {}
    for p in json.loads(r.stdout)["problems"]:
        key = next((k for k in entries if k in p["path"]), None)
        assert key in planted, (p, batch)  # no false alarm on a healthy entry
        found.setdefault(key, set()).add(p["kind"])
    for key, (name, kinds) in planted.items():
        assert found.get(key, set()) & set(kinds.split("|")), (name, found.get(key), SEED)

    # The runtime refuses every damaged entry and never maps it; healthy ones load.
    seen = probe(toy.cache, sorted(entries))
    for key, (name, _) in planted.items():
        got = seen["keys"][key]
        assert not got["mapped"], (name, got)
        assert got["state"] in ("refused", "set aside", "absent"), (name, got)
        if got["state"] == "refused":
            assert key[:12] in got["message"] and "Traceback" not in got["message"], got
    for key in healthy:
        assert seen["keys"][key] == {"state": "registered", "mapped": True}, seen["keys"][key]
    _no_traceback_anywhere(toy, sorted(planted))

    # Fix, rebuild: exactly the damaged entries are rebuilt, and everything is whole again.
    r = cli("verify", "--fix", "--cache-dir", str(toy.cache))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    r = cli("build", str(toy.manifest), "--cache-dir", str(toy.cache), "-j", "2", "--no-lock",
            "--json")
    assert r.returncode == 0, r.stderr
    status = {e["key"]: e["status"] for e in json.loads(r.stdout)["entries"]}
    assert {k for k, s in status.items() if s == "built"} == set(planted)
    r = cli("verify", "--cache-dir", str(toy.cache))
    assert r.returncode == 0 and " 0 problem(s)" in r.stdout, r.stdout
    if not SOAK or rng.random() < 0.2:
        again = probe(toy.cache, sorted(entries))
        assert all(v == {"state": "registered", "mapped": True} for v in again["keys"].values())
    tally.add("damage", planted=len(planted), detected_by_verify=len(planted),
              refused_by_runtime=len(planted), mapped_while_damaged=0, rebuilt=len(planted),
              **{f"planted_{n.replace('-', '_')}": 1 for n in batch})
    tally.add("damage", false_alarms_on_healthy=0, healthy_loaded=len(healthy))


def test_a_cache_writable_by_others_is_refused_unless_trusted(toy8, tmp_path: Path, tally) -> None:
    """Whoever can write an entry can write its library and the SHA-256 beside it, so the
    runtime refuses a library that it, its meta.json or any directory above is writable by
    any user (a sticky directory such as /tmp excepted) or owned by another user."""
    toy = toy8.copy(tmp_path)
    entries = sorted(toy.store.entries(), key=lambda e: e.key)
    keys = [e.key for e in entries]
    cases = {  # key -> (what, how), reverted after the probe
        keys[0]: ("entry directory mode 0777", lambda e: os.chmod(e.path, 0o777)),
        keys[1]: ("library mode 0666", lambda e: os.chmod(e.path / LIB, 0o666)),
        keys[2]: ("metadata mode 0646", lambda e: os.chmod(e.path / META, 0o646)),
    }
    if os.geteuid() == 0:
        cases[keys[3]] = ("library owned by uid 65534", lambda e: os.chown(e.path / LIB, 65534, -1))
        cases[keys[4]] = ("shard directory owned by uid 65534",
                          lambda e: os.chown(e.path.parent, 65534, -1))
    for e in entries:
        if e.key in cases:
            cases[e.key][1](e)
    fine = [k for k in keys if k not in cases and k[:2] not in {c[:2] for c in cases}]
    seen = probe(toy.cache, keys)
    for key, (what, _) in cases.items():
        got = seen["keys"][key]
        assert got["state"] == "refused" and not got["mapped"], (what, got)
        assert "CUTECC_ALLOW_SHARED_CACHE=1" in got["message"], got["message"]
        assert ("writable by any user" in got["message"]) or ("owned by uid 65534" in got["message"])
    for key in fine:
        assert seen["keys"][key] == {"state": "registered", "mapped": True}
    trusted = probe(toy.cache, keys, env={"CUTECC_ALLOW_SHARED_CACHE": "1"})
    assert all(v == {"state": "registered", "mapped": True} for v in trusted["keys"].values())
    # The cache root itself writable by anyone: nothing in it loads.
    for e in entries:
        if e.key in cases:
            os.chmod(e.path, 0o755)
            os.chmod(e.path / LIB, 0o644)
            os.chmod(e.path / META, 0o644)
            os.chown(e.path / LIB, os.geteuid(), -1)
            os.chown(e.path.parent, os.geteuid(), -1)
    os.chmod(toy.cache, 0o777)
    seen = probe(toy.cache, keys[:2])
    assert all(v["state"] == "refused" and not v["mapped"] for v in seen["keys"].values())
    assert "mode 777" in seen["keys"][keys[0]]["message"]
    os.chmod(toy.cache, 0o1777)  # sticky, like /tmp: others cannot rename what is ours
    seen = probe(toy.cache, keys[:2])
    assert all(v == {"state": "registered", "mapped": True} for v in seen["keys"].values())
    tally.add("damage", unsafe_permissions_planted=len(cases) + 1,
              unsafe_permissions_refused=len(cases) + 1)


def test_the_runtime_reads_a_library_through_no_symlink(toy8, tmp_path: Path) -> None:
    """Even with matching bytes, a symlinked library is refused at the call, with its name."""
    from cutecc.runtime.library import verified_bytes

    toy = toy8.copy(tmp_path)
    e = next(iter(toy.store.entries()))
    rec = e.doc["files"][LIB]
    copy = tmp_path / "elsewhere.so"
    shutil.copyfile(e.path / LIB, copy)
    (e.path / LIB).unlink()
    (e.path / LIB).symlink_to(copy)
    with pytest.raises(CuteccError, match="is a symbolic link") as err:
        verified_bytes(e.path / LIB, rec["sha256"], rec["size"], "scale")
    assert err.value.exit_code == 1 and str(e.path / LIB) in str(err.value)
    assert Counter(p.kind for p in verify(toy.cache).problems) == Counter({"altered": 1})
    assert Store(toy.cache).get(e.key) is not None  # reported, not silently dropped


SHAPES = {  # meta.json rewritten to valid JSON of the wrong shape: (edit, what verify says)
    "files-a-list": (lambda m: m.update(files=[m["files"]]), "no file records"),
    "size-a-string": (lambda m: m["files"][LIB].update(size="1133296"), "bad record"),
    "no-key-inputs": (lambda m: m.pop("key_inputs"), "no key_inputs"),
    "contract-edited": (lambda m: m["args"][0].update(dtype="float16"),
                        "args differs from key_inputs.args"),
    "inputs-edited-too": (lambda m: (m["args"][0].update(dtype="float16"),
                                     m["key_inputs"]["args"][0].update(dtype="float16")),
                          "key_inputs do not hash to the entry's key"),
    "library-renamed": (lambda m: m.update(library="kernel.sp"), "library 'kernel.sp' is not"),
    "variant-a-table": (lambda m: m.update(variant={"a": 1}), "variant is not a string"),
    "built-at-garbage": (lambda m: m.update(built_at=[1, 2], build_seconds="slow"), None),
}


def test_metadata_of_the_wrong_shape_is_reported_and_breaks_no_command(toy8, tmp_path: Path,
                                                                        tally) -> None:
    """Valid JSON, wrong content: each command still answers (no traceback); verify names
    each entry whose contract or records cannot be trusted, and the runtime sets it aside."""
    toy = toy8.copy(tmp_path)
    entries = sorted(toy.store.entries(), key=lambda e: e.key)
    planted = {}
    for e, (name, (edit, detail)) in zip(entries, SHAPES.items()):
        meta = json.loads((e.path / META).read_text())
        edit(meta)
        (e.path / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
        planted[e.key] = (name, detail)
    report = verify(toy.cache)
    found = {p.key: p for p in report.problems}
    for key, (name, detail) in planted.items():
        if detail is None:  # fields only `cutecc list` shows: not the runtime's concern
            assert key not in found, (name, found.get(key))
            continue
        assert found[key].kind == "malformed" and detail in found[key].detail, (name, found[key])
    _no_traceback_anywhere(toy, sorted(planted))
    seen = probe(toy.cache, sorted(planted))
    for key, (name, detail) in planted.items():
        got = seen["keys"][key]
        if detail is None:
            assert got == {"state": "registered", "mapped": True}, (name, got)
        else:
            assert got["state"] == "set aside" and not got["mapped"], (name, got)
    tally.add("damage", planted=len(planted) - 1, detected_by_verify=len(planted) - 1,
              refused_by_runtime=len(planted) - 1, mapped_while_damaged=0,
              planted_meta_wrong_shape=len(planted) - 1)
