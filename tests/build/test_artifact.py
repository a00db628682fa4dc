"""cutecc.build.artifact: the digest of an exported compile (the whole file, and its cubins apart),
how two digests differ, and how meta.json's record of one is read back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cutecc import cubin
from cutecc.build.artifact import difference, digest
from cutecc.entry.rules import ArtifactRec, artifact_of


def _cuda_image(fill: int) -> bytes:
    """The smallest ELF `cutecc.cubin` takes for a cubin: a header of machine EM_CUDA and an
    empty section table, then `fill` as payload past its end (not part of the image)."""
    head = bytearray(b"\x7fELF" + bytes(60))
    head[18:20] = cubin.EM_CUDA.to_bytes(2, "little")
    head[0x28:0x30] = (64).to_bytes(8, "little")
    head[0x3A:0x3C] = (64).to_bytes(2, "little")
    head[0x16] = fill  # inside the header: images with different bytes
    return bytes(head)


def _object(tmp_path: Path, host: bytes, image: bytes) -> Path:
    path = tmp_path / "kernel.o"
    path.write_bytes(b"HOST" + host + image + b"TAIL")
    return path


def test_the_digest_covers_the_whole_file_and_the_device_code_apart(tmp_path: Path) -> None:
    a = digest(_object(tmp_path, b"one", _cuda_image(1)))
    data = (tmp_path / "kernel.o").read_bytes()
    assert a == ArtifactRec("kernel.o", hashlib.sha256(data).hexdigest(), len(data),
                            hashlib.sha256(hashlib.sha256(_cuda_image(1)).digest()).hexdigest())
    assert digest(_object(tmp_path, b"one", _cuda_image(1))) == a  # the same bytes, the same digest
    ir = tmp_path / "kernel.ll"
    ir.write_text("target triple = \"aarch64-unknown-linux-gnu\"\n")
    assert digest(ir).device_sha256 is None  # no cubin found: the whole file's hash stands alone


def test_a_difference_says_which_code_differs(tmp_path: Path) -> None:
    a = digest(_object(tmp_path, b"one", _cuda_image(1)))
    assert difference(a, a) is None
    host = digest(_object(tmp_path, b"two", _cuda_image(1)))
    why = difference(a, host)
    assert why is not None and "host code differs" in why and a.sha256[:16] in why and host.sha256[:16] in why
    device = digest(_object(tmp_path, b"one", _cuda_image(2)))
    why = difference(a, device)
    assert why is not None and "device code (cubin) differs" in why
    ir = ArtifactRec("kernel.ll", a.sha256, a.size, None)
    assert "exported kernel.ll" in (difference(a, ir) or "")


def test_a_recorded_digest_is_read_only_when_well_formed() -> None:
    good = {"file": "kernel.o", "sha256": "a" * 64, "size": 10, "device_sha256": "b" * 64}
    assert artifact_of({"artifact": good}) == ArtifactRec("kernel.o", "a" * 64, 10, "b" * 64)
    assert artifact_of({"artifact": {**good, "device_sha256": None}}) is not None
    assert artifact_of({}) is None  # built before digests were recorded
    for bad in ({**good, "sha256": "A" * 64}, {**good, "size": -1}, {**good, "size": True},
                {**good, "file": "../kernel.o"}, {**good, "extra": 1}, {**good, "device_sha256": 5},
                [good], "x"):
        assert artifact_of({"artifact": bad}) is None, bad


@pytest.mark.parametrize("size", [0, 1])
def test_an_empty_or_tiny_export_has_a_digest(tmp_path: Path, size: int) -> None:
    path = tmp_path / "kernel.o"
    path.write_bytes(b"x" * size)
    assert digest(path).size == size and digest(path).device_sha256 is None
