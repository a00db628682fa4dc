"""Moves across filesystems fall back safely: no `Invalid cross-device link` tracebacks.

Seen: with `entries/` or a shard on another filesystem, `rm`, `gc` (which stops partway),
`verify --fix` and `build` die with `OSError: [Errno 18] Invalid cross-device link`
tracebacks, because every move is one rename(2) between entries/ and tmp/ or quarantine/.
Moves that cross filesystems must fall back safely (stage on the destination's
filesystem, or remove in place under the key's lock).

Each case mounts a tmpfs in a private mount namespace (`unshare -m`, as root), copies the
entries in, runs the command there, and lists what is left before the namespace goes.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import CLI, LIB, Cache, child_env

pytestmark = [pytest.mark.usefixtures("dsl"), pytest.mark.needs_root]

SCRIPT = r'''
M="$1"; SRC="$2"; ENTRIES="$3"; shift 3
mount -t tmpfs -o size=512m tmpfs "$M" || exit 99
if [ -n "$SRC" ]; then cp -a "$SRC"/. "$M"/ || exit 98; fi
"$@"; rc=$?
echo "@@rc=$rc"
for d in "$ENTRIES"/*/*; do [ -f "$d/meta.json" ] && echo "@@entry=$(basename "$d")"; done
exit 0
'''


@functools.lru_cache(maxsize=1)
def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


@pytest.fixture(autouse=True)
def _need_mount() -> None:
    if not _can_mount():
        pytest.skip("needs root and `unshare -m` to mount a tmpfs in a private mount namespace")


def on_tmpfs(mount: Path, entries: Path, *args: str | Path) -> tuple[int, str, set[str]]:
    """Move `mount`'s contents aside, mount a tmpfs there with a copy of them, run `cutecc
    ARGS`; (exit code, output, keys whose meta.json is in entries/ afterwards)."""
    aside = entries.parent.parent / f"{mount.name}.aside"  # outside the cache
    os.rename(mount, aside)
    mount.mkdir()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh",
                        str(mount), str(aside), str(entries), *CLI, *map(str, args)],
                       capture_output=True, text=True, env=child_env(), timeout=600)
    assert r.returncode == 0, f"the namespace script failed ({r.returncode}): {r.stderr[-1500:]}"
    lines = r.stdout.splitlines()
    rc = int(next(x for x in lines if x.startswith("@@rc="))[5:])
    keys = {x[8:] for x in lines if x.startswith("@@entry=")}
    text = "\n".join(x for x in lines if not x.startswith("@@")) + r.stderr
    return rc, text, keys


def _check(rc: int, text: str) -> None:
    raised = [ln for ln in text.splitlines() if "Error" in ln][-1:]
    assert "Traceback" not in text, f"exit {rc}: {raised}\n{text[-2000:]}"
    assert rc == 0, f"exit {rc}: {text[-1500:]}"


def test_rm_with_entries_on_another_filesystem(cache: Cache) -> None:
    """`cutecc rm KEY` where entries/ is a tmpfs: removed, exit 0, no traceback."""
    key = cache.key("axpy")
    rc, text, left = on_tmpfs(cache.root / "entries", cache.root / "entries", "rm", key[:16],
                              "--cache-dir", cache.root)
    _check(rc, text)
    assert key not in left and len(left) == 10, left


def test_rm_with_one_shard_on_another_filesystem(cache: Cache) -> None:
    """The same with only the entry's shard (entries/ab) on a tmpfs."""
    key = cache.key("axpy")
    rc, text, left = on_tmpfs(cache.root / "entries" / key[:2], cache.root / "entries", "rm",
                              key[:16], "--cache-dir", cache.root)
    _check(rc, text)
    assert key not in left, left


def test_gc_with_entries_on_another_filesystem(cache: Cache) -> None:
    """`cutecc gc --max-size 0` removes every entry (it stopped at the first)."""
    rc, text, left = on_tmpfs(cache.root / "entries", cache.root / "entries", "gc", "--max-size",
                              "0", "--cache-dir", cache.root)
    _check(rc, text)
    assert not left, f"{len(left)} entries left"


def test_verify_fix_with_entries_on_another_filesystem(cache: Cache) -> None:
    """`verify --fix` quarantines a damaged entry across filesystems."""
    key = cache.key("mul", "float16")
    lib = cache.entry(key) / LIB
    data = bytearray(lib.read_bytes())
    data[100] ^= 1
    lib.write_bytes(bytes(data))
    rc, text, left = on_tmpfs(cache.root / "entries", cache.root / "entries", "verify", "--fix",
                              "--cache-dir", cache.root)
    _check(rc, text)
    assert key not in left and len(left) == 10, left


def test_build_with_entries_on_another_filesystem(cache: Cache) -> None:
    """`cutecc build` publishes across filesystems (tmp/ -> entries/)."""
    key = cache.key("axpy")
    shutil.rmtree(cache.entry(key))
    rc, text, left = on_tmpfs(cache.root / "entries", cache.root / "entries", "build",
                              cache.manifest, "--kernel", "axpy", "--no-lock", "--cache-dir",
                              cache.root)
    _check(rc, text)
    assert key in left, "axpy was not published"
