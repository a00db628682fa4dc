"""The manylinux tag of a pack comes from its libraries' glibc symbol versions."""

from __future__ import annotations

import struct

import pytest

from cutecc.errors import CuteccError
from cutecc.toolchain import elf


def fake_so(needs: dict[str, list[str]], machine: int = 62) -> bytes:
    """A minimal x86-64 ELF shared object whose .gnu.version_r requires `needs`
    ({file: [version, ...]}): an ELF header, a string table and the Verneed records."""
    strtab = b"\0"
    offsets: dict[str, int] = {}
    for name in [*needs, *(v for vs in needs.values() for v in vs)]:
        if name not in offsets:
            offsets[name] = len(strtab)
            strtab += name.encode() + b"\0"
    verneed = b""
    files = list(needs.items())
    for i, (file, versions) in enumerate(files):
        size = 16 + 16 * len(versions)
        verneed += struct.pack("<HHIII", 1, len(versions), offsets[file], 16,
                               size if i + 1 < len(files) else 0)
        for j, v in enumerate(versions):
            verneed += struct.pack("<IHHII", 0, 0, 2 + j, offsets[v], 16 if j + 1 < len(versions) else 0)
    str_off = 64
    vn_off = str_off + len(strtab)
    sh_off = vn_off + len(verneed)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 0)
    sections = struct.pack("<IIQQQQIIQQ", *([0] * 10))
    sections += struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, str_off, len(strtab), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 0, 0x6FFFFFFE, 0, 0, vn_off, len(verneed), 1, len(files), 8, 0)
    return header + strtab + verneed + sections


def test_versions_are_read_per_needed_file() -> None:
    data = fake_so({"libc.so.6": ["GLIBC_2.2.5", "GLIBC_2.17"], "libdl.so.2": ["GLIBC_2.3.4"]})
    assert elf.needed_versions(data) == {"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.17"},
                                         "libdl.so.2": {"GLIBC_2.3.4"}}


@pytest.mark.parametrize(("versions", "tag"), [
    ([], "manylinux2014_x86_64.manylinux_2_17_x86_64"),  # the floor
    (["GLIBC_2.2.5", "GLIBC_2.14"], "manylinux2014_x86_64.manylinux_2_17_x86_64"),
    (["GLIBC_2.17", "GLIBC_2.28"], "manylinux_2_28_x86_64"),
    (["GLIBC_2.34", "GLIBC_2.3.4"], "manylinux_2_34_x86_64"),  # what a host gcc on glibc 2.36 gives
])
def test_the_tag_is_the_highest_glibc_any_library_needs(versions: list[str], tag: str) -> None:
    libs = [("a.so", fake_so({"libc.so.6": versions})), ("b.so", fake_so({}))]
    assert elf.manylinux_tag(libs) == tag


@pytest.mark.parametrize(("versions", "tag"), [
    ([], "manylinux2014_aarch64.manylinux_2_17_aarch64"),
    (["GLIBC_2.17", "GLIBC_2.28"], "manylinux_2_28_aarch64"),
])
def test_aarch64_libraries_get_aarch64_tags(versions: list[str], tag: str) -> None:
    assert elf.manylinux_tag([("a.so", fake_so({"libc.so.6": versions}, machine=183))]) == tag


def test_what_no_manylinux_tag_covers_is_refused() -> None:
    with pytest.raises(CuteccError, match="GLIBCXX_3.4.30 of libstdc"):
        elf.manylinux_tag([("k.so", fake_so({"libstdc++.so.6": ["GLIBCXX_3.4.30"]}))])
    with pytest.raises(CuteccError, match="not an x86-64 or aarch64 shared object"):
        elf.needed_versions(fake_so({}, machine=40))  # 32-bit ARM
    with pytest.raises(CuteccError, match="not an ELF file"):
        elf.needed_versions(b"#!/bin/sh\n" * 10)
    with pytest.raises(CuteccError, match="malformed"):
        elf.needed_versions(fake_so({"libc.so.6": ["GLIBC_2.17"]})[:120])
