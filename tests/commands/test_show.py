"""`cutecc show`: one entry's metadata and files, by key or unique prefix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from meta_records import entry_record

from cutecc.cli import main
from cutecc.commands.show import show
from cutecc.entry.meta import EntryMeta
from cutecc.errors import CuteccError

pytestmark = pytest.mark.usefixtures("dsl")


def test_show_by_key_and_by_prefix_gives_metadata_and_real_file_hashes(built) -> None:
    e = built.entries()["threads=64"]
    info = show(e.key, built.cache)
    assert info == show(e.key[:6], built.cache)
    assert info["key"] == e.key and info["label"] == "scale[threads=64]@sm_90a"
    assert info["meta"]["key_inputs"]["constants"] == {"threads": 64}
    [f] = info["files"]
    data = (e.path / "kernel.so").read_bytes()
    assert f == {"name": "kernel.so", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_ambiguous_prefix_lists_the_matches(built) -> None:
    e = built.entries()["threads=64"]
    twin = e.key[:6] + "0" * 58  # a second entry sharing the first 6 hex digits

    def produce(d: Path) -> EntryMeta:
        (d / "kernel.so").write_bytes(b"x")
        return entry_record({"kernel": "twin", "variant": "v", "arch": "sm_90a"})

    built.store.publish(twin, produce)
    with pytest.raises(CuteccError) as err:
        show(e.key[:6], built.cache)
    assert err.value.exit_code == 2
    assert "ambiguous" in err.value.message and e.key[:16] in err.value.message
    assert twin[:16] in err.value.message and "scale[threads=64]@sm_90a" in err.value.message
    assert "twin[v]@sm_90a" in err.value.message
    assert show(e.key[:7], built.cache)["key"] == e.key  # one more digit resolves it


@pytest.mark.parametrize("prefix, code, text", [
    ("0123456789abcdef", 1, "no entry matches"),  # well-formed, unknown
    ("xyz", 2, "not a key or key prefix"),
    ("", 2, "not a key or key prefix"),
])
def test_unknown_or_bad_prefix(built, prefix: str, code: int, text: str) -> None:
    known = {e.key for e in built.store.entries()}
    if any(k.startswith(prefix) for k in known) and prefix:
        pytest.skip("the random key happens to start with this prefix")
    with pytest.raises(CuteccError, match=text) as err:
        show(prefix, built.cache)
    assert err.value.exit_code == code


def test_show_on_a_missing_cache_says_so(tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="no cutecc cache here") as err:
        show("ab", tmp_path / "nothing")
    assert err.value.exit_code == 1
    assert not (tmp_path / "nothing").exists()


def test_cli_show_text_and_json(built) -> None:
    e = built.entries()["threads=128"]
    r = CliRunner().invoke(main, ["show", e.key[:10], "--cache-dir", str(built.cache)])
    assert r.exit_code == 0, r.output
    assert e.key in r.stdout and e.doc["files"]["kernel.so"]["sha256"] in r.stdout
    assert 'key_inputs.constants: {"threads": 128}' in r.stdout
    r = CliRunner().invoke(main, ["show", e.key, "--cache-dir", str(built.cache), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["meta"] == e.doc
    r = CliRunner().invoke(main, ["show", "ffff" * 16, "--cache-dir", str(built.cache)])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.output
