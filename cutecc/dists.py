"""Installed code and the environment in the key: what a kernel reaches beyond the project.

A kernel's key covers, besides the project's own modules (`cutecc.key.SourceIndex`):

- every installed distribution that owns a top-level module the kernel's code imports
  (the entry's own package included), every DSL distribution (`nvidia-cutlass-dsl*`) and
  the toolchain's (`apache-tvm-ffi`, `nvidia-cuda-runtime`, `cuda-bindings`), each by
  name, version and a digest of its installed files: small ones by content, large ones
  (torch, triton, the DSL's native libraries) by their RECORD plus the hash of any file
  that no longer matches it, both through a persistent per-file hash cache keyed by path,
  size, mtime and inode, so an edited installed file changes the key, and the same wheel
  installed anywhere gives the same digest (no times; the committed kernels.lock must
  reproduce on CI). Byte code, files outside site-packages (console scripts: their first
  line names the interpreter) and the dist-info's files (written or rewritten by the
  installer: INSTALLER, REQUESTED, direct_url.json naming where the wheel came from; the
  version stands for them) are left out;
- the distributions those require (Requires-Dist, transitively), by name, version and
  RECORD digest;
- the compile-affecting environment: `CUTE_DSL_*`, `CUTLASS_*`, `QUACK_*`,
  `FLASH_ATTENTION_*`, `FA_*`, less `ENV_EXCLUDED` (caches, dumps, logs), and the
  manifest's `[env]`, which the build workers set.
Editable installs are keyed by their sources: the index treats their packages as
project-local (RECORD lists only the install's shim).
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import functools
import hashlib
import importlib.metadata as md
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cutecc.atomic import atomic_write

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
HASH_CACHE_FORMAT = 1
_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def compile_env(manifest_env: Mapping[str, str] = (), environ: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """The environment that decides what a build compiles: the keyed variables of the
    build's environment, and all of the manifest's `[env]` (which workers set)."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k.startswith(ENV_PREFIXES) and not any(fnmatch.fnmatchcase(k, p) for p in ENV_EXCLUDED)}
    env.update(dict(manifest_env))
    return dict(sorted(env.items()))


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, md.Distribution]:
    out: dict[str, md.Distribution] = {}
    for d in md.distributions():  # first on sys.path wins, as import would
        name = d.metadata["Name"]
        if name and normalize(name) not in out:
            out[normalize(name)] = d
    return out


@functools.lru_cache(maxsize=1)
def _owners() -> dict[str, tuple[str, ...]]:
    """Top-level module name -> names of the distributions that install it."""
    out: dict[str, tuple[str, ...]] = {}
    for top, names in md.packages_distributions().items():
        out[top] = tuple(sorted({normalize(n) for n in names}))
    return out


def owners(top: str) -> tuple[str, ...]:
    """The distributions installing top-level module `top` (none: the stdlib or the project)."""
    return _owners().get(top, ())


@functools.cache
def is_editable(name: str) -> bool:
    """Whether distribution `name` is an editable install (its RECORD covers no sources)."""
    d = _installed().get(normalize(name))
    if d is None:
        return False
    try:
        info = json.loads(d.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return bool(isinstance(info, dict) and (info.get("dir_info") or {}).get("editable"))


def _requires(name: str) -> list[str]:
    d = _installed().get(name)
    out = []
    for req in (d.requires or []) if d is not None else []:
        if "extra ==" in req.replace('"', "").replace("'", ""):
            continue  # only with an extra; not what the distribution itself needs
        m = _REQ_NAME.match(req.strip())
        if m:
            out.append(normalize(m.group()))
    return out


class HashCache:
    """SHA-256 of files, remembered across runs by (path, size, mtime_ns, inode)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._data: dict[str, list[Any]] = {}
        self._dirty = False
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(path.read_bytes())
                if isinstance(doc, dict) and doc.get("format") == HASH_CACHE_FORMAT:
                    self._data = dict(doc.get("files") or {})

    def sha256(self, f: str, st: os.stat_result) -> str:
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        rec = self._data.get(f)
        if isinstance(rec, list) and rec[:3] == stamp and isinstance(rec[3], str):
            return rec[3]
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        self._data[f] = [*stamp, h.hexdigest()]
        self._dirty = True
        return h.hexdigest()

    def save(self) -> None:
        """Write the cache if it learned anything (best-effort: a read-only cache is fine)."""
        if self.path is None or not self._dirty:
            return
        with contextlib.suppress(OSError):
            atomic_write(self.path, json.dumps({"format": HASH_CACHE_FORMAT, "files": self._data},
                                               separators=(",", ":")).encode())
            self._dirty = False


class DistIndex:
    """Digests of installed distributions, each computed once per planning pass."""

    def __init__(self, hash_cache: HashCache | None = None) -> None:
        self.hashes = hash_cache or HashCache(None)
        self._digest: dict[tuple[str, bool], str] = {}

    def reached(self, tops: Iterable[str]) -> dict[str, str]:
        """`{distribution: "version digest"}` for what code importing `tops` reaches: the
        owners of those tops, the DSL and toolchain distributions (content or stat
        digests), and their Requires-Dist closure (RECORD digests)."""
        installed = _installed()
        direct = {n for t in tops for n in owners(t)}
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
                out[name] = f"{installed[name].version} {self.digest(name, full=name in direct)}"
        return out

    def digest(self, name: str, *, full: bool) -> str:
        """A distribution's digest: its files' contents (small, `full`), else its RECORD
        plus (if `full`) the hash of every installed file that no longer matches it (no
        times or paths: a key is the same on every machine that installed the same wheel)."""
        if (name, full) not in self._digest:
            self._digest[(name, full)] = self._compute(name, full)
        return self._digest[(name, full)]

    def _compute(self, name: str, full: bool) -> str:
        d = _installed()[name]
        h = hashlib.sha256()
        rows = _portable_rows(d.read_text("RECORD") or "")
        record = "".join(f"{rel},{digest},{size}\n" for rel, (digest, size) in sorted(rows.items()))
        if not full:
            h.update(b"record\0" + record.encode())
            return h.hexdigest()
        stats = []
        for f in d.files or []:
            rel = f.as_posix()
            if "__pycache__" in f.parts or f.suffix == ".pyc" or rel not in rows:
                continue  # not what pip wrote from the wheel, or an installer's own record
            p = str(f.locate())
            try:
                stats.append((rel, p, os.stat(p)))
            except OSError:
                stats.append((rel, p, None))  # a listed file is gone: part of the digest
        stats.sort(key=lambda x: x[0])
        size = sum(st.st_size for _, _, st in stats if st is not None)
        if size > FULL_HASH_LIMIT:
            # The RECORD, which names every file's SHA-256, stands for the contents, so the
            # digest is the same on every machine that installed the same wheel; each file
            # is checked against it (hashed once per change of its stat, through the hash
            # cache), and one that differs (edited after install) adds its own hash.
            h.update(b"record\0" + record.encode())
            for rel, p, st in stats:
                got = self.hashes.sha256(p, st) if st else "missing"
                if rows[rel][0] != _record_digest(got):
                    h.update(f"{rel}\0{got}\0".encode())
        else:
            h.update(b"content\0")
            for rel, p, st in stats:
                h.update(f"{rel}\0{self.hashes.sha256(p, st) if st else 'missing'}\0".encode())
        return h.hexdigest()


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
        if (not rel or rel.startswith("..") or "__pycache__" in rel.split("/")
                or any(part.endswith(".dist-info") for part in rel.split("/"))):
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
