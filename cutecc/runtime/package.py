"""Find an installed `cutecc pack` wheel's cache tree without importing the package."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

from cutecc.errors import WorkError
from cutecc.lock.lockfile import LOCK_NAME

PACK_DIR = "_cutecc"  # a pack's cache-shaped tree, inside its import package
# in that tree: the fallbacks' pinned closures, each file at its path below its root
# (`cutecc.contract.fallbacks.ClosureFile.path`), read by `cutecc.runtime.fallback_code`
FALLBACK_DIR = "fallbacks"
# what a pack's tree holds beyond a cache's areas (`cutecc.store.layout.AREAS`), by design
PACK_FILES = (LOCK_NAME, FALLBACK_DIR)


def is_pack_tree(root: str | Path) -> bool:
    """Whether the cache-shaped tree `root` is a pack's (`_cutecc/` of an installed wheel, or
    an unpacked tarball): its kernels.lock at the top, a regular file, as `package_root`
    finds it. A pack is read through that lock, never through an index, and never written."""
    try:
        return stat.S_ISREG(os.lstat(Path(root) / LOCK_NAME).st_mode)
    except OSError:
        return False


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
