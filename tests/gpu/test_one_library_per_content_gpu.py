"""One key, one library per process, on a real GPU: a second cache holding other bytes
under a key this process already runs is refused naming both sources, never served by the
first library (before the fix, its call ran the first cache's code)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CHILD = r'''
import sys, numpy as np, jax.numpy as jnp, cutecc
first, second = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(32)
x = jnp.asarray(rng.standard_normal(4099, dtype=np.float32))
y = jnp.asarray(rng.standard_normal(4099, dtype=np.float32))
got = cutecc.load(first).mul(x, y)
assert np.allclose(np.asarray(got), np.asarray(x) * np.asarray(y), rtol=1e-6), "first cache wrong"
try:
    cutecc.load(second).mul(x, y)
    print("SERVED")
except cutecc.CuteccError as e:
    print("REFUSED", e)
'''


def test_a_second_cache_with_other_bytes_under_a_loaded_key_is_refused(example_cache: Path,
                                                                       tmp_path: Path) -> None:
    other = Path(shutil.copytree(example_cache, tmp_path / "other"))
    metas = {p.parent.name: p for p in (other / "entries").glob("*/*/meta.json")}
    docs = {k: json.loads(p.read_text()) for k, p in metas.items()}
    (target,) = [k for k, m in docs.items() if m["kernel"] == "mul" and m["variant"] == "dtype=float32"]
    donor = next(k for k, m in docs.items() if m["kernel"] == "mul" and k != target)
    lib = metas[target].parent / docs[target]["library"]
    data = (metas[donor].parent / docs[donor]["library"]).read_bytes()
    lib.write_bytes(data)  # the second cache is self-consistent: its meta.json records these bytes
    docs[target]["files"][docs[target]["library"]] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                      "size": len(data)}
    metas[target].write_text(json.dumps(docs[target], indent=1, sort_keys=True))
    # from a folder of no project: the caches alone decide (from this checkout, load() would
    # serve what kernels.lock pins, and refuse the other bytes as not the lock's)
    r = subprocess.run([sys.executable, "-c", CHILD, str(example_cache), str(other)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "REFUSED" in r.stdout, r.stdout
    assert str(example_cache) in r.stdout and str(other) in r.stdout, r.stdout
