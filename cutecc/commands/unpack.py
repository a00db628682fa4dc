"""`cutecc unpack`: import a pack's entries (wheel or tarball) into a cache.

Each entry is checked against its meta.json, its key and the pack's lock before it is
published atomically like a build; a bad entry is refused by name and the rest land.
The runtime libraries the entries link against come with them (each once): one is
checked against its own meta.json and key and against the SHA-256 every entry records
for it, and published before the entries that need it; an entry whose runtime library
is neither in the pack nor in the cache is refused. The lock's composite lines, signed with
it, are recorded in the cache (as a build records them) once every entry the lock pins of
their launches is there, so the cache offers them as the pack does.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.entry.meta import EntryMeta, RuntimeLink, RuntimeMeta
from cutecc.entry.rules import MAX_META_BYTES, META, STORE_FORMAT, is_key, parse_json, runtime_record
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import LOCK_NAME, MAX_LOCK_BYTES, Lock, LockEntry
from cutecc.lock.signing import MAX_SIG_BYTES, SIG_SUFFIX, check_lock
from cutecc.runtime.package import FALLBACK_DIR, PACK_DIR
from cutecc.ship.archive import Limits, PackTree
from cutecc.ship.ingest import Refused, check_whole, publish
from cutecc.store.build_records import CompositeRecord
from cutecc.store.layout import (
    ENTRIES,
    entry_parts,
    member,
    member_parts,
    meta_parts,
    runtime_parts,
)
from cutecc.store.writer import Store


@dataclass
class UnpackReport(Report):
    """What `unpack` did with each entry of an archive."""

    cache_dir: Path
    imported: list[str] = field(default_factory=list)  # "label key" of entries published
    runtimes: list[str] = field(default_factory=list)  # runtime libraries published
    present: list[str] = field(default_factory=list)  # already in the cache
    refused: list[tuple[str, str]] = field(default_factory=list)  # ("label key", why)
    composites: list[str] = field(default_factory=list)  # composite kernels recorded

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def warnings(self) -> list[str]:
        return [f"error: refused {e}: {why}" for e, why in self.refused]

    def lines(self, verbose: int = 0) -> list[str]:
        return [f"{len(self.imported)} imported, {len(self.present)} already present, "
                f"{len(self.refused)} refused ({self.cache_dir})"]

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "imported": self.imported,
                "present": self.present, "runtimes": self.runtimes, "composites": self.composites,
                "refused": [{"entry": e, "reason": r} for e, r in self.refused]}


def unpack(archive: str | Path, cache_dir: str | Path | None = None, *,
           limits: Limits | None = None, trusted_keys: list[str | Path] | None = None,
           allow_unsigned: bool | None = None, read_only: bool = False) -> UnpackReport:
    """Import a pack's entries into a cache, each verified first, each published atomically.

    The pack's lock must carry a signature by one of `trusted_keys` (else
    `$CUTECC_TRUSTED_KEYS`), unless the deployer opts out with `allow_unsigned`: an archive
    can only vouch for itself, a signature ties it to its builder. Reading is bounded
    (`limits`). An entry whose meta.json does not describe its key,
    whose files are not exactly the ones meta.json lists and matching it, or whose line in
    the pack's lock differs, is refused (reported, not imported); the others still land.
    """
    if read_only:  # `$CUTECC_READ_ONLY`, read at the edge
        raise WorkError("read-only mode ($CUTECC_READ_ONLY): unpack writes to the cache",
                        where="cutecc unpack")
    store = Store(cache_dir)
    store.ensure()
    tag = secrets.token_hex(8)  # its staging dir is swept only when nobody holds this lock
    with store.lock(tag), store.staging_dir(f"{tag}.unpack") as staging, \
            PackTree(archive, limits, staging) as tree:
        return _unpack(archive, tree, store, trusted_keys, allow_unsigned)


def _unpack(archive: str | Path, tree: PackTree, store: Store, trusted_keys: list[str | Path] | None,
            allow_unsigned: bool | None) -> UnpackReport:
    fmt = _read(tree, "format", 64)
    if fmt != f"{STORE_FORMAT}\n".encode():
        raise CuteccError(f"pack format {fmt!r}, this cutecc reads {STORE_FORMAT}",
                          where=f"{archive}: {PACK_DIR}/format")
    lock_bytes = _read(tree, LOCK_NAME, MAX_LOCK_BYTES)
    sig_name = LOCK_NAME + SIG_SUFFIX
    sig = _read(tree, sig_name, MAX_SIG_BYTES) if sig_name in tree.names else None
    where = f"{archive}: {PACK_DIR}/{LOCK_NAME}"
    check_lock(lock_bytes, sig, where, trusted_keys=trusted_keys, allow_unsigned=allow_unsigned)
    lock = Lock.loads(lock_bytes, where)
    report = UnpackReport(store.root)
    by_key = lock.by_key()
    entries: dict[str, list[str]] = {}
    runtimes: dict[str, list[str]] = {}
    for n in sorted({*tree.names, *tree.bad}):
        named = member_parts(n)
        if named is not None:  # a cache's layout
            area, key, file = named
            (entries if area == ENTRIES else runtimes).setdefault(key, []).append(file)
        elif n.startswith(f"{FALLBACK_DIR}/"):
            continue  # the fallbacks' closures serve an installed pack (`load(package=)`), not a cache
        elif n not in ("format", LOCK_NAME, sig_name):
            report.refused.append((n[:80], "not part of a cutecc pack's tree"))
    for n in tree.outside:
        report.refused.append((n[:80], f"outside the {PACK_DIR}/ tree: not part of a cutecc pack"))
    for key in sorted(set(entries) - set(by_key)):
        report.refused.append((key[:12], "not named by the pack's kernels.lock"))
    needed: dict[str, RuntimeLink] = {}  # the runtime libraries the entries name
    for key, le in sorted(by_key.items()):  # from their meta.json only (small; each entry is
        rec = _runtime_named(tree, key)  # checked whole below), as far as the lock vouches
        if rec is not None and rec.sha256 == le.pin.runtime:
            needed.setdefault(rec.key, rec)
    for rkey in sorted(set(runtimes) - set(needed)):
        report.refused.append((f"runtime {rkey[:12]}", "no entry of the pack links against it"))
    usable: dict[str, str] = {}  # runtime key -> its library's SHA-256, now in the store
    for rkey, rec in sorted(needed.items()):
        have = store.get_runtime(rkey)
        try:
            if have is not None:
                usable[rkey] = have.runtime_meta.library.sha256
                continue
        except ValueError:
            pass  # damaged: the pack's copy replaces it below
        try:
            rmeta, rfiles = _check_runtime(tree, rkey, rec, runtimes.get(rkey, []))
        except ValueError as e:
            report.refused.append((f"runtime {rkey[:12]}", str(e)))
            continue
        try:
            found, built = publish(store, rkey, rmeta, rfiles, runtime=True)
        except Refused as e:
            report.refused.append((f"runtime {rkey[:12]}", e.why))
            continue
        usable[rkey] = found.runtime_meta.library.sha256
        if built:
            report.runtimes.append(found.runtime_meta.library.name)
    ok: set[str] = set()  # the keys now in the cache
    for key, le in sorted(by_key.items()):  # one entry in memory at a time
        label = f"{le.label} {key[:12]}"
        try:
            meta, files = _check_entry(tree, key, le, entries.get(key, []))
        except ValueError as e:
            report.refused.append((label, str(e)))
            continue
        rt = EntryMeta.parse(meta, key).runtime  # check_whole checked it: typed here
        if usable.get(rt.key) != rt.sha256:
            why = ("its runtime library is not in the pack" if rt.key not in usable
                   else "the cache holds another runtime library under its key")
            report.refused.append((label, f"{why} ({rt.library})"))
            continue
        try:
            _, built = publish(store, key, meta, files)
        except Refused as e:
            report.refused.append((label, e.why))
            continue
        (report.imported if built else report.present).append(label)
        ok.add(key)
    landed = {le.kernel for le in lock.entries} - {le.kernel for le in lock.entries if le.key not in ok}
    for c in lock.composites:  # each launch's pinned entries all landed (or were there)
        if set(c.launches) <= landed:
            try:
                store.record_composite(CompositeRecord(c.name, c.launches, c.inputs, c.outputs, str(archive)))
            except OSError as e:
                report.refused.append((f"composite {c.name}", f"cannot record it: {e.strerror}"))
                continue
            report.composites.append(c.name)
    return report


def _read(tree: PackTree, name: str, cap: int) -> bytes:
    if name not in tree.names:
        raise CuteccError(f"not a cutecc pack: no {PACK_DIR}/{name}", where=str(tree.path))
    if tree.size(name) > cap:
        raise CuteccError(f"{PACK_DIR}/{name} is {tree.size(name)} bytes, over {cap}", where=str(tree.path))
    try:
        return tree.read(name)
    except ValueError as e:
        raise CuteccError(str(e), where=str(tree.path)) from None


def _members(tree: PackTree, parts: tuple[str, ...], names: list[str],
             cap: int) -> tuple[bytes, dict[str, bytes]]:
    """meta.json's bytes and the other members of the pack directory at `parts`
    (`entry_parts`, `runtime_parts`), once none of them was refused while reading the
    archive; else ValueError(why)."""
    at = {n: member((*parts, n)) for n in names}
    if META not in names or any(m not in tree.names and m not in tree.bad for m in at.values()):
        raise ValueError(f"no {META}, or stored under the wrong shard directory")
    for n, m in at.items():
        if m in tree.bad:
            raise ValueError(f"{n}: {tree.bad[m]}")
        if tree.size(m) > (MAX_META_BYTES if n == META else cap):
            raise ValueError(f"{n}: {tree.size(m)} bytes, over the limit")
    return tree.read(at[META]), {n: tree.read(m) for n, m in at.items() if n != META}


def _check_entry(tree: PackTree, key: str, le: LockEntry,
                 names: list[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(meta, files) of a pack's entry once the one verifier (`cutecc.ship.ingest`) passes it
    and it matches its line in the pack's lock; else ValueError(why)."""
    if not is_key(key):
        raise ValueError("not a cache key")
    if not names:
        raise ValueError("missing from the archive")
    meta_bytes, files = _members(tree, entry_parts(key), names, le.pin.size)
    try:
        meta = check_whole(key, meta_bytes, files, le.pin.size)
    except Refused as e:
        raise ValueError(e.why) from None
    why = le.mismatch(EntryMeta.parse(meta, key))  # check_whole checked it
    if why:
        raise ValueError(why)
    return meta, files


def _runtime_named(tree: PackTree, key: str) -> RuntimeLink | None:
    """The runtime library record an entry's meta.json names, or None. Unchecked but for
    its form: the caller takes it only where the lock's line names the same SHA-256, and
    the entry and the runtime library are each checked whole before they land."""
    name = member(meta_parts(entry_parts(key)))
    if not is_key(key) or name not in tree.names or tree.size(name) > MAX_META_BYTES:
        return None
    try:
        meta = parse_json(tree.read(name))
    except ValueError:
        return None
    rec = runtime_record(meta) if isinstance(meta, dict) else None
    return None if rec is None else RuntimeLink(rec["key"], rec["library"], rec["sha256"], rec["size"])


def _check_runtime(tree: PackTree, key: str, rec: RuntimeLink,
                   names: list[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(meta, files) of a pack's runtime library once the one verifier passes it and its
    library is the one the entries that need it record (`rec`); else ValueError(why)."""
    if not names:
        raise ValueError(f"missing from the archive ({rec.library})")
    meta_bytes, files = _members(tree, runtime_parts(key), names, rec.size)
    try:
        meta = check_whole(key, meta_bytes, files, rec.size, runtime=True)
    except Refused as e:
        raise ValueError(e.why) from None
    got = RuntimeMeta.parse(meta, key).library.sha256  # check_whole checked it: typed here
    if got != rec.sha256:
        raise ValueError(f"SHA-256 {got[:16]}... differs from what its entries record "
                         f"({rec.sha256[:16]}...)")
    return meta, files
