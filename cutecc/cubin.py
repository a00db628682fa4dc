"""The CUDA ELF images (cubins) embedded in a kernel library, and the kernels they define.

A cutecc kernel library carries its device code as an embedded cubin (an ELF whose machine
is EM_CUDA). Its kernel functions' names are what a profiler reports for their launches, so
`cutecc tune` counts exactly a candidate's own kernels on the device clock, and the parity
benchmark compares cubins byte for byte. Pure Python, ELF64 little-endian only; the input
may be any bytes: every offset is bounds-checked and a malformed image yields nothing.
"""

from __future__ import annotations

import contextlib
import re

EM_CUDA = 190
MAX_IMAGES = 64  # EM_CUDA headers looked at per library, well-formed or not
MAX_SECTIONS = 4096
MAX_NAME = 4096  # bytes of one section name
_SHDR = 0x40  # an ELF64 section header
_TEXT = b".text."


class BadImage(ValueError):
    """An ELF image whose headers point outside it or exceed the bounds above."""


def _u(b: bytes, off: int, n: int) -> int:
    if off < 0 or off + n > len(b):
        raise BadImage(f"offset {off}+{n} outside {len(b)} bytes")
    return int.from_bytes(b[off:off + n], "little")


def _headers(b: bytes, at: int) -> tuple[int, int]:
    """(offset of the section header table, number of sections) of the image at `at`,
    checked to lie within `b` before anything is read from it."""
    shoff, shent, shnum = _u(b, at + 0x28, 8), _u(b, at + 0x3A, 2), _u(b, at + 0x3C, 2)
    if shent != _SHDR or shnum > MAX_SECTIONS or at + shoff + shnum * _SHDR > len(b):
        raise BadImage(f"{shnum} section headers of {shent} bytes at {shoff}")
    return at + shoff, shnum


def elf_size(b: bytes, at: int = 0) -> int:
    """Bytes of the ELF image starting at `at`: the end of its furthest header or section."""
    table, shnum = _headers(b, at)
    phoff, phent, phnum = _u(b, at + 0x20, 8), _u(b, at + 0x36, 2), _u(b, at + 0x38, 2)
    end = max(table - at + shnum * _SHDR, phoff + phent * phnum)
    for i in range(shnum):
        h = table + i * _SHDR
        if _u(b, h + 4, 4) != 8:  # SHT_NOBITS occupies no bytes
            end = max(end, _u(b, h + 0x18, 8) + _u(b, h + 0x20, 8))
    if at + end > len(b):
        raise BadImage(f"an image of {end} bytes at {at} passes the end ({len(b)} bytes)")
    return end


def cubins(blob: bytes) -> list[bytes]:
    """The well-formed embedded ELFs whose machine is EM_CUDA, in file order; at most
    MAX_IMAGES EM_CUDA headers are looked at (a malformed one counts and is skipped)."""
    out: list[bytes] = []
    tried = 0
    i = blob.find(b"\x7fELF", 1)
    while i >= 0 and tried < MAX_IMAGES:
        if i + 20 <= len(blob) and _u(blob, i + 18, 2) == EM_CUDA:
            tried += 1
            with contextlib.suppress(BadImage):
                out.append(blob[i:i + elf_size(blob, i)])
        i = blob.find(b"\x7fELF", i + 1)
    return out


def _names(elf: bytes) -> list[tuple[bytes, int]]:
    """(name, header offset) of every section; BadImage if the headers lie."""
    table, shnum = _headers(elf, 0)
    shstr = _u(elf, 0x3E, 2)
    if shstr >= max(shnum, 1):
        raise BadImage(f"section names in section {shstr} of {shnum}")
    names_at = _u(elf, table + shstr * _SHDR + 0x18, 8)
    out = []
    for i in range(shnum):
        h = table + i * _SHDR
        start = names_at + _u(elf, h, 4)
        end = elf.find(b"\0", start, start + MAX_NAME)
        if start >= len(elf) or end < 0:
            raise BadImage(f"a section name at {start} is not terminated within {MAX_NAME} bytes")
        out.append((elf[start:end], h))
    return out


def sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> contents (empty for SHT_NOBITS); BadImage if the headers lie."""
    out = {}
    for raw, h in _names(elf):
        try:
            name = raw.decode()
        except UnicodeDecodeError:
            raise BadImage("a section name is not text") from None
        off, size = _u(elf, h + 0x18, 8), _u(elf, h + 0x20, 8)
        nobits = _u(elf, h + 4, 4) == 8
        if not nobits and off + size > len(elf):
            raise BadImage(f"section {name!r} passes the end of the image")
        out[name] = b"" if nobits else elf[off:off + size]
    return out


def kernel_names(library: bytes) -> frozenset[str]:
    """The names of the kernel functions the library's cubins define (each has its code in
    section `.text.<name>`); empty when there is no well-formed cubin. Reads names only."""
    names: set[str] = set()
    for image in cubins(library):
        try:
            found = _names(image)
        except BadImage:
            continue
        for raw, _ in found:
            if raw.startswith(_TEXT) and len(raw) > len(_TEXT):
                try:
                    names.add(raw[len(_TEXT):].decode())
                except UnicodeDecodeError:
                    continue
    return frozenset(names)


# The SM a cubin was compiled for, as its ELF header records it (EI_ABIVERSION at e_ident[8]
# says where): ABI 7 keeps it in e_flags' low byte, ABI 8 (CUDA 12.8 on) in its second byte;
# 90 for sm_90 and sm_90a alike (the arch-specific feature is another flag, not read here).
_SM_BYTE = {7: 0, 8: 8}


def sm_of(image: bytes) -> int | None:
    """The SM number (major * 10 + minor) a cubin's header records; None for an ELF ABI
    version this does not know or a header too short to hold one."""
    if len(image) < 0x34 or image[8] not in _SM_BYTE:
        return None
    return (_u(image, 0x30, 4) >> _SM_BYTE[image[8]]) & 0xFF


def arch_problem(library: bytes, arch: str) -> str | None:
    """Why a kernel library cannot be the entry of a key whose arch is `arch` (`sm_90a`):
    a cubin in it whose recorded SM is another (or that records none we can read); None
    when every cubin's SM is the arch's. Read before publishing, so a wrong-arch object
    (a worker whose DSL targeted another GPU) is refused at build, never served."""
    from cutecc.archs import ARCH_RE, is_ptx

    m = ARCH_RE.fullmatch(arch)
    if m is None:
        return f"{arch!r} is not an arch name"
    want = int(m.group(1)) * 10 + int(m.group(2))
    if is_ptx(arch):  # portable PTX: its `.target`, and no machine code beside it
        return ptx_problem(library, want, arch)
    for i, image in enumerate(cubins(library)):
        sm = sm_of(image)
        if sm is None:
            return (f"cubin {i} records no SM this cutecc reads (ELF ABI version {image[8]}); "
                    f"the key's arch is {arch}")
        if sm != want:
            return f"cubin {i} is for sm_{sm}, the key's arch is {arch} (sm_{want})"
    return None


_PTX_TARGET = re.compile(rb"^\.target\s+sm_(\d+)([af]?)\b", re.M)


def ptx_targets(library: bytes) -> list[str]:
    """The `.target` of each PTX module embedded in a library (`sm_80`), in file order."""
    return [f"sm_{m.group(1).decode()}{m.group(2).decode()}" for m in _PTX_TARGET.finditer(library)]


_PTX_VERSION = re.compile(rb"^\.version\s+(\d{1,2})\.(\d{1,2})\b", re.M)


def ptx_versions(library: bytes) -> list[str]:
    """The PTX ISA version (`.version 9.4`, read as "9.4") of each PTX module embedded in
    a library, in file order; read as `ptx_targets` reads the `.target`."""
    return [f"{int(m.group(1))}.{int(m.group(2))}" for m in _PTX_VERSION.finditer(library)]


def ptx_isa(library: bytes) -> str | None:
    """The PTX ISA a driver must know to compile every PTX module of a library: the
    highest `.version` in it ("9.4"), None when it carries none."""
    found = ptx_versions(library)
    return max(found, key=lambda v: tuple(int(x) for x in v.split("."))) if found else None


def ptx_problem(library: bytes, sm: int, arch: str) -> str | None:
    """Why a library cannot be a `compute_<sm>` entry: it carries a cubin (machine code for
    one GPU, not portable), no PTX, or PTX for another target; None when it carries PTX
    for exactly `sm_<sm>` and nothing else."""
    found = cubins(library)
    if found:
        return f"it carries {len(found)} cubin(s), the key's arch {arch} is portable PTX only"
    targets = ptx_targets(library)
    if not targets:
        return f"it carries no PTX, the key's arch is {arch}"
    other = [t for t in targets if t != f"sm_{sm}"]
    if other:
        return f"its PTX targets {other[0]}, the key's arch is {arch} (.target sm_{sm})"
    return None
