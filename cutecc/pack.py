"""`cutecc pack` / `cutecc unpack`: ship locked cache entries as a wheel or a tarball.

A pack holds a `_cutecc/` tree laid out like a cache (format file, `entries/ab/<key>/`
with meta.json and the library) plus the `kernels.lock` naming exactly its entries.
The wheel puts it inside an import package whose `load()` is
`cutecc.load(package=__name__)`, so a deploy host needs only `pip install` and the
runtime. Both formats are reproducible: the same entries give byte-identical files
(sorted members, fixed times and modes, no timestamps). `unpack` imports a pack's
entries into a cache, each verified against its meta.json and the lock first.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import keyword
import os
import re
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.lockfile import LOCK_NAME, Lock, LockEntry, lock_for, read_lock
from cutecc.store import ENTRY_FORMAT, META, STORE_FORMAT, Entry, Store, atomic_write, read_only_from_env

PACK_DIR = "_cutecc"
WHEEL_TAG = "py3-none-linux_x86_64"  # the libraries are x86-64 Linux shared objects
FORMATS = ("wheel", "tar")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$")
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_KEY = re.compile(r"^[0-9a-f]{64}$")

_INIT = '''\
"""CuTe DSL kernels prebuilt by cutecc: {name} {version} ({archs}).

`load(**kw)` is `cutecc.load(package=__name__, **kw)`: the packed kernels usable on this
GPU (or on `arch="sm_90a"` etc. to lower without one). The kernels are also attributes of
this module, loaded on first access for this machine's GPU: `{package}.{first}(...)`.
"""

from __future__ import annotations

import threading
from typing import Any

__version__ = {version!r}
KERNELS = {kernels!r}
_lock = threading.Lock()
_default: Any = None


def load(**kw: Any) -> Any:
    """The packed kernels as a `cutecc` KernelSet; see `cutecc.load`."""
    import cutecc

    return cutecc.load(package=__name__, **kw)


def __getattr__(name: str) -> Any:
    global _default
    if name not in KERNELS:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    with _lock:
        if _default is None:
            _default = load()
    return getattr(_default, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(KERNELS))
'''


@dataclass
class PackReport:
    """What `pack` wrote: the file, its entries, and their sizes per arch."""

    path: Path
    format: str
    name: str
    package: str
    version: str
    lock: Lock
    sizes: dict[str, dict[str, int]]  # arch -> {"entries": n, "bytes": uncompressed bytes}
    file_bytes: int  # the wheel or tarball on disk

    @property
    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.sizes.values())

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "name": self.name,
                "package": self.package, "version": self.version,
                "entries": len(self.lock.distinct_keys()), "sizes": self.sizes,
                "total_bytes": self.total_bytes, "file_bytes": self.file_bytes,
                "kernels": sorted({e.kernel for e in self.lock.entries})}


@dataclass
class UnpackReport:
    """What `unpack` did with each entry of an archive."""

    cache_dir: Path
    imported: list[str] = field(default_factory=list)  # "label key" of entries published
    present: list[str] = field(default_factory=list)  # already in the cache
    refused: list[tuple[str, str]] = field(default_factory=list)  # ("label key", why)

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "imported": self.imported,
                "present": self.present,
                "refused": [{"entry": e, "reason": r} for e, r in self.refused]}


def names(name: str, version: str) -> tuple[str, str]:
    """(file-name form of the distribution, import package) for NAME; bad input: exit 2."""
    if not _NAME.match(name):
        raise CuteccError(f"{name!r} is not a valid distribution name (letters, digits, . _ -)",
                          where="--name")
    if not _VERSION.match(version):
        raise CuteccError(f"{version!r} is not a version such as 1.2.0, 1.2.0rc1 or 1.2.0+cu13",
                          where="--version")
    dist = re.sub(r"[-_.]+", "_", name).lower()
    if not dist.isidentifier() or keyword.iskeyword(dist) or dist == "cutecc":
        raise CuteccError(f"{name!r} does not give a usable import name ({dist!r})", where="--name")
    return dist, dist


def select(store: Store, *, manifest: str | Path | None = None, lock: str | Path | None = None,
           archs: Iterable[str] = (), kernels: Iterable[str] = ()) -> Lock:
    """The lock of what to pack: a manifest's planned entries, or a lock file's, filtered.

    Every entry must be in the cache with the library the lock names (else exit 1).
    Backward kernels of selected kernels come along (`jax.grad` needs them).
    """
    if (manifest is None) == (lock is None):
        raise CuteccError("pass exactly one of --manifest and --lock", where="cutecc pack")
    archs, kernels = tuple(archs), tuple(kernels)
    if manifest is not None:
        from cutecc.build import plan
        from cutecc.manifest import load_manifest, parse_archs

        m = load_manifest(manifest, kernels=kernels)
        planned = plan(m, parse_archs(archs) if archs else ())
        chosen = lock_for([(p.kernel.name, p.variant.id, p.arch, p.key) for p in planned], store)
    else:
        full = read_lock(lock)  # type: ignore[arg-type]
        chosen = full.select(archs, kernels)
        if kernels:
            wanted = set(kernels)
            for entry, _ in chosen.resolve(store):
                if isinstance(entry.meta.get("backward"), str):
                    wanted.add(entry.meta["backward"])
            chosen = full.select(archs, wanted)
    if not chosen.entries:
        raise CuteccError("nothing to pack: no entry matches the --arch/--kernel filters",
                          where=str(manifest or lock))
    for entry, le in chosen.resolve(store):
        why = le.mismatch(entry)
        if why:
            raise CuteccError(f"{le.label}: {why}", where=str(entry.path), exit_code=1)
    return chosen


def pack(*, name: str, version: str, manifest: str | Path | None = None,
         lock: str | Path | None = None, archs: Iterable[str] = (), kernels: Iterable[str] = (),
         out: str | Path = ".", cache_dir: str | Path | None = None,
         fmt: str = "wheel") -> PackReport:
    """Write a wheel (or a .tar.gz) of the selected entries into `out`; see the module doc."""
    if fmt not in FORMATS:
        raise CuteccError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})", where="--format")
    dist, package = names(name, version)
    store = Store(cache_dir)
    chosen = select(store, manifest=manifest, lock=lock, archs=archs, kernels=kernels)
    tree, sizes = _tree(chosen, store)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "wheel":
        path = out / f"{dist}-{version}-{WHEEL_TAG}.whl"
        init = _INIT.format(name=name, version=version, package=package,
                            archs=", ".join(sorted(sizes)),
                            kernels=tuple(sorted({e.kernel for e in chosen.entries})),
                            first=min(e.kernel for e in chosen.entries))
        data = wheel_bytes(name, dist, version, {f"{package}/__init__.py": init.encode(),
                                                 **{f"{package}/{PACK_DIR}/{k}": v
                                                    for k, v in tree.items()}})
    else:
        path = out / f"{dist}-{version}.cutecc.tar.gz"
        data = tar_bytes({f"{PACK_DIR}/{k}": v for k, v in tree.items()})
    atomic_write(path, data)
    return PackReport(path, fmt, name, package, version, chosen, sizes, len(data))


def _tree(chosen: Lock, store: Store) -> tuple[dict[str, bytes], dict[str, dict[str, int]]]:
    """The `_cutecc/` files (relative path -> bytes), each verified, and sizes per arch."""
    tree = {"format": f"{STORE_FORMAT}\n".encode(), LOCK_NAME: chosen.dumps()}
    sizes: dict[str, dict[str, int]] = {}
    for entry, le in chosen.resolve(store):
        base = f"entries/{entry.key[:2]}/{entry.key}"
        tree[f"{base}/{META}"] = (entry.path / META).read_bytes()
        for fname, rec in sorted(entry.meta.get("files", {}).items()):
            data = (entry.path / fname).read_bytes()
            if len(data) != rec.get("size") or hashlib.sha256(data).hexdigest() != rec.get("sha256"):
                raise CuteccError(f"{le.label}: {fname} does not match its recorded SHA-256; "
                                  "run `cutecc verify --fix` and rebuild", where=str(entry.path),
                                  exit_code=1)
            tree[f"{base}/{fname}"] = data
        s = sizes.setdefault(le.arch, {"entries": 0, "bytes": 0})
        s["entries"] += 1
        s["bytes"] += sum(len(v) for k, v in tree.items() if k.startswith(base + "/"))
    return tree, dict(sorted(sizes.items()))


def wheel_bytes(name: str, dist: str, version: str, files: dict[str, bytes]) -> bytes:
    """A reproducible wheel of `files` (archive path -> bytes) with its dist-info."""
    import cutecc

    info = f"{dist}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: CuTe DSL kernels prebuilt by cutecc\nRequires-Python: >=3.10\n"
            f"Requires-Dist: cutecc>={cutecc.__version__}\n").encode(),
        f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: cutecc {cutecc.__version__}\n"
                          f"Root-Is-Purelib: false\nTag: {WHEEL_TAG}\n").encode(),
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


# Reading packs -------------------------------------------------------------------


def package_root(package: str) -> Path:
    """The `_cutecc/` directory of an installed pack, found without importing anything."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise CuteccError(f"no installed package {package!r}; `pip install` its wheel",
                          where="cutecc.load package", exit_code=1)
    for loc in spec.submodule_search_locations:
        root = Path(loc) / PACK_DIR
        if (root / LOCK_NAME).is_file():
            return root
    raise CuteccError(f"package {package!r} is not a cutecc pack (no {PACK_DIR}/{LOCK_NAME})",
                      where="cutecc.load package", exit_code=1)


def read_archive(path: str | Path) -> dict[str, bytes]:
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


def unpack(archive: str | Path, cache_dir: str | Path | None = None) -> UnpackReport:
    """Import a pack's entries into a cache, each verified first, each published atomically.

    An entry whose files do not match its meta.json, or whose library does not match the
    pack's lock, is refused (reported, not imported); the others still land.
    """
    if read_only_from_env():
        raise CuteccError("read-only mode ($CUTECC_READ_ONLY): unpack writes to the cache",
                          where="cutecc unpack", exit_code=1)
    files = read_archive(archive)
    if files.get("format") != f"{STORE_FORMAT}\n".encode():
        raise CuteccError(f"pack format {files.get('format')!r}, this cutecc reads {STORE_FORMAT}",
                          where=f"{archive}: {PACK_DIR}/format")
    lock = Lock.loads(files[LOCK_NAME], f"{archive}: {PACK_DIR}/{LOCK_NAME}")
    store = Store(cache_dir)
    store.ensure()
    report = UnpackReport(store.root)
    by_key = lock.by_key()
    listed = {n.split("/")[2] for n in files if n.startswith("entries/") and n.count("/") == 3}
    for key in sorted(listed - set(by_key)):
        report.refused.append((key[:12], "not named by the pack's kernels.lock"))
    for key, le in sorted(by_key.items()):
        label = f"{le.label} {key[:12]}"
        base = f"entries/{key[:2]}/{key}/"
        mine = {n[len(base):]: d for n, d in files.items() if n.startswith(base)}
        meta, why = _check_entry(key, le, mine)
        if why:
            report.refused.append((label, why))
            continue
        _, built = store.publish(key, lambda staging, m=meta, f=mine: _stage(staging, m, f))
        (report.imported if built else report.present).append(label)
    return report


def _check_entry(key: str, le: LockEntry, files: dict[str, bytes]) -> tuple[dict[str, Any], str | None]:
    """(meta, None) if the entry's files match its meta.json and the lock, else (_, why)."""
    from cutecc.key import compute_key

    if not _KEY.match(key):
        return {}, "not a cache key"
    if META not in files:
        return {}, "missing from the archive" if not files else f"no {META}"
    try:
        meta = json.loads(files[META])
        recs = dict(meta["files"])
    except (ValueError, KeyError, TypeError):
        return {}, f"malformed {META}"
    if meta.get("format") != ENTRY_FORMAT:
        return meta, f"entry format {meta.get('format')!r}, this cutecc reads {ENTRY_FORMAT}"
    if meta.get("key") != key or compute_key(meta.get("key_inputs")) != key:
        return meta, f"{META} does not describe key {key[:12]}"
    got = set(files) - {META}
    if got != set(recs) or not all(_FILE.match(n) for n in got):
        return meta, f"files {sorted(got)} differ from those {META} lists {sorted(recs)}"
    for n in sorted(got):
        h = hashlib.sha256(files[n]).hexdigest()
        if h != recs[n].get("sha256") or len(files[n]) != recs[n].get("size"):
            return meta, f"{n}: SHA-256 {h[:16]}... does not match {META}'s; refusing it"
    why = le.mismatch(Entry(key, Path(), meta))
    return meta, why


def _stage(staging: Path, meta: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """Write a verified entry's files into the store's staging directory."""
    for n, d in files.items():
        if n != META:
            with open(staging / n, "wb") as f:
                f.write(d)
                f.flush()
                os.fsync(f.fileno())
    return {k: v for k, v in meta.items() if k not in ("files", "format", "key")}
