"""A quarantined entry's note (`quarantine/<key>.<time>/why.json`, `QUARANTINE_FORMAT`),
typed both ways: `Store.quarantine` writes one beside the entry it sets aside (`dumps`: the
bytes as ever), and whoever looks at the quarantine reads it back (`loads`) to say which
entry it was, why and when.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.entry.rules import MAX_META_BYTES, is_key, parse_json
from cutecc.store.layout import QUARANTINE_FORMAT

QUARANTINE_NOTE = "why.json"  # the note's name in a quarantined entry's directory


@dataclass(frozen=True)
class QuarantineNote:
    """Which entry was set aside (`key`), why (`reason`, as `cutecc verify` said it) and
    when (`at`, ISO 8601 UTC)."""

    key: str
    reason: str
    at: str

    def to_json(self) -> dict[str, Any]:
        return {"format": QUARANTINE_FORMAT, "key": self.key, "reason": self.reason, "at": self.at}

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1).encode()

    @classmethod
    def loads(cls, data: bytes) -> QuarantineNote | None:
        """The note in `data`, or None when it is not one of this format (damaged, or
        another cutecc's)."""
        try:
            d = parse_json(data, MAX_META_BYTES)
        except ValueError:
            return None
        if not (isinstance(d, dict) and d.get("format") == QUARANTINE_FORMAT and is_key(d.get("key"))
                and isinstance(d.get("reason"), str) and isinstance(d.get("at"), str)):
            return None
        return cls(d["key"], d["reason"], d["at"])

    @classmethod
    def read(cls, entry_dir: Path) -> QuarantineNote | None:
        """The note of the quarantined entry at `entry_dir` (None: absent, unreadable, not a
        regular file of this user's, or over MAX_META_BYTES: read bounded, through `trust`)."""
        try:
            return cls.loads(trust.read_path(entry_dir / QUARANTINE_NOTE, MAX_META_BYTES))
        except (OSError, trust.Untrusted):
            return None
