"""The one verifier: every entry or runtime library that arrives or is vouched for is
checked here before it is published, recorded, signed or served.

Arrivals are a remote cache's objects, a pack's members (wheel or tarball), a Ray task's
result (from any node, the driver's included) and, before a build signs a lock, the
cache's own entries. Until checked, their bytes are hostile. One rule for all of them:

- meta.json is bounded in size, nesting and parse time (`entry.rules.parse_json`) and must
  describe the key it was asked for (`entry.rules.meta_problem`, `entry.rules.runtime_meta_problem`:
  its key inputs hash to that key, the fields the runtime acts on equal their keyed
  copies, a runtime library carries its key's soname);
- it records exactly one file, its library, within the size cap, and the files given are
  exactly that one: no more, no fewer;
- the library's bytes hash to its record;
- a kernel library's cubins record the SM of its key's arch (`cutecc.cubin.arch_problem`).

Only then does `Store.publish` write them, atomically, under the key's lock, exactly as a
local build would have (`receive`), or does a caller take the metadata as true
(`check_stored`, `check_whole`).

A remote's planning facts (`check_planning`: source files' parsed facts, `planshare`) are
hints, never keys: a bundle must hash to the name it is filed under, be of this parser, be
bounded and have every record of its shape (else the whole bundle is refused), and each fact
is filed under the SHA-256 of the bytes it was parsed from, so planning looks it up by the
SHA-256 of the bytes it read itself and it can never stand for other bytes. What a fact says
of its bytes (their imports and top-level definitions) cannot be checked without the parse it
saves: it is trusted as the remote's entries are, by write access to the bucket.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.entry.meta import EntryMeta, FileRec, RuntimeMeta
from cutecc.entry.rules import MAX_META_BYTES, META, parse_json
from cutecc.store.layout import entry_parts, meta_parts, runtime_parts
from cutecc.store.view import Entry, StoreView
from cutecc.store.writer import Store
from cutecc.toolchain.planfacts import SourceFacts

DEFAULT_MAX_FILE_BYTES = 2 << 30  # a kernel library is KBs to a few MB; a runtime ~2 MB
PLANNING_FORMAT = 1  # a remote's bundle of planning facts (`check_planning`)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FACT_NAME = re.compile(r"source:[0-9a-f]{64}")  # (a path effect is a moment's work: never carried)
MAX_IMPORT_LEVEL = 64


class Refused(Exception):
    """An entry from elsewhere failed a check; `why` says which (nothing was written)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def check_meta(key: str, data: bytes, max_file_bytes: int, *,
               runtime: bool = False) -> tuple[dict[str, Any], tuple[FileRec, ...]]:
    """Parse and check the meta.json bytes of entry `key` (of runtime library `key` when
    `runtime`): (meta, its file records). It must record its library alone, within
    `max_file_bytes`. Raises Refused."""
    try:
        meta = parse_json(data, MAX_META_BYTES)
    except ValueError as e:
        raise Refused(f"{META}: {e}") from None
    try:
        rec = RuntimeMeta.parse(meta, key) if runtime else EntryMeta.parse(meta, key)
    except ValueError as e:
        raise Refused(f"{META}: {e}") from None
    if {f.name for f in rec.files} != {rec.library_name}:
        extra = sorted({f.name for f in rec.files} - {rec.library_name})
        raise Refused(f"{META} lists files other than its library: {extra[:4]}")
    blobs = rec.files
    for b in blobs:
        if len(b.sha256) != 64 or any(c not in "0123456789abcdef" for c in b.sha256):
            raise Refused(f"{b.name}: {b.sha256[:70]!r} is not a SHA-256")
        if b.size > max_file_bytes:
            raise Refused(f"{b.name}: {b.size} bytes, over the {max_file_bytes}-byte limit")
    return meta, blobs


def check_file(blob: FileRec, data: bytes) -> None:
    """Raise Refused unless `data` is exactly the recorded file."""
    if len(data) != blob.size:
        raise Refused(f"{blob.name}: {len(data)} bytes, {META} records {blob.size} (truncated?)")
    got = hashlib.sha256(data).hexdigest()
    if got != blob.sha256:
        raise Refused(f"{blob.name}: SHA-256 {got[:16]}... differs from {META}'s "
                      f"{blob.sha256[:16]}... (altered)")


def check_whole(key: str, meta_bytes: bytes, files: Mapping[str, bytes], max_file_bytes: int, *,
                runtime: bool = False) -> dict[str, Any]:
    """The metadata of an entry given whole (meta.json's bytes and its files), once
    `check_meta` passes, the files are exactly those it records and each matches its
    record. Raises Refused."""
    meta, blobs = check_meta(key, meta_bytes, max_file_bytes, runtime=runtime)
    if set(files) != {b.name for b in blobs}:
        raise Refused(f"files {sorted(files)[:4]} differ from those {META} lists "
                      f"{sorted(b.name for b in blobs)}")
    _check_files(key, meta, blobs, files, runtime)
    return meta


def publish(store: Store, key: str, meta: dict[str, Any], files: Mapping[str, bytes], *,
            runtime: bool = False) -> tuple[Entry, bool]:
    """Publish a checked entry into `store` (atomic, under the key's lock); (entry, written):
    written is False when the store already had the key. The caller checked everything
    with `check_whole`."""
    rec = RuntimeMeta.parse(meta, key) if runtime else EntryMeta.parse(meta, key)

    def stage(staging: Path) -> EntryMeta | RuntimeMeta:
        for name, data in files.items():
            with open(staging / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        return rec  # the store records the files written

    entry, written = store.publish(key, stage, runtime=runtime)
    written_rec = (entry.runtime_meta if runtime else entry.meta) if written else rec
    if written_rec.files != rec.files:  # the disk changed the bytes
        store.remove(key, timeout=10, runtime=runtime)
        raise Refused("the files written differ from their records (a failing disk?)")
    return entry, written


def receive(store: Store, key: str, meta_bytes: bytes, files: Mapping[str, bytes],
            max_file_bytes: int, *, runtime: bool = False) -> tuple[Entry, bool]:
    """Check an entry given whole and publish it (see `check_whole`, `publish`)."""
    meta = check_whole(key, meta_bytes, files, max_file_bytes, runtime=runtime)
    return publish(store, key, meta, files, runtime=runtime)


def check_stored(store: StoreView, key: str, *, runtime: bool = False,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> dict[str, Any]:
    """The metadata of the store's entry `key`, once it passes the same checks as an
    arrival: read through directories only this user or root could have written,
    following no link (`cutecc.trust`), its library hashed against its record. For what
    this process is about to vouch for (a lock it signs, a Ray task's result) rather
    than what an earlier check already recorded. Raises Refused (absent, damaged, or
    someone else's)."""
    parts = runtime_parts(key) if runtime else entry_parts(key)
    what = "runtime library" if runtime else "entry"
    try:
        meta_bytes = trust.read_file(store.root, meta_parts(parts), MAX_META_BYTES)
        meta, blobs = check_meta(key, meta_bytes, max_file_bytes, runtime=runtime)
        files = {b.name: trust.read_file(store.root, (*parts, b.name), b.size) for b in blobs}
    except FileNotFoundError:
        raise Refused(f"{what} {key[:12]} is not in the cache") from None
    except trust.Untrusted as e:
        raise Refused(e.message) from None
    except OSError as e:
        raise Refused(f"{what} {key[:12]}: {e.strerror or e}") from None
    _check_files(key, meta, blobs, files, runtime)
    return meta


def _check_files(key: str, meta: dict[str, Any], blobs: tuple[FileRec, ...], files: Mapping[str, bytes],
                 runtime: bool) -> None:
    """Every file `meta` lists, as it lists it; and a kernel library's device code for the
    arch its key names (code for another GPU is never served). Raises Refused."""
    for b in blobs:
        check_file(b, files[b.name])
    if not runtime:
        from cutecc.cubin import arch_problem

        rec = EntryMeta.parse(meta, key)
        wrong = arch_problem(files[rec.library.name], rec.arch)
        if wrong:
            raise Refused(wrong)


def check_planning(sha256: str, data: bytes, parser: str, limit: int) -> dict[str, SourceFacts]:
    """The parsed facts of a bundle of planning facts (`cutecc.ship.planshare`) filed under
    `sha256`, by "kind:SHA-256 of the source's bytes", once the bundle's bytes hash to
    `sha256`, are at most `limit`, are of `parser` (`hashcache.parser_id`) and every record
    is of its shape: a source's, whose modules and names are what `ast` gives (dotted
    identifiers, `*`), nothing a path could be made of. Raises Refused (the whole bundle: a
    hint, dropped, never a key)."""
    if not _SHA256.fullmatch(sha256):
        raise Refused(f"{sha256[:70]!r} is not a SHA-256")
    if len(data) > limit:
        raise Refused(f"{len(data)} bytes, over the {limit}-byte limit")
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise Refused(f"its SHA-256 {got[:16]}... is not its name's (altered)")
    try:
        doc = parse_json(data, limit)
    except (ValueError, RecursionError) as e:
        raise Refused(f"not JSON: {e}") from None
    if not (isinstance(doc, dict) and doc.get("format") == PLANNING_FORMAT
            and isinstance(doc.get("parsed"), dict)):
        raise Refused(f"not a bundle of planning facts of format {PLANNING_FORMAT}")
    if doc.get("parser") != parser:
        raise Refused("another parser's facts (another cutecc or Python)")
    out: dict[str, SourceFacts] = {}
    for name, v in doc["parsed"].items():
        facts = SourceFacts.of_json(v) if _FACT_NAME.fullmatch(name) else None
        if facts is None or not _names_ok(facts):
            raise Refused(f"a record of the wrong shape: {name[:80]!r}")
        out[name] = facts
    return out


def _names_ok(facts: SourceFacts) -> bool:
    """Whether every module and name in `facts` is one `ast` could have given."""
    for level, module, names in facts.imports:
        if not (0 <= level <= MAX_IMPORT_LEVEL and (module == "" and level > 0 or _dotted(module))
                and (names is None or all(n == "*" or n.isidentifier() for n in names))):
            return False
    return all(n.isidentifier() for n in facts.defs)


def _dotted(module: str) -> bool:
    return all(part.isidentifier() for part in module.split("."))
