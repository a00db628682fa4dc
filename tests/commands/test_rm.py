"""`cutecc rm`: remove chosen entries safely; nothing matched is an error."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from helpers import opts

from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.commands.rm import rm
from cutecc.errors import CuteccError

pytestmark = pytest.mark.usefixtures("dsl")


def test_rm_by_prefix_removes_exactly_that_entry_and_build_brings_it_back(built) -> None:
    e = built.entries()["threads=64"]
    report = rm(built.cache, keys=(e.key[:8],))
    assert [(r["key"], r["label"]) for r in report.removed] == [(e.key, "scale[threads=64]@sm_90a")]
    assert report.removed[0]["bytes"] > 1000
    assert set(built.entries()) == {"threads=128"} and not e.path.exists()
    assert list(built.store.tmp_dir.iterdir()) == []  # renamed out, then deleted
    again = build(built.manifest, opts(cache_dir=built.cache))
    assert sorted(o.status for o in again.outcomes) == ["built", "cached"]


def test_rm_by_kernel_and_by_arch(built) -> None:
    with pytest.raises(CuteccError, match="no entry matches arch 'sm_80'") as err:
        rm(built.cache, arch="sm_80")
    assert err.value.exit_code == 1
    assert len(rm(built.cache, kernel="scale", arch="sm_90a", dry_run=True).removed) == 2
    assert len(built.entries()) == 2  # dry run
    assert len(rm(built.cache, kernel="scale").removed) == 2
    assert built.entries() == {}
    with pytest.raises(CuteccError, match="no entry matches kernel 'scale'"):
        rm(built.cache, kernel="scale")


@pytest.mark.parametrize("kwargs, code", [
    ({}, 2),
    ({"keys": ("ab",), "kernel": "scale"}, 2),
    ({"keys": ("not-hex",)}, 2),
    ({"keys": ("0123456789abcdef0123",)}, 1),
])
def test_bad_selection(built, kwargs: dict, code: int) -> None:
    with pytest.raises(CuteccError) as err:
        rm(built.cache, **kwargs)
    assert err.value.exit_code == code
    assert len(built.entries()) == 2


def test_rm_waits_for_a_key_another_process_holds(built, hold_lock) -> None:
    e = built.entries()["threads=64"]
    hold_lock(built.store, e.key, seconds=1.0)
    t0 = time.monotonic()
    report = rm(built.cache, keys=(e.key,), lock_timeout=30)
    assert time.monotonic() - t0 > 0.5  # it waited for the holder to let go
    assert report.ok and [r["key"] for r in report.removed] == [e.key]


def test_rm_skips_a_key_held_past_the_timeout(built, hold_lock) -> None:
    e = built.entries()["threads=64"]
    hold_lock(built.store, e.key)
    report = rm(built.cache, kernel="scale", lock_timeout=0.2)
    assert not report.ok and report.busy == [e.key]
    assert (e.path / "kernel.so").exists() and set(built.entries()) == {"threads=64"}


def test_cli_rm(built) -> None:
    e = built.entries()["threads=128"]
    r = CliRunner().invoke(main, ["rm", "--arch", "sm_100a", "--cache-dir", str(built.cache)])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "no entry matches" in r.stderr
    r = CliRunner().invoke(main, ["rm", "--cache-dir", str(built.cache)])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["rm", e.key[:12], "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and f"removed scale[threads=128]@sm_90a {e.key[:12]}" in r.stdout
    assert set(built.entries()) == {"threads=64"}
