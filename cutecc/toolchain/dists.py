"""Installed code and the environment in the key: what a kernel reaches beyond the project.

A kernel's key covers, besides the project's own modules (`cutecc.plan.key.SourceIndex`):

- every installed distribution whose code the kernel's imports run (`DistIndex.reaches`):
  one that installs a top-level module the kernel's code imports (the entry's own package
  included), or a module at some level of an imported name (a sub-package added to
  another distribution's package, as nvidia-cutlass-operators adds `cutlass.operators`
  to the DSL's `cutlass`, counts only where imported), every DSL distribution
  (`nvidia-cutlass-dsl*`, whole: whatever it imports of its own at run time) and
  the toolchain's (`apache-tvm-ffi`, `nvidia-cuda-runtime`, `cuda-bindings`), each by
  name, version and a digest of its installed files: small ones by content, large ones
  (torch, triton, the DSL's native libraries) by their RECORD plus the hash of any file
  that no longer matches it, so an edited installed file changes the key, and the same
  wheel installed anywhere gives the same digest (no times; the committed kernels.lock
  must reproduce on CI). A build remembers each digest in its store under the stamps
  (size, mtime, ctime, inode, device) of the distribution's files (`HashCache`), so a
  no-op build stats installed files and reads none (a RECORD-only digest: under the
  RECORD's stamp; an entry's import closure: under its files' and searched directories'
  stamps, `HashCache.closure`); a first planning reads none whose stat its RECORD vouches
  for (`recordstat`: the RECORD's SHA-256 is taken as the file's, so the digest is
  hashing's), and `HashCache.trust_records` off hashes them all. Byte code, files outside
  site-packages (console scripts: their first line names the interpreter) and the
  dist-info's files (written or rewritten by the installer: INSTALLER, REQUESTED,
  direct_url.json naming where the wheel came from; the version stands for them) are
  left out;
- the distributions those require (Requires-Dist, transitively), by name, version and
  RECORD digest (installed code outside the walked closure reaches others through
  these: what it imports without declaring it, as the DSL imports numpy, is not keyed);
- the compile-affecting environment: `CUTE_DSL_*`, `CUTLASS_*`, `QUACK_*`,
  `FLASH_ATTENTION_*`, `FA_*`, less `ENV_EXCLUDED` (caches, dumps, logs), and the
  manifest's `[env]`, which the build workers set.
Editable installs are keyed by their sources: the index treats their packages as
project-local (RECORD lists only the install's shim).
"""

from __future__ import annotations

import base64
import csv
import email.message
import email.parser
import fnmatch
import functools
import hashlib
import importlib.metadata as md
import json
import operator
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.machinery import EXTENSION_SUFFIXES
from stat import S_ISLNK
from typing import Any

from cutecc.toolchain import hashcache
from cutecc.toolchain.hashcache import HashCache, path_stamp, settled
from cutecc.toolchain.planfacts import DIGEST, FLAG, INSTALLED, LISTED, Fact, InstalledFacts, Listed, T
from cutecc.toolchain.recordstat import by_stat, record_hex

DSL_PREFIX = "nvidia-cutlass-dsl"
TOOLCHAIN_DISTS = ("apache-tvm-ffi", "nvidia-cuda-runtime", "cuda-bindings")
FULL_HASH_LIMIT = 64 << 20  # bytes installed: above, RECORD digest + stat fingerprint
ENV_PREFIXES = ("CUTE_DSL_", "CUTLASS_", "QUACK_", "FLASH_ATTENTION_", "FA_")
# Read by that code but not deciding what it compiles (fnmatch patterns). CUTE_DSL_ARCH is
# the arch, keyed on its own. FA_LOG_LEVEL is kept: FA4 keys its own compiles on it.
ENV_EXCLUDED = ("CUTE_DSL_ARCH", "CUTE_DSL_CACHE_DIR", "CUTE_DSL_DISABLE_FILE_CACHING",
                "CUTE_DSL_DUMP_DIR", "CUTE_DSL_KEEP*", "CUTE_DSL_FILTER_STACKTRACE",
                "CUTE_DSL_SHOW_STACKTRACE", "CUTE_DSL_LOG_*", "QUACK_CACHE_*",
                "QUACK_COMPILE_WORKERS", "QUACK_ASYNC_COMPILE_START", "FLASH_ATTENTION_CUTE_DSL_CACHE_*")
DIGEST_VERSION = 1  # what a remembered digest was computed by: bumped with `_compute`
_MODULE_ENDS = ("/__init__.py", ".py", *(f"/__init__{s}" for s in EXTENSION_SUFFIXES),
                *EXTENSION_SUFFIXES)
_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def compile_env(manifest_env: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                environ: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """The environment that decides what a build compiles: the keyed variables of the
    build's environment, and all of the manifest's `[env]` (which workers set)."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k.startswith(ENV_PREFIXES) and not any(fnmatch.fnmatchcase(k, p) for p in ENV_EXCLUDED)}
    env.update(dict(manifest_env))
    return dict(sorted(env.items()))


class _Installed(dict):
    """Distribution name -> the distribution import would use (first on sys.path), with
    `every`: all of them, shadowed ones too, as `(name, distribution, the top-level names
    its top_level.txt declares)`, and what was read of them (`_facts`, once each)."""

    def __init__(self) -> None:
        super().__init__()
        self.every: list[tuple[str, md.Distribution, tuple[str, ...]]] = []
        self.facts: dict[str, InstalledFacts] = {}  # name -> `_facts` of the one import uses
        self.inferred: dict[int, set[str]] = {}  # id(distribution) -> `_inferred_tops`


# Where `_installed` remembers what it read of each distribution (`DistIndex` sets it).
_MEMORY: list[HashCache] = []
# The files of a distribution's metadata directory `_read_facts` reads (with the directory).
_META_FILES = ("METADATA", "PKG-INFO", "top_level.txt", "RECORD", "direct_url.json", "requires.txt")


@functools.lru_cache(maxsize=1)
def _installed() -> _Installed:
    out = _Installed()
    for d in md.distributions():  # first on sys.path wins, as import would
        facts = _facts(d)
        name = facts.name
        if name:
            out.every.append((normalize(name), d, tuple(facts.tops)))
            if facts.inferred is not None:
                out.inferred[id(d)] = set(facts.inferred)
            if normalize(name) not in out:
                out[normalize(name)] = d
                out.facts[normalize(name)] = facts
    return out


def _facts(d: md.Distribution) -> InstalledFacts:
    """What planning reads of installed distribution `d` (`_read_facts`), remembered in the
    planning caches (`_MEMORY`) under the stamps of its metadata directory and of the files
    in it that are read: on a no-op, 147 METADATA files are stat'ed, not parsed."""
    path = getattr(d, "_path", None)
    if not _MEMORY or not isinstance(d, md.PathDistribution) or path is None:
        return _read_facts(d)
    files = [str(path), *(os.path.join(str(path), f) for f in _META_FILES)]
    stamps = [path_stamp(f) for f in files]
    fp = f"installed\0{DIGEST_VERSION}\0{stamps}"
    stable = stamps[0] is not None and all(
        st is None or time.time_ns() - st[2] >= hashcache.SETTLE_NS for st in stamps)
    if stable and (known := _MEMORY[0].recall(f"{path}\0installed", fp, INSTALLED)) is not None:
        return known
    facts = _read_facts(d)
    if stable and [path_stamp(f) for f in files] == stamps:
        _MEMORY[0].remember(f"{path}\0installed", fp, INSTALLED, facts)
    return facts


def _read_facts(d: md.Distribution) -> InstalledFacts:
    """Distribution `d`'s name and version (METADATA's headers), the top-level names its
    top_level.txt declares (else those its RECORD's `.py` files imply: `inferred`), the
    names of the distributions it requires (`_requires`) and whether it is editable."""
    meta = _headers(d)
    tops = (d.read_text("top_level.txt") or "").split()
    try:
        info = json.loads(d.read_text("direct_url.json") or "{}")
    except ValueError:
        info = {}
    reqs = meta.get_all("Requires-Dist")
    return InstalledFacts(meta["Name"], meta["Version"], tops,
                          None if tops else sorted(_read_inferred_tops(d)),
                          _required_names(d.requires or [] if reqs is None else reqs),  # None: requires.txt
                          bool(isinstance(info, dict) and (info.get("dir_info") or {}).get("editable")))


def _headers(d: md.Distribution) -> email.message.Message:
    """`d.metadata`'s headers, read as it reads them, less the body it parses too (torch's
    long description: a fifth of the planning time)."""
    text = d.read_text("METADATA") or d.read_text("PKG-INFO") or d.read_text("") or ""
    head = text.split("\n\n", 1)[0] if "\r" not in text else text
    return email.parser.HeaderParser().parsestr(head)


def _version(name: str) -> str:
    return str(_installed().facts[name].version)


@functools.cache
def _owners(top: str) -> tuple[str, ...]:
    """Names of the distributions that install top-level module `top`, as
    `importlib.metadata.packages_distributions` tells them (top_level.txt, else the first
    component of each `.py` file in RECORD), without building a path object per RECORD
    row as it does (ziglang's 19,500: a tenth of a second of every no-op build)."""
    out = set()
    for name, d, declared in _installed().every:
        if top in (declared or _inferred_tops(d)):
            out.add(name)
    return tuple(sorted(out))


def _inferred_tops(d: md.Distribution) -> set[str]:
    """The top-level names `packages_distributions` infers for `d` from its RECORD, read
    once per process (or remembered: `_facts`)."""
    memo = _installed().inferred
    if id(d) not in memo:
        memo[id(d)] = _read_inferred_tops(d)
    return memo[id(d)]


def _read_inferred_tops(d: md.Distribution) -> set[str]:
    """The first component of each `.py` file `d`'s RECORD lists."""
    if not isinstance(d, md.PathDistribution):
        files = [f for f in d.files or () if f.suffix == ".py"]
        return {f.parts[0] if len(f.parts) > 1 else f.with_suffix("").name for f in files}
    out = set()
    for line in (d.read_text("RECORD") or "").splitlines():
        if ".py" not in line:  # only these can name a .py file once normalized
            continue
        name = next(csv.reader([line]))[0] if line.startswith('"') else line.partition(",")[0]
        _, parts = _parts(name)
        if parts and _suffix(parts[-1]) == ".py":
            out.add(parts[0] if len(parts) > 1 else parts[0][: parts[0].rfind(".")])
    return out


def owners(top: str) -> tuple[str, ...]:
    """The distributions installing top-level module `top` (none: the stdlib or the project)."""
    return _owners(top)


def tops(name: str) -> tuple[str, ...]:
    """The top-level module names distribution `name` (the one import uses) installs, as
    `owners` reads them: its top_level.txt's, else those its RECORD's `.py` files imply."""
    installed = _installed()
    d = installed.get(name)
    if d is None:
        return ()
    return tuple(installed.facts[name].tops) or tuple(sorted(_inferred_tops(d)))


@functools.cache
def is_editable(name: str) -> bool:
    """Whether distribution `name` is an editable install (its RECORD covers no sources)."""
    facts = _installed().facts.get(normalize(name))
    return bool(facts and facts.editable)


def _requires(name: str) -> list[str]:
    facts = _installed().facts.get(name)
    return list(facts.requires) if facts else []


def _required_names(reqs: Iterable[str]) -> list[str]:
    """The names of the distributions Requires-Dist lines `reqs` require (less extras')."""
    out = []
    for req in reqs:
        if "extra ==" in req.replace('"', "").replace("'", ""):
            continue  # only with an extra; not what the distribution itself needs
        m = _REQ_NAME.match(req.strip())
        if m:
            out.append(normalize(m.group()))
    return out


def installed_fingerprint() -> list[Any]:
    """Which distributions are installed where, and their RECORDs' stamps: what says which
    packages a distribution owns and which are editable (`owners`, `is_editable`)."""
    out = []
    for name, d, tops in _installed().every:
        where = str(getattr(d, "_path", ""))
        out.append([name, where, list(tops), path_stamp(os.path.join(where, "RECORD")) if where else None])
    return out


class _Record:
    """A distribution's RECORD within one planning pass: its stamp, taken before it is read,
    and whether what is computed from it may be remembered under that stamp (`stable`: the
    stamp is settled and the file read had it still)."""

    def __init__(self, d: md.Distribution) -> None:
        self.d = d
        self.file = os.path.join(str(d._path), "RECORD") if isinstance(d, md.PathDistribution) else None
        self.stamp = path_stamp(self.file) if self.file else None
        self.stable = self.stamp is not None and time.time_ns() - self.stamp[2] >= hashcache.SETTLE_NS
        self._text: str | None = None
        self._rows: dict[str, tuple[str, str]] | None = None

    def text(self) -> str:
        if self._text is None:
            self._text = self.d.read_text("RECORD") or ""
            if self.file is None or path_stamp(self.file) != self.stamp:
                self.stable = False  # changed while read: nothing from it is remembered
        return self._text

    def installer(self) -> list[int] | None:
        """The stamp of the INSTALLER beside this RECORD (`recordstat`), None if none."""
        return path_stamp(os.path.join(os.path.dirname(self.file), "INSTALLER")) if self.file else None

    def rows(self) -> dict[str, tuple[str, str]]:
        if self._rows is None:
            self._rows = _portable_rows(self.text())
        return self._rows

    def fact(self, hashes: HashCache, what: str, compute: Callable[[], T], kind: Fact[T]) -> T:
        """`compute()`, a function of this RECORD's text alone, remembered in `hashes` under
        the RECORD's stamp (read from there while the stamp holds and it is of `kind`)."""
        key, fp = f"{self.file}\0{what}", f"{what}\0{DIGEST_VERSION}\0{self.stamp}"
        if self.stable and (known := hashes.recall(key, fp, kind)) is not None:
            return known
        value = compute()
        if self.stable:  # (`compute` read the text, which would have unset it)
            hashes.remember(key, fp, kind, value)
        return value


class DistIndex:
    """Digests of installed distributions, each computed once per planning pass."""

    def __init__(self, hash_cache: HashCache | None = None) -> None:
        self.hashes = hash_cache or HashCache(None)
        _MEMORY[:] = [self.hashes]  # what `_installed` reads remembered there (`_facts`)
        self._digest: dict[tuple[str, bool], str] = {}
        self._records: dict[str, _Record] = {}

    def reached(self, modules: Iterable[str]) -> dict[str, str]:
        """`{distribution: "version digest"}` for what code importing `modules` (dotted
        names) reaches: the distributions installing them (`reaches`), the DSL and
        toolchain distributions (content or stat digests), and their Requires-Dist closure
        (RECORD digests)."""
        installed = _installed()
        by_top: dict[str, set[str]] = {}
        for m in modules:
            by_top.setdefault(m.split(".")[0], set()).add(m)
        direct = {n for top, mods in by_top.items() for n in owners(top) if self.reaches(n, top, mods)}
        direct |= {n for n in installed if n.startswith(DSL_PREFIX)}
        direct |= {n for n in TOOLCHAIN_DISTS if n in installed}
        out = {}
        todo, seen = sorted(direct), set(direct)
        while todo:
            name = todo.pop()
            if name not in installed:
                continue
            for dep in _requires(name):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        for name in sorted(seen):
            if name in installed:
                out[name] = f"{_version(name)} {self.digest(name, full=name in direct)}"
        return out

    def environment(self, names: Iterable[str]) -> dict[str, str]:
        """`{distribution: "version digest"}` of the installed distributions `names` as a
        lock's environment records them: each by its installed files (the `full` digest:
        their contents, or a large one's RECORD plus any file that no longer matches it),
        whether a kernel's key took it so or by its RECORD alone (a requirement only), so a
        distribution is named alike whichever kernels a build planned, and an edited
        installed file is named whichever kernel reaches it."""
        installed = _installed()
        return {n: f"{_version(n)} {self.digest(n, full=True)}" for n in sorted(set(names)) if n in installed}

    def reaches(self, name: str, top: str, modules: Iterable[str]) -> bool:
        """Whether importing `modules` (all under `top`) runs code of distribution `name`,
        one of `top`'s owners: it installs `top` itself (its `__init__`, which every import
        under it runs), or one of the modules at some level of their dotted names (a
        sub-package it adds to another distribution's package, as nvidia-cutlass-operators
        adds `cutlass/operators/` to the DSL's `cutlass`: keyed only where imported). Told by
        the paths in its RECORD (the answer remembered under its stamp); one whose RECORD
        puts nothing at `top/` (installed elsewhere, through a .pth) counts as reached."""
        record = self._record(name)
        if record is None:
            return True
        modules = sorted(set(modules))
        return bool(record.fact(self.hashes, "reaches\0" + "\0".join([top, *modules]),
                                lambda: _reaches(record.rows(), top, modules), FLAG))

    def installs(self, name: str, path: str) -> bool:
        """Whether the file at `path` is distribution `name`'s own: one its RECORD lists
        (not a same-named module found ahead of it on the path)."""
        d = _installed().get(name)
        record = self._record(name)
        if d is None or record is None:
            return False
        base = str(d.locate_file(""))
        for b, p in ((os.path.abspath(base), os.path.abspath(path)),
                     (os.path.realpath(base), os.path.realpath(path))):
            prefix = b if b.endswith(os.sep) else b + os.sep
            if p.startswith(prefix) and p[len(prefix):].replace(os.sep, "/") in record.rows():
                return True
        return False

    def _record(self, name: str) -> _Record | None:
        """Distribution `name`'s RECORD this pass (None: not installed)."""
        if name not in self._records:
            d = _installed().get(name)
            if d is None:
                return None
            self._records[name] = _Record(d)
        return self._records[name]

    def digest(self, name: str, *, full: bool) -> str:
        """A distribution's digest: its files' contents (small, `full`), else its RECORD
        plus (if `full`) the hash of every installed file that no longer matches it (no
        times or paths: a key is the same on every machine that installed the same wheel)."""
        if (name, full) not in self._digest:
            self._digest[(name, full)] = self._compute(name, full)
        return self._digest[(name, full)]

    def _compute(self, name: str, full: bool) -> str:
        d = _installed()[name]
        rec = self._record(name)
        assert rec is not None

        def record() -> str:
            return "".join(f"{rel},{digest},{size}\n" for rel, (digest, size) in sorted(rec.rows().items()))

        if not full:  # a function of the RECORD alone: remembered under its stamp (the
            # thirty-odd distributions torch and the DSL require, read on every no-op)
            return rec.fact(self.hashes, "record", lambda: _sha256(b"record\0" + record().encode()), DIGEST)
        # The files the digest covers, as the RECORD lists them (remembered under its stamp:
        # torch lists 14,000), each stat'ed; their stamps tell the digest unchanged without
        # reading a file (`HashCache`), as does the RECORD's (or, unsettled, its text).
        base = str(d.locate_file(""))
        prefix = base if base.endswith("/") else base + "/"
        # (one string of the paths in RECORD, NUL-separated, and the few paths on disk that
        # are not the prefix's join: loaded with the cache's facts on every no-op)
        listed = rec.fact(self.hashes, "listed",
                          lambda: _pack_listed(_listed(d, rec.text(), rec.rows()), prefix), LISTED)
        joined, odd = listed.joined, listed.odd
        by_stamp = rec.stable
        stats: list[tuple[str, str, os.stat_result | None]] = []
        linked: set[str] = set()  # listed paths that are symbolic links: never trusted by stat
        for i, rel in enumerate(joined.split("\0") if joined else ()):
            p = (odd.get(str(i)) or prefix + rel) if odd else prefix + rel
            try:
                one = os.lstat(p)  # (the same as `os.stat` but for a link, stat'ed through next)
                if S_ISLNK(one.st_mode):
                    linked.add(rel)
                    one = os.stat(p)
                stats.append((rel, p, one))
            except OSError:
                stats.append((rel, p, None))  # a listed file is gone: part of the digest
        stats.sort(key=operator.itemgetter(0))
        fp = hashlib.sha256(f"{DIGEST_VERSION}\0{FULL_HASH_LIMIT}\0".encode())
        fp.update(f"stamp\0{rec.stamp}".encode() if by_stamp else rec.text().encode())
        # (each stamp as str(stamp(st)) spells it, formatted at once)
        fp.update("".join([
            f"\0{rel}\0[{st.st_size}, {st.st_mtime_ns}, {st.st_ctime_ns}, {st.st_ino}, {st.st_dev}]"
            if st else f"\0{rel}\0missing" for rel, _, st in stats]).encode())
        where = str(getattr(d, "_path", name))
        known = self.hashes.dist_digest(where, fp.hexdigest())
        if known is not None:
            return known
        rows = rec.rows()
        if by_stamp and not rec.stable:  # the RECORD changed since its stamp was taken: afresh
            self._records[name] = _Record(d)  # (its new stamp is unsettled: read as text)
            return self._compute(name, full)
        # Files the RECORD vouches for by their stat alone (`by_stat`: its digest for theirs);
        # the others are read and hashed, on several threads.
        trusted = (by_stat(rec.stamp, rec.installer(), rec.stable, rows, stats, linked, prefix)
                   if self.hashes.trust_records else set())
        self.hashes.prefetch([(p, st) for rel, p, st in stats if st is not None and rel not in trusted])
        h = hashlib.sha256()
        size = sum(st.st_size for _, _, st in stats if st is not None)
        if size > FULL_HASH_LIMIT:
            # The RECORD, which names every file's SHA-256, stands for the contents, so the
            # digest is the same on every machine that installed the same wheel; each file
            # is checked against it (hashed once per change of its stamp, through the hash
            # cache), and one that differs (edited after install) adds its own hash.
            h.update(b"record\0" + record().encode())
            for rel, p, st in stats:
                if rel in trusted:
                    continue  # (its digest is its row's)
                got = self.hashes.sha256(p) if st else "missing"
                if rows[rel][0] != _record_digest(got):
                    h.update(f"{rel}\0{got}\0".encode())
        else:
            h.update(b"content\0")
            for rel, p, st in stats:
                got = record_hex(rows[rel][0]) if rel in trusted else (
                    self.hashes.sha256(p) if st else "missing")
                h.update(f"{rel}\0{got}\0".encode())
        if all(st is not None and settled(st) for _, _, st in stats):
            self.hashes.remember_dist(where, fp.hexdigest(), h.hexdigest())
        return h.hexdigest()


def _pack_listed(listed: list[tuple[str, str]], prefix: str) -> Listed:
    """`_listed`'s `(path in RECORD, path on disk)` pairs as `DistIndex._compute` remembers them."""
    return Listed("\0".join(rel for rel, _ in listed),
                  {str(i): p for i, (rel, p) in enumerate(listed) if p != prefix + rel})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reaches(rows: Mapping[str, Any], top: str, modules: Iterable[str]) -> bool:
    """`DistIndex.reaches` told by a RECORD's `rows`."""
    if any(f"{top}{end}" in rows for end in _MODULE_ENDS):
        return True
    if not any(r.startswith((f"{top}/", f"{top}.")) for r in rows):
        return True
    for m in modules:
        parts = m.split(".")
        for i in range(2, len(parts) + 1):
            p = "/".join(parts[:i])
            if any(f"{p}{end}" in rows for end in _MODULE_ENDS) or any(
                    r.startswith(f"{p}/") for r in rows):
                return True
    return False


def _listed(d: md.Distribution, record: str, rows: Mapping[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """`(path in RECORD, path on disk)` of each file of `d` its digest covers: the files its
    RECORD lists (as `Distribution.files` reads them) that `rows` keeps, less byte code.
    Read without building a path object per file (torch lists 14,000)."""
    if not isinstance(d, md.PathDistribution) or not record:
        out = []
        for f in d.files or []:
            rel = f.as_posix()
            if "__pycache__" in f.parts or f.suffix == ".pyc" or rel not in rows:
                continue  # not what pip wrote from the wheel, or an installer's own record
            out.append((rel, str(f.locate())))
        return out
    base = str(d.locate_file(""))
    prefix = base if base.endswith("/") else base + "/"
    out = []
    for line in record.splitlines():
        if not line:
            continue  # (`files` would fail on it)
        raw = next(csv.reader([line]))[0] if line.startswith('"') else line.partition(",")[0]
        if raw in rows and _normal(raw):
            # The usual row, already as `PackagePath` spells it and kept by `rows` (so not
            # under __pycache__): only byte code is left out (`_suffix`), and the path is
            # os.path.join's.
            last = raw.rpartition("/")[2]
            if not (last.endswith(".pyc") and last != ".pyc"):
                out.append((raw, prefix + raw))
            continue
        name, parts = _parts(raw)
        if "__pycache__" in parts or _suffix(parts[-1] if parts else "") == ".pyc" or name not in rows:
            continue
        out.append((name, os.path.join(base, name)))
    return out


def _normal(name: str) -> bool:
    """Whether a RECORD path is already as `PackagePath` (pathlib) spells it, relative."""
    return not (not name or name.startswith(("/", "./")) or "//" in name or "/./" in name
                or name.endswith(("/", "/.")) or name == ".")


def _parts(name: str) -> tuple[str, tuple[str, ...]]:
    """A RECORD path as `PackagePath` (pathlib) normalizes it, and its parts, without
    building a path object for the usual, already normal, path."""
    if not _normal(name):
        f = md.PackagePath(name)
        return f.as_posix(), f.parts
    return name, tuple(name.split("/"))


def _suffix(last: str) -> str:
    """A file name's suffix as pathlib tells it ("" for ".pyc" itself or "a.")."""
    i = last.rfind(".")
    return last[i:] if 0 < i < len(last) - 1 else ""


def _portable_rows(record: str) -> dict[str, tuple[str, str]]:
    """A RECORD's rows `{path: (digest, size)}` that are the same wherever the wheel was
    installed: only what the distribution installed into site-packages (files outside it,
    console scripts whose first line names this interpreter, differ per environment), no
    byte code, and none of the dist-info's files (an installer writes or rewrites them:
    INSTALLER, REQUESTED, direct_url.json naming where the wheel came from, RECORD)."""
    out = {}
    for line in record.splitlines():
        rel, _, rest = line.partition(",")
        digest, _, size = rest.partition(",")
        if not rel or rel.startswith("..") or (
                "__pycache__" in rel and "__pycache__" in rel.split("/")) or (
                ".dist-info" in rel and any(part.endswith(".dist-info") for part in rel.split("/"))):
            continue
        out[rel] = (digest, size)
    return out


def _record_digest(hex_sha256: str) -> str:
    """A SHA-256 as RECORD writes it (`sha256=` and unpadded URL-safe base64)."""
    try:
        raw = bytes.fromhex(hex_sha256)
    except ValueError:
        return hex_sha256
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
