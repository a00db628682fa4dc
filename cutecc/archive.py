"""Reproducible wheels and tarballs, and reading them back.

Writing: sorted members, 1980-01-01 (zip) or epoch-0 (tar) times, fixed modes and
owners, so the same files give the same bytes. Reading: the regular files under a
pack's `_cutecc/` tree, whatever the container.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

from cutecc.errors import CuteccError
from cutecc.lockfile import LOCK_NAME
from cutecc.runtime.package import PACK_DIR

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def wheel_bytes(name: str, dist: str, version: str, *, tag: str, generator: str, requires: str,
                files: dict[str, bytes]) -> bytes:
    """A reproducible wheel of `files` (archive path -> bytes) with its dist-info."""
    info = f"{dist}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: CuTe DSL kernels prebuilt by cutecc\nRequires-Python: >=3.10\n"
            f"Requires-Dist: {requires}\n").encode(),
        f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: {generator}\n"
                          f"Root-Is-Purelib: false\nTag: {tag}\n").encode(),
    }
    ordered = [(n, files[n]) for n in sorted(files)] + [(n, meta[n]) for n in sorted(meta)]
    record = "".join(f"{n},sha256={_b64sha(d)},{len(d)}\n" for n, d in ordered)
    ordered.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, d in ordered:
            zi = zipfile.ZipInfo(n, date_time=_ZIP_EPOCH)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.create_system = 3  # Unix, so external_attr holds the mode
            zi.external_attr = 0o100644 << 16
            zf.writestr(zi, d)
    return buf.getvalue()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A reproducible .tar.gz of `files`: sorted, mtime 0, root-owned, mode 0644."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for n in sorted(files):
            ti = tarfile.TarInfo(n)
            ti.size, ti.mtime, ti.mode = len(files[n]), 0, 0o644
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            tf.addfile(ti, io.BytesIO(files[n]))
    return buf.getvalue()


def _b64sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_pack_tree(path: str | Path) -> dict[str, bytes]:
    """The regular files of a pack's `_cutecc/` tree (wheel or tarball), relative to it."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                raw = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
        else:
            with tarfile.open(path, "r:*") as tf:
                raw = {m.name: tf.extractfile(m).read()  # type: ignore[union-attr]
                       for m in tf.getmembers() if m.isreg()}
    except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise CuteccError(f"cannot read the archive: {e}", where=str(path)) from None
    locks = [n for n in raw if n == f"{PACK_DIR}/{LOCK_NAME}" or n.endswith(f"/{PACK_DIR}/{LOCK_NAME}")]
    if len(locks) != 1:
        raise CuteccError(f"not a cutecc pack: expected one {PACK_DIR}/{LOCK_NAME}, found "
                          f"{len(locks)}", where=str(path))
    prefix = locks[0][: -len(LOCK_NAME)]
    return {n[len(prefix):]: d for n, d in raw.items() if n.startswith(prefix)}
