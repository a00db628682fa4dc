"""cutecc.cubin: the kernels a library's embedded cubins define, from any bytes."""

from __future__ import annotations

import random

import pytest
from helpers import REPO, opts

from cutecc import cubin


@pytest.mark.usefixtures("dsl")
def test_kernel_names_of_a_built_library(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real build (axpy of the root manifest, compiled here on the CPU): one cubin, whose
    one kernel is named as the profiler names its launches; the same bytes damaged at
    random give names or none, never an exception."""
    pytest.importorskip("cutlass", reason="compiling needs the build extra")
    from cutecc.commands.build import build
    from cutecc.store import Store

    rep = build(REPO / "kernels.toml", opts(cache_dir=tmp_path / "c"), kernels=("axpy",), lock=False)
    assert all(o.error is None for o in rep.outcomes), [o.error for o in rep.outcomes]
    (e,) = [e for e in Store(tmp_path / "c").entries() if e.doc["kernel"] == "axpy"]
    data = (e.path / e.doc["library"]).read_bytes()
    assert len(cubin.cubins(data)) == 1
    (name,) = cubin.kernel_names(data)
    assert name.startswith("kernel_cutlass_") and name.isascii() and " " not in name
    rng = random.Random(1)
    at = data.find(b"\x7fELF", 1)
    for _ in range(300):
        bad = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            bad[at + rng.randrange(0, 256)] = rng.getrandbits(8)  # the cubin's headers
        assert isinstance(cubin.kernel_names(bytes(bad)), frozenset)


def test_malformed_bytes_give_no_names_and_no_crash() -> None:
    rng = random.Random(0)
    elf_cuda = bytearray(b"\x7fELF" + bytes(60))
    elf_cuda[18:20] = cubin.EM_CUDA.to_bytes(2, "little")
    elf_cuda[0x28:0x30] = (10**12).to_bytes(8, "little")  # section headers far past the end
    elf_cuda[0x3C:0x3E] = (3).to_bytes(2, "little")
    samples = [b"", b"\x7fELF", bytes(elf_cuda), b"junk" + bytes(elf_cuda) + b"junk"]
    samples += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 400))) for _ in range(200)]
    samples += [b"x" + bytes(elf_cuda[:n]) for n in range(0, 64, 7)]
    for s in samples:
        assert cubin.kernel_names(s) == frozenset()


def test_hostile_libraries_are_read_in_bounded_time() -> None:
    """Many EM_CUDA headers claiming 65,535 sections, and one image with thousands of
    sections and unterminated names: all refused quickly (they took seconds to days)."""
    import time

    head = bytearray(b"\x7fELF" + bytes(60))
    head[18:20] = cubin.EM_CUDA.to_bytes(2, "little")
    head[0x3A:0x3C] = (0).to_bytes(2, "little")  # zero-byte section headers
    head[0x3C:0x3E] = (0xFFFF).to_bytes(2, "little")
    many = b"x" + bytes(head) * 20_000  # 1.3 MB of claimed images
    names = bytearray(head)
    names[0x3A:0x3C] = (0x40).to_bytes(2, "little")
    names[0x3C:0x3E] = (4000).to_bytes(2, "little")
    names[0x28:0x30] = (64).to_bytes(8, "little")
    wide = b"x" + bytes(names) + b"\x01" * (4000 * 0x40 + (1 << 20))  # names never end
    t0 = time.perf_counter()
    assert cubin.kernel_names(many) == frozenset() and cubin.kernel_names(wide) == frozenset()
    assert time.perf_counter() - t0 < 60  # terminates (a bound, not a speed target): it took days
