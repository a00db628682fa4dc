"""The CUDA ELF images (cubins) embedded in a kernel library, and the kernels they define.

A cutecc kernel library carries its device code as an embedded cubin (an ELF whose machine
is EM_CUDA). Its kernel functions' names are what a profiler reports for their launches, so
`cutecc tune` counts exactly a candidate's own kernels on the device clock, and the parity
benchmark compares cubins byte for byte. Pure Python, ELF64 little-endian only; the input
may be any bytes: every offset is bounds-checked and a malformed image yields nothing.
"""

from __future__ import annotations

EM_CUDA = 190
MAX_IMAGES = 64  # embedded ELFs looked at per library
MAX_SECTIONS = 1 << 16
_TEXT = ".text."


class BadImage(ValueError):
    """An ELF image whose headers point outside it."""


def _u(b: bytes, off: int, n: int) -> int:
    if off < 0 or off + n > len(b):
        raise BadImage(f"offset {off}+{n} outside {len(b)} bytes")
    return int.from_bytes(b[off:off + n], "little")


def elf_size(b: bytes, at: int = 0) -> int:
    """Bytes of the ELF image starting at `at`: the end of its furthest header or section."""
    shoff, shent, shnum = _u(b, at + 0x28, 8), _u(b, at + 0x3A, 2), _u(b, at + 0x3C, 2)
    phoff, phent, phnum = _u(b, at + 0x20, 8), _u(b, at + 0x36, 2), _u(b, at + 0x38, 2)
    end = max(shoff + shent * shnum, phoff + phent * phnum)
    for i in range(shnum):
        h = at + shoff + i * shent
        if _u(b, h + 4, 4) != 8:  # SHT_NOBITS occupies no bytes
            end = max(end, _u(b, h + 0x18, 8) + _u(b, h + 0x20, 8))
    if at + end > len(b):
        raise BadImage(f"an image of {end} bytes at {at} passes the end ({len(b)} bytes)")
    return end


def cubins(blob: bytes) -> list[bytes]:
    """Every well-formed embedded ELF whose machine is EM_CUDA, in file order (at most
    MAX_IMAGES; a malformed one is skipped)."""
    out: list[bytes] = []
    i = blob.find(b"\x7fELF", 1)
    while i >= 0 and len(out) < MAX_IMAGES:
        try:
            if _u(blob, i + 18, 2) == EM_CUDA:
                out.append(blob[i:i + elf_size(blob, i)])
        except BadImage:
            pass
        i = blob.find(b"\x7fELF", i + 1)
    return out


def sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> contents (empty for SHT_NOBITS); BadImage if the headers lie."""
    shoff, shent, shnum, shstr = _u(elf, 0x28, 8), _u(elf, 0x3A, 2), _u(elf, 0x3C, 2), _u(elf, 0x3E, 2)
    if shnum > MAX_SECTIONS or shstr >= max(shnum, 1) or shent < 0x40:
        raise BadImage(f"{shnum} sections, names in section {shstr}, {shent}-byte headers")
    heads = [(shoff + i * shent) for i in range(shnum)]
    names_at = _u(elf, heads[shstr] + 0x18, 8)
    out = {}
    for h in heads:
        start = names_at + _u(elf, h, 4)
        end = elf.find(b"\0", start)
        if start >= len(elf) or end < 0:
            raise BadImage(f"a section name at {start} is not terminated")
        try:
            name = elf[start:end].decode()
        except UnicodeDecodeError:
            raise BadImage(f"a section name at {start} is not text") from None
        off, size = _u(elf, h + 0x18, 8), _u(elf, h + 0x20, 8)
        if _u(elf, h + 4, 4) != 8 and off + size > len(elf):
            raise BadImage(f"section {name!r} passes the end of the image")
        out[name] = b"" if _u(elf, h + 4, 4) == 8 else elf[off:off + size]
    return out


def kernel_names(library: bytes) -> frozenset[str]:
    """The names of the kernel functions the library's cubins define (each has its code in
    section `.text.<name>`); empty when there is no well-formed cubin."""
    names: set[str] = set()
    for image in cubins(library):
        try:
            found = sections(image)
        except BadImage:
            continue
        names.update(n[len(_TEXT):] for n in found if n.startswith(_TEXT) and len(n) > len(_TEXT))
    return frozenset(names)
