"""The on-disk cache, owned here: `layout` (where everything is), `view` (reading, all the
runtime imports) and `writer` (publishing, removal, records); each record file the store
keeps is one typed record both ways (`index_record`, `build_records`, `stats`, `misses`,
`tuning_records`, `quarantine_note`), which the view and the writer read and write
through. See docs/architecture.md.

The public names are re-exported for `from cutecc.store import Store`; each is imported
on first use (PEP 562), so importing `cutecc.store.view` never loads the writer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cutecc.store.layout import HASH_CACHE, Layout, manifest_id
    from cutecc.store.view import (
        Entry,
        StoreView,
        default_cache_dir,
        entry_trust_problem,
        read_meta,
        touch_used,
    )
    from cutecc.store.writer import Store

_WHERE = {"HASH_CACHE": "layout", "Layout": "layout", "manifest_id": "layout",
          "Entry": "view", "StoreView": "view", "default_cache_dir": "view",
          "entry_trust_problem": "view", "read_meta": "view", "touch_used": "view",
          "Store": "writer"}
__all__ = ["HASH_CACHE", "Entry", "Layout", "Store", "StoreView", "default_cache_dir",
           "entry_trust_problem", "manifest_id", "read_meta", "touch_used"]


def __getattr__(name: str) -> Any:
    if name in ("layout", "view", "writer"):  # `import cutecc.store` then `cutecc.store.view`
        return importlib.import_module(f"cutecc.store.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cutecc.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cutecc.store.{module}"), name)
