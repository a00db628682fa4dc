"""Where everything in a cutecc cache lives: one function per path, no I/O.

Every other module asks this one for a path in the cache, so the layout is written down
once (the store's format, `STORE_FORMAT`, versions it as a whole; each file's own layout
has its format number, named beside its path). The cache directory is
`$CUTECC_CACHE_DIR`, else `v<STORE_FORMAT>` in the user's cache directory (XDG):

    README, CACHEDIR.TAG   who owns the directory; backup tools skip it
    format                 the store's format version
    entries/ab/<key>/      a published kernel entry: meta.json (ENTRY_FORMAT), the kernel's
                           library, `used` (its mtime is the last use)
    runtimes/ab/<key>/     a runtime library entry (meta.json of RUNTIME_ENTRY_FORMAT,
                           libcutecc_rt_<key16>.so, `used`), shared by every kernel library
                           of its toolchain
    by-kernel/<kernel>/<key>  the index: one record (INDEX_FORMAT) per entry of a kernel
    tmp/<key>.<rand>/      an entry being built, removed or unpacked
    locks/<key>.lock       held while a key is built, removed or quarantined; store.lock,
                           stats.lock and misses.lock guard the root's files
    quarantine/<key>.<time>/  entries `cutecc verify --fix` set aside, with why.json
                           (QUARANTINE_FORMAT)
    stats.json             build counters (STATS_FORMAT)
    misses.json            calls the runtime served by a kernel's fallback, per kernel, call
                           signature and arch (MISSES_FORMAT; bounded; never an entry)
    generations/<kernel>@<arch>.json  the keys the newest build planned (GENERATION_FORMAT)
    manifests/<sha>.json   the keys the newest build of a manifest planned and the SHA-256
                           of the sources they read, with its last 7 other builds, by its
                           path's SHA-256 (GENERATION_FORMAT)
    composites/<name>.json a composite kernel's launches (GENERATION_FORMAT)
    tuning/plans/<sha>.json    `cutecc tune`'s plan of a manifest, by its bytes' SHA-256
                           (PLAN_FORMAT)
    tuning/results/<key>.json  tuning results of one default entry (TUNING_FORMAT)
    src/<digest>/          kernel sources a Ray worker on another node received, by their
                           source digest (a node's own cache only)
    filehashes.json        planning cache: SHA-256s of installed files by stamp
    planfacts.json         planning cache: distribution digests, parsed sources, import closures

An entry's files are named by its meta.json; everything else in the cache is one of the
above (`cutecc verify` reports anything else as an orphan).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cutecc.entry.rules import (
    ENTRY_FORMAT,
    INDEX_FORMAT,
    META,
    RUNTIME_ENTRY_FORMAT,
    STORE_FORMAT,
    USED,
)

__all__ = [
    "AREAS", "ENTRY_FORMAT", "GENERATION_FORMAT", "INDEX_FORMAT", "MAX_PLAN_BYTES", "META", "MISSES",
    "MISSES_FORMAT",
    "PLAN_FORMAT", "QUARANTINE_FORMAT", "RUNTIME_ENTRY_FORMAT", "STATS_FORMAT", "STORE_FORMAT",
    "TUNING_FORMAT", "USED", "Layout", "entry_file_parts", "entry_parts", "manifest_id",
    "runtime_parts",
]

STATS_FORMAT = 1
MISSES_FORMAT = 1  # misses.json
QUARANTINE_FORMAT = 1  # the layout of why.json in a quarantined entry
GENERATION_FORMAT = 1  # generations/*.json, manifests/*.json and composites/*.json
PLAN_FORMAT = 1  # tuning/plans/*.json
TUNING_FORMAT = 1  # tuning/results/*.json (and a lock's tuning lines)
MAX_PLAN_BYTES = 16 << 20  # a tuning plan or record larger than this is not ours

# The names of the cache's areas, relative to its root.
ENTRIES = "entries"
RUNTIMES = "runtimes"
INDEX = "by-kernel"
TMP = "tmp"
LOCKS = "locks"
QUARANTINE = "quarantine"
GENERATIONS = "generations"
MANIFESTS = "manifests"
COMPOSITES = "composites"
TUNING_PLANS = ("tuning", "plans")
TUNING_RESULTS = ("tuning", "results")
SOURCES = "src"
STATS = "stats.json"
MISSES = "misses.json"
HASH_CACHE = "filehashes.json"
PLAN_FACTS = "planfacts.json"  # beside HASH_CACHE (`cutecc.toolchain.hashcache.HashCache` derives it)
FORMAT = "format"
README = "README"
CACHEDIR_TAG = "CACHEDIR.TAG"

# Every top-level name of the cache: what `cutecc verify`, `gc` and `rm` know.
AREAS: tuple[str, ...] = (README, CACHEDIR_TAG, FORMAT, ENTRIES, RUNTIMES, INDEX, TMP, LOCKS,
                          QUARANTINE, STATS, MISSES, GENERATIONS, MANIFESTS, COMPOSITES, "tuning", SOURCES,
                          HASH_CACHE, PLAN_FACTS)


def manifest_id(manifest: Path) -> str:
    """A manifest's name in `manifests/`: the SHA-256 of its absolute path."""
    return hashlib.sha256(str(Path(manifest).absolute()).encode()).hexdigest()


def entry_file_parts(path: Path) -> tuple[Path, tuple[str, ...]]:
    """(cache root, parts under it) of a file of an entry or runtime entry
    (`<root>/entries/ab/<key>/<file>`), as `cutecc.trust.read_file` takes them."""
    return path.parents[3], path.parts[-4:]


def entry_parts(key: str) -> tuple[str, str, str]:
    """`entries/ab/<key>` as parts under a cache's (or a pack's) root."""
    return (ENTRIES, key[:2], key)


def runtime_parts(key: str) -> tuple[str, str, str]:
    """`runtimes/ab/<key>` as parts under a cache's (or a pack's) root."""
    return (RUNTIMES, key[:2], key)


def meta_parts(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The `meta.json` of the entry (or runtime entry) directory at `parts` under a cache's
    (or a pack's) root (`entry_parts`, `runtime_parts`), as parts under that root."""
    return (*parts, META)


def member(parts: tuple[str, ...]) -> str:
    """The name, in a pack's tree, of the path `parts` under a cache's root (`entry_parts`,
    `meta_parts`, ...): the parts joined by `/`, how `pack` writes it and `unpack` reads it."""
    return "/".join(parts)


def member_parts(name: str) -> tuple[str, str, str] | None:
    """(area, key, file) of a pack member `area/ab/<key>/<file>` (`member`), area being
    `entries` or `runtimes`; None for any other name. The shard is not checked here: a file
    under the wrong one is missing from its entry, which `unpack` refuses."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] not in (ENTRIES, RUNTIMES):
        return None
    return parts[0], parts[2], parts[3]


def meta_file(entry_dir: Path) -> Path:
    """`<entry>/meta.json` of an entry or runtime entry directory: in a cache
    (`Layout.entry`, `Layout.runtime`), or one being staged or received."""
    return entry_dir / META


@dataclass(frozen=True)
class Layout:
    """The paths of one cache directory (`root`). Pure: it creates and reads nothing."""

    root: Path

    @classmethod
    def of_entry(cls, entry_dir: Path) -> Layout:
        """The layout of the cache holding entry (or runtime entry) directory `entry_dir`."""
        return cls(entry_dir.parents[2])

    # The root's files ----------------------------------------------------------------

    def format_file(self) -> Path:
        """`format`: the store's format version (`STORE_FORMAT`), one line."""
        return self.root / FORMAT

    def readme(self) -> Path:
        """`README`: says who owns the directory."""
        return self.root / README

    def cachedir_tag(self) -> Path:
        """`CACHEDIR.TAG`: tells backup tools to skip the cache."""
        return self.root / CACHEDIR_TAG

    def stats(self) -> Path:
        """`stats.json`: the build counters (`STATS_FORMAT`), guarded by `stats_lock`."""
        return self.root / STATS

    def hash_cache(self) -> Path:
        """`filehashes.json`: remembered SHA-256s of installed files (a planning cache);
        `planfacts.json` lies beside it (`plan_facts`)."""
        return self.root / HASH_CACHE

    def plan_facts(self) -> Path:
        """`planfacts.json`: remembered distribution digests, parsed sources and import closures."""
        return self.root / PLAN_FACTS

    # Entries -------------------------------------------------------------------------

    def entries(self) -> Path:
        """`entries/`: the published kernel entries, in shards of their key's first two
        hex digits."""
        return self.root / ENTRIES

    def entry(self, key: str) -> Path:
        """`entries/ab/<key>/`: one kernel entry's directory."""
        return self.root / ENTRIES / key[:2] / key

    def entry_str(self, key: str) -> str:
        """`entry` as a string (cheaper where a build handles 10,000 keys)."""
        return os.path.join(self.root, ENTRIES, key[:2], key)

    def entry_meta(self, key: str) -> Path:
        """`entries/ab/<key>/meta.json`: what the entry is (`ENTRY_FORMAT`)."""
        return meta_file(self.entry(key))

    def entry_meta_str(self, key: str) -> str:
        """`entry_meta` as a string (cheaper where a build handles 10,000 keys)."""
        return os.path.join(self.entry_str(key), META)

    def runtimes(self) -> Path:
        """`runtimes/`: the runtime library entries, sharded like `entries/`."""
        return self.root / RUNTIMES

    def runtime(self, key: str) -> Path:
        """`runtimes/ab/<key>/`: one runtime library entry's directory."""
        return self.root / RUNTIMES / key[:2] / key

    def runtime_meta(self, key: str) -> Path:
        """`runtimes/ab/<key>/meta.json`: what the runtime library entry is."""
        return meta_file(self.runtime(key))

    def runtime_library(self, key: str, soname: str) -> Path:
        """`runtimes/ab/<key>/<soname>`: the runtime library a kernel library links against."""
        return self.runtime(key) / soname

    def used(self, entry_dir: Path) -> Path:
        """`<entry>/used`: empty; its mtime records the entry's last use."""
        return entry_dir / USED

    # The index -----------------------------------------------------------------------

    def index(self) -> Path:
        """`by-kernel/`: the index, one directory per kernel."""
        return self.root / INDEX

    def index_kernel(self, kernel: str) -> Path:
        """`by-kernel/<kernel>/`: the records of one kernel's entries."""
        return self.root / INDEX / kernel

    def index_record(self, kernel: str, key: str) -> Path:
        """`by-kernel/<kernel>/<key>`: one entry's record (`INDEX_FORMAT`)."""
        return self.root / INDEX / kernel / key

    def index_record_str(self, kernel: str, key: str) -> str:
        """`index_record` as a string (a no-op build reads 10,000 of these)."""
        return os.path.join(self.root, INDEX, kernel, key)

    # Work in progress ----------------------------------------------------------------

    def tmp(self) -> Path:
        """`tmp/`: entries being built (`<key>.<rand>`), removed (`<key>.rm-<rand>`) or
        unpacked (`<tag>.unpack`); swept under each key's lock."""
        return self.root / TMP

    def staging(self, name: str) -> Path:
        """`tmp/<name>`: one staging directory (its name starts with the key it is for)."""
        return self.root / TMP / name

    def locks(self) -> Path:
        """`locks/`: lock files; nothing else is written there but a writability probe."""
        return self.root / LOCKS

    def key_lock(self, key: str) -> Path:
        """`locks/<key>.lock`: held while the key is built, removed or quarantined."""
        return self.root / LOCKS / f"{key}.lock"

    def store_lock(self) -> Path:
        """`locks/store.lock`: guards the creation of the root's files."""
        return self.root / LOCKS / "store.lock"

    def stats_lock(self) -> Path:
        """`locks/stats.lock`: guards `stats.json`."""
        return self.root / LOCKS / "stats.lock"

    def misses(self) -> Path:
        """`misses.json`: the calls fallbacks served (`MISSES_FORMAT`), guarded by `misses_lock`."""
        return self.root / MISSES

    def misses_lock(self) -> Path:
        """`locks/misses.lock`: guards `misses.json`."""
        return self.root / LOCKS / "misses.lock"

    def quarantine(self) -> Path:
        """`quarantine/`: entries `cutecc verify --fix` set aside."""
        return self.root / QUARANTINE

    def quarantined(self, key: str, stamp: str) -> Path:
        """`quarantine/<key>.<time>/`: one set-aside entry, with why.json (`QUARANTINE_FORMAT`)."""
        return self.root / QUARANTINE / f"{key}.{stamp}"

    # What builds recorded ------------------------------------------------------------

    def generations(self) -> Path:
        """`generations/`: per kernel and arch, the keys of the newest build."""
        return self.root / GENERATIONS

    def generation(self, kernel: str, arch: str) -> Path:
        """`generations/<kernel>@<arch>.json` (`GENERATION_FORMAT`)."""
        return self.root / GENERATIONS / f"{kernel}@{arch}.json"

    def manifests(self) -> Path:
        """`manifests/`: per manifest (by path), the keys of its newest build."""
        return self.root / MANIFESTS

    def manifest_record(self, manifest: Path) -> Path:
        """`manifests/<sha of its absolute path>.json` (`GENERATION_FORMAT`)."""
        return self.root / MANIFESTS / f"{manifest_id(manifest)}.json"

    def composites(self) -> Path:
        """`composites/`: composite kernels (launches of other kernels, no entry of their own)."""
        return self.root / COMPOSITES

    def composite(self, name: str) -> Path:
        """`composites/<name>.json` (`GENERATION_FORMAT`)."""
        return self.root / COMPOSITES / f"{name}.json"

    def composite_parts(self, name: str) -> tuple[str, str]:
        """`composite`'s parts under the root (for `cutecc.trust.read_file`)."""
        return (COMPOSITES, f"{name}.json")

    # Tuning --------------------------------------------------------------------------

    def tuning(self) -> Path:
        """`tuning/`: what `cutecc tune` keeps (plans and results)."""
        return self.root / TUNING_PLANS[0]

    def tuning_plans(self) -> Path:
        """`tuning/plans/`: `cutecc tune`'s plans, by manifest."""
        return self.root.joinpath(*TUNING_PLANS)

    def tuning_plan(self, digest: str) -> Path:
        """`tuning/plans/<manifest sha256>.json` (`PLAN_FORMAT`): every candidate of every
        tuned kernel with its key, so measuring needs only the cache."""
        return self.root.joinpath(*TUNING_PLANS, f"{digest}.json")

    def tuning_plan_parts(self, digest: str) -> tuple[str, ...]:
        """`tuning_plan`'s parts under the root."""
        return (*TUNING_PLANS, f"{digest}.json")

    def tuning_results(self) -> Path:
        """`tuning/results/`: measured winners, per default entry."""
        return self.root.joinpath(*TUNING_RESULTS)

    def tuning_result(self, base: str) -> Path:
        """`tuning/results/<default key>.json` (`TUNING_FORMAT`): the full records (lines
        and times) of one default entry's tuning."""
        return self.root.joinpath(*TUNING_RESULTS, f"{base}.json")

    def tuning_result_parts(self, base: str) -> tuple[str, ...]:
        """`tuning_result`'s parts under the root."""
        return (*TUNING_RESULTS, f"{base}.json")

    # Sources -------------------------------------------------------------------------

    def sources(self) -> Path:
        """`src/`: kernel sources received by a Ray worker on another node."""
        return self.root / SOURCES

    def source_tree(self, digest: str) -> Path:
        """`src/<source digest>/`: one kernel's source closure, as its key names it."""
        return self.root / SOURCES / digest
