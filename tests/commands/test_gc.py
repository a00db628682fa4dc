"""`cutecc gc`: least-recently-used eviction, age limits, use recording, locks respected."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import PY, opts

from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.commands.gc import gc
from cutecc.entry.rules import USED
from cutecc.errors import CuteccError
from cutecc.units import parse_age, parse_size

pytestmark = pytest.mark.usefixtures("dsl")
DAY = 86400.0


def _use(entry_path: Path, when: float) -> None:
    (entry_path / USED).touch()
    os.utime(entry_path / USED, (when, when))


@pytest.fixture
def aged(built):
    """Ages made deterministic: gc runs 100 days from now; threads=64 was last used 10 days
    before that, threads=128 one hour before."""
    now = time.time() + 100 * DAY
    e = built.entries()
    _use(e["threads=64"].path, now - 10 * DAY)
    _use(e["threads=128"].path, now - 3600)
    return built, now, e["threads=64"], e["threads=128"]


@pytest.mark.parametrize("text, n", [("500M", 500 << 20), ("2G", 2 << 30), ("1024K", 1 << 20),
                                     ("123", 123), ("1.5GiB", 3 << 29), ("10mb", 10 << 20)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text, s", [("30d", 30 * DAY), ("12h", 43200), ("90m", 5400),
                                     ("45s", 45), ("2w", 14 * DAY)])
def test_parse_age(text: str, s: float) -> None:
    assert parse_age(text) == s


@pytest.mark.parametrize("call", [lambda: parse_size("12Q"), lambda: parse_size("-1"),
                                  lambda: parse_age("30"), lambda: parse_age("soon")])
def test_bad_size_or_age_is_bad_input(call) -> None:
    with pytest.raises(CuteccError) as err:
        call()
    assert err.value.exit_code == 2


def test_older_than_removes_only_entries_unused_that_long(aged) -> None:
    built, now, old, recent = aged
    report = gc(built.cache, older_than="1d", now=now)
    assert [r["key"] for r in report.removed] == [old.key]
    assert not old.path.exists() and (recent.path / "meta.json").exists()
    assert set(built.entries()) == {"threads=128"}


def test_max_size_evicts_least_recently_used_first(aged) -> None:
    built, now, old, recent = aged
    one = recent.disk_bytes()
    report = gc(built.cache, max_size=one + 10, now=now)
    assert [r["key"] for r in report.removed] == [old.key] and report.kept_bytes == one
    assert set(built.entries()) == {"threads=128"}


def test_max_size_follows_the_recorded_use_not_the_build_order(aged) -> None:
    built, now, old, recent = aged
    _use(old.path, now - 60)  # now threads=64 is the most recently used
    gc(built.cache, max_size=old.disk_bytes() + 10, now=now)
    assert set(built.entries()) == {"threads=64"}


def test_size_bound_is_respected_exactly(aged) -> None:
    built, now, *_ = aged
    total = sum(e.disk_bytes() for e in built.store.entries())
    assert gc(built.cache, max_size=total, now=now).removed == []
    assert len(gc(built.cache, max_size=total - 1, now=now).removed) == 1
    assert len(gc(built.cache, max_size=0, now=now).removed) == 1
    assert list(built.store.entries()) == []


def test_a_runtime_library_goes_once_no_entry_links_against_it(aged) -> None:
    built, now, old, recent = aged
    [rt] = list(built.store.runtimes())
    report = gc(built.cache, older_than="1d", now=now)  # threads=128 still links against it
    assert report.removed_runtimes == [] and report.runtime_bytes == rt.disk_bytes()
    fresh = gc(built.cache, max_size=0, now=time.time())  # unlinked, but used just now: kept
    assert len(fresh.removed) == 1 and fresh.removed_runtimes == []
    report = gc(built.cache, max_size=0, now=now + 2 * 3600)
    assert [r["key"] for r in report.removed_runtimes] == [rt.key] and report.runtime_bytes == 0
    assert list(built.store.runtimes()) == [] and not rt.path.exists()


def test_dry_run_removes_nothing(aged) -> None:
    built, now, old, _ = aged
    report = gc(built.cache, older_than="1d", max_size="1K", now=now, dry_run=True)
    assert [r["key"] for r in report.removed][0] == old.key and len(report.removed) == 2
    assert len(built.entries()) == 2


def test_gc_skips_a_key_another_process_holds(aged, hold_lock) -> None:
    built, now, old, recent = aged
    hold_lock(built.store, old.key)
    report = gc(built.cache, max_size=0, now=now)
    assert report.busy == [old.key] and [r["key"] for r in report.removed] == [recent.key]
    assert (old.path / "kernel.so").exists()


def test_gc_sweeps_tmp_leftovers_and_old_quarantine(aged) -> None:
    built, now, *_ = aged
    stale = built.store.tmp_dir / f"{'ab' * 32}.dead01"
    stale.mkdir(parents=True)
    q = built.store.quarantine_dir / f"{'cd' * 32}.20200101T000000.000000Z"
    q.mkdir(parents=True)
    os.utime(q, (now - 400 * DAY, now - 400 * DAY))
    recent_q = built.store.quarantine_dir / f"{'ef' * 32}.20300101T000000.000000Z"
    recent_q.mkdir()
    report = gc(built.cache, older_than="365d", now=now)
    assert report.swept_tmp == 1 and not stale.exists()
    assert report.quarantine_removed == 1 and not q.exists() and recent_q.exists()
    assert len(built.entries()) == 2


def test_build_hit_records_use_and_dry_run_does_not(built) -> None:
    e = built.entries()["threads=64"]
    past = time.time() - 30 * DAY
    _use(e.path, past)
    build(built.manifest, opts(cache_dir=built.cache), dry_run=True)
    assert (e.path / USED).stat().st_mtime == past
    before = json.loads((e.path / "meta.json").read_bytes())
    build(built.manifest, opts(cache_dir=built.cache))
    assert (e.path / USED).stat().st_mtime > time.time() - 60
    assert json.loads((e.path / "meta.json").read_bytes()) == before  # hashes untouched


LOWER = (
    "import cutecc, jax, jax.numpy as jnp, sys\n"
    "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
    "s = jax.ShapeDtypeStruct((256,), jnp.float32)\n"
    "jax.jit(lambda x: ks.scale(x, threads=64)).trace(s).lower(lowering_platforms=('cuda',))\n"
    "print('LOWERED')\n"
)


@pytest.mark.parametrize("read_only", [False, True])
def test_runtime_records_use_at_registration_unless_read_only(built, read_only: bool) -> None:
    for e in built.store.entries():
        (e.path / USED).unlink(missing_ok=True)
    env = {**os.environ, "CUTECC_READ_ONLY": "1" if read_only else "0"}
    r = subprocess.run([PY, "-c", LOWER, str(built.cache)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and "LOWERED" in r.stdout, r.stderr
    used = {v: (e.path / USED).exists() for v, e in built.entries().items()}
    # Lowering registers the variant that matched the call (threads=64 and 128 both fit:
    # the more specific or first one is registered), and only that one.
    assert sum(used.values()) == (0 if read_only else 1), used


def test_cli_gc(aged) -> None:
    built, *_ = aged
    r = CliRunner().invoke(main, ["gc", "--max-size", "0", "--dry-run", "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and r.stdout.count("would remove scale[") == 2
    assert len(built.entries()) == 2
    r = CliRunner().invoke(main, ["gc", "--max-size", "12Q", "--cache-dir", str(built.cache)])
    assert r.exit_code == 2 and r.stderr.startswith("error: --max-size:")
    r = CliRunner().invoke(main, ["gc", "--max-size", "0", "--json", "--cache-dir", str(built.cache)])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["removed"]) == 2
