"""The cache commands on an installed pack (`cutecc pack`'s wheel, `pip install`ed into a
venv): `--cache-dir <site-packages>/<package>/_cutecc` is read, never written. Seen: `cutecc
verify` there created `locks/` with a lock file per entry, and reported the healthy pack's
entries as `unindexed` (a pack is read through its kernels.lock, it ships no `by-kernel/`
index) and its kernels.lock as an orphan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Toy, run_cli

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("dsl")

# pip with no configuration and no index: the wheel alone (its dependencies are not needed
# for the cache commands, run by this cutecc)
NO_INDEX = {**{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "CUTECC_", "PYTHON"))},
            "PIP_CONFIG_FILE": os.devnull}


@pytest.fixture
def installed(toy_cache: Toy, tmp_path: Path) -> Path:
    """The toy packed as a wheel and `pip install`ed into a fresh venv: its `_cutecc/` tree."""
    dist = tmp_path / "dist"
    r = run_cli("pack", "--lock", str(toy_cache.lock), "--cache-dir", str(toy_cache.cache), "--name",
                "toy-kernels", "--version", "1.0.0", "--out", str(dist), "--no-runtime-wheel", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = json.loads(r.stdout)["path"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=NO_INDEX)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    r = subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], capture_output=True,
                       text=True, timeout=600, env=NO_INDEX)
    assert r.returncode == 0, r.stdout + r.stderr
    (root,) = venv.glob("lib/python*/site-packages/toy_kernels/_cutecc")
    assert (root / "kernels.lock").is_file() and not (root / "by-kernel").exists()
    return root


def test_list_and_verify_on_an_installed_pack_write_nothing_and_find_it_healthy(installed: Path) -> None:
    before = snapshot(installed)
    r = run_cli("list", "--cache-dir", str(installed), "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(e["variant"] for e in json.loads(r.stdout)["entries"]) == ["threads=128", "threads=64"]
    r = run_cli("verify", "--cache-dir", str(installed), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got["problems"] == [] and got["entries"] == got["healthy"] == 2, got
    for cmd in (("stats",), ("gc", "--dry-run"), ("list", "--gpu", "sm_90")):
        r = run_cli(*cmd, "--cache-dir", str(installed))
        assert r.returncode == 0, (cmd, r.stderr)
    assert snapshot(installed) == before  # no locks/, no by-kernel/, no use mark, no counter


def test_verify_finds_a_damaged_installed_pack_and_fix_refuses_to_write_into_it(installed: Path) -> None:
    lib = sorted(installed.glob("entries/*/*/kernel.so"))[0]
    data = lib.read_bytes()
    lib.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    (installed / "stray").write_text("x")
    before = snapshot(installed)
    r = run_cli("verify", "--cache-dir", str(installed), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    kinds = sorted((p["kind"], Path(p["path"]).name) for p in json.loads(r.stdout)["problems"])
    assert kinds == [("altered", "kernel.so"), ("orphan", "stray")], kinds
    r = run_cli("verify", "--cache-dir", str(installed), "--fix")
    assert r.returncode == 1 and "an installed pack is not fixed in place" in r.stderr, r.stderr
    assert snapshot(installed) == before
