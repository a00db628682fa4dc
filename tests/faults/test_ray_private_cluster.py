"""`--executor ray` without an address starts a private cluster, never a shared one.

Seen: `--executor ray` without an address joined whatever the shared Ray
temp directory names (`<tmp>/ray/ray_current_cluster`, which any local user can write on
a host whose /tmp/ray is world-writable), then failed (`num_cpus ... must not be
provided`). Without an explicit address a build must start a private cluster in a fresh
directory of its own, reading neither that file nor Ray's own `RAY_ADDRESS`.

The hostile directory is this test's own: the build's TMPDIR and RAY_TMPDIR point there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import PY, write_toy_project

from .conftest import run_bounded

pytestmark = [pytest.mark.usefixtures("dsl")]


def test_a_build_without_an_address_never_joins_the_shared_temp_dirs_cluster(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    shared = tmp_path / "shared-tmp"
    (shared / "ray").mkdir(parents=True)
    os.chmod(shared, 0o777)
    os.chmod(shared / "ray", 0o777)  # world-writable, not sticky: as found on the host
    planted = shared / "ray" / "ray_current_cluster"
    planted.write_text("127.0.0.1:9\n")  # the discard port: nothing of ours listens there
    manifest = write_toy_project(tmp_path / "p", threads=(64,))
    r = run_bounded([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", str(tmp_path / "c"),
                     "--executor", "ray", "-j", "1", "--no-lock", "--json"],
                    env={"TMPDIR": str(shared), "RAY_TMPDIR": str(shared / "ray"),
                         "RAY_ADDRESS": "127.0.0.1:9"}, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    rep = json.loads(r.stdout)
    assert (rep["built"], rep["failed"], rep["executor"]) == (1, 0, "ray"), rep
    assert sorted(p.name for p in (shared / "ray").iterdir()) == ["ray_current_cluster"], \
        "the build's Ray wrote into the shared temp directory"
    assert planted.read_text() == "127.0.0.1:9\n"
