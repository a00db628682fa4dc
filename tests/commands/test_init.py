"""`cutecc init`'s project pins its build environment as the README tells a team to: its
requirements.in, compiled with hashes, installs a fresh venv in which the project builds and
locks, and a second build there names no drift."""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import opts

from cutecc.build import builder
from cutecc.commands.build import build
from cutecc.commands.init import _pins_file, build_requirements, init
from cutecc.lock.pins import installed_unlike, read_pins
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from cutecc.ship.archive import runtime_wheel


def test_init_writes_the_build_environment_to_pin_and_names_it_in_the_manifest(tmp_path: Path) -> None:
    report = init(tmp_path / "p")
    req = tmp_path / "p" / "requirements.in"
    assert req in report.written
    lines = [ln for ln in req.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == build_requirements()
    assert (tmp_path / "p" / "requirements.txt") in report.written
    assert any(ln.startswith("nvidia-cutlass-dsl") for ln in lines) and not any("extra" in ln for ln in lines)
    assert 'pins = "requirements.txt"' in (tmp_path / "p" / "kernels.toml").read_text()


def test_inits_pins_are_the_installed_versions_of_what_the_keys_read(tmp_path: Path) -> None:
    """The pins are what is installed here, exactly: every key-deciding distribution of the
    starter's plan (what its lock's environment records) at the version installed (seen: a
    resolve of requirements.in picked newer cuda-pathfinder and filelock, moving the keys)."""
    init(tmp_path / "p")
    pins = read_pins(tmp_path / "p" / "requirements.txt")
    assert pins is not None and pins.versions
    for name, version in pins.versions:
        assert md.version(name) == version, name
    env = dict(builder.environment_of(plan(load_manifest(tmp_path / "p" / "kernels.toml"))).distributions)
    assert "nvidia-cutlass-dsl" in env
    for name, recorded in env.items():
        assert pins.version(name) == recorded.split(" ")[0] == md.version(name), name
    assert pins.version("cutecc") is None  # installed on its own, from its wheel or checkout
    assert installed_unlike(pins, env) == []


@pytest.mark.usefixtures("dsl")
def test_inits_pins_install_a_fresh_venv_that_reproduces_the_lock(tmp_path: Path) -> None:
    """init's requirements.txt, hashes added as its header says, installs a fresh venv (from
    the index: this host's mirror) in which `cutecc build` writes the lock, byte for byte,
    that this environment writes; a second build there names no drift."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv (the test extra) to add the hashes")
    proj = tmp_path / "proj"
    init(proj)
    here = build(proj / "kernels.toml", opts(cache_dir=tmp_path / "c0"), lock_file=tmp_path / "here.lock")
    assert here.ok, [o.error for o in here.outcomes]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    r = subprocess.run([uv, "pip", "compile", "requirements.txt", "--generate-hashes", "--quiet",
                        "--python-version", py, "-o", "requirements.txt"],
                       cwd=proj, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    hashed = read_pins(proj / "requirements.txt")
    assert hashed is not None and hashed.hashed
    assert hashed.versions == read_pins_text(_pins_file())  # the same versions, hashed
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    r = subprocess.run([*pip, "--require-hashes", "-r", str(proj / "requirements.txt")],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    name, data = runtime_wheel()
    (tmp_path / name).write_bytes(data)
    r = subprocess.run([*pip, "--no-deps", str(tmp_path / name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    cmd = [str(venv / "bin" / "cutecc"), "build", str(proj / "kernels.toml"),
           "--cache-dir", str(tmp_path / "c")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0 and "1 built" in r.stdout, r.stdout + r.stderr
    assert "another environment" not in r.stderr and "not the one" not in r.stderr, r.stderr
    assert (proj / "kernels.lock").read_bytes() == (tmp_path / "here.lock").read_bytes()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0 and "1 cached" in r.stdout and "another environment" not in r.stderr, r.stderr


def read_pins_text(text: str) -> tuple[tuple[str, str], ...]:
    from cutecc.lock.pins import parse_pins

    return parse_pins(text, "requirements.txt").versions
