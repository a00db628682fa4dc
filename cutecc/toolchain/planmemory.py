"""The planning memory shared by every cache of one user (issue 35): what planning learned that
does not depend on which cache it plans into, so the first planning into a new cache (a
fresh checkout, CI's empty cache, `--dry-run` of another project) need not parse every
source file or hash every installed file again.

Two kinds of facts, each sound wherever it is served:

- a source file's parsed facts (its imports and top-level names, a package `__init__`'s path
  effect), keyed by the SHA-256 of its bytes and by the parser (`hashcache.parser_id`): a
  function of those bytes alone, so an edited file (new bytes) is parsed afresh whatever its
  stamps say; the file is still read and hashed (its SHA-256 is a key input);
- what was computed of an installed distribution (its digest, its RECORD's listing, its
  metadata: `HashCache.recall`), under the same fingerprints of its files' stamps as in the
  cache: served only while every stamp it was computed under holds;
- an entry's import closure (`HashCache.closure`), under its context and the stamps of every
  file and directory its walk read, checked as a cache's own are (`HashCache._holds`).

A cache asks it, and tells it, only of what the cache itself never knew (a new cache, a new
file): what an edit or a reinstall changed is computed afresh, so the edit-and-rebuild loop
neither reads nor writes it.

One JSON file, `$CUTECC_PLAN_MEMORY/planmemory.json` (else in the user's cache directory;
`off` turns it off), read once, lazily (only when the cache does not answer), through
`cutecc.trust` and bounded (MAX_BYTES); a file that is not this user's is refused (never read,
never written); a damaged one, or a record of the wrong shape, is ignored and written anew.
Written atomically (`cutecc.atomic`), merged with what another process wrote meanwhile,
holding the facts of the newest PARSERS parsers; never inside a cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.atomic import atomic_write
from cutecc.entry import parse_json

ENV = "CUTECC_PLAN_MEMORY"
FILE = "planmemory.json"
FORMAT = 1
MAX_BYTES = 96 << 20
PARSERS = 3  # the parsers (cutecc versions) whose facts one file holds, newest last
CLOSURES = 256  # import closures held (`HashCache.closure`'s records), the newest


def directory() -> Path | None:
    """Where the memory lives: `$CUTECC_PLAN_MEMORY`, else `cutecc-planning` in the user's cache
    directory; None when that variable is `off`."""
    env = os.environ.get(ENV)
    if env == "off":
        return None
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("cutecc-planning", appauthor=False))


def _valid_source(v: Any) -> bool:
    """The shape `cutecc.plan.key._parse` gives: imports `[level, module, names | None]`
    and top-level names (None: it may make names at run time)."""
    if not (isinstance(v, dict) and set(v) == {"imports", "names"}):
        return False
    names, imports = v["names"], v["imports"]
    return (names is None or (isinstance(names, list) and all(isinstance(n, str) for n in names))) and \
        isinstance(imports, list) and all(
            isinstance(i, list) and len(i) == 3 and type(i[0]) is int and isinstance(i[1], str)
            and (i[2] is None or (isinstance(i[2], list) and all(isinstance(n, str) for n in i[2])))
            for i in imports)


# the kinds of parsed facts the memory holds (`HashCache.source`'s `kind`), each with its shape
KINDS = {"source": _valid_source,
         "path_effect": lambda v: isinstance(v, dict) and set(v) == {"effect"}
         and isinstance(v["effect"], str)}


def _dict(x: Any) -> dict[str, Any]:
    return dict(x) if isinstance(x, dict) else {}


class PlanMemory:
    """The memory of parser `parser` in `where` (a directory; None: remembered within the run only)."""

    def __init__(self, where: Path | None, parser: str) -> None:
        self.file = None if where is None else where / FILE
        self.parser = parser
        self._parsed: dict[str, Any] | None = None  # "kind:sha256" -> facts (loaded lazily)
        self._dists: dict[str, Any] = {}
        self._closures: dict[str, Any] = {}  # key and context -> [key, body digest]
        self._bodies: dict[str, Any] = {}
        self._new_parsed: dict[str, Any] = {}
        self._new_dists: dict[str, Any] = {}
        self._new_closures: dict[str, Any] = {}
        self._refused = False

    def _load(self) -> None:
        if self._parsed is not None:
            return
        doc = self._read()
        mine = _dict(_dict(doc.get("parsers")).get(self.parser))
        # (what this run told it before it was first asked, kept over what was read)
        self._parsed = {**_dict(mine.get("parsed")), **self._new_parsed}
        self._dists = {**_dict(mine.get("dists")), **self._dists}
        self._closures = {**_dict(mine.get("closures")), **self._closures}
        self._bodies = {**_dict(mine.get("bodies")), **self._bodies}

    def _read(self) -> dict[str, Any]:
        if self.file is None:
            return {}
        try:
            doc = parse_json(trust.read_path(self.file, MAX_BYTES), MAX_BYTES)
        except trust.Untrusted:
            self._refused = True  # another user's (or a link): never read, never written
            return {}
        except (OSError, ValueError, RecursionError):
            return {}  # absent, over the bound or damaged: written anew
        return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else {}

    def parsed(self, kind: str, sha256: str) -> dict[str, Any] | None:
        """The facts parsing content `sha256` as `kind` gave (None: not remembered)."""
        check = KINDS.get(kind)
        if check is None:
            return None
        self._load()
        assert self._parsed is not None
        got = self._parsed.get(f"{kind}:{sha256}")
        return dict(got) if isinstance(got, dict) and check(got) else None

    def remember_parsed(self, kind: str, sha256: str, facts: dict[str, Any]) -> None:
        if kind in KINDS and KINDS[kind](facts):  # (added to the file by `save`, unread till then)
            self._new_parsed[f"{kind}:{sha256}"] = facts
            if self._parsed is not None:
                self._parsed[f"{kind}:{sha256}"] = facts

    def recall(self, where: str, fingerprint: str) -> Any:
        """`HashCache.recall`'s answer from this memory."""
        self._load()
        rec = self._dists.get(where)
        return rec[1] if isinstance(rec, list) and len(rec) == 2 and rec[0] == fingerprint else None

    def remember(self, where: str, fingerprint: str, value: Any) -> None:
        self._dists[where] = self._new_dists[where] = [fingerprint, value]

    def closure(self, where: str) -> tuple[str, Any] | None:
        """The closure record remembered under `where` (its key and context) and its body,
        unchecked (`HashCache.closure` checks it as its own)."""
        self._load()
        rec = self._closures.get(where)
        if not (isinstance(rec, list) and len(rec) == 2 and isinstance(rec[1], str)):
            return None
        body = self._bodies.get(rec[1])
        return None if body is None else (rec[1], body)

    def remember_closure(self, where: str, key: str, digest: str, body: Any) -> None:
        self._closures.pop(where, None)
        self._closures[where] = [key, digest]
        self._bodies[digest] = body
        self._new_closures[where] = ([key, digest], body)

    def save(self) -> None:
        """Add what this run learned to the file (best-effort: a memory, not a record)."""
        if self.file is None or self._refused or not (
                self._new_parsed or self._new_dists or self._new_closures):
            return
        with contextlib.suppress(OSError):
            self.file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = os.lstat(self.file.parent)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                return  # not a directory of this user's
            doc = self._read()  # what others wrote meanwhile, kept
            if self._refused:
                return
            held = doc.get("parsers")
            parsers = {k: v for k, v in held.items() if isinstance(v, dict)} if isinstance(held, dict) else {}
            mine = _dict(parsers.pop(self.parser, {}))
            parsed = _dict(mine.get("parsed"))
            dists = _dict(mine.get("dists"))
            parsed.update(self._new_parsed)
            dists.update(self._new_dists)
            closures = _dict(mine.get("closures"))
            bodies = _dict(mine.get("bodies"))
            for where, (rec, body) in self._new_closures.items():
                closures.pop(where, None)
                closures[where] = rec
                bodies[rec[1]] = body
            while len(closures) > CLOSURES:
                del closures[next(iter(closures))]
            live = {r[1] for r in closures.values() if isinstance(r, list) and len(r) == 2}
            bodies = {k: v for k, v in bodies.items() if k in live}
            parsers[self.parser] = {"parsed": parsed, "dists": dists, "closures": closures, "bodies": bodies}
            while len(parsers) > PARSERS:
                del parsers[next(iter(parsers))]
            data = json.dumps({"format": FORMAT, "parsers": parsers}, separators=(",", ":")).encode()
            if len(data) > MAX_BYTES:  # only this parser's, and from this run's alone if need be
                data = json.dumps({"format": FORMAT, "parsers": {self.parser: {
                    "parsed": self._new_parsed, "dists": self._new_dists}}}, separators=(",", ":")).encode()
                if len(data) > MAX_BYTES:
                    return
            atomic_write(self.file, data, mode=0o600)
            self._new_parsed.clear()
            self._new_dists.clear()
            self._new_closures.clear()
