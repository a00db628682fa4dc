"""Find an installed `cutecc pack` wheel's cache tree without importing the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cutecc.errors import WorkError
from cutecc.lock.lockfile import LOCK_NAME

PACK_DIR = "_cutecc"  # a pack's cache-shaped tree, inside its import package
# in that tree: the fallbacks' pinned closures, each file at its path below its root
# (`cutecc.contract.fallbacks.ClosureFile.path`), read by `cutecc.runtime.fallback_code`
FALLBACK_DIR = "fallbacks"


def package_root(package: str) -> Path:
    """The `_cutecc/` directory of an installed pack, found by `find_spec` (no import)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise WorkError(f"no installed package {package!r}; `pip install` its wheel",
                        where="cutecc.load package")
    for loc in spec.submodule_search_locations:
        root = Path(loc) / PACK_DIR
        if (root / LOCK_NAME).is_file():
            return root
    raise WorkError(f"package {package!r} is not a cutecc pack (no {PACK_DIR}/{LOCK_NAME})",
                    where="cutecc.load package")
