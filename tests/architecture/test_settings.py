"""Every environment variable cutecc reads is declared in the settings table
(`cutecc.settings.TABLE`, or `FOREIGN` for other programs' variables), and read only there:
the rest of the package reads the table's rows, never `os.environ` by a CUTECC_ name."""

from __future__ import annotations

import dataclasses
import re

from helpers import REPO

from cutecc import settings

PACKAGE = REPO / "cutecc"
# What reads or names a variable: os.environ[...] / .get(...) / getenv(...) / environ.pop
_READ = re.compile(r"(?:os\.environ(?:\.get|\.pop|\.setdefault)?\s*[\[(]\s*|getenv\(\s*)"
                   r"""["']([A-Z0-9_]+)["']""")
_NAMED = re.compile(r"""["'](CUTECC_[A-Z0-9_]+)["']""")
# Names spelled CUTECC_* that are not environment variables: the C sources' macros
# (`cutecc/native/`, `cutecc/build/linker.py`) and what a Ray worker's runtime environment carries.
NOT_VARIABLES = {"CUTECC_EXPORT", "CUTECC_INNER", "CUTECC_ENTRY", "CUTECC_ARCH", "CUTECC_KEY",
                 "CUTECC_RT_API", "CUTECC_RT_ABI", "CUTECC_RT_LABEL", "CUTECC_WHO", "CUTECC_SYNC_ENV",
                 "CUTECC_DEVICE_ANSWERS"}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_every_variable_the_code_reads_is_in_the_table() -> None:
    declared = {s.env for s in settings.TABLE} | set(settings.FOREIGN)
    read: dict[str, set[str]] = {}
    for path, text in _sources().items():
        for name in _READ.findall(text) + [n for n in _NAMED.findall(text) if n not in NOT_VARIABLES]:
            read.setdefault(name, set()).add(path)
    missing = {n: sorted(p) for n, p in read.items() if n not in declared}
    assert not missing, f"read but not in cutecc/settings.py: {missing}"
    # the C runtime's one variable: the same switch as the table's
    native = (PACKAGE / "native" / "cutecc_rt.c").read_text()
    assert f'"{settings.SYNC_CHECK.env}"' in native or settings.SYNC_CHECK.env in native


def test_no_module_but_the_table_reads_a_cutecc_variable_by_its_name() -> None:
    offenders = {path: sorted(set(_READ.findall(text)) & {s.env for s in settings.TABLE})
                 for path, text in _sources().items() if path != "cutecc/settings.py"}
    assert not {p: n for p, n in offenders.items() if n}, offenders
    # nor by a name held elsewhere: every read of the environment outside the table names a
    # variable in the open (one of FOREIGN), but for the one report that prints a list of them
    by_name = re.compile(r"(?:os\.environ\.get|getenv)\(\s*(?![\"'])([\w.]+)")
    hidden = {path: by_name.findall(text) for path, text in _sources().items()
              if path != "cutecc/settings.py"}
    assert {p: n for p, n in hidden.items() if n} == {"cutecc/commands/env.py": ["n"]}, hidden
    assert not any("from cutecc import environ" in t for t in _sources().values())


def test_each_setting_is_declared_once() -> None:
    envs = [s.env for s in settings.TABLE]
    flags = [s.flag for s in settings.TABLE if s.flag]
    keys = [s.key for s in settings.TABLE if s.key]
    assert len(envs) == len(set(envs)) and len(flags) == len(set(flags)) and len(keys) == len(set(keys))
    from cutecc.manifest.grammar import _BUILD_KEYS

    assert set(keys) <= _BUILD_KEYS  # each [build] key a setting names is one the manifest takes
    fields = {f.name for f in dataclasses.fields(settings.BuildOptions)}
    assert {s.option for s in settings.TABLE if s.option} <= fields  # each option a field of the record
    for s in settings.TABLE:  # a hook is named as one, and is no flag or key of anyone's
        assert s.internal == s.env.startswith("CUTECC_INTERNAL_"), s.env
        assert not (s.internal and (s.flag or s.key)), s.env


def test_flags_win_over_the_environment_and_bad_values_name_where(monkeypatch) -> None:
    import pytest

    from cutecc.errors import CuteccError

    monkeypatch.setenv("CUTECC_EXECUTOR", "ray")
    monkeypatch.setenv("CUTECC_COMPILE_TIMEOUT", "off")
    monkeypatch.setenv("CUTECC_READ_ONLY", "no")
    o = settings.BuildOptions.from_environment(executor="local", compile_memory="16G")
    assert (o.executor, o.compile_timeout, o.compile_memory, o.read_only) == ("local", 0.0, 16 << 30, False)
    assert o.where("executor") == "--executor" and o.where("compile_timeout") == "$CUTECC_COMPILE_TIMEOUT"
    monkeypatch.setenv("CUTECC_COMPILE_TIMEOUT", "soon")
    with pytest.raises(CuteccError) as e:
        settings.BuildOptions.from_environment()
    assert e.value.where == "$CUTECC_COMPILE_TIMEOUT" and e.value.exit_code == 2
    assert settings.BuildOptions.from_environment({}) == settings.NOTHING_GIVEN


def test_cutecc_env_shows_every_setting(tmp_path) -> None:
    """`cutecc env` (what a bug report carries) lists every setting of the table, set or not."""
    import json

    from click.testing import CliRunner

    from cutecc.cli import main

    r = CliRunner().invoke(main, ["env", "--json", "--cache-dir", str(tmp_path / "c")],
                           env={"CUTECC_JIT": "1"})
    shown = json.loads(r.stdout)["environment"]
    assert {s.env for s in settings.TABLE if not s.internal} <= set(shown) and shown["CUTECC_JIT"] == "1"
