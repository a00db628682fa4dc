"""`cutecc pack`: ship locked cache entries as a wheel or a tarball.

A pack holds a `_cutecc/` tree laid out like a cache (format file, `entries/ab/<key>/`
with meta.json and the library) plus the `kernels.lock` naming exactly its entries, and
under `fallbacks/` the pinned closure of every fallback the lock names (each file checked
against its pin here, and again by the deploy host before it runs).
The wheel puts it inside an import package whose `load()` is
`cutecc.load(package=__name__)`, so a deploy host needs only `pip install` and the
runtime. Both formats are reproducible (`cutecc.ship.archive`).
"""

from __future__ import annotations

import hashlib
import keyword
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.archs import parse_archs
from cutecc.atomic import atomic_write
from cutecc.commands.report import Report
from cutecc.contract.composite_line import CompositeLine
from cutecc.entry.meta import RuntimeLink, RuntimeMeta
from cutecc.entry.rules import (
    MAX_LIBRARY_BYTES,
    MAX_META_BYTES,
    STORE_FORMAT,
    is_file_name,
    parse_json,
    runtime_meta_problem,
)
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import LOCK_NAME, Lock, lock_for, read_lock
from cutecc.platforms import BUILD_PLATFORM, check_platform
from cutecc.runtime.package import FALLBACK_DIR, PACK_DIR
from cutecc.ship.archive import own_version, runtime_requires, runtime_wheel, tar_bytes, wheel_bytes
from cutecc.ship.ingest import Refused, check_whole
from cutecc.store.layout import entry_parts, member, meta_parts, runtime_parts
from cutecc.store.view import StoreView
from cutecc.toolchain.elf import manylinux_tag
from cutecc.units import human_size

# A wheel's tag: pure Python (the libraries are loaded by cutecc, not imported), and the
# manylinux platform its libraries' glibc symbol versions allow (`cutecc.toolchain.elf`).
WHEEL_TAG_PREFIX = "py3-none-"
FORMATS = ("wheel", "tar")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$")

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
class PackReport(Report):
    """What `pack` wrote: the file, its entries, and their sizes per arch."""

    path: Path
    format: str
    name: str
    package: str
    version: str
    lock: Lock
    sizes: dict[str, dict[str, int]]  # arch (or "runtime") -> {"entries": n, "bytes": uncompressed}
    file_bytes: int  # the wheel or tarball on disk
    platform: str = ""  # the manylinux platform tag the libraries allow (wheel and tarball alike)
    runtime: Path | None = None  # cutecc's own wheel, written beside a wheel
    wheelhouse: tuple[Path, ...] = ()  # the runtime's dependencies' wheels, written beside it

    @property
    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.sizes.values())

    def lines(self, verbose: int = 0) -> list[str]:
        out = []
        for arch, s in self.sizes.items():
            noun = ("library" if s["entries"] == 1 else "libraries") if arch == "runtime" else \
                "fallback files" if arch == FALLBACK_DIR else "entries"
            out.append(f"{arch:10} {s['entries']:4} {noun}  {human_size(s['bytes'])}")
        out.append(f"{'total':10} {len(self.lock.distinct_keys()):4} entries  "
                   f"{human_size(self.total_bytes)}")
        out.append(f"wrote {self.path} ({human_size(self.file_bytes)})")
        if self.runtime is not None:
            out.append(f"wrote {self.runtime} (the runtime it requires)")
        if self.wheelhouse:
            shown = ", ".join(p.name.split("-")[0] for p in self.wheelhouse)
            out.append(f"wrote {len(self.wheelhouse)} wheels of its dependencies ({shown}); on a host "
                       f"with no index: pip install --no-index --find-links {self.path.parent} {self.name}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "name": self.name,
                "package": self.package, "version": self.version,
                "entries": len(self.lock.distinct_keys()), "sizes": self.sizes,
                "total_bytes": self.total_bytes, "file_bytes": self.file_bytes,
                "platform": self.platform, "runtime": str(self.runtime) if self.runtime else None,
                "wheelhouse": [str(p) for p in self.wheelhouse],
                "kernels": sorted({e.kernel for e in self.lock.entries})}


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


def select(store: StoreView, *, manifest: str | Path | None = None, lock: str | Path | None = None,
           archs: Iterable[str] = (), kernels: Iterable[str] = ()) -> Lock:
    """The lock of what to pack: a manifest's planned entries, or a lock file's, filtered.

    Every entry must be in the cache with the library the lock names (else exit 1).
    Backward kernels of selected kernels come along (`jax.grad` needs them), a composite's
    launches with it, and so do the composite lines whose launches all come (each checked
    against the cache's contracts, `cutecc.ship.vouch`, as the lock that ships them is signed).
    """
    if (manifest is None) == (lock is None):
        raise CuteccError("pass exactly one of --manifest and --lock", where="cutecc pack")
    archs, kernels = tuple(archs), tuple(kernels)
    if manifest is not None:
        from cutecc.manifest import load_manifest
        from cutecc.plan.build_plan import plan

        m = load_manifest(manifest, kernels=kernels)
        planned = plan(m, parse_archs(archs) if archs else ())
        chosen = lock_for([(p.kernel.name, p.variant.id, p.arch, p.key) for p in planned], store)
        chosen = chosen.with_composites(CompositeLine(c.name, c.launches, c.inputs, c.outputs)
                                        for c in m.composites)
    else:
        full = read_lock(lock)  # type: ignore[arg-type]
        chosen = full.select(archs, kernels)
        if kernels:
            wanted = set(kernels)
            for entry, _ in chosen.resolve(store):
                if entry.recorded.backward is not None:
                    wanted.add(entry.recorded.backward)
            for c in full.composites:  # a composite asked for, or a selected kernel's backward
                if c.name in wanted:
                    wanted |= set(c.launches)
            chosen = full.select(archs, wanted)
    if not chosen.entries:
        raise CuteccError("nothing to pack: no entry matches the --arch/--kernel filters",
                          where=str(manifest or lock))
    for entry, le in chosen.resolve_all(store):  # tuned winners ship too, the rest of a space not
        why = le.mismatch(entry)
        if why:
            raise WorkError(f"{le.label}: {why}", where=str(entry.path))
    from cutecc.ship.vouch import composite_line_problem, tuning_line_problem

    for c in chosen.composites:  # the pack's signed lock vouches for how their tensors flow
        why = composite_line_problem(store, chosen, c, hashed=False, present=True)
        if why:
            raise WorkError(f"composite {c.name}: {why}; run `cutecc build`", where=str(lock or manifest))

    for t in chosen.tuning:  # a pack's lock vouches for its tuning lines too (and is signed)
        why = tuning_line_problem(store, t, None, hashed=False, present=True)
        if why:
            raise WorkError(f"tuning line {t.kernel}[{t.variant}]@{t.arch} {t.bucket} on {t.device}: "
                            f"{why}; run `cutecc build` (which drops it) or `cutecc tune` again",
                            where=str(lock or manifest))
    return chosen


def pack(*, name: str, version: str, manifest: str | Path | None = None,
         lock: str | Path | None = None, archs: Iterable[str] = (), kernels: Iterable[str] = (),
         out: str | Path = ".", cache_dir: str | Path | None = None,
         fmt: str = "wheel", sign_key: str | Path | None = None,
         platform: str | None = None, with_runtime: bool = True, wheelhouse: bool = False,
         with_jax: bool = False, python_version: str | None = None) -> PackReport:
    """Write a wheel (or a .tar.gz) of the selected entries into `out`; see the module doc.
    A wheel holds one host platform's libraries (its tag names it): `platform`, which may
    be left out when the selection holds one platform only. `with_runtime`: also write
    cutecc's own wheel (`cutecc.ship.archive.runtime_wheel`) beside a wheel, so the pack's
    `Requires-Dist: cutecc` is met from the same directory where no index serves cutecc.
    `wheelhouse`: also the wheels of the runtime's dependencies for the pack's platform and
    CPython `python_version` (default: this one's), JAX's only `with_jax`
    (`cutecc.ship.wheelhouse`), so the directory installs with pip's `--no-index`."""
    if fmt not in FORMATS:
        raise CuteccError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})", where="--format")
    if wheelhouse and (fmt != "wheel" or not with_runtime):
        raise CuteccError("a wheelhouse is for a wheel and its runtime wheel (not --format tar or "
                          "--no-runtime-wheel)", where="--wheelhouse")
    if (with_jax or python_version) and not wheelhouse:
        raise CuteccError("--with-jax and --python-version choose a wheelhouse's wheels: add --wheelhouse",
                          where="--with-jax" if with_jax else "--python-version")
    if python_version is not None:
        from cutecc.ship.wheelhouse import check_python

        check_python(python_version)
    dist, package = names(name, version)
    store = StoreView(cache_dir).require()
    store.check_trust()
    chosen = select(store, manifest=manifest, lock=lock, archs=archs, kernels=kernels)
    if platform is not None:
        chosen = chosen.select(platforms=[check_platform(platform, "--platform")])
        if not chosen.entries:
            raise CuteccError(f"nothing selected is built for {platform}", where="--platform")
    elif len(chosen.platforms) > 1:
        raise CuteccError(f"the selection holds entries for {' and '.join(chosen.platforms)}; a wheel "
                          "is for one host platform: pass --platform", where="pack")
    tree, sizes = _tree(chosen, store)
    _add_fallbacks(tree, sizes, chosen, store, _fallback_roots(manifest, lock))
    if sign_key:  # the packed lock's signature: what `unpack` and `load(package=)` check
        from cutecc.lock import signing

        key = signing.read_signing_key(sign_key)
        tree[LOCK_NAME + signing.SIG_SUFFIX] = signing.sign(tree[LOCK_NAME], key, "lock")
    platform = manylinux_tag((k, v) for k, v in sorted(tree.items()) if k.endswith(".so"))
    tag = WHEEL_TAG_PREFIX + platform
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "wheel":
        path = out / f"{dist}-{version}-{tag}.whl"
        init = _INIT.format(name=name, version=version, package=package,
                            archs=", ".join(sorted(a for a in sizes if a != "runtime")),
                            kernels=tuple(sorted({*(e.kernel for e in chosen.entries),
                                                  *(c.name for c in chosen.composites)})),
                            first=min(e.kernel for e in chosen.entries))
        own = own_version()
        data = wheel_bytes(name, dist, version, tag=tag, generator=f"cutecc {own}", requires=f"cutecc>={own}",
                           files={f"{package}/__init__.py": init.encode(),
                                  **{f"{package}/{PACK_DIR}/{k}": v for k, v in tree.items()}})
    else:
        path = out / f"{dist}-{version}.cutecc.tar.gz"
        data = tar_bytes({f"{PACK_DIR}/{k}": v for k, v in tree.items()})
    atomic_write(path, data)
    runtime_path = None
    if fmt == "wheel" and with_runtime:
        runtime_name, runtime_data = runtime_wheel()
        runtime_path = out / runtime_name
        atomic_write(runtime_path, runtime_data)
    deps: list[Path] = []
    if wheelhouse:
        from cutecc.ship import wheelhouse as house

        host = chosen.platforms[0] if chosen.platforms else BUILD_PLATFORM
        py = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
        deps = house.fill(out, runtime_requires(), platform=host, python=py, with_jax=with_jax)
    return PackReport(path, fmt, name, package, version, chosen, sizes, len(data), platform,
                      runtime_path, tuple(deps))


def _tree(chosen: Lock, store: StoreView) -> tuple[dict[str, bytes], dict[str, dict[str, int]]]:
    """The `_cutecc/` files (relative path -> bytes), each verified, and sizes per arch (the
    runtime libraries, each packed once, under "runtime")."""
    # The pack's lock names its entries; the build environment the lock was planned in is
    # build-side (`lockfile.Environment`): left out, so a pack is the same bytes whether it
    # was selected from a manifest or a lock.
    tree = {"format": f"{STORE_FORMAT}\n".encode(), LOCK_NAME: chosen.with_environment(None).dumps()}
    sizes: dict[str, dict[str, int]] = {}
    runtimes: dict[str, RuntimeLink] = {}
    for entry, le in chosen.resolve_all(store):  # the entries and the tuned winners
        parts = entry_parts(entry.key)  # the pack's tree is a cache's
        meta_bytes = _read(store, meta_parts(parts), MAX_META_BYTES, le.label)
        try:  # the one verifier's rule, on exactly the bytes that go into the pack
            files = {n: _read(store, (*parts, n), r["size"], le.label)
                     for n, r in sorted(entry.recorded.files.items()) if is_file_name(n)}
            meta = check_whole(entry.key, meta_bytes, files, MAX_LIBRARY_BYTES)
            why = None if meta == entry.doc else "meta.json changed while packing"
        except (Refused, KeyError, TypeError, AttributeError) as e:
            why = e.why if isinstance(e, Refused) else f"malformed meta.json ({type(e).__name__})"
        if why:
            raise WorkError(f"{le.label}: {why}; run `cutecc verify --fix` and rebuild",
                            where=str(entry.path))
        tree[member(meta_parts(parts))] = meta_bytes
        for fname, data in files.items():
            tree[member((*parts, fname))] = data
        s = sizes.setdefault(le.arch, {"entries": 0, "bytes": 0})
        s["entries"] += 1
        s["bytes"] += len(meta_bytes) + sum(len(v) for v in files.values())
        link = entry.meta.runtime  # check_whole checked the metadata: typed here
        runtimes.setdefault(link.key, link)
    for key, rec in sorted(runtimes.items()):
        parts = runtime_parts(key)
        what = f"runtime library {rec.library}"
        meta_bytes = _read(store, meta_parts(parts), MAX_META_BYTES, what)
        try:
            meta = parse_json(meta_bytes)
        except ValueError as e:
            meta = {"format": f"unreadable: {e}"}
        why = runtime_meta_problem(meta, key)
        library = None if why else RuntimeMeta.parse(meta, key).library.name
        data = b"" if library is None else _read(store, (*parts, library), rec.size, what)
        if not why and (len(data) != rec.size or hashlib.sha256(data).hexdigest() != rec.sha256):
            why = "does not match the SHA-256 its entries record"
        if why or library is None:
            raise WorkError(f"{what}: {why}; run `cutecc verify --fix` and `cutecc build`",
                            where=str(store.layout.runtime(key)))
        tree[member(meta_parts(parts))] = meta_bytes
        tree[member((*parts, library))] = data
        s = sizes.setdefault("runtime", {"entries": 0, "bytes": 0})
        s["entries"] += 1
        s["bytes"] += len(meta_bytes) + len(data)
    return tree, dict(sorted(sizes.items(), key=lambda kv: (kv[0] == "runtime", kv[0])))




def _fallback_roots(manifest: str | Path | None, lock: str | Path | None) -> list[Path]:
    """Where the fallbacks' closures are looked for first: the manifest's python_path, or
    the lock's directory (then the build records' python_path and `sys.path`)."""
    if manifest is not None:
        from cutecc.manifest import load_manifest

        return list(load_manifest(manifest).python_path)
    return [Path(lock).resolve().parent] if lock is not None else []


def _add_fallbacks(tree: dict[str, bytes], sizes: dict[str, dict[str, int]], chosen: Lock,
                   store: StoreView, roots: list[Path]) -> None:
    """The pinned closure of every fallback the pack's lock names, each file checked
    against its pin (`cutecc.runtime.fallback_code.check_closure`), at `fallbacks/<path>`
    in the tree: a deploy host serves a miss from these bytes (`load(package=)`)."""
    from cutecc.errors import NoBuildFits
    from cutecc.runtime.fallback_code import check_closure

    found: dict[str, tuple[str, bytes]] = {}
    for le in chosen.entries:
        for fld, ref in le.fallbacks:
            where = f"{le.label}: {fld} {ref.ref}"
            extra: list[Path] = []
            try:
                gen = store.generation_fallbacks(le.kernel, le.arch)
                extra = [Path(r) for r in gen.roots] if gen is not None else []
            except (CuteccError, trust.Untrusted):
                pass
            search = [*roots, *extra, *(Path(p or ".") for p in sys.path if isinstance(p, str))]
            try:
                files = check_closure(ref, search, where, "its lock line")
            except NoBuildFits as e:
                raise WorkError(f"cannot pack its fallback: {e.message}", where=where) from None
            for c, f in zip(files, ref.files):
                name = f"{FALLBACK_DIR}/{f.path}"
                if name in found and found[name][0] != c.sha256:
                    raise WorkError(f"two fallbacks pin {f.path} with other bytes ({found[name][0][:12]} "
                                    f"and {c.sha256[:12]}); build the kernels together so that one "
                                    "lock pins one file", where=where)
                found[name] = (c.sha256, c.data)
    if found:
        for name, (_, data) in sorted(found.items()):
            tree[name] = data
        sizes[FALLBACK_DIR] = {"entries": len(found), "bytes": sum(len(d) for _, d in found.values())}


def _read(store: StoreView, parts: tuple[str, ...], max_bytes: int, label: str) -> bytes:
    """A file of the cache through checked directories (`cutecc.trust`), bounded."""
    try:
        return trust.read_file(store.root, parts, max_bytes)
    except OSError as e:
        raise WorkError(f"{label}: cannot read {parts[-1]}: {e.strerror}; run `cutecc verify --fix` "
                        "and rebuild", where=str(store.root.joinpath(*parts))) from None
