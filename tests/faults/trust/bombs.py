"""Hostile archives for the unpack-bounds tests (test_unpack_bounds.py), built from a genuine pack.

Each is a genuine `cutecc pack` (11 entries) with one thing changed, so a bounded,
per-entry unpack refuses that one thing and imports the rest:

  gz-1GiB / xz-1GiB  one entry's kernel.so is 1 GiB of zeros (the archive: ~4.5 MB)
  sparse-1GiB        the same as a GNU sparse member: one header, no data (GNU tar)
  zip-1GiB           the wheel, with that kernel.so 1 GiB of deflated zeros
  members-200k       200,000 one-byte members beside the pack's (archive-level cap)
  reversed+1GiB-pad  a 1 GiB member of zeros first, then the pack's members in reverse
                     order: a CPU bomb for a reader that seeks back to each member

Used by tests/faults/trust/test_unpack_bounds.py and tools/measure_unpack.py.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

GIB = 1 << 30
_CHUNK = bytes(1 << 20)


class Zeros(io.RawIOBase):
    """`size` zero bytes, streamed (never held in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        n = min(len(b), self.left)
        b[:n] = bytes(n) if n < len(_CHUNK) else _CHUNK[:n]
        self.left -= n
        return n


def _victim(files: dict[str, bytes]) -> str:
    """The member replaced by the bomb: the first entry's kernel.so."""
    return sorted(n for n in files if n.endswith("/kernel.so"))[0]


def tar_with_big_member(legit: dict[str, bytes], dest: Path, mode: str, size: int = GIB) -> Path:
    """`mode` "w:gz" or "w:xz": the pack with its first kernel.so replaced by `size` zeros."""
    victim = _victim(legit)
    kw = {"preset": 0} if mode == "w:xz" else {"compresslevel": 6}
    with tarfile.open(dest, mode, format=tarfile.PAX_FORMAT, **kw) as tf:
        for name in sorted(legit):
            ti = tarfile.TarInfo(name)
            ti.mode = 0o644
            if name == victim:
                ti.size = size
                tf.addfile(ti, io.BufferedReader(Zeros(size), 1 << 20))
            else:
                ti.size = len(legit[name])
                tf.addfile(ti, io.BytesIO(legit[name]))
    return dest


def tar_with_sparse_member(legit: dict[str, bytes], dest: Path, size: int = GIB) -> Path:
    """The pack with its first kernel.so a GNU sparse member of `size` bytes, all hole."""
    if not shutil.which("tar"):
        raise RuntimeError("GNU tar is needed to write a sparse member")
    victim = _victim(legit)
    with tempfile.TemporaryDirectory(dir=dest.parent) as d:
        for name, data in legit.items():
            p = Path(d) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if name == victim:
                with open(p, "wb") as f:
                    f.truncate(size)
            else:
                p.write_bytes(data)
        subprocess.run(["tar", "--sparse", "--format=gnu", "--owner=0", "--group=0", "-czf",
                        str(dest), "-C", d, "_cutecc"], check=True)
    return dest


def zip_with_big_member(wheel: Path, dest: Path, size: int = GIB) -> Path:
    """The wheel with its first kernel.so replaced by `size` deflated zeros (~1 MB)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        victim = _victim({i.filename: b"" for i in src.infolist()})
        for info in src.infolist():
            if info.filename == victim:
                zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                zi.compress_type = zipfile.ZIP_DEFLATED
                with out.open(zi, "w", force_zip64=True) as f:
                    left = size
                    while left:
                        n = min(left, len(_CHUNK))
                        f.write(_CHUNK[:n])
                        left -= n
            else:
                out.writestr(info, src.read(info))
    return dest


def tar_with_many_members(legit: dict[str, bytes], dest: Path, n: int = 200_000) -> Path:
    """The pack plus `n` one-byte members under _cutecc/junk/."""
    with tarfile.open(dest, "w:gz", format=tarfile.GNU_FORMAT, compresslevel=1) as tf:
        for name in sorted(legit):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(legit[name]), 0o644
            tf.addfile(ti, io.BytesIO(legit[name]))
        one = b"x"
        for i in range(n):
            ti = tarfile.TarInfo(f"_cutecc/junk/{i:06d}")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(one))
    return dest


def tar_reversed_with_pad(legit: dict[str, bytes], dest: Path, pad: int = GIB) -> Path:
    """A `pad`-byte member of zeros first, then the pack's members in *reverse* name order: a
    reader that lists the members and then seeks back to each one (in name order) re-inflates
    the pad for every member; a single forward pass does not. A 5 MB CPU bomb."""
    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tf:
        ti = tarfile.TarInfo("_cutecc/0pad")
        ti.size = pad
        tf.addfile(ti, io.BufferedReader(Zeros(pad), 1 << 20))
        for name in sorted(legit, reverse=True):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(legit[name]), 0o644
            tf.addfile(ti, io.BytesIO(legit[name]))
    return dest


def make_all(legit_tar: Path, legit_wheel: Path, out: Path) -> dict[str, Path]:
    from conftest import read_tar

    legit = read_tar(legit_tar)
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "gz-1GiB": tar_with_big_member(legit, out / "gz-1GiB.tar.gz", "w:gz"),
        "xz-1GiB": tar_with_big_member(legit, out / "xz-1GiB.tar.xz", "w:xz"),
        "sparse-1GiB": tar_with_sparse_member(legit, out / "sparse-1GiB.tar.gz"),
        "zip-1GiB": zip_with_big_member(legit_wheel, out / "zip-1GiB.whl"),
        "members-200k": tar_with_many_members(legit, out / "members-200k.tar.gz"),
        "reversed+1GiB-pad": tar_reversed_with_pad(legit, out / "reversed-pad.tar.gz"),
    }
    return made


def sizes(paths: dict[str, Path]) -> dict[str, int]:
    return {k: os.path.getsize(v) for k, v in paths.items()}
