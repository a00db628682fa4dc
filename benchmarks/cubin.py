"""Find the CUDA ELF images (cubins) embedded in a host object or shared library, and
split an ELF into its named sections. Pure Python; ELF64 little-endian only."""

from __future__ import annotations

EM_CUDA = 190


def _u(b: bytes, off: int, n: int) -> int:
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
    return end


def cubins(blob: bytes) -> list[bytes]:
    """Every embedded ELF whose machine is EM_CUDA, in file order."""
    out, i = [], blob.find(b"\x7fELF", 1)
    while i >= 0:
        if _u(blob, i + 18, 2) == EM_CUDA:
            out.append(blob[i:i + elf_size(blob, i)])
        i = blob.find(b"\x7fELF", i + 1)
    return out


def sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> contents (empty for SHT_NOBITS)."""
    shoff, shent, shnum, shstr = _u(elf, 0x28, 8), _u(elf, 0x3A, 2), _u(elf, 0x3C, 2), _u(elf, 0x3E, 2)
    heads = [elf[shoff + i * shent: shoff + (i + 1) * shent] for i in range(shnum)]
    names_at = _u(heads[shstr], 0x18, 8)
    out = {}
    for h in heads:
        start = names_at + _u(h, 0, 4)
        name = elf[start:elf.index(b"\0", start)].decode()
        off, size = _u(h, 0x18, 8), _u(h, 0x20, 8)
        out[name] = b"" if _u(h, 4, 4) == 8 else elf[off:off + size]
    return out
