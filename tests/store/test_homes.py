"""Every directory cutecc keeps on a machine comes from `cutecc.store.homes` (issue 46): `cutecc
env --json` lists each with its size, and `cutecc gc` reaches each (a test per home below;
the cache's own eviction is tests/commands/test_gc.py and tests/store/test_areas.py).

Each test runs the real command in a subprocess whose homes all lie under `tmp_path`
(`$XDG_CACHE_HOME`, `$TMPDIR`, `$XDG_RUNTIME_DIR`), never this machine's own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY

from cutecc.store import Store, homes
from cutecc.toolchain.targetlibs import pinned_files

OLD = time.time() - 30 * 86400  # a month ago
VARIABLES = ("CUTECC_CACHE_DIR", "CUTECC_PLAN_MEMORY", "CUTECC_PLATFORM_LIBS", "ZIG_GLOBAL_CACHE_DIR",
             "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "TMPDIR")


class Machine:
    """A machine's homes under one directory: the environment that names them there, and
    their paths as `cutecc.store.homes` gives them in that environment."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        self.env.update(XDG_CACHE_HOME=str(root / "xdg"), TMPDIR=str(root / "tmp"),
                        XDG_RUNTIME_DIR=str(root / "run"))
        for d in ("xdg", "tmp", "run"):
            (root / d).mkdir(mode=0o700)
        for k in VARIABLES:
            monkeypatch.delenv(k, raising=False)
        for k in ("XDG_CACHE_HOME", "TMPDIR", "XDG_RUNTIME_DIR"):
            monkeypatch.setenv(k, self.env[k])
        import tempfile

        monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
        store = Store(homes.cache())
        store.ensure()
        self.cache = store.root
        self.paths = {name: homes.path_of(name) for name in homes.NAMES}
        self.legacy = homes.legacy()

    def cutecc(self, *args: str) -> dict:
        r = subprocess.run([PY, "-m", "cutecc.cli", *args, "--json"], capture_output=True, text=True,
                           env=self.env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    def gc(self, *args: str) -> dict[str, list[str]]:
        """`cutecc gc` with `args`: what it removed outside the cache, by home."""
        out: dict[str, list[str]] = {}
        for r in self.cutecc("gc", *args)["removed_homes"]:
            out.setdefault(r["home"], []).append(r["path"])
        return out


def _file(path: Path, size: int = 10, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(b"x" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _age_tree(path: Path, mtime: float) -> None:
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.utime(os.path.join(root, name), (mtime, mtime), follow_symlinks=False)
    os.utime(path, (mtime, mtime))


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    return Machine(tmp_path, monkeypatch)


def test_env_lists_every_home_with_its_size(machine: Machine) -> None:
    sizes = {homes.PLANNING: 11, homes.PLATFORM_LIBS: 22, homes.ZIG: 33, homes.WRAPPERS: 44,
             homes.SERVICES: 0}
    for name, n in sizes.items():
        made, why = homes.make(name)
        assert made is not None and why is None, why
        if n:
            _file(made / "sub" / "f", n)
    listed = {h["name"]: h for h in machine.cutecc("env")["homes"]}
    assert set(listed) == set(homes.NAMES), listed
    for name, h in listed.items():
        assert h["path"] == str(machine.paths[name]) and h["exists"], h
        assert h["bytes"] == sizes.get(name, h["bytes"]), h
    assert listed["cache"]["bytes"] > 0  # the cache's README, CACHEDIR.TAG and format
    assert all(h["variable"] for h in listed.values())
    # each is versioned in its name
    for name in homes.NAMES:
        assert any(part.startswith("v") or "-v" in part for part in machine.paths[name].parts[-1:]), name


def test_env_lists_what_an_older_cutecc_left(machine: Machine) -> None:
    _file(machine.legacy[homes.ZIG] / "o" / "stub", 5)
    listed = {h["name"]: h for h in machine.cutecc("env")["homes"]}
    assert listed["zig (older cutecc)"]["bytes"] == 5
    assert listed["zig (older cutecc)"]["path"] == str(machine.legacy[homes.ZIG])


def test_a_planning_home_can_be_turned_off(machine: Machine) -> None:
    machine.env["CUTECC_PLAN_MEMORY"] = "off"
    listed = {h["name"]: h for h in machine.cutecc("env")["homes"]}
    assert listed["planning"]["path"] is None and not listed["planning"]["exists"]


def test_gc_removes_the_planning_memory_unused_for_the_age(machine: Machine) -> None:
    memory = _file(machine.paths[homes.PLANNING] / "planmemory.json", mtime=OLD)
    assert machine.gc("--older-than", "40d") == {}
    assert memory.is_file()
    assert machine.gc("--older-than", "7d") == {"planning": [str(memory)]}
    assert not memory.exists()


def test_gc_removes_platform_link_inputs_no_pin_names(machine: Machine) -> None:
    libs = machine.paths[homes.PLATFORM_LIBS]
    kept = sorted(pinned_files())[:2]
    for rel in kept:
        _file(libs / rel / "lib.a") if not rel.startswith("wheels/") else _file(libs / rel)
    stale_tree = _file(libs / "aarch64" / "0123456789abcdef" / "lib.a").parent
    stale_wheel = _file(libs / "wheels" / "nvidia_cuda_runtime-0.0.1-py3-none-any.whl")
    under_way = _file(libs / "aarch64" / ".extract-abc" / "lib.a").parent
    downloading = _file(libs / "wheels" / "tmpabc" / "x.whl").parent
    assert machine.gc("--dry-run") == {"platform-libs": [str(stale_tree), str(stale_wheel)]}
    assert stale_tree.is_dir()
    assert machine.gc() == {"platform-libs": [str(stale_tree), str(stale_wheel)]}
    assert not stale_tree.exists() and not stale_wheel.exists()
    assert all((libs / rel).exists() for rel in kept) and under_way.is_dir() and downloading.is_dir()


def test_gc_removes_zig_cache_no_link_used_for_the_age(machine: Machine) -> None:
    zig, why = homes.make(homes.ZIG)
    assert zig is not None and why is None
    _file(zig / "o" / "abc" / "libc.so", 100, mtime=OLD)
    homes.mark_used(zig)
    assert machine.gc("--older-than", "1d") == {}  # a link marked it just now
    os.utime(zig / homes.USED, (OLD, OLD))
    assert machine.gc("--older-than", "1d") == {"zig": [str(zig)]}
    assert not zig.exists()


def test_gc_removes_wrappers_unused_for_the_age_and_nothing_else_there(machine: Machine) -> None:
    wraps, why = homes.make(homes.WRAPPERS)
    assert wraps is not None and why is None
    old = _file(wraps / "cutecc_wrapper_0123456789abcdef.py", mtime=OLD)
    old_pyc = _file(wraps / "__pycache__" / "cutecc_wrapper_0123456789abcdef.cpython-311.pyc", mtime=OLD)
    fresh = _file(wraps / "cutecc_wrapper_fedcba9876543210.py")
    other = _file(wraps / "notes.txt", mtime=OLD)
    assert machine.gc() == {}  # only with an age
    assert machine.gc("--older-than", "1d") == {"wrappers": [str(old_pyc), str(old)]}
    assert fresh.is_file() and other.is_file() and not old.exists()


def test_gc_removes_sockets_no_service_listens_on(machine: Machine) -> None:
    run, why = homes.make(homes.SERVICES)
    assert run is not None and why is None
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(run / "live.sock"))
    live.listen()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(run / "dead.sock"))
    dead.close()  # its file stays, no one listens
    new = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    new.bind(str(run / "starting.sock"))  # bound, not listening yet: a service starting
    try:
        for name in ("live.sock", "dead.sock"):
            os.utime(run / name, (OLD, OLD), follow_symlinks=False)
        assert machine.gc() == {"services": [str(run / "dead.sock")]}
        assert (run / "live.sock").exists() and (run / "starting.sock").exists()
    finally:
        live.close()
        new.close()


@pytest.mark.parametrize("name", [homes.PLANNING, homes.PLATFORM_LIBS, homes.ZIG, homes.WRAPPERS,
                                  homes.SERVICES])
def test_gc_removes_what_an_older_cutecc_left_once_unchanged(machine: Machine, name: str) -> None:
    old = machine.legacy[name]
    _file(old / "data" / "f", 7)
    assert machine.gc() == {}  # just written: an older cutecc may be running
    _age_tree(old, OLD)
    assert machine.gc("--dry-run") == {name: [str(old)]}
    assert machine.gc() == {name: [str(old)]}
    assert not old.exists()


def test_gc_leaves_an_older_home_that_is_a_link_alone(machine: Machine, tmp_path: Path) -> None:
    target = _file(tmp_path / "elsewhere" / "f").parent
    machine.legacy[homes.ZIG].parent.mkdir(parents=True, exist_ok=True)
    machine.legacy[homes.ZIG].symlink_to(target)
    os.utime(machine.legacy[homes.ZIG], (OLD, OLD), follow_symlinks=False)
    assert machine.gc("--older-than", "1d") == {}
    assert (target / "f").is_file()


def test_a_home_that_is_a_link_or_open_to_others_is_refused(machine: Machine, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    machine.paths[homes.ZIG].parent.mkdir(parents=True, exist_ok=True)
    machine.paths[homes.ZIG].symlink_to(target)
    assert homes.make(homes.ZIG)[1] == f"{machine.paths[homes.ZIG]} is a symbolic link"
    machine.paths[homes.SERVICES].mkdir(mode=0o700)
    machine.paths[homes.SERVICES].chmod(0o755)
    assert "open to other users" in (homes.make(homes.SERVICES)[1] or "")
    assert homes.make(homes.WRAPPERS)[1] is None  # another home is not: a private one need not be


def test_a_pinned_wheel_comes_from_an_older_cutecc_home_checked_and_unchanged(machine: Machine) -> None:
    """An older cutecc's `cutecc-platform-libs/wheels/` serves a pinned wheel rather than a
    fetch, checked against the pin (a stand-in pin here); its home is read, never changed."""
    import hashlib

    from cutecc.toolchain import targetlibs

    data = b"a pinned wheel's bytes"
    w = targetlibs.Wheel("demo", "1.0", "demo-1.0-py3-none-manylinux_2_28_aarch64.whl",
                         hashlib.sha256(data).hexdigest(), len(data))
    old = machine.legacy[homes.PLATFORM_LIBS] / "wheels" / w.filename
    _file(old).write_bytes(data)
    root = targetlibs.cache_dir()
    got = targetlibs._wheel_file(w, root)
    assert got == root / "wheels" / w.filename and got.read_bytes() == data and old.read_bytes() == data
    other = targetlibs.Wheel("demo", "1.0", "demo-1.0-py3-none-manylinux_2_28_aarch64.whl",
                             hashlib.sha256(b"other").hexdigest(), len(data))
    got.unlink()
    assert not targetlibs._is_pinned(old, other)  # bytes that are not the pin's are never taken
