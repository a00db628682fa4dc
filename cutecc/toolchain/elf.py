"""What a pack's shared libraries need from the deploy host, read from their ELF headers.

A wheel's platform tag must promise no more than its libraries need: the manylinux tag
(PEP 600) `manylinux_2_<minor>_x86_64` names the oldest glibc they run on, which is the
highest `GLIBC_2.<minor>` symbol version any of them requires (the `.gnu.version_r`
section). Only x86-64 and aarch64 ELF shared objects are accepted (one machine per set of
libraries), and only glibc's own versions (libstdc++ and other libraries outside the
manylinux policy cannot be promised).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable

from cutecc.errors import CuteccError, WorkError

_SHT_GNU_VERNEED = 0x6FFFFFFE
_MACHINES = {62: "x86_64", 183: "aarch64"}  # e_machine -> the wheel tags' arch
_ET_DYN = 3
_GLIBC = re.compile(r"GLIBC_2\.(\d+)(?:\.\d+)?")
MIN_GLIBC_MINOR = 17  # manylinux2014, the oldest x86-64 baseline pip still installs
# What a library may require besides glibc's own versions: none of cutecc's libraries needs more.
_ALLOWED_OTHER = re.compile(r"(GLIBC_PRIVATE)")
# PEP 600's aliases of the older manylinux tags, which older installers only know by these names.
_LEGACY = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}


def machine(data: bytes, name: str = "library") -> str:
    """The wheel-tag arch (`x86_64`, `aarch64`) of a 64-bit little-endian ELF shared object."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise WorkError(f"{name}: not an ELF file", where="pack")
    if data[4] != 2 or data[5] != 1:
        raise WorkError(f"{name}: not a 64-bit little-endian ELF file", where="pack")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_machine not in _MACHINES or e_type != _ET_DYN:
        raise WorkError(f"{name}: not an x86-64 or aarch64 shared object (type {e_type}, machine "
                        f"{e_machine})", where="pack")
    return _MACHINES[e_machine]


def needed_versions(data: bytes, name: str = "library") -> dict[str, set[str]]:
    """The symbol versions an ELF shared object (`machine`) requires: {DT_NEEDED file: versions}."""
    def bad(why: str) -> CuteccError:
        return WorkError(f"{name}: {why}", where="pack")

    machine(data, name)
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    try:
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                    for i in range(e_shnum)]
        out: dict[str, set[str]] = {}
        for sh in sections:
            if sh[1] != _SHT_GNU_VERNEED:
                continue
            strtab = sections[sh[6]]  # sh_link: the string table of the names
            base, count = sh[4], sh[7]  # sh_offset, sh_info: how many Verneed records
            at = base
            for _ in range(count):
                _, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, at)
                file = _cstr(data, strtab[4] + vn_file)
                aux = at + vn_aux
                for _ in range(vn_cnt):
                    _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                    out.setdefault(file, set()).add(_cstr(data, strtab[4] + vna_name))
                    aux += vna_next
                at += vn_next
        return out
    except (struct.error, IndexError, UnicodeDecodeError):
        raise bad("malformed ELF section headers") from None


def _cstr(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode("ascii")


def glibc_minor(libraries: Iterable[tuple[str, bytes]]) -> int:
    """The highest `GLIBC_2.<minor>` the libraries require (at least MIN_GLIBC_MINOR).
    A version of any other library is an error: no manylinux tag could promise it."""
    minor = MIN_GLIBC_MINOR
    for name, data in libraries:
        for file, versions in needed_versions(data, name).items():
            for v in versions:
                m = _GLIBC.fullmatch(v)
                if m:
                    minor = max(minor, int(m.group(1)))
                elif not _ALLOWED_OTHER.fullmatch(v):
                    raise WorkError(f"{name} needs {v} of {file}, which no manylinux tag covers",
                                    where="pack")
    return minor


def manylinux_tag(libraries: Iterable[tuple[str, bytes]]) -> str:
    """The wheel platform tag for these libraries (all of one machine), e.g.
    `manylinux2014_x86_64.manylinux_2_17_x86_64` (the legacy alias first, as auditwheel
    writes it), `manylinux_2_28_aarch64`. Libraries of two machines are an error."""
    libraries = list(libraries)
    arches = {machine(data, name) for name, data in libraries} or {"x86_64"}
    if len(arches) > 1:
        raise WorkError(f"libraries for {' and '.join(sorted(arches))} in one pack; pack one host "
                        "platform at a time (--platform)", where="pack")
    arch = arches.pop()
    minor = glibc_minor(libraries)
    tags = [f"manylinux_2_{minor}_{arch}"]
    if minor in _LEGACY and (minor == 17 or arch == "x86_64"):  # manylinux1/2010: x86 only
        tags.insert(0, f"{_LEGACY[minor]}_{arch}")
    return ".".join(tags)
