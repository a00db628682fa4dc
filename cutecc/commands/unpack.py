"""`cutecc unpack`: import a pack's entries (wheel or tarball) into a cache.

Each entry is checked against its meta.json, its key and the pack's lock before it is
published atomically like a build; a bad entry is refused by name and the rest land.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import environ
from cutecc.archive import read_pack_tree
from cutecc.entry import ENTRY_FORMAT, META, STORE_FORMAT, compute_key, is_file_name, is_key
from cutecc.errors import CuteccError
from cutecc.lockfile import LOCK_NAME, Lock, LockEntry
from cutecc.report import Report
from cutecc.runtime.package import PACK_DIR
from cutecc.store import Entry, Store


@dataclass
class UnpackReport(Report):
    """What `unpack` did with each entry of an archive."""

    cache_dir: Path
    imported: list[str] = field(default_factory=list)  # "label key" of entries published
    present: list[str] = field(default_factory=list)  # already in the cache
    refused: list[tuple[str, str]] = field(default_factory=list)  # ("label key", why)

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
                "present": self.present,
                "refused": [{"entry": e, "reason": r} for e, r in self.refused]}


def unpack(archive: str | Path, cache_dir: str | Path | None = None) -> UnpackReport:
    """Import a pack's entries into a cache, each verified first, each published atomically.

    An entry whose files do not match its meta.json, or whose library does not match the
    pack's lock, is refused (reported, not imported); the others still land.
    """
    if environ.read_only():
        raise CuteccError("read-only mode ($CUTECC_READ_ONLY): unpack writes to the cache",
                          where="cutecc unpack", exit_code=1)
    files = read_pack_tree(archive)
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
    if not is_key(key):
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
    if got != set(recs) or not all(is_file_name(n) for n in got):
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
