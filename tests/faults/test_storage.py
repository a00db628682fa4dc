"""A full disk and a read-only cache: clear messages, non-zero exits, nothing lost.

Both run cutecc in subprocesses through storage_driver.py. Where this process may create
a private mount namespace (root in a sandbox, as here), the full disk is a 4 MiB tmpfs and
the read-only cache a read-only bind mount: the real errors (ENOSPC, EROFS). Elsewhere the
full disk is RLIMIT_FSIZE, and the read-only cache is permission bits, which only bind a
user other than root (root ignores them): that case is skipped for root without mounts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import PY

from .conftest import HERE, Toy, in_mount_namespace, write_toy_project

pytestmark = pytest.mark.usefixtures("dsl")
DRIVER = HERE / "storage_driver.py"


def drive(scenario: str, spec: dict[str, Any], tmp_path: Path, namespace: bool) -> dict[str, Any]:
    spec = {**spec, "out": str(tmp_path / f"{scenario}.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    cmd = [PY, str(DRIVER), scenario, str(tmp_path / "spec.json")]
    if namespace:
        cmd = ["unshare", "-m", "--propagation", "private", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(Path(spec["out"]).read_text())


def ok(step: dict[str, Any], *fragments: str) -> None:
    out = step["out"] + step["err"]
    assert step["rc"] == 0 and "Traceback" not in out, out
    for f in fragments:
        assert f in out, (f, out)


def failed(step: dict[str, Any], code: int, *fragments: str) -> None:
    """Exit `code`, no traceback, each fragment said, and every FAILED line is one line."""
    out = step["out"] + step["err"]
    assert step["rc"] == code and "Traceback" not in out and 'File "' not in out, out
    for f in fragments:
        assert f in out, (f, out)


def _projects(tmp_path: Path, extra: int = 256) -> tuple[str, str]:
    """Manifests for two variants, and for those plus threads=`extra`."""
    proj = tmp_path / "proj"
    small = write_toy_project(proj, threads=(64, 128), name="small.toml")
    more = write_toy_project(proj, threads=(64, 128, extra), name="more.toml")
    return str(small), str(more)


@pytest.mark.usefixtures("dsl")
def test_a_full_disk_fails_cleanly_keeps_every_entry_and_recovers(tmp_path: Path, tally) -> None:
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    small, more = _projects(tmp_path)
    if in_mount_namespace():
        (tmp_path / "mnt").mkdir()
        s = drive("full-tmpfs", {"mount": str(tmp_path / "mnt"), "small": small, "more": more},
                  tmp_path, namespace=True)
        ok(s["build-2"], "2 built")
        failed(s["build-miss-link-enospc"], 1, "FAILED scale[threads=256]@sm_90a",
               "No space left on device", "2 cached, 1 failed")
        ok(s["verify-after-link-enospc"], "2 entries, 2 healthy, 0 problem(s)")
        assert s["tmp-after-link-enospc"] == []  # the failed build's staging went with it
        failed(s["build-miss-export-enospc"], 1, "cannot write the artifact into",
               "No space left on device")
        ok(s["verify-after-export-enospc"], "2 entries, 2 healthy, 0 problem(s)")
        ok(s["build-hits-disk-full"], "0 built, 2 cached, 0 failed")  # hits need no space
        failed(s["new-cache-disk-full"], 1, "cannot create the cache: No space left on device")
        ok(s["load-disk-full"])
        assert s["load-disk-full"]["out"].split() == ["2", "2"]  # loaded and mapped
        ok(s["build-after-freeing"], "1 built, 2 cached, 0 failed")
        ok(s["verify-after-freeing"], "3 entries, 3 healthy, 0 problem(s)")
        assert s["tmp-after-freeing"] == []
        ok(s["new-cache-after-freeing"], "2 built")
        tally.add("storage", full_disk_failures=3, full_disk_entries_lost=0, full_disk_recovered=2,
                  full_disk_via_tmpfs=1)
    else:
        s = drive("full-rlimit", {"cache": str(tmp_path / "cache"), "small": small, "more": more},
                  tmp_path, namespace=False)
        ok(s["build-2"], "2 built")
        for limit in (4 * 1024, 256 * 1024):
            failed(s[f"build-miss-fsize-{limit}"], 1, "FAILED scale[threads=256]@sm_90a")
            ok(s[f"verify-after-fsize-{limit}"], "2 entries, 2 healthy, 0 problem(s)")
        ok(s["build-after-freeing"], "1 built, 2 cached, 0 failed")
        ok(s["verify-after-freeing"], "3 entries, 3 healthy, 0 problem(s)")
        assert s["tmp-after-freeing"] == []
        tally.add("storage", full_disk_failures=2, full_disk_entries_lost=0, full_disk_recovered=1,
                  full_disk_via_rlimit=1)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_a_read_only_cache_serves_hits_and_refuses_writes_clearly(toy8, tmp_path: Path,
                                                                  tally) -> None:
    if os.geteuid() != 0:
        how = "chmod"
    elif in_mount_namespace():
        how = "mount"
    else:
        pytest.skip("root ignores permission bits, and no mount namespace is available here "
                    "for a read-only bind mount")
    toy = Toy.copy(toy8, tmp_path)
    small, more = _projects(tmp_path, extra=48)  # threads=48 is not in the cache
    key = next(toy.store.entries()).key
    stale = toy.store.tmp_dir / f"{'ab' * 32}.0123456789ab"  # a killed build's leftover
    stale.mkdir(parents=True)
    if how == "chmod":
        for p in [toy.cache, *toy.cache.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
    before = _tree(toy.cache)
    spec = {"cache": str(toy.cache), "small": small, "more": more, "key": key, "how": how}
    s = drive(f"ro-{how}", spec, tmp_path, namespace=how == "mount")
    if how == "chmod":
        for p in [toy.cache, *toy.cache.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert _tree(toy.cache) == before  # nothing written, nothing lost
    why = "Read-only file system" if how == "mount" else "Permission denied"
    ok(s["build-hits"], "0 built, 2 cached, 0 failed")
    failed(s["build-miss"], 1, "cannot write to the cache", why, "--read-only")
    failed(s["build-miss-read-only-mode"], 1, "read-only mode: 1 entry not in the cache")
    ok(s["list"], "8 entries")
    ok(s["stats"])
    ok(s["show"], key)
    failed(s["verify"], 1, "stale-tmp", "cannot take the lock", why)
    failed(s["verify-fix"], 1, "cannot take the lock", why)
    failed(s["gc"], 1, "cannot take the lock", why)
    failed(s["rm"], 1, "cannot take the lock", why)
    ok(s["load"])
    assert s["load"]["out"].split() == ["8", "8"]  # every entry loads from a read-only cache
    tally.add("storage", read_only_commands=11, read_only_clean_refusals=5,
              read_only_entries_loaded=8, read_only_bytes_changed=0)
