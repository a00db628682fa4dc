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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Limits:
    """Bounds on what reading an archive may cost; anything over them is refused, by name."""

    members: int = 50_000  # a 10,000-entry pack holds about 20,000
    member_bytes: int = 64 << 20  # a kernel library is about 1 MB
    total_bytes: int = 4 << 30  # declared, summed over the members read
    name_bytes: int = 512


class PackTree:
    """The regular files of a pack's `_cutecc/` tree, listed first (names and sizes only)
    and read one by one, each bounded: memory never holds more than one entry's files.

    Reading refuses (CuteccError naming the archive) too many members, a member or a total
    over the limits, and anything that is not a regular file; a member's bytes are read
    with a cap, so a size that lies is caught too.
    """

    def __init__(self, path: str | Path, limits: Limits | None = None) -> None:
        self.path = Path(path)
        self.limits = limits = limits or Limits()
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, Any] = {}
        try:
            if zipfile.is_zipfile(self.path):
                self._zip = zipfile.ZipFile(self.path)
                items = self._zip.infolist()
                self._count(len(items))
                listed = [(i.filename, i.file_size, i) for i in items if not i.is_dir()]
            else:
                self._tar = tarfile.open(self.path, "r:*")  # noqa: SIM115 (closed by close())
                listed = []
                n = 0
                while (m := self._tar.next()) is not None:
                    n += 1
                    self._count(n)
                    if m.isreg() and not m.issparse():
                        listed.append((m.name, m.size, m))
                    elif not m.isdir():
                        raise CuteccError(f"member {m.name[:80]!r} is not a regular file or directory",
                                          where=str(self.path))
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, ValueError) as e:
            self.close()
            raise CuteccError(f"cannot read the archive: {e}", where=str(self.path)) from None
        except BaseException:
            self.close()
            raise
        total = 0
        for name, size, info in listed:
            if len(name.encode()) > limits.name_bytes:
                self.close()
                raise CuteccError(f"a member name is over {limits.name_bytes} bytes", where=str(self.path))
            total += size
            if total > limits.total_bytes:
                self.close()
                raise CuteccError(f"members declare over {limits.total_bytes} bytes in all; "
                                  "raise --max-total-size to accept it", where=str(self.path))
            self._members[name] = (size, info)
        locks = [n for n in self._members
                 if n == f"{PACK_DIR}/{LOCK_NAME}" or n.endswith(f"/{PACK_DIR}/{LOCK_NAME}")]
        if len(locks) != 1:
            self.close()
            raise CuteccError(f"not a cutecc pack: expected one {PACK_DIR}/{LOCK_NAME}, found "
                              f"{len(locks)}", where=str(self.path))
        self.prefix = locks[0][: -len(LOCK_NAME)]
        self.names = sorted(n[len(self.prefix):] for n in self._members if n.startswith(self.prefix))

    def _count(self, n: int) -> None:
        if n > self.limits.members:
            raise CuteccError(f"over {self.limits.members} members; raise --max-members to accept it",
                              where=str(self.path))

    def size(self, name: str) -> int:
        return int(self._members[self.prefix + name][0])

    def read(self, name: str) -> bytes:
        """One member's bytes (ValueError if over the member limit, whatever it declared)."""
        size, info = self._members[self.prefix + name]
        cap = self.limits.member_bytes
        if size > cap:
            raise ValueError(f"{name} declares {size} bytes, over the {cap}-byte member limit")
        try:
            if self._zip is not None:
                with self._zip.open(info) as f:
                    data = f.read(cap + 1)
            else:
                assert self._tar is not None
                f = self._tar.extractfile(info)
                data = f.read(cap + 1) if f is not None else b""
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, RuntimeError) as e:
            raise ValueError(f"{name}: unreadable ({e})") from None
        if len(data) > cap or len(data) != size:
            raise ValueError(f"{name}: {len(data)} bytes read, {size} declared")
        return data

    def close(self) -> None:
        for a in (self._zip, self._tar):
            if a is not None:
                a.close()

    def __enter__(self) -> PackTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
