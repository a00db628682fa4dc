"""What a pack's shared libraries need from the deploy host, read from their ELF headers.

A wheel's platform tag must promise no more than its libraries need: the manylinux tag
(PEP 600) `manylinux_2_<minor>_x86_64` names the oldest glibc they run on, which is the
highest `GLIBC_2.<minor>` symbol version any of them requires (the `.gnu.version_r`
section). Only x86-64 ELF shared objects are accepted, and only glibc's own versions
(libstdc++ and other libraries outside the manylinux policy cannot be promised).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable

from cutecc.errors import CuteccError

_SHT_GNU_VERNEED = 0x6FFFFFFE
_EM_X86_64 = 62
_ET_DYN = 3
_GLIBC = re.compile(r"GLIBC_2\.(\d+)(?:\.\d+)?")
MIN_GLIBC_MINOR = 17  # manylinux2014, the oldest x86-64 baseline pip still installs
# What a library may require besides glibc's own versions: none of cutecc's libraries needs more.
_ALLOWED_OTHER = re.compile(r"(GLIBC_PRIVATE)")
# PEP 600's aliases of the older manylinux tags, which older installers only know by these names.
_LEGACY = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}


def needed_versions(data: bytes, name: str = "library") -> dict[str, set[str]]:
    """The symbol versions an x86-64 ELF shared object requires: {DT_NEEDED file: versions}."""
    def bad(why: str) -> CuteccError:
        return CuteccError(f"{name}: {why}", where="pack", exit_code=1)

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise bad("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise bad("not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_machine != _EM_X86_64 or e_type != _ET_DYN:
        raise bad(f"not an x86-64 shared object (type {e_type}, machine {e_machine})")
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
                    raise CuteccError(f"{name} needs {v} of {file}, which no manylinux tag covers",
                                      where="pack", exit_code=1)
    return minor


def manylinux_tag(libraries: Iterable[tuple[str, bytes]]) -> str:
    """The wheel platform tag for these x86-64 libraries, e.g.
    `manylinux2014_x86_64.manylinux_2_17_x86_64` (the legacy alias first, as auditwheel
    writes it) or `manylinux_2_34_x86_64`."""
    minor = glibc_minor(libraries)
    tags = [f"manylinux_2_{minor}_x86_64"]
    if minor in _LEGACY:
        tags.insert(0, f"{_LEGACY[minor]}_x86_64")
    return ".".join(tags)
