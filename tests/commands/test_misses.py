"""`cutecc misses`: the calls fallbacks served, listed from the cache's record, and with
`--toml` the manifest variants that, once built, serve the same call from the cache; the
record is bounded and read with the checks of any record."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import fallback_manifest, opts

import cutecc
from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.errors import FallbackWarning
from cutecc.store import misses as misses_record
from cutecc.store.misses import miss_of, read_misses, record_miss
from cutecc.trust import Untrusted

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


def _cli(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False, prog_name="cutecc")
    assert r.exit_code == 0, r.output
    return r.stdout


def _missed(project: Path) -> Path:
    cache = project.parent.parent / "cache"
    assert build(project, opts(cache_dir=cache)).ok
    ks = cutecc.load(cache, arch="sm_90a")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        ks.scale(jnp.ones((3, 32), jnp.float32), factor=2.0)
    return cache


def test_misses_lists_the_calls_fallbacks_served(fallback_project: Path) -> None:
    cache = _missed(fallback_project)
    doc = json.loads(_cli("misses", "--cache-dir", str(cache), "--json"))
    (m,) = doc["misses"]
    assert (m["kernel"], m["arch"], m["signature"], m["count"]) == ("scale", "sm_90a", "(float32[3, 32])", 1)
    assert "scale(float32[3, 32]) on sm_90a: no built variant fits, 1 time(s)" in _cli(
        "misses", "--cache-dir", str(cache))
    # the record and its lock are names the cache's layout knows: no orphans, nothing damaged
    verify = json.loads(_cli("verify", "--cache-dir", str(cache), "--json"))
    assert verify["ok"] and not verify["problems"] and (cache / "misses.json").is_file(), verify


def test_misses_toml_prints_a_variant_that_once_built_serves_the_call(fallback_project: Path) -> None:
    cache = _missed(fallback_project)
    out = _cli("misses", "--cache-dir", str(cache), "--toml", "-m", str(fallback_project))
    assert "[kernel.scale]\nvariants = { d = [64, 32] }\n# adds d=32" in out
    # the printed table, put in the manifest and built, serves the call from the cache
    fallback_project.write_text(fallback_manifest(ds=[64, 32]))
    assert build(fallback_project, opts(cache_dir=cache)).ok
    b, _ = cutecc.load(cache, arch="sm_90a").scale.select(jnp.ones((3, 32), jnp.float32))
    assert b.variant == "d=32"


def test_misses_toml_adds_the_arch_a_cache_lacks(fallback_project: Path) -> None:
    fallback_project.write_text(fallback_manifest(archs=["sm_100a"]))
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        cutecc.load(cache, arch="sm_90a").scale(jnp.ones((2, 64), jnp.float32))
    out = _cli("misses", "--cache-dir", str(cache), "--toml", "-m", str(fallback_project))
    assert '[kernel.scale]\narchs = ["sm_100a", "sm_90a"]' in out


def test_a_miss_no_axis_covers_asks_for_a_contract_change(fallback_project: Path) -> None:
    cache = _missed(fallback_project)
    record_miss(cache, miss_of("scale", "sm_90a", [("float16", (3, 64))], {}, "no built variant fits"))
    doc = json.loads(_cli("misses", "--cache-dir", str(cache), "--toml", "-m", str(fallback_project),
                          "--json"))
    (u,) = doc["uncovered"]
    assert u["signature"] == "(float16[3, 64])" and "change the contract" in u["why"]
    assert "dtype float16, expected float32" in u["why"]


def test_the_record_is_bounded_and_counts_per_signature(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(misses_record, "MAX_MISSES", 20)
    def seen(n: int) -> bool:
        return record_miss(tmp_path, miss_of("k", "sm_90a", [("float32", (n,))], {}, "no built variant fits"))

    assert all(seen(i + 1) for i in range(25))
    assert seen(10)
    got = read_misses(tmp_path)
    assert len(got) == 20 and got[0].arrays == (("float32", (10,)),) and got[0].count == 2
    assert sorted(m.arrays[0][1][0] for m in got) == list(range(6, 26))  # the least recently seen went
    assert not list(tmp_path.glob(".misses.json.*"))  # written atomically: no temporary left


def test_a_hostile_record_is_refused_not_believed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": 1, "misses": []}))
    (tmp_path / "misses.json").symlink_to(target)
    with pytest.raises(Untrusted):
        read_misses(tmp_path)
    assert not record_miss(tmp_path, miss_of("k", "sm_90a", [("float32", (1,))], {}, "r"))
    assert target.read_text() == json.dumps({"format": 1, "misses": []})  # not written through


@pytest.mark.parametrize("doc", [b"not json", b'{"format": 2, "misses": []}', b'{"format": 1, "misses": 3}',
                                 b'{"format": 1, "misses": [{"kernel": "../x"}]}'])
def test_a_malformed_record_reads_as_nothing(tmp_path: Path, doc: bytes) -> None:
    (tmp_path / "misses.json").write_bytes(doc)
    assert read_misses(tmp_path) == []
    os.chmod(tmp_path / "misses.json", 0o644)
    np.testing.assert_equal(len(read_misses(tmp_path)), 0)


EVIL = {"kernel": "scale", "arch": "sm_90a\n[kernel.evil]\nentry = \"evil.mod:run\"",
        "arrays": [{"dtype": "float32", "shape": [3, 32]}], "keywords": {}, "reason": "no build for sm_90a",
        "count": 1, "first": "2026-01-01T00:00:00+00:00", "last": "2026-01-01T00:00:00+00:00"}


def test_an_injected_record_never_reaches_what_is_printed(fallback_project: Path) -> None:
    """misses.json is trust-checked (only its owner writes it), yet what `misses --toml`
    prints is pasted into a manifest: a record whose arch carries a newline and a table (on
    1518079 the printed TOML gained `[kernel.evil]`) is skipped with a note, and every line
    printed holds printable text only."""
    import tomllib

    cache = _missed(fallback_project)
    doc = json.loads((cache / "misses.json").read_text())
    evil_dtype = [{"dtype": "float32\n[kernel.evil]", "shape": [3]}]
    doc["misses"] += [EVIL, {**EVIL, "reason": "no built variant fits"},
                      {**EVIL, "arch": "sm_90a", "arrays": evil_dtype}]
    (cache / "misses.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["misses", "--cache-dir", str(cache), "--toml", "-m", str(fallback_project)],
                           catch_exceptions=False, prog_name="cutecc")
    assert r.exit_code == 0, r.output
    assert "evil" not in r.stdout and set(tomllib.loads(r.stdout)) == {"kernel"}
    assert set(tomllib.loads(r.stdout)["kernel"]) == {"scale"}
    assert "skipped 3 record(s)" in r.stderr and "misses.json" in r.stderr
    text = CliRunner().invoke(main, ["misses", "--cache-dir", str(cache)], prog_name="cutecc")
    assert text.exit_code == 0 and "evil" not in text.stdout and "skipped 3 record(s)" in text.stderr
    assert all(line.isprintable() for line in text.stdout.splitlines())


@pytest.mark.parametrize("value", ['say "hi"', "back\\slash", "\u00e9t\u00e9", "\U0001f600", "tab\there",
                                   "new\nline", "\x1b[31m", "\u202eevil", "\x7f", "'''", "#", "[kernel.x]"])
def test_a_toml_value_reads_back_as_itself(value: str) -> None:
    """What `--toml` prints for a value is TOML for that value, whatever its characters (on
    1518079 JSON's spelling served: an emoji became a surrogate pair, which is no TOML)."""
    import tomllib

    from cutecc.commands.misses import toml_key, toml_value

    line = f"{toml_key(value)} = {toml_value([value, 1.5, True, 7])}"
    assert "\n" not in line and line.isprintable()
    assert tomllib.loads(line) == {value: [value, 1.5, True, 7]}
