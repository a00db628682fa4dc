"""`cutecc gc`: evict least recently used entries to fit a size, or those unused for an age.

Last use is the later of an entry's `used` mtime (touched by `cutecc build` on a hit and
by the runtime at registration) and its `built_at`. Removal goes through
`Store.remove` (under the key's lock, by rename out of entries/ first); a key whose
lock another process holds (a build) is skipped, never deleted under it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.commands.show import label
from cutecc.errors import CuteccError
from cutecc.store import Busy, Store

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str | int) -> int:
    """Bytes from `500M`, `2G`, `1024K`, `1.5GiB` or plain `1048576` (K/M/G/T are powers of 1024)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise CuteccError(f'"{text}" is not a size such as 500M, 2G, 1024K or a byte count',
                          where="--max-size")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_age(text: str | float) -> float:
    """Seconds from `30d`, `12h`, `90m`, `45s` or `2w`."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text, re.IGNORECASE)
    if not m:
        raise CuteccError(f'"{text}" is not an age such as 30d, 12h or 90m', where="--older-than")
    return float(m.group(1)) * _AGE_UNITS[m.group(2).lower()]


@dataclass
class GcReport:
    cache_dir: str
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)  # key, label, bytes, last_used
    busy: list[str] = field(default_factory=list)
    kept: int = 0
    kept_bytes: int = 0
    swept_tmp: int = 0
    quarantine_removed: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, freed_bytes=sum(r["bytes"] for r in self.removed))


def gc(cache_dir: str | Path | None = None, *, max_size: str | int | None = None,
       older_than: str | float | None = None, dry_run: bool = False, now: float | None = None,
       lock_timeout: float = 0) -> GcReport:
    """Remove entries unused for `older_than`, then the least recently used until the cache
    holds at most `max_size` bytes; also sweep tmp/ leftovers and (with `older_than`) old
    quarantined entries. `dry_run` only reports what would go."""
    limit = None if max_size is None else parse_size(max_size)
    age = None if older_than is None else parse_age(older_than)
    store = Store(cache_dir).require()
    now = time.time() if now is None else now
    report = GcReport(str(store.root), dry_run)
    entries = sorted(((e.last_used(), e.key, e) for e in store.entries()), key=lambda t: t[:2])
    sizes = {e.key: e.disk_bytes() for _, _, e in entries}
    total = sum(sizes.values())
    for used, key, e in entries:  # oldest first
        stale = age is not None and now - used > age
        if not stale and (limit is None or total <= limit):
            report.kept += 1
            continue
        try:
            gone = dry_run or store.remove(key, timeout=lock_timeout)
        except Busy:
            report.busy.append(key)
            report.kept += 1
            continue
        if gone:
            total -= sizes[key]
            report.removed.append({"key": key, "label": label(e.meta), "bytes": sizes[key],
                                   "last_used": used})
    report.kept_bytes = total
    if not dry_run:
        report.swept_tmp = store.sweep_tmp()
        if age is not None:
            report.quarantine_removed = _prune_quarantine(store, now - age)
    return report


def _prune_quarantine(store: Store, before: float) -> int:
    n = 0
    for d in sorted(store.quarantine_dir.glob("*")) if store.quarantine_dir.is_dir() else []:
        try:
            if os.stat(d).st_mtime < before:
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        except OSError:
            continue
    return n
