"""`cutecc show` says an entry's sharding choices, `shard` and `reshard`, as the runtime reads
them from the entry's key inputs."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from meta_records import entry_record

from cutecc.cli import main
from cutecc.commands.show import sharding
from cutecc.entry.meta import EntryMeta
from cutecc.store import Store


def _publish(cache: Path, key: str, key_inputs: dict) -> None:
    def produce(d: Path) -> EntryMeta:
        (d / "kernel.so").write_bytes(b"x")
        return entry_record({"kernel": "attn", "variant": "v", "arch": "sm_90a", "key_inputs": key_inputs})

    store = Store(cache)
    store.ensure()
    store.publish(key, produce)


def test_show_says_the_shard_rule_and_the_reshard_choice(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    _publish(cache, "a" * 64, {"shard": ["b", "h"], "reshard": "warn"})
    _publish(cache, "b" * 64, {})
    r = CliRunner().invoke(main, ["show", "aaaa", "--cache-dir", str(cache)])
    assert r.exit_code == 0, r.output
    assert ("sharding   shard = [b, h]; reshard = warn: a call split elsewhere under an explicit "
            "mesh warns once, then is gathered") in r.stdout.splitlines()
    r = CliRunner().invoke(main, ["show", "bbbb", "--cache-dir", str(cache)])
    assert r.exit_code == 0, r.output
    assert ("sharding   no shard rule (one device per call); reshard = error: a call split elsewhere "
            "under an explicit mesh is an error") in r.stdout.splitlines()
    r = CliRunner().invoke(main, ["show", "aaaa", "--cache-dir", str(cache), "--json"])
    assert json.loads(r.stdout)["sharding"] == {"shard": ["b", "h"], "reshard": "warn"}


def test_a_manifests_reshard_reaches_show_through_the_key_inputs(tmp_path: Path) -> None:
    from cutecc.plan.key import key_inputs  # what the build records as the entry's key inputs

    p = tmp_path / "kernels.toml"
    p.write_text("""
[kernel.k]
entry = "kk.ops:mul"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
shard = ["n"]
reshard = "allow"
""")
    from cutecc.manifest import load_manifest

    k = load_manifest(p).kernel("k")
    got = sharding({"key_inputs": key_inputs(k, k.variants[0], "sm_90a", "0" * 64)})
    assert got == {"shard": ["n"], "reshard": "allow"}
