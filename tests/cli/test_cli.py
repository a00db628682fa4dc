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
@pytest.mark.parametrize("args", [["kernels.toml"], ["-j", "2"]])
def test_verify_takes_a_manifest_and_jobs_only_with_deep(args: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["verify", *args, "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert ("give --deep too" if args[0] == "kernels.toml" else "--jobs is for --deep") in r.stderr


def test_deep_verify_checks_the_host_and_the_manifest_before_the_cache(
        tmp_path: Path, toy_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad manifest or a host without the DSL fails at once (exit 2 / 1), naming it,
    before the cache (missing here) is looked at."""
    import importlib.util

    from cutecc.commands.verify import verify
    from cutecc.errors import CuteccError, WorkError

    with pytest.raises(CuteccError, match="cannot read manifest") as err:
        verify(tmp_path / "none", deep=tmp_path / "nope.toml")
    assert err.value.exit_code == 2
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cutlass"
                        else real(name, *a))
    with pytest.raises(WorkError, match="needs the build extra") as err:
        verify(tmp_path / "none", deep=toy_project)
    assert err.value.exit_code == 1 and err.value.where == "--deep"


def test_plain_verify_compiles_nothing_and_reads_no_manifest(tmp_path: Path) -> None:
    """Without --deep, verify neither imports the DSL nor the re-trace, and its report has
    no `deep` part: as fast as it was."""
    import json
    import subprocess
    import sys

    from cutecc.store.writer import Store

    Store(tmp_path / "cache").ensure()
    script = ("import json, sys\nfrom cutecc.commands.verify import verify\n"
              f"r = verify({str(tmp_path / 'cache')!r})\n"
              "print(json.dumps([r.ok, 'deep' in r.to_json(), 'cutlass' in sys.modules,"
              " 'cutecc.commands.retrace' in sys.modules, 'cutecc.build.builder' in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [True, False, False, False, False]


def test_the_real_entry_point(built) -> None:
    r = run_cli("verify", "--cache-dir", str(built.cache))
    assert r.returncode == 0 and "2 healthy" in r.stdout
    r = run_cli("explain", "scale", str(built.manifest), "--cache-dir", str(built.cache))
    assert r.returncode == 0 and r.stdout.count(": cached") == 2


def test_build_kernel_help_says_what_it_builds(tmp_path: Path) -> None:
    """`--kernel X` builds X's backward too: the help says so, and the plan shows it."""
    r = CliRunner().invoke(main, ["build", "-h"])
    assert r.exit_code == 0
    said = " ".join(r.stdout.split())
    assert "--kernel TEXT Build only these kernels and what calling them needs: each one's backward " \
        "kernel (a composite backward's launches too) and a composite's launches." in said, said
    from helpers import TOY_KERNEL

    (tmp_path / "toy").mkdir()
    (tmp_path / "toy/__init__.py").write_text("")
    (tmp_path / "toy/ops.py").write_text(TOY_KERNEL)
    args = '''args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
'''
    bwd_args = args.replace('{ name = "out"', '{ name = "ct", dtype = "float32", shape = ["n"] },\n'
                                              '  { name = "out"')
    (tmp_path / "kernels.toml").write_text(
        '[kernel.fwd]\nentry = "toy.ops:scale"\ngrad = { backward = "bwd" }\n' + args
        + '[kernel.bwd]\nentry = "toy.ops:scale"\n' + bwd_args
        + '[kernel.other]\nentry = "toy.ops:scale"\n' + args)
    r = CliRunner().invoke(main, ["build", str(tmp_path / "kernels.toml"), "--kernel", "fwd", "--dry-run",
                                  "--json", "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert '"bwd' in r.stdout and '"fwd' in r.stdout and "other" not in r.stdout, r.stdout
