"""The device's arch, learned before JAX's GPU backend starts: `cutecc.load` in a fresh
process asks the CUDA driver, leaves JAX's backends unstarted, and names the arch JAX then
reports for its first GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import jax
from jax._src import xla_bridge
import cutecc
from cutecc import archs
ks = cutecc.load(sys.argv[1])
started = bool(xla_bridge._backends)  # JAX's backends, started or not, after the load
cc = jax.devices("gpu")[0].compute_capability
print(json.dumps({"uses_driver": archs.jax_uses_driver_order(jax.config), "driver": archs.driver_arch(),
                  "loaded_for": ks.arch, "started_by_load": started, "jax_cc": cc}))
"""


def test_load_learns_the_arch_from_the_driver_not_from_jax(example_cache: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, str(example_cache)], capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    major, minor = str(got["jax_cc"]).split(".")
    assert got["uses_driver"] is True, got
    assert got["driver"] == got["loaded_for"] == f"sm_{major}{minor}", got
    assert got["started_by_load"] is False, got
