"""Bit-reproducible builds: one manifest built twice, in environments that differ in every
way a build host can, gives the same bytes.

Environment A is this process's. Environment B differs in the working directory, the
project's and the cache's paths, HOME (so zig's cache starts empty), TMPDIR, the user (uid
4242 and USER=builder, in a user namespace), the hostname (a UTS namespace), the locale,
the time zone, the clock (faketime, 2031), the CPUs (taskset, one CPU), an environment
otherwise empty but for DSL variables that decide nothing compiled (its log level, its
file cache's place: `cutecc.toolchain.dists` leaves them out of the key, so they must not reach a
byte; those that do decide, such as CUTE_DSL_LINEINFO, are key inputs). A dimension this
host cannot vary (no faketime, no user namespaces) is left out with a warning that says
why; the rest still run. Every library, every lock line and
every metadata field but the build's time and duration must be equal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
from helpers import PY, write_toy_project

pytestmark = pytest.mark.usefixtures("dsl")
TIMES = ("built_at", "build_seconds")  # the only metadata allowed to differ
# An index record's stamp of its meta.json (size, inode, ctime): this file system's, not
# the artifact's (the lock and meta.json never carry it).
LOCAL = ("meta_stat",)


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _environment_b(base: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """(command prefix, environment, dimensions left out with why) for environment B."""
    home, tmp = base / "home", base / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(tmp),
           "USER": "builder", "LOGNAME": "builder", "LANG": "C", "LC_ALL": "C",
           "TZ": "Pacific/Kiritimati", "CUTE_DSL_LOG_LEVEL": "10",
           "CUTE_DSL_CACHE_DIR": str(tmp)}
    prefix: list[str] = []
    skipped = []
    if len(os.sched_getaffinity(0)) < 2:
        skipped.append("CPU count (this host gives one CPU)")
    elif shutil.which("taskset") and _works(["taskset", "-c", "0", "true"]):
        prefix += ["taskset", "-c", "0"]
    else:
        skipped.append("CPU count (no taskset)")
    if shutil.which("faketime") and _works(["faketime", "2031-03-04 05:06:07", "true"]):
        prefix += ["faketime", "2031-03-04 05:06:07"]
    else:
        skipped.append("clock (faketime is not installed: apt-get install faketime)")
    if shutil.which("unshare") and _works(["unshare", "-U", "--map-user=4242", "--map-group=4242", "true"]):
        prefix = ["unshare", "-U", "--map-user=4242", "--map-group=4242", *prefix]
    else:
        skipped.append("user (no user namespaces here: unshare -U --map-user)")
    if shutil.which("unshare") and _works(["unshare", "-r", "-u", "hostname", "cutecc-b"]):
        inner = " ".join(f"'{a}'" for a in prefix)
        prefix = ["unshare", "-r", "-u", "sh", "-c", f'hostname cutecc-b && exec {inner} "$@"', "sh"]
    else:
        skipped.append("hostname (no UTS namespaces here: unshare -r -u)")
    return prefix, env, skipped


SEEN = (
    "import json, os, socket, time\n"
    "print(json.dumps([os.getuid(), socket.gethostname(), time.gmtime().tm_year,"
    " len(os.sched_getaffinity(0)), os.getcwd(), os.environ.get('HOME'), time.tzname[0]]))\n")


def _seen(cwd: Path, prefix: list[str], env: dict[str, str]) -> list:
    """What a process of the environment sees: uid, hostname, year, CPUs, cwd, HOME, zone."""
    cwd.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([*prefix, PY, "-c", SEEN], capture_output=True, text=True, timeout=60, cwd=cwd,
                       env=env, check=True)
    return json.loads(r.stdout)


def _build(manifest: Path, cache: Path, cwd: Path, prefix: list[str], env: dict[str, str]) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([*prefix, PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                        str(cache), "-j", "2"], capture_output=True, text=True, timeout=900, cwd=cwd,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def _artifacts(cache: Path) -> dict[str, bytes | dict]:
    """Every file of the cache's entries and runtime libraries, by path in the cache: the
    libraries' bytes, the metadata without its times."""
    out: dict[str, bytes | dict] = {}
    for area in ("entries", "runtimes", "by-kernel"):
        for f in sorted((cache / area).rglob("*")):
            if not f.is_file() or f.name == "used":
                continue
            rel = f.relative_to(cache).as_posix()
            if f.name == "meta.json" or area == "by-kernel":
                doc = json.loads(f.read_bytes())
                out[rel] = {k: v for k, v in doc.items() if k not in TIMES + LOCAL}
            else:
                out[rel] = f.read_bytes()
    return out


@pytest.mark.usefixtures("dsl")
def test_two_builds_in_different_environments_give_the_same_bytes(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="building needs the build extra")
    a = write_toy_project(tmp_path / "a" / "proj", threads=(64, 256))
    b = write_toy_project(tmp_path / "b" / "elsewhere" / "project", threads=(64, 256))
    _build(a, tmp_path / "a" / "cache", tmp_path / "a", [], dict(os.environ))
    prefix, env, skipped = _environment_b(tmp_path / "b")
    _build(b, tmp_path / "b" / "cache", tmp_path / "b" / "cwd", prefix, env)
    for why in skipped:
        warnings.warn(f"reproducibility: not varied on this host: {why}", stacklevel=1)
    seen_a = _seen(tmp_path / "a", [], dict(os.environ))
    seen_b = _seen(tmp_path / "b" / "cwd", prefix, env)
    differ = {name for name, x, y in zip(("user", "hostname", "clock", "CPU count", "cwd", "HOME",
                                          "time zone"), seen_a, seen_b) if x != y}
    assert {"cwd", "HOME", "time zone"} <= differ, (seen_a, seen_b)
    left_out = {why.split(" (")[0] for why in skipped}
    assert {"user", "hostname", "clock", "CPU count"} - left_out <= differ, (seen_a, seen_b, skipped)

    got_a, got_b = _artifacts(tmp_path / "a" / "cache"), _artifacts(tmp_path / "b" / "cache")
    assert sorted(got_a) == sorted(got_b)
    assert sum(k.endswith(".so") for k in got_a) == 3  # two kernels and their runtime library
    for name in got_a:
        assert got_a[name] == got_b[name], name
    assert a.with_name("kernels.lock").read_bytes() == b.with_name("kernels.lock").read_bytes()
    meta = next(v for k, v in got_b.items() if k.endswith("meta.json") and "entries" in k)
    assert isinstance(meta, dict) and str(tmp_path) not in json.dumps(meta)
