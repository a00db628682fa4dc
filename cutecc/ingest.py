"""Entries that arrive from another machine (a remote cache, a Ray worker on another
node): every check is made before anything lands, then they are published like a build.

Until checked, the bytes are hostile: meta.json is bounded in size and nesting and must
describe the key it was asked for (`entry.meta_problem`: its key inputs hash to that
key), it lists at most `MAX_FILES` files, none over the size cap, and every file's bytes
must hash to its record. Only then does `Store.publish` write them, atomically, under the
key's lock, exactly as a local build would have.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.entry import MAX_META_BYTES, meta_problem, parse_json
from cutecc.store import Entry, Store, entry_trust_problem, read_meta

MAX_FILES = 16  # an entry holds one library today


class Refused(Exception):
    """An entry from elsewhere failed a check; `why` says which (nothing was written)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Blob:
    """One file an entry records: its name, SHA-256 and size."""

    name: str
    sha256: str
    size: int


def check_meta(key: str, data: bytes, max_file_bytes: int) -> tuple[dict[str, Any], tuple[Blob, ...]]:
    """Parse and check an entry's meta.json bytes for `key`; its file records, each within
    `max_file_bytes`. Raises Refused."""
    try:
        meta = parse_json(data, MAX_META_BYTES)
    except ValueError as e:
        raise Refused(f"meta.json: {e}") from None
    why = meta_problem(meta, key)
    if why:
        raise Refused(f"meta.json: {why}")
    files = meta["files"]
    if len(files) > MAX_FILES:
        raise Refused(f"meta.json lists {len(files)} files, more than {MAX_FILES}")
    blobs = tuple(Blob(n, r["sha256"], r["size"]) for n, r in sorted(files.items()))
    for b in blobs:
        if len(b.sha256) != 64 or any(c not in "0123456789abcdef" for c in b.sha256):
            raise Refused(f"{b.name}: {b.sha256[:70]!r} is not a SHA-256")
        if b.size > max_file_bytes:
            raise Refused(f"{b.name}: {b.size} bytes, over the {max_file_bytes}-byte limit "
                          "(CUTECC_REMOTE_MAX_BLOB)")
    return meta, blobs


def check_file(blob: Blob, data: bytes) -> None:
    """Raise Refused unless `data` is exactly the recorded file."""
    if len(data) != blob.size:
        raise Refused(f"{blob.name}: {len(data)} bytes, meta.json records {blob.size} (truncated?)")
    got = hashlib.sha256(data).hexdigest()
    if got != blob.sha256:
        raise Refused(f"{blob.name}: SHA-256 {got[:16]}... differs from meta.json's "
                      f"{blob.sha256[:16]}... (altered)")


def publish(store: Store, key: str, meta: dict[str, Any], files: Mapping[str, bytes]) -> tuple[Entry, bool]:
    """Publish a checked entry into `store` (atomic, under the key's lock); (entry, written):
    written is False when the store already had the key. The caller checked everything
    with `check_meta` and `check_file`."""
    rest = {k: v for k, v in meta.items() if k not in ("files", "format", "key")}

    def stage(staging: Path) -> dict[str, Any]:
        for name, data in files.items():
            with open(staging / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        return dict(rest)

    entry, written = store.publish(key, stage)
    if written and entry.meta.get("files") != meta["files"]:  # the disk changed the bytes
        store.remove(key, timeout=10)
        raise Refused("the files written differ from their records (a failing disk?)")
    return entry, written


def receive(store: Store, key: str, meta_bytes: bytes, files: Mapping[str, bytes],
            max_file_bytes: int) -> tuple[Entry, bool]:
    """Check an entry given whole (meta.json's bytes and its files) and publish it."""
    meta, blobs = check_meta(key, meta_bytes, max_file_bytes)
    if set(files) != {b.name for b in blobs}:
        raise Refused(f"files {sorted(files)} differ from those meta.json lists "
                      f"{sorted(b.name for b in blobs)}")
    for b in blobs:
        check_file(b, files[b.name])
    return publish(store, key, meta, files)


def check_stored(store: Store, key: str) -> dict[str, Any]:
    """The metadata of `key`'s entry as this process finds it in `store`, checked whole, not
    as whoever published it says (a Ray task on this node publishes here itself): meta.json
    read without following links and parsed bounded (`store.read_meta`), the key's
    (`entry.meta_problem`), owned as the cache must be (`store.entry_trust_problem`), and
    every file it records hashed against its record, streamed (never the recorded size
    allocated). Raises Refused."""
    d = store.entry_dir(key)
    try:
        meta = read_meta(d)
    except FileNotFoundError:
        raise Refused(f"no entry {key[:12]} in {store.root}") from None
    except (OSError, ValueError) as e:
        raise Refused(f"meta.json: {e}") from None
    why = meta_problem(meta, key)
    if why:
        raise Refused(f"meta.json: {why}")
    why = entry_trust_problem(d, list(meta["files"]))
    if why:
        raise Refused(why)
    for name, rec in sorted(meta["files"].items()):
        h, size = hashlib.sha256(), 0
        try:
            fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise Refused(f"{name}: {e.strerror}") from None
        with os.fdopen(fd, "rb", buffering=0) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(f"{name} is not a regular file")
            while size <= rec["size"] and (chunk := f.read(1 << 20)):
                h.update(chunk)
                size += len(chunk)
        if size != rec["size"]:
            more = " or more" if size > rec["size"] else " (truncated?)"
            raise Refused(f"{name}: {size} bytes{more}, meta.json records {rec['size']}")
        if h.hexdigest() != rec["sha256"]:
            raise Refused(f"{name}: SHA-256 {h.hexdigest()[:16]}... differs from meta.json's "
                          f"{rec['sha256'][:16]}... (altered)")
    return meta
