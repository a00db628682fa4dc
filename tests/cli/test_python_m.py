"""`python -m cutecc` runs the command line: where wheels are installed with
`pip install --target` there is no `cutecc` script on PATH, only the package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import PY

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([PY, "-m", "cutecc", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)


def test_python_m_cutecc_prints_the_commands() -> None:
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: cutecc "), r.stdout
    for command in ("init", "build", "list", "pack", "unpack", "verify"):
        assert f"\n  {command} " in r.stdout, (command, r.stdout)


def test_python_m_cutecc_exits_as_the_script_does_on_bad_input() -> None:
    """A bad argument is the command line's one-line error with its exit status (2)."""
    r = _run("init", "--name", "not a name", "/nonexistent-never-created")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "--name" in r.stderr and "Traceback" not in r.stderr
