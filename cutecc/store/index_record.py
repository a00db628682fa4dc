"""An index record (`by-kernel/<kernel>/<key>`, `INDEX_FORMAT`), typed both ways.

A record is derived from its entry's meta.json, which stays the truth: it says which entry
it is and, when the metadata has them, what a lock line pins (`IndexFacts`), so a build
that finds the entry cached reads this one small file instead of meta.json for as long as
the stamp it keeps (`entry.rules.meta_stamp`) is that meta.json's. Written by the store
(`Store.index`), read by it (`StoreView.indexed_facts`) and compared by `cutecc verify`;
nothing else looks inside one. The bytes are one line of canonical JSON, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.contract.pinned import PIN_FIELDS, Pin
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import INDEX_FORMAT, MAX_INDEX_BYTES, is_key, parse_json

INDEX_DEPTH = 2  # one object and its stamp
# what `cutecc verify` does not compare: build seconds (only `cutecc stats` reads them) and
# the stamp (a stale one only sends builds to meta.json)
_HINTS = ("build_seconds", "meta_stat")


@dataclass(frozen=True)
class IndexFacts(Pin):
    """What a lock line and a no-op build need of an entry: its pin (`Pin`: everything the
    runtime acts on), its runtime library's key and its build seconds."""

    runtime_key: str
    build_seconds: float

    def pin(self) -> Pin:
        """The pin alone, as a lock line holds it."""
        return Pin(*(getattr(self, name) for name in PIN_FIELDS))


@dataclass(frozen=True)
class IndexRecord:
    """One index record. `variant` and `arch` are as the metadata holds them (strings in
    any entry that passes its checks); `facts` is None when the metadata records no
    library (a partial record: builds read meta.json); `meta_stat` is the stamp of the
    meta.json it was taken from (None: none kept)."""

    key: str
    kernel: str
    variant: Any
    arch: Any
    facts: IndexFacts | None
    meta_stat: tuple[int, int, int] | None = None

    @classmethod
    def of_meta(cls, key: str, meta: EntryMeta, stamp: list[int] | None = None) -> IndexRecord:
        """The record of the entry `key` whose record is `meta`, stamped with `stamp`; its
        facts None when its library is not among its files (a publish that wrote none)."""
        try:
            facts: IndexFacts | None = IndexFacts(**meta.acted_on, runtime_key=meta.runtime.key,
                                                  build_seconds=meta.build_seconds)
        except ValueError:
            facts = None
        return cls(key, meta.kernel, meta.variant, meta.arch, facts,
                   None if stamp is None else (stamp[0], stamp[1], stamp[2]))

    def taken_from(self, stamp: list[int] | None) -> bool:
        """Whether this record was taken from the meta.json whose stamp (`entry.rules.meta_stamp`)
        is `stamp` (None: no meta.json), so it can stand in for it."""
        return stamp is not None and self.meta_stat == tuple(stamp)

    def to_json(self) -> dict[str, Any]:
        """The record's object (the facts' fields beside the identity, when known)."""
        out: dict[str, Any] = {"format": INDEX_FORMAT, "key": self.key, "kernel": self.kernel,
                               "variant": self.variant, "arch": self.arch}
        if self.facts is not None:
            f = self.facts
            out.update(library=f.library, sha256=f.sha256, size=f.size, symbol=f.symbol,
                       backward=f.backward, contract=f.contract, runtime=f.runtime,
                       runtime_key=f.runtime_key, build_seconds=f.build_seconds)
        if self.meta_stat is not None:
            out["meta_stat"] = list(self.meta_stat)
        return out

    def dumps(self) -> bytes:
        """The record's bytes: one line of canonical JSON."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def loads(cls, data: bytes, kernel: str, key: str) -> IndexRecord | None:
        """The record of `kernel`/`key` in `data` when it is whole (everything a lock line
        needs, well formed), else None (then the entry's meta.json is read)."""
        try:  # one flat object and its stamp: parse_json's nesting scan only when it could be more
            flat = len(data) <= MAX_INDEX_BYTES and data.count(b"{") + data.count(b"[") <= 2
            d = json.loads(data) if flat else parse_json(data, MAX_INDEX_BYTES, INDEX_DEPTH)
        except ValueError:
            return None
        if not (isinstance(d, dict) and d.get("format") == INDEX_FORMAT and d.get("key") == key
                and d.get("kernel") == kernel and is_key(d.get("runtime_key"))
                and is_key(d.get("runtime")) and is_key(d.get("contract"))
                and all(isinstance(d.get(f), str) for f in ("variant", "arch", "library", "sha256", "symbol"))
                and type(d.get("size")) is int and isinstance(d.get("build_seconds"), float)
                and (d.get("backward") is None or isinstance(d.get("backward"), str))):
            return None
        stamp = d.get("meta_stat")
        if not (stamp is None or (isinstance(stamp, list) and len(stamp) == 3
                                  and all(type(x) is int for x in stamp))):
            return None
        facts = IndexFacts(d["library"], d["sha256"], d["size"], d["symbol"], d.get("backward"),
                           d["contract"], d["runtime"], d["runtime_key"], d["build_seconds"])
        return cls(key, kernel, d["variant"], d["arch"], facts,
                   None if stamp is None else (stamp[0], stamp[1], stamp[2]))


def record_differs(data: bytes, key: str, meta: EntryMeta) -> bool:
    """Whether the index record `data` of entry `key` says something else than the entry's
    checked record `meta`: a whole record in anything but its build seconds and stamp, any
    other (a partial or unreadable one) in anything but its stamp."""
    want = IndexRecord.of_meta(key, meta).to_json()
    try:
        doc = parse_json(data, MAX_INDEX_BYTES, INDEX_DEPTH)
    except ValueError:
        doc = {}
    have = doc if isinstance(doc, dict) else {}
    if "sha256" in want and IndexRecord.loads(data, meta.kernel, key) is not None:
        return _without(have, _HINTS) != _without(want, _HINTS)
    return _without(have, ("meta_stat",)) != want


def _without(doc: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in names}
