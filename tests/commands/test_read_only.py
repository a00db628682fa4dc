"""Read-only mode (`cutecc build --read-only`, `CUTECC_READ_ONLY=1`): nothing is written,
and a miss is an error naming it, never a compile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import opts, toy_manifest

from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.errors import CuteccError
from cutecc.settings import read_only as read_only_from_env

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("dsl")


@pytest.mark.parametrize("via", ["argument", "env"])
def test_all_hits_write_nothing(built, via: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(built.cache)
    if via == "env":
        monkeypatch.setenv("CUTECC_READ_ONLY", "1")
    report = build(built.manifest, opts(cache_dir=built.cache, read_only=via == "argument"))
    assert report.ok and report.count("cached") == 2
    assert snapshot(built.cache) == before  # no `used`, no stats.json, no lock, no sweep


@pytest.mark.parametrize("via", ["argument", "env"])
def test_a_miss_is_an_error_naming_it_and_compiles_nothing(built, via: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    built.manifest.write_text(toy_manifest(threads=(64, 256)))
    stale = built.store.tmp_dir / f"{'ab' * 32}.dead01"
    stale.mkdir(parents=True)
    before = snapshot(built.cache)
    if via == "env":
        monkeypatch.setenv("CUTECC_READ_ONLY", "yes")
    t0 = time.monotonic()
    with pytest.raises(CuteccError) as err:
        build(built.manifest, opts(cache_dir=built.cache, read_only=via == "argument"))
    assert time.monotonic() - t0 < 5  # no compile
    assert err.value.exit_code == 1
    assert "read-only mode: 1 entry not in the cache: scale[threads=256]@sm_90a" in err.value.message
    assert "threads=64" not in err.value.message
    assert snapshot(built.cache) == before


def test_read_only_never_creates_a_cache(built, tmp_path: Path) -> None:
    with pytest.raises(CuteccError, match="2 entries not in the cache"):
        build(built.manifest, opts(cache_dir=tmp_path / "new", read_only=True))
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("yes", True), ("0", False),
                                       ("", False), ("off", False), ("false", False)])
def test_env_values(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("CUTECC_READ_ONLY", value)
    assert read_only_from_env() is on


def test_cli_read_only(built) -> None:
    args = ["build", str(built.manifest), "--cache-dir", str(built.cache), "--read-only"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "0 built, 2 cached, 0 failed" in r.stdout
    built.manifest.write_text(toy_manifest(threads=(32, 64)))
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.count("\n") == 1 and "read-only mode" in r.stderr and "threads=32" in r.stderr
    r = CliRunner().invoke(main, args[:-1], env={"CUTECC_READ_ONLY": "1"})
    assert r.exit_code == 1 and "read-only mode" in r.stderr
