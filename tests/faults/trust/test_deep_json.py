"""Deeply nested JSON is a one-line problem, never a RecursionError.

Seen: deeply nested JSON (about 1,100 levels, a 2.2 KB file) in a meta.json or a lock raised
RecursionError tracebacks from every command that reads it, and from `cutecc.load`; `verify
--fix` could not remove the entry.

Every reader must be bounded: a malformed file is a one-line problem for that entry (or,
for a lock, a one-line input error), and `verify --fix` quarantines such an entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import (
    ARCH,
    META,
    UNSIGNED_OK,
    Cache,
    assert_no_traceback,
    cli,
    one_line_error,
    out,
    py,
    read_tar,
    unpack_cmd,
    write_tar,
)

pytestmark = pytest.mark.usefixtures("dsl")

DEPTH = 1100
DEEP = ("[" * DEPTH + "]" * DEPTH).encode()  # 2.2 KB


@pytest.fixture
def deep_entry(cache: Cache) -> tuple[Cache, str]:
    """The cache with axpy's meta.json replaced by 1,100 nested arrays."""
    key = cache.key("axpy")
    (cache.entry(key) / META).write_bytes(DEEP)
    return cache, key


META_COMMANDS = {
    "list": ["list"],
    "list-json": ["list", "--json"],
    "show": ["show", "{key}"],
    "stats": ["stats"],
    "gc": ["gc", "--dry-run", "--max-size", "0"],
    "rm-kernel": ["rm", "--dry-run", "--kernel", "mul"],
    "explain": ["explain", "axpy", "{manifest}"],
    "build": ["build", "{manifest}", "--lock-file", "{tmp}/new.lock"],
}


@pytest.mark.parametrize("name", sorted(META_COMMANDS))
def test_a_deeply_nested_meta_json_breaks_no_command(deep_entry: tuple[Cache, str], name: str,
                                                     tmp_path: Path) -> None:
    """Each command reading metadata answers without a traceback (exit 0 or 1);
    the nested file is someone's problem to report, not a crash."""
    cache, key = deep_entry
    args = [a.format(key=key, manifest=cache.manifest, tmp=tmp_path) for a in META_COMMANDS[name]]
    r = cli(*args, "--cache-dir", cache.root)
    assert_no_traceback(r)
    assert r.returncode in (0, 1), out(r)


def test_verify_reports_a_deeply_nested_meta_json_as_malformed(deep_entry: tuple[Cache, str]) -> None:
    """Verify names the entry (kind malformed), exit 1, no traceback."""
    cache, key = deep_entry
    r = cli("verify", "--json", "--cache-dir", cache.root)
    assert_no_traceback(r)
    assert r.returncode == 1, out(r)
    problems = json.loads(r.stdout)["problems"]
    assert any(p["kind"] == "malformed" and key in p["path"] for p in problems), problems


def test_verify_fix_quarantines_a_deeply_nested_meta_json(deep_entry: tuple[Cache, str]) -> None:
    """`verify --fix` moves the entry out of entries/ (exit 0) and a second
    verify is clean."""
    cache, key = deep_entry
    r = cli("verify", "--fix", "--cache-dir", cache.root)
    assert_no_traceback(r)
    assert r.returncode == 0, out(r)
    assert not cache.entry(key).exists(), "the entry is still in entries/"
    assert cli("verify", "--cache-dir", cache.root).returncode == 0


def test_load_sets_aside_a_deeply_nested_meta_json(deep_entry: tuple[Cache, str]) -> None:
    """`cutecc.load` of the cache works (the entry set aside or skipped), or
    raises a CuteccError, never a RecursionError."""
    cache, _ = deep_entry
    r = py("import sys, cutecc\nfrom cutecc.errors import CuteccError\n"
           "try:\n    ks = cutecc.load(sys.argv[1], arch=sys.argv[2])\n    print('LOADED', sorted(ks))\n"
           "except CuteccError as e:\n    print('REFUSED', e)\n", cache.root, ARCH)
    assert_no_traceback(r)
    assert r.returncode == 0 and ("LOADED" in r.stdout or "REFUSED" in r.stdout), out(r)


# The same nesting in a lock file ------------------------------------------------------------


@pytest.fixture
def deep_lock(cache: Cache) -> Cache:
    cache.lock.write_bytes(DEEP)
    return cache


def test_build_reading_a_deeply_nested_lock_fails_cleanly(deep_lock: Cache) -> None:
    """A build narrowed by --kernel reads the old lock to keep its other lines:
    a nested one is a one-line input error (exit 2)."""
    r = cli("build", deep_lock.manifest, "--kernel", "axpy", "--cache-dir", deep_lock.root,
            "--lock-file", deep_lock.lock)
    one_line_error(r, (2,))


def test_pack_reading_a_deeply_nested_lock_fails_cleanly(deep_lock: Cache, tmp_path: Path) -> None:
    """`cutecc pack --lock` of a nested lock: one-line input error (exit 2)."""
    r = cli("pack", "--lock", deep_lock.lock, "--name", "k", "--version", "1.0",
            "--out", tmp_path / "d", "--cache-dir", deep_lock.root)
    one_line_error(r, (2,))


def test_load_of_a_deeply_nested_lock_raises_cuteccerror(deep_lock: Cache) -> None:
    """`cutecc.load(lock=...)` of a nested lock raises CuteccError."""
    r = py("import sys, cutecc\nfrom cutecc.errors import CuteccError\n"
           "try:\n    cutecc.load(sys.argv[1], lock=sys.argv[2], arch=sys.argv[3])\n    print('LOADED')\n"
           "except CuteccError as e:\n    print('REFUSED', e)\n", deep_lock.root, deep_lock.lock, ARCH,
           env=UNSIGNED_OK)
    assert_no_traceback(r)
    assert "REFUSED" in r.stdout, out(r)


def test_unpack_of_an_archive_with_a_deeply_nested_lock_fails_cleanly(legit_tar: Path,
                                                                      tmp_path: Path) -> None:
    """The archive's own kernels.lock nested 1,100 deep: refused in one line."""
    files = read_tar(legit_tar)
    files["_cutecc/kernels.lock"] = DEEP
    archive = write_tar(tmp_path / "deep-lock.tar.gz", files)
    r = cli(*unpack_cmd(archive, tmp_path / "cache"))
    one_line_error(r, (1, 2))


def test_unpack_of_an_archive_with_a_deeply_nested_meta_json_refuses_that_entry(
        built: Cache, legit_tar: Path, tmp_path: Path) -> None:
    """An archive entry's meta.json nested 1,100 deep refuses that entry; the
    other ten land."""
    key = built.key("axpy")
    files = read_tar(legit_tar)
    files[f"_cutecc/entries/{key[:2]}/{key}/{META}"] = DEEP
    archive = write_tar(tmp_path / "deep-meta.tar.gz", files)
    r = cli(*unpack_cmd(archive, tmp_path / "cache"))
    err = one_line_error(r, (1,))
    assert key[:12] in err, err
    assert "10 imported" in r.stdout, r.stdout
