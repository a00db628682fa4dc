"""A packed wheel, pip-installed into a clean directory, runs its kernels correctly on the GPU.

This is the deploy story end to end on real hardware: the cache built elsewhere is locked,
packed into a wheel, installed with pip (no dependencies, no index), and used from a fresh
process that never sees the cache or the DSL: only the installed package and the runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cutecc.commands.pack import pack
from cutecc.lock.lockfile import lock_for, write_lock
from cutecc.store import Store

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

RUN = r'''
import json, sys
import numpy as np, jax, jax.numpy as jnp
assert not any(m.startswith("cutlass") for m in sys.modules)
import cutecc_examples as pkg

ks = pkg.load()  # this GPU's arch
rng = np.random.default_rng(int(sys.argv[1]))
out = {"file": pkg.__file__, "arch": ks.arch}
x = jnp.asarray(rng.standard_normal(100_003, dtype=np.float32))
y = jnp.asarray(rng.standard_normal(100_003, dtype=np.float32))
got = jax.jit(pkg.mul)(x, y)  # the lazily loaded module attribute
out["mul"] = float(jnp.max(jnp.abs(got - x * y)) / jnp.max(jnp.abs(x * y)))
a = jnp.asarray(rng.standard_normal((77, 4096), dtype=np.float32)).astype(jnp.bfloat16)
w = jnp.asarray(rng.standard_normal(4096, dtype=np.float32)).astype(jnp.bfloat16)
got = ks.rmsnorm(a, w, eps=1e-5).astype(jnp.float32)
af = a.astype(jnp.float32)
want = af * jax.lax.rsqrt(jnp.mean(af * af, -1, keepdims=True) + 1e-5) * w.astype(jnp.float32)
out["rmsnorm"] = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
out["finite"] = bool(jnp.isfinite(got).all())
out["dsl"] = sorted(m for m in sys.modules if m.startswith(("cutlass", "nvidia_cutlass")))
print(json.dumps(out))
'''


def test_packed_wheel_runs_from_a_pip_install(example_cache: Path, tmp_path: Path) -> None:
    store = Store(example_cache)
    items = [(e.doc["kernel"], e.doc["variant"], e.doc["arch"], e.key) for e in store.entries()]
    lock = tmp_path / "kernels.lock"
    write_lock(lock, lock_for(items, store))
    from cutecc.lock.signing import keygen

    private, public = keygen(tmp_path / "ci")  # the builder signs; the deploy host trusts .pub
    report = pack(name="cutecc-examples", version="1.0", lock=lock, kernels=("mul", "rmsnorm"),
                  cache_dir=example_cache, out=tmp_path / "dist", sign_key=private)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", "--target", str(site), str(report.path)],
                   check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
    env.pop("CUTECC_CACHE_DIR", None)
    env.pop("CUTECC_ALLOW_UNSIGNED", None)
    env["CUTECC_TRUSTED_KEYS"] = str(public)
    r = subprocess.run([sys.executable, "-c", RUN, "7"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["file"].startswith(str(site))
    assert got["mul"] <= 1e-6 and got["rmsnorm"] <= 1.6e-2 and got["finite"], got
    assert got["dsl"] == []
