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
import os
import re
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import LOCK_NAME
from cutecc.runtime.package import PACK_DIR

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_WHEEL_INFO = re.compile(r"[^/]+\.dist-info/(METADATA|WHEEL|RECORD)")  # what wheel_bytes adds
TWICE = "appears twice in the archive"


def wheel_bytes(name: str, dist: str, version: str, *, tag: str, generator: str,
                requires: str | Sequence[str], files: dict[str, bytes],
                summary: str = "CuTe DSL kernels prebuilt by cutecc", extras: Sequence[str] = (),
                purelib: bool = False, info: dict[str, bytes] | None = None) -> bytes:
    """A reproducible wheel of `files` (archive path -> bytes) with its dist-info (`info`:
    more dist-info files, e.g. entry_points.txt)."""
    dist_info = f"{dist}-{version}.dist-info"
    reqs = [requires] if isinstance(requires, str) else list(requires)
    meta = {
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: {summary}\nRequires-Python: >=3.10\n"
            + "".join(f"Provides-Extra: {e}\n" for e in extras)
            + "".join(f"Requires-Dist: {r}\n" for r in reqs)).encode(),
        f"{dist_info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: {generator}\n"
                               f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n").encode(),
        **{f"{dist_info}/{n}": d for n, d in (info or {}).items()},
    }
    ordered = [(n, files[n]) for n in sorted(files)] + [(n, meta[n]) for n in sorted(meta)]
    record = "".join(f"{n},sha256={_b64sha(d)},{len(d)}\n" for n, d in ordered)
    ordered.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, d in ordered:
            zi = zipfile.ZipInfo(n, date_time=_ZIP_EPOCH)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.create_system = 3  # Unix, so external_attr holds the mode
            zi.external_attr = 0o100644 << 16
            zf.writestr(zi, d)
    return buf.getvalue()


RUNTIME_WHEEL_SUFFIXES = (".py", ".c", ".typed")  # cutecc's package files: sources, native sources


def own_version() -> str:
    """cutecc's installed version (`cutecc.__version__`, which the top-level package, above
    every layer, looks up the same way); `0+unknown` in a source tree never installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version("cutecc")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def runtime_wheel() -> tuple[str, bytes]:
    """cutecc's own wheel, made from the package this process runs (its file name, bytes):
    what `cutecc pack` writes beside a pack, so a deploy host with no index that serves
    cutecc installs the runtime its pack requires from the same directory. Pure Python; its
    metadata (dependencies, extras, the `cutecc` command) is the installed distribution's,
    or, run from a source checkout that is not installed, its `pyproject.toml`'s."""
    root = Path(__file__).parent.parent  # the cutecc package this process runs
    files = {f"cutecc/{p.relative_to(root).as_posix()}": p.read_bytes()
             for p in sorted(root.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix in RUNTIME_WHEEL_SUFFIXES}
    summary, requires, extras = _own_metadata(root)
    version = own_version()
    data = wheel_bytes("cutecc", "cutecc", version, tag="py3-none-any", generator=f"cutecc {version}",
                       requires=requires, files=files, summary=summary, extras=extras, purelib=True,
                       info={"entry_points.txt": b"[console_scripts]\ncutecc = cutecc.cli:main\n"})
    return f"cutecc-{version}-py3-none-any.whl", data


def runtime_requires() -> list[str]:
    """The Requires-Dist of cutecc's runtime wheel (`runtime_wheel`), extras' included."""
    return _own_metadata(Path(__file__).parent.parent)[1]  # the cutecc package this process runs


def _own_metadata(package: Path) -> tuple[str, list[str], list[str]]:
    """cutecc's summary, Requires-Dist and extras: the installed distribution's, else those
    of the checkout's pyproject.toml beside `package`; neither is an error (nothing written)."""
    import importlib.metadata as md

    try:
        # an email.message.Message at run time (typeshed's PackageMetadata declares no .get)
        meta = cast(Any, md.metadata("cutecc"))
        return (meta.get("Summary") or "cutecc", meta.get_all("Requires-Dist") or [],
                meta.get_all("Provides-Extra") or [])
    except md.PackageNotFoundError:
        pass
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        project = tomllib.loads((package.parent / "pyproject.toml").read_text())["project"]
        extras = project.get("optional-dependencies", {})
        requires = list(project.get("dependencies", []))
        for extra, reqs in sorted(extras.items()):
            for r in reqs:
                spec, _, marker = r.partition(";")
                m = marker.strip()
                m = f"({m})" if " or " in m else m
                cond = (f"{m} and " if m else "") + f'extra == "{extra}"'
                requires.append(f"{spec.strip()}; {cond}")
        return str(project.get("description", "cutecc")), requires, sorted(extras)
    except (OSError, KeyError, ValueError) as e:
        raise WorkError(f"cannot tell cutecc's own dependencies (not installed, and no readable "
                        f"pyproject.toml beside the package: {e}); pass --no-runtime-wheel",
                        where=str(package)) from None


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


def _drain(f: Any) -> None:
    """Read past a member nobody will use (its size already counted against the total)."""
    if f is not None:
        while f.read(1 << 22):
            pass


class PackTree:
    """The regular files of a pack's `_cutecc/` tree, read under limits so that no archive
    can cost unbounded memory or time.

    A wheel (zip) is read in place: its directory lists every member, and each is inflated
    on its own when read. A tarball is read in one forward pass (a compressed tar cannot be
    read backwards without inflating it again from the start): each regular member within
    the limits is copied into `staging` (a directory on disk that the caller owns), so
    memory holds one member at a time and time grows with the archive's size, whatever the
    members' order. Too many members or too many bytes in all refuse the archive
    (CuteccError naming it); a member that is too large, not a regular file or present
    twice is recorded in `bad` and refuses only the entry it belongs to. A size that lies
    is caught when read. `outside` lists the members that are neither in the tree nor the
    container's own (a wheel's dist-info and package `__init__.py`): a pack is ours, so
    the reader refuses them by name, whatever the container.
    """

    def __init__(self, path: str | Path, limits: Limits | None = None,
                 staging: Path | None = None) -> None:
        self.path = Path(path)
        self.limits = limits = limits or Limits()
        self.bad: dict[str, str] = {}  # member name (relative to the tree) -> why unreadable
        self._zip: zipfile.ZipFile | None = None
        self._members: dict[str, tuple[int, Any]] = {}  # name -> (size, ZipInfo | staged Path)
        try:
            if zipfile.is_zipfile(self.path):
                self._list_zip()
            else:
                if staging is None:
                    raise CuteccError("reading a tarball needs a staging directory", where=str(self.path))
                self._stream_tar(staging)
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, ValueError) as e:
            self.close()
            raise CuteccError(f"cannot read the archive: {e}", where=str(self.path)) from None
        except BaseException:
            self.close()
            raise
        locks = [n for n in self._members
                 if n == f"{PACK_DIR}/{LOCK_NAME}" or n.endswith(f"/{PACK_DIR}/{LOCK_NAME}")]
        if len(locks) != 1:
            self.close()
            raise CuteccError(f"not a cutecc pack: expected one {PACK_DIR}/{LOCK_NAME}, found "
                              f"{len(locks)}", where=str(self.path))
        self.prefix = locks[0][: -len(LOCK_NAME)]
        own: set[str] = set() if self._zip is None else {self.prefix[: -len(PACK_DIR) - 1] + "__init__.py"}
        self.outside = sorted(n for n in {*self._members, *self.bad} if not n.startswith(self.prefix)
                              and n not in own and not (own and _WHEEL_INFO.fullmatch(n)))
        self.names = sorted(n[len(self.prefix):] for n in self._members if n.startswith(self.prefix))
        self.bad = {n[len(self.prefix):]: why for n, why in self.bad.items() if n.startswith(self.prefix)}

    def _admit(self, name: str, size: int, total: int) -> bool:
        """Whether a member may be read; refuses the whole archive over the totals."""
        if len(name.encode()) > self.limits.name_bytes:
            raise CuteccError(f"a member name is over {self.limits.name_bytes} bytes", where=str(self.path))
        if total > self.limits.total_bytes:
            raise CuteccError(f"members declare over {self.limits.total_bytes} bytes in all; "
                              "raise --max-total-size to accept it", where=str(self.path))
        if size > self.limits.member_bytes:
            self.bad[name] = f"declares {size} bytes, over the {self.limits.member_bytes}-byte member limit"
            return False
        return True

    def _list_zip(self) -> None:
        self._zip = zipfile.ZipFile(self.path)
        items = self._zip.infolist()
        self._count(len(items))
        total = 0
        for i in items:
            if i.is_dir():
                continue
            total += i.file_size
            if self._admit(i.filename, i.file_size, total):
                self._add(i.filename, i.file_size, i)

    def _stream_tar(self, staging: Path) -> None:
        total = n = 0
        # Seekable mode, read strictly forward: its decompressors inflate in bounded steps
        # (stream mode inflates a whole compressed buffer at once: ~100 MB of zeros per read).
        with tarfile.open(self.path, "r:*") as tf:
            while (m := tf.next()) is not None:
                n += 1
                self._count(n)
                if m.isdir():
                    continue
                if not m.isreg() or m.issparse():
                    self.bad[m.name] = "not a regular file"
                    continue
                total += m.size
                if not self._admit(m.name, m.size, total):
                    _drain(tf.extractfile(m))  # in large reads: tarfile's own skip is slow
                    continue
                f = tf.extractfile(m)
                data = f.read(self.limits.member_bytes + 1) if f is not None else b""
                if len(data) != m.size:
                    self.bad[m.name] = f"{len(data)} bytes read, {m.size} declared"
                    continue
                if m.name in self._members or m.name in self.bad:
                    self._add(m.name, m.size, None)
                    continue
                staged = staging / str(n)
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                self._add(m.name, m.size, staged)

    def _add(self, name: str, size: int, info: Any) -> None:
        """Record a readable member; one whose name came before is bad, in every kind of
        archive (neither copy is chosen)."""
        if name in self._members or name in self.bad:
            self.bad[name] = TWICE
        else:
            self._members[name] = (size, info)

    def _count(self, n: int) -> None:
        if n > self.limits.members:
            raise CuteccError(f"over {self.limits.members} members; raise --max-members to accept it",
                              where=str(self.path))

    def size(self, name: str) -> int:
        return int(self._members[self.prefix + name][0])

    def read(self, name: str) -> bytes:
        """One member's bytes (ValueError if unreadable or over the member limit)."""
        if name in self.bad:
            raise ValueError(f"{name}: {self.bad[name]}")
        size, info = self._members[self.prefix + name]
        cap = self.limits.member_bytes
        try:
            if isinstance(info, Path):
                with open(info, "rb") as f:
                    data = f.read(cap + 1)
            else:
                assert self._zip is not None
                with self._zip.open(info) as f:
                    data = f.read(cap + 1)
        except (OSError, EOFError, zipfile.BadZipFile, RuntimeError) as e:
            raise ValueError(f"{name}: unreadable ({e})") from None
        if len(data) > cap or len(data) != size:
            raise ValueError(f"{name}: {len(data)} bytes read, {size} declared")
        return data

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> PackTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
