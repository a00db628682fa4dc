"""`cutecc verify --fix` never deletes anything outside the cache.

Seen: `cutecc verify --fix` deleted files outside the cache when a shard
directory (entries/ab) is a symlink to elsewhere: it lists the shard through the link,
calls what it finds orphans, and unlinks or rmtrees them where they really are.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import Cache, assert_no_traceback, cli, out

pytestmark = pytest.mark.usefixtures("dsl")


def _outside(tmp_path: Path) -> Path:
    victim = tmp_path / "precious"
    (victim / "subdir").mkdir(parents=True)
    (victim / "notes.txt").write_text("keep me\n")
    (victim / "subdir" / "data.bin").write_bytes(b"\x00" * 100)
    (victim / ("f" * 64)).mkdir()  # looks like an entry directory without meta.json
    (victim / ("f" * 64) / "x").write_text("keep me too\n")
    return victim


def _intact(victim: Path) -> list[str]:
    want = ["notes.txt", "subdir/data.bin", f"{'f' * 64}/x"]
    return [w for w in want if not (victim / w).exists()]


def test_verify_fix_never_deletes_through_a_symlinked_shard(cache: Cache, tmp_path: Path) -> None:
    """A shard `entries/ff` that is a symlink to a directory outside the cache:
    verify reports the link, and --fix removes at most the link itself, never a file
    behind it."""
    victim = _outside(tmp_path)
    (cache.root / "entries" / "ff").symlink_to(victim, target_is_directory=True)
    r = cli("verify", "--fix", "--cache-dir", cache.root)
    assert_no_traceback(r)
    lost = _intact(victim)
    assert not lost, f"verify --fix deleted {lost} outside the cache:\n{out(r)[-1500:]}"


def test_verify_fix_never_deletes_through_a_symlinked_entries_dir(cache: Cache,
                                                                   tmp_path: Path) -> None:
    """The same with a shard directory holding a symlinked stray subdirectory
    and entries/ itself pointing elsewhere: nothing outside the cache is removed."""
    victim = _outside(tmp_path)
    real = tmp_path / "real-entries"
    os.rename(cache.root / "entries", real)
    (cache.root / "entries").symlink_to(real, target_is_directory=True)
    (real / "zz").symlink_to(victim, target_is_directory=True)
    r = cli("verify", "--fix", "--cache-dir", cache.root)
    assert_no_traceback(r)
    lost = _intact(victim)
    assert not lost, f"verify --fix deleted {lost} outside the cache:\n{out(r)[-1500:]}"
