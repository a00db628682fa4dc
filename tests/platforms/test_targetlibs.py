"""Another platform's link inputs: only pinned bytes are used, the extracted files are
checked on every use, and what cannot be fetched or is not pinned is a clear error.
A small wheel made here stands for the real ones (no network)."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cutecc.errors import CuteccError
from cutecc.toolchain import targetlibs

NAME = "fake_libs-1.0-py3-none-manylinux_2_28_aarch64.whl"
MEMBERS = {"fake/lib/libx.a": b"!<arch>\nfake archive\n", "fake/lib/libtvm_ffi.so": b"\x7fELF fake",
           "fake/include/a.h": b"int a;\n", "fake/include/sub/b.h": b"int b;\n"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(tmp: Path, members: dict[str, bytes] = MEMBERS) -> tuple[Path, targetlibs.Wheel]:
    path = tmp / NAME
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    include = tmp / "include-tree"
    for name, data in members.items():
        if name.startswith("fake/include/"):
            f = include / name.removeprefix("fake/include/")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
    data = path.read_bytes()
    pin = targetlibs.Wheel("fake-libs", "1.0", NAME, _sha(data), len(data),
                           files=(("dialect_rt", "fake/lib/libx.a", _sha(members["fake/lib/libx.a"])),
                                  ("tvm_ffi_so", "fake/lib/libtvm_ffi.so",
                                   _sha(members["fake/lib/libtvm_ffi.so"]))),
                           tree=("tvm_include", "fake/include", targetlibs.tree_digest(include)))
    return path, pin


@pytest.fixture
def pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, targetlibs.Wheel]:
    """A cache directory holding the pinned fake wheel, and its pin."""
    made, pin = _wheel(tmp_path)
    cache = tmp_path / "libs"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / NAME).write_bytes(made.read_bytes())
    monkeypatch.setenv(targetlibs.CACHE_VAR, str(cache))
    monkeypatch.setattr(targetlibs, "PINNED", {"aarch64": {"9.9": (pin,)}})
    monkeypatch.setattr(targetlibs, "_dsl_version", lambda: "9.9")
    targetlibs.paths.cache_clear()
    yield cache, pin
    targetlibs.paths.cache_clear()


def test_the_pinned_files_are_extracted_and_checked_on_every_use(pinned: tuple[Path, Any]) -> None:
    cache, pin = pinned
    p = targetlibs.paths("aarch64")
    assert p["dialect_rt"].read_bytes() == MEMBERS["fake/lib/libx.a"]
    assert (p["tvm_include"] / "sub" / "b.h").read_bytes() == b"int b;\n"
    assert p["tvm_lib"] == p["tvm_ffi_so"].parent
    assert targetlibs.pins("aarch64") == {"fake-libs": f"1.0 sha256:{pin.sha256}",
                                          "dialect_rt": pin.files[0][2], "tvm_ffi_so": pin.files[1][2],
                                          "tvm_include": pin.tree[2]}
    # A changed extracted file, or an added header, is never used: extracted again from the wheel.
    p["dialect_rt"].write_bytes(b"tampered")
    (p["tvm_include"] / "evil.h").write_text("#define a b\n")
    targetlibs.paths.cache_clear()
    again = targetlibs.paths("aarch64")
    assert again["dialect_rt"].read_bytes() == MEMBERS["fake/lib/libx.a"]
    assert not (again["tvm_include"] / "evil.h").exists()


def test_a_wheel_that_is_not_the_pinned_one_is_fetched_again_and_refused_if_pip_fails(
        pinned: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cache, pin = pinned
    (cache / "wheels" / NAME).write_bytes(b"PK not the wheel")
    asked: list[list[str]] = []

    def no_pip(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(targetlibs.subprocess, "run", no_pip)
    with pytest.raises(CuteccError, match=f"pip could not fetch {NAME} .*copy the file into") as e:
        targetlibs.paths("aarch64")
    assert e.value.exit_code == 1
    cmd = asked[0]
    assert "--require-hashes" in cmd and cmd[cmd.index("--platform") + 1] == "manylinux_2_28_aarch64"
    req = Path(cmd[cmd.index("-r") + 1])
    assert not req.exists()  # the requirements file lived in a temporary directory


def test_a_member_path_out_of_the_tree_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made, pin = _wheel(tmp_path, {**MEMBERS, "fake/include/../../../escape.h": b"x"})
    with pytest.raises(CuteccError, match="unsafe member"):
        targetlibs._extract(pin, made, tmp_path / "out")
    assert not (tmp_path / "escape.h").exists() and not (tmp_path / "out").exists()


def test_a_dsl_version_without_pins_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targetlibs, "_dsl_version", lambda: "0.0.1")
    with pytest.raises(CuteccError, match="pins aarch64 link inputs for nvidia-cutlass-dsl 4.8.1; "
                                          "this environment has 0.0.1") as e:
        targetlibs.wheels("aarch64")
    assert e.value.exit_code == 2


def test_the_real_pins_name_wheels_for_aarch64() -> None:
    for versions in targetlibs.PINNED.values():
        for wheels in versions.values():
            roles = {r for w in wheels for r, _, _ in w.files} | {w.tree[0] for w in wheels if w.tree}
            assert roles == {"dialect_rt", "cudart", "tvm_ffi_so", "tvm_include"}
            assert all(t.endswith("_aarch64") for w in wheels for t in w.tags)
