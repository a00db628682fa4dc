"""`misses.json`: the calls a kernel's fallback served, counted per (kernel, call signature,
arch), so `cutecc misses` can list them and say which variants would cover them.

The runtime records a miss when it serves a fallback (once per traced signature); it
never imports the store's writer, so this small record owns its own writing, with the
writer's rules: under `locks/misses.lock`, read, bounded (`MAX_MISSES` signatures, the
least recently seen dropped first), written atomically. Recording is best-effort: a
read-only cache, a full disk or a busy lock loses a count, never a call. Read as every
record of the cache is (`cutecc.store.view.read_record`): a file someone else could
have written, a link, an oversized or malformed one is refused, never believed.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.atomic import atomic_write
from cutecc.entry.rules import is_kernel_name
from cutecc.store.layout import LOCKS, MISSES_FORMAT, Layout
from cutecc.store.view import read_record
from cutecc.units import now_iso

MAX_MISSES = 1000  # signatures kept; the least recently seen go first
MAX_MISSES_BYTES = 4 << 20
MAX_ARRAYS = 64  # arrays of one recorded call
_FILE_MODE = 0o644


@dataclass(frozen=True)
class Miss:
    """One call signature a fallback served: the kernel, the arch it was loaded for, the
    arrays (dtype, shape; a symbolic extent as its text), the call keywords' values, why no
    build served it, how many times and when first and last."""

    kernel: str
    arch: str
    arrays: tuple[tuple[str, tuple[int | str, ...]], ...]
    keywords: tuple[tuple[str, Any], ...]
    reason: str
    count: int = 1
    first: str = ""
    last: str = ""

    @property
    def ident(self) -> tuple[Any, ...]:
        return (self.kernel, self.arch, self.arrays, tuple((k, repr(v)) for k, v in self.keywords))

    @property
    def signature(self) -> str:
        """`(bfloat16[2, 256, 4, 64], ..., causal=True)`."""
        arrs = ", ".join(f"{dt}[{', '.join(map(str, shape))}]" for dt, shape in self.arrays)
        kws = "".join(f", {k}={v!r}" for k, v in self.keywords)
        return f"({arrs}{kws})"

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch,
                "arrays": [{"dtype": dt, "shape": list(shape)} for dt, shape in self.arrays],
                "keywords": dict(self.keywords), "reason": self.reason, "count": self.count,
                "first": self.first, "last": self.last}

    @classmethod
    def from_json(cls, d: Any) -> Miss | None:
        """A recorded miss, or None when anything in it is not what this module writes."""
        try:
            ok = (isinstance(d, dict) and is_kernel_name(d["kernel"]) and isinstance(d["arch"], str)
                  and isinstance(d["arrays"], list) and len(d["arrays"]) <= MAX_ARRAYS
                  and isinstance(d["keywords"], dict) and isinstance(d["reason"], str)
                  and type(d["count"]) is int and d["count"] > 0
                  and isinstance(d["first"], str) and isinstance(d["last"], str))
            if not ok:
                return None
            arrays = []
            for a in d["arrays"]:
                shape = a["shape"]
                if not (isinstance(a["dtype"], str) and isinstance(shape, list) and all(
                        (type(n) is int and n >= 0) or isinstance(n, str) for n in shape)):
                    return None
                arrays.append((a["dtype"], tuple(shape)))
            kws = d["keywords"]
            if not all(isinstance(k, str) and isinstance(v, (bool, int, float, str)) for k, v in kws.items()):
                return None
        except (KeyError, TypeError):
            return None
        return cls(d["kernel"], d["arch"], tuple(arrays), tuple(sorted(kws.items())), d["reason"][:500],
                   d["count"], d["first"], d["last"])


@dataclass(frozen=True)
class MissesFile:
    """misses.json: the recorded misses, most recently seen first (at most `MAX_MISSES`)."""

    misses: tuple[Miss, ...]

    @classmethod
    def from_json(cls, doc: Any) -> MissesFile:
        """The misses of `doc`: none when it is not a misses record of this format, and a
        malformed one (`Miss.from_json`) skipped."""
        if not (isinstance(doc, dict) and doc.get("format") == MISSES_FORMAT
                and isinstance(doc.get("misses"), list)):
            return cls(())
        return cls(tuple(m for m in map(Miss.from_json, doc["misses"][:MAX_MISSES]) if m is not None))

    def to_json(self) -> dict[str, Any]:
        return {"format": MISSES_FORMAT, "misses": [m.to_json() for m in self.misses]}

    def dumps(self) -> bytes:
        """misses.json's bytes: sorted keys, one space of indent, a final newline."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode() + b"\n"


def read_misses(root: str | Path) -> list[Miss]:
    """The misses recorded in the cache at `root`, most recently seen first ([] when none).
    A record someone else could have written raises `trust.Untrusted`; a malformed one
    (or one of another format) reads as empty, and its malformed lines are skipped."""
    try:
        doc = read_record(Layout(Path(root)).misses(), MAX_MISSES_BYTES, 6)
    except trust.Untrusted:
        raise
    except (OSError, ValueError):  # absent, unreadable, oversized or not JSON: nothing recorded
        return []
    return list(MissesFile.from_json(doc).misses)


def record_miss(root: str | Path, miss: Miss) -> bool:
    """Count one more use of `miss` (its signature) in the cache at `root`; True when
    recorded. Best-effort: False where the cache cannot be written or the lock is busy."""
    import filelock

    lay = Layout(Path(root))
    try:
        (lay.root / LOCKS).mkdir(mode=0o755, exist_ok=True)
        with filelock.FileLock(lay.misses_lock(), timeout=2, mode=_FILE_MODE):
            try:
                known = read_misses(root)
            except trust.Untrusted:
                return False  # someone else's file: neither believed nor overwritten
            now = now_iso()
            old = next((m for m in known if m.ident == miss.ident), None)
            seen = Miss(miss.kernel, miss.arch, miss.arrays, miss.keywords, miss.reason,
                        (old.count if old else 0) + miss.count, old.first if old else now, now)
            # the file lists the most recently seen first: the bound drops the tail
            kept = (seen, *(m for m in known if m.ident != miss.ident))[:MAX_MISSES]
            data = MissesFile(kept).dumps()
            if len(data) > MAX_MISSES_BYTES:
                return False
            atomic_write(lay.misses(), data, _FILE_MODE)
    except (OSError, filelock.Timeout):
        return False
    return True


def miss_of(kernel: str, arch: str, arrays: list[tuple[str, tuple[Any, ...]]],
            keywords: Mapping[str, Any], reason: str) -> Miss:
    """A miss for a call: a symbolic extent (`jax.export`) is kept as its text, a keyword
    value that is not a plain number, bool or string as its repr."""
    arrs = tuple((dt, tuple(int(n) if isinstance(n, numbers.Integral) else str(n) for n in shape))
                 for dt, shape in arrays[:MAX_ARRAYS])
    kws = tuple(sorted((k, v if isinstance(v, (bool, int, float, str)) else repr(v)[:200])
                       for k, v in keywords.items()))
    return Miss(kernel, arch, arrs, kws, reason)

