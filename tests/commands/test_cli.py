"""The lifecycle commands' wiring: each parses, calls its library function, renders errors
as one line with the right exit code, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import run_cli

from cutecc.cli import main

COMMANDS = ["show", "verify", "gc", "rm", "stats", "explain"]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help(cmd: str) -> None:
    r = CliRunner().invoke(main, [cmd, "--help"])
    assert r.exit_code == 0 and "--cache-dir" in r.stdout


@pytest.mark.parametrize("args", [["show", "abcd"], ["verify"], ["gc", "--max-size", "1G"],
                                  ["rm", "abcd"], ["stats"]])
def test_a_missing_cache_is_one_line_exit_1(args: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(main, [*args, "--cache-dir", str(tmp_path / "none")])
    assert r.exit_code == 1, r.output
    assert r.stderr == f"error: {tmp_path / 'none'}: no cutecc cache here; run `cutecc build` first\n"
    assert not (tmp_path / "none").exists()


def test_explain_of_an_unknown_kernel_is_bad_input(toy_project: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["explain", "nope", str(toy_project), "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and 'no kernel "nope"' in r.stderr


def test_gc_bad_age_is_bad_input(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["gc", "--older-than", "forever", "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.startswith("error: --older-than: ")


@pytest.mark.usefixtures("dsl")
def test_the_real_entry_point(built) -> None:
    r = run_cli("verify", "--cache-dir", str(built.cache))
    assert r.returncode == 0 and "2 healthy" in r.stdout
    r = run_cli("explain", "scale", str(built.manifest), "--cache-dir", str(built.cache))
    assert r.returncode == 0 and r.stdout.count(": cached") == 2
