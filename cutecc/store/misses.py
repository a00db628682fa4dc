"""`misses.json`: the calls a kernel's fallback served, counted per (kernel, call signature,
arch), so `cutecc misses` can list them and say which variants would cover them.

The runtime records a miss when it serves a fallback (once per traced signature); it
never imports the store's writer, so this small record owns its own writing, with the
writer's rules: read, merged and written atomically under `locks/misses.lock` (a
recorder waits for it up to `LOCK_WAIT` seconds, so processes recording at once each
keep their count), bounded (`MAX_MISSES` signatures, the least recently seen dropped
first). Recording is best-effort: a read-only cache, a full disk or a lock held past
`LOCK_WAIT` loses a count, never a call. Read as every record of the cache is
(`cutecc.store.view.read_record`): a file someone else could have written, a link, an
oversized or malformed one is refused, never believed.

Every field has a grammar (`Miss.problem`), the manifest's where it has one: a kernel
name and call keywords as `cutecc.names` rules them, an arch as `cutecc.archs`, a dtype
a numpy name, an extent a bounded integer or the text of a symbolic one, keyword values
plain and printable, times as cutecc writes them. `cutecc misses` prints these strings
(and pastes of its `--toml` end up in manifests), so a miss off its grammar is never
recorded, and a record off it is skipped and counted (`MissesFile.skipped`), never shown.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.archs import is_arch
from cutecc.atomic import atomic_write
from cutecc.contract import refs
from cutecc.entry.rules import is_kernel_name
from cutecc.errors import CuteccError
from cutecc.names import call_name_problem
from cutecc.store.layout import LOCKS, MISSES_FORMAT, Layout
from cutecc.store.view import read_record
from cutecc.units import now_iso

MAX_MISSES = 1000  # signatures kept; the least recently seen go first
MAX_MISSES_BYTES = 4 << 20
MAX_ARRAYS = 64  # arrays of one recorded call
MAX_RANK = 16  # extents of one array
MAX_KEYWORDS = 64  # keywords of one recorded call
MAX_TEXT = 200  # characters of a keyword's text value or a symbolic extent
MAX_REASON = 500  # characters of why no build served the call
MAX_COUNT = 2**62
LOCK_WAIT = 30.0  # seconds a recorder waits for misses.lock before it gives the count up
_FILE_MODE = 0o644
# The grammar of each string field (matched in full, ASCII only: `$` and `\d` would let a
# newline or another script's digits through).
DTYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)  # numpy's names: float32, float8_e4m3fn
SYMBOLIC_RE = re.compile(rf"[A-Za-z0-9_ +\-*/%(),]{{1,{MAX_TEXT}}}", re.ASCII)  # jax.export: 2*b + 1
TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:\d\d)", re.ASCII)
_INT64 = (-(2**63), 2**63 - 1)


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

    def problem(self) -> str | None:
        """Which field breaks its grammar (module docstring), and how; None when none does."""
        if not is_kernel_name(self.kernel):
            return "kernel: not a kernel name"
        if not is_arch(self.arch):
            return "arch: not an arch such as sm_90a"
        if len(self.arrays) > MAX_ARRAYS:
            return f"arrays: over {MAX_ARRAYS}"
        for i, (dtype, shape) in enumerate(self.arrays):
            if not (isinstance(dtype, str) and DTYPE_RE.fullmatch(dtype)):
                return f"arrays[{i}].dtype: not a dtype name"
            if len(shape) > MAX_RANK or not all(_is_extent(n) for n in shape):
                return f"arrays[{i}].shape: not extents (integers, or a symbolic extent's text)"
        if len(self.keywords) > MAX_KEYWORDS:
            return f"keywords: over {MAX_KEYWORDS}"
        for k, v in self.keywords:
            why = call_name_problem(k)
            if why:
                return f"keywords: {why}"
            if not _is_value(v):
                return (f"keywords.{k}: not a bool, an int64, a finite float, printable text or an "
                        "import reference")
        if not _is_text(self.reason, MAX_REASON):
            return "reason: not printable text"
        if not (type(self.count) is int and 0 < self.count <= MAX_COUNT):
            return "count: not a positive integer"
        if not all(t == "" or TIME_RE.fullmatch(t) for t in (self.first, self.last)):
            return "first/last: not ISO 8601 times"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch,
                "arrays": [{"dtype": dt, "shape": list(shape)} for dt, shape in self.arrays],
                "keywords": dict(self.keywords), "reason": self.reason, "count": self.count,
                "first": self.first, "last": self.last}

    @classmethod
    def from_json(cls, d: Any) -> Miss | None:
        """A recorded miss, or None when anything in it is not what this module writes (its
        form, or a field's grammar: `problem`)."""
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
            if not all(isinstance(k, str) and (isinstance(v, (bool, int, float, str))
                                               or refs.is_import_value(v)) for k, v in kws.items()):
                return None
        except (KeyError, TypeError):
            return None
        m = cls(d["kernel"], d["arch"], tuple(arrays), tuple(sorted(kws.items())), d["reason"],
                d["count"], d["first"], d["last"])
        return None if m.problem() else m


@dataclass(frozen=True)
class MissesFile:
    """misses.json: the recorded misses, most recently seen first (at most `MAX_MISSES`), and
    how many records read were skipped (malformed, or a field off its grammar)."""

    misses: tuple[Miss, ...]
    skipped: int = field(default=0, compare=False)

    @classmethod
    def from_json(cls, doc: Any) -> MissesFile:
        """The misses of `doc`: none when it is not a misses record of this format, and a
        malformed one (`Miss.from_json`) skipped and counted."""
        if not (isinstance(doc, dict) and doc.get("format") == MISSES_FORMAT
                and isinstance(doc.get("misses"), list)):
            return cls(())
        read = [Miss.from_json(d) for d in doc["misses"][:MAX_MISSES]]
        kept = tuple(m for m in read if m is not None)
        return cls(kept, len(read) - len(kept))

    def to_json(self) -> dict[str, Any]:
        return {"format": MISSES_FORMAT, "misses": [m.to_json() for m in self.misses]}

    def dumps(self) -> bytes:
        """misses.json's bytes: sorted keys, one space of indent, a final newline."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode() + b"\n"


def load_misses(root: str | Path) -> MissesFile:
    """The record in the cache at `root` (none: empty). A file someone else could have
    written raises `trust.Untrusted`; a malformed one (or one of another format) reads as
    empty, and its malformed records are skipped and counted."""
    try:
        doc = read_record(Layout(Path(root)).misses(), MAX_MISSES_BYTES, 6)
    except trust.Untrusted:
        raise
    except (OSError, ValueError):  # absent, unreadable, oversized or not JSON: nothing recorded
        return MissesFile(())
    return MissesFile.from_json(doc)


def read_misses(root: str | Path) -> list[Miss]:
    """The misses recorded in the cache at `root`, most recently seen first ([] when none):
    `load_misses`'s."""
    return list(load_misses(root).misses)


def record_miss(root: str | Path, miss: Miss) -> bool:
    """Count one more use of `miss` (its signature) in the cache at `root`; True when
    recorded. Read, merged and written under the record's lock, so no concurrent count is
    lost. Best-effort: False where the cache cannot be written, the lock stays held past
    `LOCK_WAIT` or `miss` breaks its grammar (never recorded)."""
    from cutecc import locks  # filelock: imported at the first miss only

    if miss.problem():
        return False
    lay = Layout(Path(root))
    try:
        (lay.root / LOCKS).mkdir(mode=0o755, exist_ok=True)
        with locks.held(lay.misses_lock(), timeout=LOCK_WAIT):
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
    except (OSError, CuteccError, locks.Timeout):
        return False
    return True


def miss_of(kernel: str, arch: str, arrays: list[tuple[str, tuple[Any, ...]]],
            keywords: Mapping[str, Any], reason: str) -> Miss:
    """A miss for a call: a symbolic extent (`jax.export`) is kept as its text, a keyword
    value that is not a plain bool, int64, finite float or printable text as the import
    reference that names it (`{"import": "operator:mul"}`, as the manifest spells it), else
    as its repr (escaped, bounded). What still breaks a grammar is refused by `record_miss`."""
    arrs = tuple((dt, tuple(int(n) if isinstance(n, numbers.Integral) else str(n) for n in shape))
                 for dt, shape in arrays[:MAX_ARRAYS])
    kws = tuple(sorted((k, v if _is_value(v) else _keyword_value(v)) for k, v in keywords.items()))
    return Miss(kernel, arch, arrs, kws, reason[:MAX_REASON])


def escaped(text: str) -> str:
    """`text` on one line with every character that is not printable (a control character,
    a newline, a bidi override, a lone surrogate) written as its Python escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _is_text(v: object, limit: int) -> bool:
    return isinstance(v, str) and len(v) <= limit and v.isprintable()


def _is_extent(n: object) -> bool:
    if type(n) is int:
        return 0 <= n <= _INT64[1]
    return isinstance(n, str) and SYMBOLIC_RE.fullmatch(n) is not None


def _is_value(v: object) -> bool:
    """A call keyword's value as recorded: a bool, an int64, a finite float, printable text,
    or an import reference (`{"import": "pkg.mod:attr"}`, `cutecc.contract.refs`)."""
    if isinstance(v, bool) or refs.is_import_value(v):
        return True
    if type(v) is int:
        return _INT64[0] <= v <= _INT64[1]
    if type(v) is float:
        return math.isfinite(v)
    return _is_text(v, MAX_TEXT)



def _keyword_value(v: Any) -> Any:
    """An object passed as a call keyword, as a miss records it: `{"import": ref}` where an
    import reference names it (`cutecc.contract.refs.ref_of`), else its repr (escaped, bounded)."""
    ref = refs.ref_of(v)
    return {"import": ref} if ref is not None else escaped(repr(v))[:MAX_TEXT]
