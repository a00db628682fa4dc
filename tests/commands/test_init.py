"""`cutecc init`'s project pins its build environment as the README tells a team to: its
requirements.in, compiled with hashes, installs a fresh venv in which the project builds and
locks, and a second build there names no drift."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cutecc.commands.init import build_requirements, init
from cutecc.ship.archive import runtime_wheel


def test_init_writes_the_build_environment_to_pin_and_names_it_in_the_manifest(tmp_path: Path) -> None:
    report = init(tmp_path / "p")
    req = tmp_path / "p" / "requirements.in"
    assert req in report.written
    lines = [ln for ln in req.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == build_requirements()
    assert any(ln.startswith("nvidia-cutlass-dsl") for ln in lines) and not any("extra" in ln for ln in lines)
    assert 'pins = "requirements.txt"' in (tmp_path / "p" / "kernels.toml").read_text()


@pytest.mark.usefixtures("dsl")
def test_inits_project_builds_in_a_fresh_venv_installed_from_its_own_pins(tmp_path: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv (the test extra) to compile the pins")
    proj = tmp_path / "proj"
    init(proj)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    r = subprocess.run([uv, "pip", "compile", "requirements.in", "--generate-hashes", "--quiet",
                        "--python-version", py, "-o", "requirements.txt"],
                       cwd=proj, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "--hash=sha256:" in (proj / "requirements.txt").read_text()
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
    lock = json.loads((proj / "kernels.lock").read_text())
    assert "nvidia-cutlass-dsl" in lock["environment"]["distributions"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0 and "1 cached" in r.stdout and "another environment" not in r.stderr, r.stderr
