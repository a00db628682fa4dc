"""Host platforms without compiling: the manifest's `platforms`, lock lines naming their
platform, the runtime setting aside another platform's entries, keys per platform, and
one ELF machine per pack."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from helpers import REPO

from cutecc import platforms
from cutecc.contract.pinned import Pin
from cutecc.entry import rules as entry
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock, LockEntry
from cutecc.manifest import load_manifest
from cutecc.toolchain.elf import manylinux_tag

KEY_A, KEY_B = "a" * 64, "b" * 64


def _manifest(tmp_path: Path, platforms_line: str) -> Path:
    text = (REPO / "kernels.toml").read_text()
    path = tmp_path / "kernels.toml"
    path.write_text(text.replace('archs = ["sm_90a"]', f'archs = ["sm_90a"]\n{platforms_line}', 1))
    (tmp_path / "kernels").symlink_to(REPO / "kernels")
    return path


def test_platforms_default_to_the_build_hosts_and_are_checked(tmp_path: Path) -> None:
    assert load_manifest(REPO / "kernels.toml").platforms == ("x86_64",)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    both = _manifest(tmp_path / "a", 'platforms = ["x86_64", "aarch64", "aarch64"]')
    assert load_manifest(both).platforms == ("x86_64", "aarch64")
    bad = _manifest(tmp_path / "b", 'platforms = ["arm64"]')
    with pytest.raises(CuteccError, match=r'platforms\[0\]: "arm64" is not a platform') as e:
        load_manifest(bad)
    assert e.value.exit_code == 2 and str(bad) in str(e.value)


def test_keys_differ_per_platform_and_x86_keys_are_the_locked_ones(tmp_path: Path) -> None:
    from cutecc.lock.lockfile import read_lock
    from cutecc.plan.build_plan import plan

    planned = plan(load_manifest(REPO / "kernels.toml"), platforms=("x86_64", "aarch64"))
    by = {(p.kernel.name, p.variant.id, p.platform): p for p in planned}
    locked = {(e.kernel, e.variant): e.key for e in read_lock(REPO / "kernels.lock").entries}
    for (kernel, variant), key in locked.items():
        assert by[(kernel, variant, "x86_64")].key == key
        arm = by[(kernel, variant, "aarch64")]
        assert arm.key != key and arm.inputs["toolchain"]["platform"] == "aarch64"
        assert arm.label.endswith("@sm_90a/aarch64")
    assert "platform" not in by[next(iter(locked)) + ("x86_64",)].inputs["toolchain"]


def _line(key: str, platform: str) -> LockEntry:
    return LockEntry("mul", "dtype=float32", "sm_90a", platform, key,
                     Pin("kernel.so", "c" * 64, 100, "cutecc_kernel", None, "d" * 64, "e" * 64))


def test_lock_lines_name_their_platform() -> None:
    lock = Lock((_line(KEY_A, "x86_64"), _line(KEY_B, "aarch64")))
    data = lock.dumps()
    assert b'"platform": "aarch64"' in data and b'"format": 3' in data
    again = Lock.loads(data, "kernels.lock")
    assert again == lock and again.platforms == ("aarch64", "x86_64")
    assert [e.key for e in again.select(platforms=["aarch64"]).entries] == [KEY_B]
    bad = data.replace(b'"platform": "aarch64"', b'"platform": "sparc"')
    with pytest.raises(CuteccError, match=r"entries\[0\]\.platform: platform 'sparc'"):
        Lock.loads(bad, "kernels.lock")
    older = data.replace(b'"format": 3', b'"format": 2')
    with pytest.raises(CuteccError, match="run `cutecc build` to write it anew"):
        Lock.loads(older, "kernels.lock")


def _meta(platform: str | None) -> entry.Recorded:
    from cutecc.entry.rules import ARTIFACT_FORMAT, ENTRY_FORMAT
    from cutecc.runtime.usable import tvm_ffi_series

    m: dict[str, object] = {"format": ENTRY_FORMAT, "arch": "sm_90a",
                            "toolchain": {"cutecc_artifact_format": str(ARTIFACT_FORMAT),
                                          "apache-tvm-ffi": tvm_ffi_series() + ".0"}}
    if platform is not None:
        m["platform"] = platform
    return entry.Recorded.of(m)


def test_the_runtime_sets_aside_another_platforms_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.runtime import usable

    series = usable.tvm_ffi_series()
    here = platforms.host_platform()
    other = "aarch64" if here != "aarch64" else "x86_64"
    assert usable.run_problem(_meta(here), "sm_90a", series) is None
    assert usable.run_problem(_meta(other), "sm_90a", series) == \
        f"built for {other} hosts, this host is {here}"
    monkeypatch.setattr(platforms._platform, "machine", lambda: "aarch64")
    assert usable.run_problem(_meta("aarch64"), "sm_90a", series) is None
    assert usable.run_problem(_meta(None), "sm_90a", series) == \
        "built for x86_64 hosts, this host is aarch64"  # entries from before platforms: x86-64


def test_labels_name_a_platform_other_than_the_build_hosts() -> None:
    assert entry.platform_of({}) == "x86_64" and entry.platform_of({"platform": "aarch64"}) == "aarch64"
    assert entry.label_of({"kernel": "k", "variant": "v", "arch": "sm_90a", "platform": "aarch64"}) == \
        "k[v]@sm_90a/aarch64"


def _elf(machine: int) -> bytes:
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", head, 16, 3, machine)
    return bytes(head)


def test_a_pack_is_tagged_for_its_libraries_machine_and_never_mixes_two() -> None:
    assert manylinux_tag([("a.so", _elf(183))]) == "manylinux2014_aarch64.manylinux_2_17_aarch64"
    assert manylinux_tag([("a.so", _elf(62))]) == "manylinux2014_x86_64.manylinux_2_17_x86_64"
    with pytest.raises(CuteccError, match="libraries for aarch64 and x86_64 in one pack"):
        manylinux_tag([("a.so", _elf(62)), ("b.so", _elf(183))])
    with pytest.raises(CuteccError, match="not an x86-64 or aarch64 shared object"):
        manylinux_tag([("a.so", _elf(40))])
