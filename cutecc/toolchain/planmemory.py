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

Where a remote cache is configured, source files' parsed facts are also shared through it
(`cutecc.ship.planshare`): asked when this memory does not know a file's bytes (`share`),
fetched once, checked (`cutecc.ship.ingest.check_planning`), and told what this run used
that the remote did not have (`unshared`), so the second CI machine of a team parses none.

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
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

from cutecc import settings, trust
from cutecc.atomic import atomic_write
from cutecc.store import homes
from cutecc.toolchain.planfacts import (
    ClosureBody,
    ClosureRef,
    DistRecord,
    MemoryFile,
    P,
    ParserFacts,
    PathEffect,
    SourceFacts,
    TopNames,
)

ENV = settings.PLAN_MEMORY.env
FILE = "planmemory.json"
MAX_BYTES = 96 << 20
PARSERS = 3  # the parsers (cutecc versions) whose facts one file holds, newest last
CLOSURES = 256  # import closures held (`HashCache.closure`'s records), the newest


def directory() -> Path | None:
    """Where the memory lives: `$CUTECC_PLAN_MEMORY`, else `planning-v1` in the user's cache
    directory (`cutecc.store.homes.planning`); None when that variable is `off`."""
    return homes.planning()


def read_bounded(path: Path, limit: int) -> tuple[bytes | None, bool]:
    """A planning file's bytes, read through `cutecc.trust` and bounded: (its bytes, False);
    (None, True) when refused (another user's, or a link: never read, never written);
    (None, False) when absent, unreadable or over `limit` (written anew). The one reader of
    `planmemory.json` and of a cache's planning files (`HashCache`)."""
    try:
        return trust.read_path(path, limit), False
    except trust.Untrusted:
        return None, True
    except (OSError, ValueError):
        return None, False


class PlanMemory:
    """The memory of parser `parser` in `where` (a directory, or what returns one, asked only
    when the memory is first read or written: a no-op build does neither, so it never
    resolves the user's directory; None: remembered within the run only)."""

    def __init__(self, where: Path | Callable[[], Path | None] | None, parser: str) -> None:
        self._where = where
        self.parser = parser
        self._mine: ParserFacts | None = None  # what the file holds of this parser (loaded lazily)
        self._new = ParserFacts.of()  # what this run learned, added to the file by `save`
        self._refused = False
        # a remote cache's parsed facts by "source:sha256" (`share`), fetched when first asked
        self._shared: Callable[[], Mapping[str, SourceFacts]] | None = None
        self._shared_facts: Mapping[str, SourceFacts] | None = None
        self._used: dict[str, SourceFacts] = {}  # sources' facts this run used (kept: `share`)
        self.served_shared = 0  # sources' facts the remote's answered

    @functools.cached_property
    def file(self) -> Path | None:
        where = self._where() if callable(self._where) else self._where
        return None if where is None else where / FILE

    def _load(self) -> ParserFacts:
        if self._mine is None:
            doc = self._read()
            self._mine = ParserFacts.of() if doc is None else doc.facts(self.parser)
            self._mine.update(self._new)  # what this run told it before it was first asked
        return self._mine

    def _read(self) -> MemoryFile | None:
        if self.file is None:
            return None
        data, refused = read_bounded(self.file, MAX_BYTES)
        self._refused = self._refused or refused
        try:
            return None if data is None else MemoryFile.loads(data, MAX_BYTES)
        except ValueError:
            return None  # damaged: written anew

    def parsed(self, kind: type[P], sha256: str) -> P | None:
        """The facts parsing content `sha256` as `kind` gave (None: not remembered), from
        this memory, else a source's from the remote's shared ones (`share`: then remembered
        here too)."""
        name = f"{kind.kind()}:{sha256}"
        got = self._load().parsed.get(name)
        if isinstance(got, kind):
            if self._shared is not None and isinstance(got, SourceFacts):
                self._used[name] = got
            return got
        if self._shared is not None and kind is SourceFacts:
            shared = self._shared_of().get(name)
            if isinstance(shared, kind):
                self.served_shared += 1
                self.remember_parsed(sha256, shared)
                return shared
        return None

    def remember_parsed(self, sha256: str, facts: SourceFacts | TopNames | PathEffect) -> None:
        name = f"{facts.kind()}:{sha256}"  # (added to the file by `save`, unread till then)
        self._new.parsed.put(name, facts)
        if self._mine is not None:
            self._mine.parsed.put(name, facts)
        if self._shared is not None and isinstance(facts, SourceFacts):
            self._used[name] = facts

    def share(self, fetch: Callable[[], Mapping[str, SourceFacts]]) -> None:
        """Ask `fetch()` (a remote cache's sources' facts by "source:sha256", each filed under
        the SHA-256 of the bytes it was parsed from and checked: `cutecc.ship.planshare`) for
        what this memory does not know; called once, when first needed."""
        self._shared, self._shared_facts = fetch, None

    def _shared_of(self) -> Mapping[str, SourceFacts]:
        if self._shared_facts is None:
            self._shared_facts = self._shared() if self._shared is not None else {}
        return self._shared_facts

    def unshared(self) -> dict[str, SourceFacts]:
        """The sources' facts this run used that the remote's shared ones lack (fetched if
        not yet: a run that used none fetches nothing)."""
        if not self._used:
            return {}
        shared = self._shared_of()
        return {k: v for k, v in self._used.items() if k not in shared}

    def recall(self, where: str, fingerprint: str) -> DistRecord | None:
        """`HashCache.recall`'s record from this memory, when of `fingerprint`."""
        rec = self._load().dists.get(where)
        return rec if rec is not None and rec.fingerprint == fingerprint else None

    def remember(self, where: str, rec: DistRecord) -> None:
        self._new.dists.put(where, rec)
        if self._mine is not None:
            self._mine.dists.put(where, rec)

    def closure(self, where: str) -> tuple[str, ClosureBody] | None:
        """The digest and body of the closure remembered under `where` (its key and context),
        unchecked (`HashCache.closure` checks it as its own)."""
        mine = self._load()
        assert mine.closures is not None and mine.bodies is not None
        ref = mine.closures.get(where)
        body = None if ref is None else mine.bodies.get(ref.digest)
        return None if ref is None or body is None else (ref.digest, body)

    def remember_closure(self, where: str, ref: ClosureRef, body: ClosureBody) -> None:
        for facts, last in ((self._new, False), (self._mine, True)):
            if facts is not None and facts.closures is not None and facts.bodies is not None:
                facts.closures.put(where, ref, last=last)
                facts.bodies.put(ref.digest, body)

    def save(self) -> None:
        """Add what this run learned to the file (best-effort: a memory, not a record)."""
        new = self._new
        if not (new.parsed or new.dists or new.closures) or self._refused or self.file is None:
            return
        assert new.closures is not None and new.bodies is not None
        with contextlib.suppress(OSError):
            if homes.make(homes.PLANNING)[1] is not None:
                return  # not a directory of this user's
            doc = self._read() or MemoryFile({})  # what others wrote meanwhile, kept
            if self._refused:
                return
            mine = doc.facts(self.parser)
            assert mine.closures is not None and mine.bodies is not None
            mine.parsed.update(new.parsed)
            mine.dists.update(new.dists)
            for where in new.closures.names():
                ref, body = new.closures.get(where), None
                if ref is not None and (body := new.bodies.get(ref.digest)) is not None:
                    mine.closures.put(where, ref, last=True)
                    mine.bodies.put(ref.digest, body)
            while len(mine.closures) > CLOSURES:
                mine.closures.drop(mine.closures.names()[0])
            live = {r.digest for k in mine.closures.names() if (r := mine.closures.get(k)) is not None}
            for digest in mine.bodies.names():
                if digest not in live:
                    mine.bodies.drop(digest)
            data = doc.dumps(self.parser, mine, PARSERS)
            if len(data) > MAX_BYTES:  # only this parser's, and from this run's alone if need be
                alone = ParserFacts(new.parsed, new.dists, None, None)
                data = MemoryFile({}).dumps(self.parser, alone, PARSERS)
                if len(data) > MAX_BYTES:
                    return
            atomic_write(self.file, data, mode=0o600)
            self._new = ParserFacts.of()
