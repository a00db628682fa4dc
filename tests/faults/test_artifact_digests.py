"""Key soundness you can audit: every entry records the digest of what the DSL compiled,
and `cutecc verify --deep` compiles each entry again (another process, a throwaway cache)
and names any whose digest comes out otherwise: here a data file the kernel reads while
it is traced, which no key hashes (it is not an import), changed after the build."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, Toy

from cutecc.entry.rules import META
from cutecc.store import Store

from .conftest import assert_clean_failure, cli

pytestmark = pytest.mark.usefixtures("dsl")

# A kernel whose scale comes from `scale.txt`, read with open() while the launcher is traced:
# a compile input the key cannot see.
DATA_KERNEL = '''\
import os

import cutlass
import cutlass.cute as cute


def _scale() -> float:
    with open(os.path.join(os.path.dirname(__file__), "scale.txt")) as f:
        return float(f.read())


@cute.kernel
def _scale_kernel(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32, scale: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        out[i] = x[i] * scale


@cute.jit
def scaled(x: cute.Tensor, out: cute.Tensor, stream):
    n = x.shape[0]
    _scale_kernel(x, out, n, _scale()).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1],
                                              stream=stream)
'''

DATA_MANIFEST = '''\
archs = ["sm_90a"]

[kernel.scaled]
entry = "data_toy.ops:scaled"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
'''


def _deep(manifest: Path, cache: Path,
          env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    r = cli("verify", "--deep", str(manifest), "--cache-dir", str(cache), "--json", "-j", "2", timeout=900,
            env=env)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r, json.loads(r.stdout)


def test_an_input_the_key_misses_is_reported_by_deep_verify(tmp_path: Path) -> None:
    """Built without the read-set check (as cutecc did before issue 44; `$CUTECC_INTERNAL_AUDIT=off`),
    then the data file the trace reads changed (the key stays: it is not an import): plain
    `verify` calls the cache healthy, `verify --deep` names the entry, the file that differs
    and that its device code differs (exit 1). Before the change it reproduces. With the
    check, the compile again is refused naming the file no key covers."""
    off = {"CUTECC_INTERNAL_AUDIT": "off"}
    proj = tmp_path / "proj"
    (proj / "data_toy").mkdir(parents=True)
    (proj / "data_toy" / "__init__.py").write_text("")
    (proj / "data_toy" / "ops.py").write_text(DATA_KERNEL)
    (proj / "data_toy" / "scale.txt").write_text("2.0\n")
    manifest = proj / "kernels.toml"
    manifest.write_text(DATA_MANIFEST)
    cache = tmp_path / "cache"
    r = cli("build", str(manifest), "--cache-dir", str(cache), "--no-lock", "-j", "1", timeout=900, env=off)
    assert r.returncode == 0, r.stderr[-3000:]
    (entry,) = Store(cache).entries()
    assert entry.meta.artifact is not None, entry.doc.get("artifact")
    assert entry.meta.read_set is None

    r, doc = _deep(manifest, cache, off)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [e["status"] for e in doc["deep"]["entries"]] == ["reproduced"]
    r, doc = _deep(manifest, cache)  # with the check: the file no key covers is named
    (found,) = doc["deep"]["entries"]
    assert r.returncode == 1 and found["status"] == "failed", found
    assert "data_toy/scale.txt (module data_toy.ops)" in found["detail"], found

    (proj / "data_toy" / "scale.txt").write_text("3.0\n")
    r = cli("verify", "--cache-dir", str(cache))
    assert r.returncode == 0, r.stdout + r.stderr  # the bytes are as recorded: only a re-trace sees it
    r = cli("build", str(manifest), "--cache-dir", str(cache), "--no-lock", "--dry-run", "--json")
    assert json.loads(r.stdout)["cached"] == 1  # the key did not move

    r, doc = _deep(manifest, cache, off)
    (found,) = doc["deep"]["entries"]
    assert r.returncode == 1 and not doc["ok"]
    assert found["status"] == "differs" and found["key"] == entry.key, found
    assert found["label"] == "scaled[default]@sm_90a", found
    assert "kernel.o sha256" in found["detail"] and "device code (cubin) differs" in found["detail"], found
    text = cli("verify", "--deep", str(manifest), "--cache-dir", str(cache), timeout=900, env=off)
    assert_clean_failure(text, 1, "differs", "scaled[default]@sm_90a", entry.key[:12],
                         "0 reproduced, 1 differ")


def test_every_recorded_digest_is_reproduced_and_older_entries_are_compared_by_library(
        toy_cache: Toy, tmp_path: Path) -> None:
    """The toy's two entries, compiled again in another process: both digests reproduced.
    One whose meta.json lost its digest (an entry built before cutecc recorded it) is said to
    have none, not an error, and is compared by its library's bytes."""
    toy = toy_cache.copy(tmp_path)
    entries = toy.entries()
    assert all(e.meta.artifact is not None for e in entries.values())
    old = entries["threads=64"]
    meta = json.loads((old.path / META).read_text())
    del meta["artifact"]
    (old.path / META).chmod(0o644)
    (old.path / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
    r, doc = _deep(toy.manifest, toy.cache)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {e["key"]: e for e in doc["deep"]["entries"]}
    assert {k: e["status"] for k, e in got.items()} == {e.key: "reproduced" for e in entries.values()}
    assert got[old.key]["note"] == "no artifact digest" and got[old.key]["detail"] == "library bytes the same"
    assert got[entries["threads=128"].key]["note"] is None


def test_deep_verify_reproduces_the_root_manifest(example_cache: Path) -> None:
    """Every entry of the repository's kernels.toml, built by another process, compiled
    again: every recorded digest reproduced."""
    r, doc = _deep(REPO / "kernels.toml", example_cache)
    assert r.returncode == 0, r.stdout + r.stderr
    deep = doc["deep"]
    assert deep["entries"] and all(e["status"] == "reproduced" and e["note"] is None
                                   for e in deep["entries"]), deep


def test_deep_verify_reproduces_the_examples(examples_build: Path) -> None:
    """The same for examples/kernels.toml (the published kernels; needs the examples extra)."""
    r, doc = _deep(REPO / "examples" / "kernels.toml", examples_build)
    assert r.returncode == 0, r.stdout + r.stderr
    deep = doc["deep"]
    assert deep["entries"] and all(e["status"] == "reproduced" and e["note"] is None
                                   for e in deep["entries"]), deep


def test_a_compile_that_read_other_files_is_reported_by_deep_verify(toy_cache: Toy, tmp_path: Path) -> None:
    """The read-set digest (`cutecc.build.read_set`) is a fresh compile's: one recorded from
    another read set (here, rewritten) is reported `differs`, naming the read set."""
    toy = toy_cache.copy(tmp_path)
    entries = toy.entries()
    assert all(e.meta.read_set is not None for e in entries.values())
    other = entries["threads=64"]
    meta = json.loads((other.path / META).read_text())
    meta["read_set"] = "0" * 64
    (other.path / META).chmod(0o644)
    (other.path / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
    r, doc = _deep(toy.manifest, toy.cache)
    got = {e["key"]: e for e in doc["deep"]["entries"]}
    assert r.returncode == 1 and got[other.key]["status"] == "differs", got
    assert "read other files" in got[other.key]["detail"], got
    assert got[entries["threads=128"].key]["status"] == "reproduced", got
