"""Run cutecc against a full or read-only cache and report each step as JSON.

`python storage_driver.py SCENARIO SPEC` (SPEC: JSON with the paths). Scenarios:

  full-tmpfs   inside a private mount namespace (`unshare -m`): a 4 MiB tmpfs holds the
               cache; builds run out of space while linking, while exporting the object,
               and while creating a new cache; then space is freed and builds complete.
  full-rlimit  no mount namespace: RLIMIT_FSIZE makes file writes past 4 KiB, then 256 KiB, fail
               (EFBIG, or SIGXFSZ for the linker), which is what a full disk looks like to
               a writer; then the limit goes and the build completes.
  ro-mount     inside a private mount namespace: the cache is bind-mounted read-only
               (root ignores permission bits, not a read-only mount).
  ro-chmod     as a user other than root: the cache's permission bits forbid writing.

Each step records the command's exit status and output; the test asserts on them.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PY = sys.executable
PROBE = r'''
import sys, cutecc
ks = cutecc.load(sys.argv[1], arch="sm_90a")
keys = [b.register("scale") for b in ks.scale.builds]
maps = open("/proc/self/maps").read()
print(len(keys), sum(k in maps for k in keys))
'''


def run(steps: dict[str, Any], name: str, *args: str, limit: int | None = None,
        env: dict[str, str] | None = None) -> None:
    """Run `cutecc ARGS` (or a Python snippet when args[0] == "-c") and record it."""
    cmd = [PY, *args] if args[0] == "-c" else [PY, "-m", "cutecc.cli", *args]

    def rlimit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=rlimit,
                       env={**os.environ, **(env or {})})
    steps[name] = {"rc": r.returncode, "out": r.stdout, "err": r.stderr}


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def fill(mount: Path, leave_kib: int) -> None:
    """Fill the tmpfs at `mount` until `leave_kib` KiB are free."""
    (mount / "fill").unlink(missing_ok=True)
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with open(mount / "fill", "wb") as f:
        left = free - leave_kib * 1024
        while left > 0:
            try:
                left -= f.write(b"\0" * min(left, 1 << 20))
            except OSError:
                break


def full_tmpfs(spec: dict[str, Any], steps: dict[str, Any]) -> None:
    m = Path(spec["mount"])
    sh("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(m))
    c, new = str(m / "cache"), str(m / "new")
    small, more = spec["small"], spec["more"]
    run(steps, "build-2", "build", small, "--cache-dir", c, "-j", "1", "--no-lock")
    fill(m, 28)  # room for the 16 KiB object and the version script, not for the library too
    run(steps, "build-miss-link-enospc", "build", more, "--cache-dir", c, "-j", "1", "--no-lock")
    run(steps, "verify-after-link-enospc", "verify", "--cache-dir", c)
    steps["tmp-after-link-enospc"] = sorted(os.listdir(m / "cache" / "tmp"))
    fill(m, 4)
    run(steps, "build-miss-export-enospc", "build", more, "--cache-dir", c, "-j", "1", "--no-lock")
    run(steps, "verify-after-export-enospc", "verify", "--cache-dir", c)
    fill(m, 0)
    run(steps, "build-hits-disk-full", "build", small, "--cache-dir", c, "--no-lock")
    run(steps, "new-cache-disk-full", "build", small, "--cache-dir", new, "--no-lock")
    run(steps, "load-disk-full", "-c", PROBE, c)
    (m / "fill").unlink()
    run(steps, "build-after-freeing", "build", more, "--cache-dir", c, "-j", "1", "--no-lock")
    run(steps, "verify-after-freeing", "verify", "--cache-dir", c)
    steps["tmp-after-freeing"] = sorted(os.listdir(m / "cache" / "tmp"))
    shutil.rmtree(m / "cache")  # room for the new cache
    run(steps, "new-cache-after-freeing", "build", small, "--cache-dir", new, "-j", "1", "--no-lock")


def full_rlimit(spec: dict[str, Any], steps: dict[str, Any]) -> None:
    c = spec["cache"]
    run(steps, "build-2", "build", spec["small"], "--cache-dir", c, "-j", "1", "--no-lock")
    for limit in (4 * 1024, 256 * 1024):
        run(steps, f"build-miss-fsize-{limit}", "build", spec["more"], "--cache-dir", c, "-j", "1",
            "--no-lock", limit=limit)
        run(steps, f"verify-after-fsize-{limit}", "verify", "--cache-dir", c)
    run(steps, "build-after-freeing", "build", spec["more"], "--cache-dir", c, "-j", "1", "--no-lock")
    run(steps, "verify-after-freeing", "verify", "--cache-dir", c)
    steps["tmp-after-freeing"] = sorted(os.listdir(Path(c) / "tmp"))


def read_only(spec: dict[str, Any], steps: dict[str, Any]) -> None:
    c = spec["cache"]
    if spec["how"] == "mount":
        sh("mount", "--bind", c, c)
        sh("mount", "-o", "remount,bind,ro", c, c)
    run(steps, "build-hits", "build", spec["small"], "--cache-dir", c, "--no-lock")
    run(steps, "build-miss", "build", spec["more"], "--cache-dir", c, "-j", "1", "--no-lock")
    run(steps, "build-miss-read-only-mode", "build", spec["more"], "--cache-dir", c, "--read-only",
        "--no-lock")
    run(steps, "list", "list", "--cache-dir", c)
    run(steps, "stats", "stats", "--cache-dir", c)
    run(steps, "show", "show", spec["key"], "--cache-dir", c)
    run(steps, "verify", "verify", "--cache-dir", c)
    run(steps, "verify-fix", "verify", "--fix", "--cache-dir", c)
    run(steps, "gc", "gc", "--max-size", "0", "--cache-dir", c)
    run(steps, "rm", "rm", spec["key"], "--cache-dir", c)
    run(steps, "load", "-c", PROBE, c)


SCENARIOS = {"full-tmpfs": full_tmpfs, "full-rlimit": full_rlimit, "ro-mount": read_only,
             "ro-chmod": read_only}


def main(scenario: str, spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    steps: dict[str, Any] = {}
    try:
        SCENARIOS[scenario](spec, steps)
    finally:
        Path(spec["out"]).write_text(json.dumps(steps))


if __name__ == "__main__":
    main(*sys.argv[1:])
