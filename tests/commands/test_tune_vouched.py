"""`cutecc tune --record` vouches for its lock as `cutecc build` does (`cutecc.ship.vouch.vouch`):
a winner (or its default) whose library changed after it was measured is refused, read back
and hashed; a signing record reads back and hashes every line of the lock it signs. On
stand-in builds (`helpers.fake_compile`): no DSL, no GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import fake_compile, opts

from cutecc.commands.build import build
from cutecc.commands.tune import tune
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import read_lock
from cutecc.plan.tuning_plan import PlanItem, manifest_digest, read_plan
from cutecc.runtime.tuning import results_path
from cutecc.store import Store

MANIFEST = """\
archs = ["sm_90a"]

[kernel.scale]
entry = "toytune.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
constants = { threads = "$threads" }

[kernel.scale.tune]
params = { threads = [64, 128] }
default = { threads = 128 }
buckets = { n = [1024, 65536] }

[kernel.plain]
entry = "toytune.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
"""
INFO = {"device": "NVIDIA H100 80GB HBM3", "driver": "cuda 12080"}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, PlanItem]:
    """A tuned kernel built and `tune --compile-only`d with stand-ins: (manifest, cache, its
    plan item)."""
    import cutecc.build.executors.local

    (tmp_path / "toytune").mkdir()
    (tmp_path / "toytune/__init__.py").write_text("")
    (tmp_path / "toytune/ops.py").write_text("def scale(x, out, stream, threads=128):\n    pass\n")
    manifest = tmp_path / "kernels.toml"
    manifest.write_text(MANIFEST)
    monkeypatch.setattr(cutecc.build.executors.local, "compile_all",
                        lambda *a, remote=None, limits=None: fake_compile(*a))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toytune", raising=False)
    cache = tmp_path / "cache"
    assert build(manifest, opts(cache_dir=cache)).ok
    assert tune(manifest, opts(cache_dir=cache), compile_only=True).failed == []
    (item,) = [it for it in read_plan(cache, manifest_digest(manifest), "x") if it.kernel == "scale"]
    return manifest, cache, item


def _results(cache: Path, item: PlanItem, path: Path) -> str:
    """A results file in which the non-default candidate wins n=65536 clearly; its key."""
    from cutecc.tuning.measure import _record

    (other,) = [c.key for c in item.candidates if not c.default]
    times = {c.key: [19.0, 20.0, 21.0] for c in item.candidates}
    times[other] = [4.9, 5.0, 5.1]
    rec = _record(Store(cache), item, "n=65536", {"times": times, "dropped": {}, "k": 8}, {}, INFO)
    assert rec.line.winner == other
    path.write_text(json.dumps({"format": 1, "records": [rec.to_json()]}))
    return other


def _alter(cache: Path, key: str) -> None:
    """Flip the last byte of an entry's library in place (same size, meta.json untouched)."""
    lib = Store(cache).layout.entry(key) / "kernel.so"
    data = bytearray(lib.read_bytes())
    data[-1] ^= 1
    lib.write_bytes(bytes(data))


def test_a_record_against_a_winner_changed_since_it_was_measured_is_refused(
        project: tuple[Path, Path, PlanItem], tmp_path: Path) -> None:
    manifest, cache, item = project
    winner = _results(cache, item, tmp_path / "r.json")
    lock = manifest.parent / "kernels.lock"
    before = lock.read_bytes()
    _alter(cache, winner)
    with pytest.raises(CuteccError, match="altered") as e:
        tune(manifest, opts(cache_dir=cache), record=tmp_path / "r.json")
    assert e.value.exit_code == 1 and "scale[threads=64]" in e.value.message, e.value.message
    assert lock.read_bytes() == before and not results_path(cache, item.base).exists()
    _alter(cache, winner)  # the bytes measured again: recorded
    report = tune(manifest, opts(cache_dir=cache), record=tmp_path / "r.json")
    assert report.lock_changed and [t.winner for t in read_lock(lock).tuning] == [winner]


def test_a_signing_record_hashes_every_line_of_the_lock_it_signs(
        project: tuple[Path, Path, PlanItem], tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from cutecc.lock import signing

    manifest, cache, item = project
    _results(cache, item, tmp_path / "r.json")
    lock = manifest.parent / "kernels.lock"
    (plain,) = [le.key for le in read_lock(lock).entries if le.kernel == "plain"]
    _alter(cache, plain)  # a line this record does not touch, about to be signed
    private, _ = signing.keygen(tmp_path / "ci")
    before = lock.read_bytes()
    with pytest.raises(CuteccError, match=r"refusing to sign: 1 lock line\(s\) this tune cannot vouch "
                                          r"for: plain\[default\]@sm_90a.*altered"):
        tune(manifest, opts(cache_dir=cache, sign_key=private), record=tmp_path / "r.json")
    assert lock.read_bytes() == before and not Path(f"{lock}{signing.SIG_SUFFIX}").exists()
    # unsigned, the line is only compared with the cache's metadata (as a build does)
    assert tune(manifest, opts(cache_dir=cache), record=tmp_path / "r.json").lock_changed
