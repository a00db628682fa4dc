"""`cutecc show`: everything one entry's metadata holds, found by its key or a unique prefix."""

from __future__ import annotations

import datetime as dt
import string
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.store import Entry, Store


def label(meta: dict[str, Any]) -> str:
    """`kernel[variant]@arch`, as `cutecc build` prints it."""
    return f"{meta.get('kernel')}[{meta.get('variant')}]@{meta.get('arch')}"


def resolve(store: Store, prefix: str) -> str:
    """The one key that starts with `prefix`.

    A prefix that is not hex, or that matches several entries (the error lists them),
    is bad input (exit 2); one that matches nothing is exit 1.
    """
    p = prefix.strip().lower()
    if not p or len(p) > 64 or any(c not in string.hexdigits for c in p):
        raise CuteccError(f'"{prefix}" is not a key or key prefix (hex digits)', where="KEY")
    keys = store.match(p)
    if not keys:
        raise CuteccError(f'no entry matches "{prefix}" (see `cutecc list`)', where=str(store.root),
                          exit_code=1)
    if len(keys) > 1:
        shown = [f"{k[:16]} {_label_of(store, k)}" for k in keys[:20]]
        more = f" (and {len(keys) - 20} more)" if len(keys) > 20 else ""
        raise CuteccError(f'"{prefix}" is ambiguous, it matches {len(keys)} entries: '
                          + "; ".join(shown) + more, where=str(store.root))
    return keys[0]


def _label_of(store: Store, key: str) -> str:
    try:
        entry = store.get(key)
    except CuteccError:
        return "(unreadable metadata)"
    return label(entry.meta) if entry else "(removed)"


def get_entry(store: Store, prefix: str) -> Entry:
    """The entry for KEY|PREFIX (see `resolve`); unreadable metadata is an error naming it."""
    entry = store.get(resolve(store, prefix))
    if entry is None:  # removed between the two looks
        raise CuteccError(f'no entry matches "{prefix}"', where=str(store.root), exit_code=1)
    return entry


def show(key: str, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """The entry for KEY|PREFIX: its metadata, its files (name, size, sha256), its last use."""
    entry = get_entry(Store(cache_dir).require(), key)
    recs = entry.meta.get("files")
    recs = recs if isinstance(recs, dict) else {}  # damaged metadata: `cutecc verify` says how
    files = [{"name": n, "size": r.get("size"), "sha256": r.get("sha256")} if isinstance(r, dict)
             else {"name": n, "size": None, "sha256": None} for n, r in sorted(recs.items())]
    last = dt.datetime.fromtimestamp(entry.last_used(), dt.timezone.utc)
    return {
        "key": entry.key,
        "path": str(entry.path),
        "label": label(entry.meta),
        "disk_bytes": entry.disk_bytes(),
        "last_used": last.isoformat(timespec="seconds"),
        "files": files,
        "meta": entry.meta,
    }
