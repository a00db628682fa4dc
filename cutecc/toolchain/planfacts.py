"""The planning files' records (issue 36), typed both ways: a cache's `filehashes.json`
(`HashesFile`) and `planfacts.json` (`PlanFacts`), read and written by
`hashcache.HashCache`, and the user's `planmemory.json` (`MemoryFile`, `ParserFacts`), by
`planmemory.PlanMemory`; nothing else looks inside one.

Records are named tuples (typed, immutable, quick to make: a dataclass costs a millisecond
to define, on every run's import). Each file is one record of sections (`Records`: entries
by name). An entry stays as loaded until asked for, then is parsed and checked into its
record type (`Sourced`, `DistRecord`, `ClosureRef`, `ClosureBody`, `FileHash`), None when
damaged: a no-op build loads a planfacts.json of megabytes and reads a part of it, so
nothing is built at load. Written back as the same JSON objects in the same order: the
bytes the untyped writers wrote (tests/toolchain/data holds what they wrote).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from cutecc.entry.rules import parse_json

FACTS_FORMAT = 2  # filehashes.json and planfacts.json; 2: stamps with ctime and device
MEMORY_FORMAT = 1  # planmemory.json

R = TypeVar("R")
T = TypeVar("T")
Stamp = list[int]  # `hashcache.stamp`: size, mtime, ctime, inode, device


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _strs(x: Any) -> bool:
    """Whether `x` is a list of strings (joined to tell: a no-op reads thousands of them)."""
    if type(x) is not list:
        return False
    try:
        "".join(x)
    except TypeError:
        return False
    return True


def _stamp(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 5 and all(type(n) is int for n in x)


class Records(Generic[R]):
    """One section of a planning file: records by name, kept as loaded (JSON), each parsed
    by `load` (None: damaged) when first asked for, and written back in the order held. A
    record's lists and objects are the loaded JSON's own: read, never changed."""

    __slots__ = ("_raw", "_got", "_load", "_dump")

    def __init__(self, raw: Any, load: Callable[[str, Any], R | None], dump: Callable[[R], Any]) -> None:
        self._raw: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        self._got: dict[str, R | None] = {}
        self._load, self._dump = load, dump

    def get(self, name: str) -> R | None:
        if name in self._got:
            return self._got[name]
        raw = self._raw.get(name)
        got = self._got[name] = None if raw is None else self._load(name, raw)
        return got

    def put(self, name: str, rec: R, last: bool = False) -> None:
        """Hold `rec` under `name`: where it was, or (`last`) as the newest."""
        if last:
            self._raw.pop(name, None)
        self._raw[name] = self._dump(rec)
        self._got[name] = rec

    def drop(self, name: str) -> None:
        self._raw.pop(name, None)
        self._got.pop(name, None)

    def update(self, other: Records[R]) -> None:
        """`other`'s records over these (each where it was, new ones last)."""
        self._raw.update(other._raw)
        self._got.clear()

    def names(self) -> list[str]:
        """The names held, oldest first."""
        return list(self._raw)

    def __contains__(self, name: str) -> bool:
        return name in self._raw

    def __len__(self) -> int:
        return len(self._raw)

    def __bool__(self) -> bool:
        return bool(self._raw)

    def to_json(self) -> dict[str, Any]:
        return self._raw


# facts parsed from a source file (`HashCache.source`)
P = TypeVar("P", bound="SourceFacts | TopNames | PathEffect")


class SourceFacts(NamedTuple):
    """What the key reads of every source file of a closure (`cutecc.plan.sourcefacts.parse`):
    its import statements as `[level, module, names or None for a plain import]`, sorted; and
    the names its top level defines by `def` or `class` statements, sorted (a part of its
    `TopNames`, enough to tell that a manifest's entry is there)."""

    imports: list[list[Any]]
    defs: list[str]

    @staticmethod
    def kind() -> str:
        return "source"

    def to_json(self) -> dict[str, Any]:
        return {"imports": self.imports, "defs": self.defs}

    @classmethod
    def of_json(cls, v: Any, extra: int = 0) -> SourceFacts | None:
        """The facts in object `v` (with `extra` other members), None when of another shape."""
        if not (isinstance(v, dict) and len(v) == 2 + extra):
            return None
        imports, defs = v.get("imports"), v.get("defs")
        if not (isinstance(imports, list) and defs is not None and _strs(defs)):
            return None
        for i in imports:
            if not (type(i) is list and len(i) == 3 and type(i[0]) is int and type(i[1]) is str
                    and (i[2] is None or _strs(i[2]))):
                return None
        return cls(imports, defs)


class TopNames(NamedTuple):
    """The names a module's top level surely binds (`cutecc.plan.sourcefacts.top_names`; None:
    it may make names at run time), read only for the modules a manifest names."""

    names: list[str] | None

    @staticmethod
    def kind() -> str:
        return "names"

    def to_json(self) -> dict[str, Any]:
        return {"names": self.names}

    @classmethod
    def of_json(cls, v: Any, extra: int = 0) -> TopNames | None:
        """The names in object `v` (with `extra` other members), None when of another shape."""
        if not (isinstance(v, dict) and len(v) == 1 + extra and "names" in v):
            return None
        names = v["names"]
        return cls(names) if names is None or _strs(names) else None


class PathEffect(NamedTuple):
    """What a package's `__init__` does to its `__path__` (`modfind.path_effect`)."""

    effect: str

    @staticmethod
    def kind() -> str:
        return "path_effect"

    def to_json(self) -> dict[str, Any]:
        return {"effect": self.effect}

    @classmethod
    def of_json(cls, v: Any, extra: int = 0) -> PathEffect | None:
        ok = isinstance(v, dict) and len(v) == 1 + extra and isinstance(v.get("effect"), str)
        return cls(v["effect"]) if ok else None


PARSED: dict[str, type[SourceFacts] | type[TopNames] | type[PathEffect]] = {
    k.kind(): k for k in (SourceFacts, TopNames, PathEffect)}


def parsed_of(name: str, v: Any) -> SourceFacts | TopNames | PathEffect | None:
    """The parsed facts `v` held under `name` ("kind:...") in the planning memory."""
    kind = PARSED.get(name.partition(":")[0])
    return None if kind is None else kind.of_json(v)


class Sourced(NamedTuple, Generic[P]):
    """A source file's SHA-256 and parsed facts, with the stamp they were taken under (None:
    not settled, not remembered). In planfacts.json, `[stamp, {**facts, "sha256": ...}]`
    under "kind:path"."""

    stamp: Stamp | None
    sha256: str
    parsed: P

    def to_json(self) -> list[Any]:
        return [self.stamp, {**self.parsed.to_json(), "sha256": self.sha256}]

    @staticmethod
    def of_json(name: str, v: Any) -> Sourced[Any] | None:
        kind = PARSED.get(name.partition(":")[0])
        if kind is None or not (isinstance(v, list) and len(v) == 2 and _stamp(v[0])
                                and isinstance(v[1], dict) and isinstance(v[1].get("sha256"), str)):
            return None
        parsed = kind.of_json(v[1], extra=1)
        return None if parsed is None else Sourced(v[0], v[1]["sha256"], parsed)


class InstalledFacts(NamedTuple):
    """What planning reads of an installed distribution (`dists._read_facts`): name and
    version, declared top-level names (else `inferred` from its RECORD), the distributions
    it requires, whether it is editable."""

    name: str | None
    version: str | None
    tops: list[str]
    inferred: list[str] | None
    requires: list[str]
    editable: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "tops": self.tops, "inferred": self.inferred,
                "requires": self.requires, "editable": self.editable}

    @classmethod
    def of_json(cls, v: Any) -> InstalledFacts | None:
        if not (isinstance(v, dict) and isinstance(v.get("name"), (str, type(None)))
                and isinstance(v.get("version"), (str, type(None))) and _strs(v.get("tops"))
                and _strs(v.get("requires")) and isinstance(v.get("editable"), bool)
                and (v.get("inferred") is None or _strs(v.get("inferred")))):
            return None
        return cls(v["name"], v["version"], v["tops"], v.get("inferred"), v["requires"], v["editable"])


class Listed(NamedTuple):
    """The files a distribution's RECORD lists (`dists.DistIndex._compute`): their paths in
    RECORD, NUL-joined, and the few whose path on disk is not the prefix's join (by index)."""

    joined: str
    odd: dict[str, str]

    def to_json(self) -> list[Any]:
        return [self.joined, self.odd]

    @classmethod
    def of_json(cls, v: Any) -> Listed | None:
        ok = (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], dict)
              and all(isinstance(x, str) for x in v[1].values()))
        return cls(v[0], v[1]) if ok else None


class Fact(Generic[T]):
    """A kind of value remembered of an installed distribution (`DistRecord.value`): how it
    is read (None: of another shape) and written."""

    def __init__(self, load: Callable[[Any], T | None], dump: Callable[[T], Any]) -> None:
        self.load, self.dump = load, dump


DIGEST: Fact[str] = Fact(lambda v: v if isinstance(v, str) else None, lambda v: v)
FLAG: Fact[bool] = Fact(lambda v: v if isinstance(v, bool) else None, lambda v: v)
INSTALLED: Fact[InstalledFacts] = Fact(InstalledFacts.of_json, InstalledFacts.to_json)
LISTED: Fact[Listed] = Fact(Listed.of_json, Listed.to_json)


class DistRecord(NamedTuple):
    """What was computed of an installed distribution, under the fingerprint of the stamps it
    was computed under; `value` as its `Fact` writes it. `[fingerprint, value]`."""

    fingerprint: str
    value: Any

    def to_json(self) -> list[Any]:
        return [self.fingerprint, self.value]

    @staticmethod
    def of_json(name: str, v: Any) -> DistRecord | None:
        ok = isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
        return DistRecord(v[0], v[1]) if ok else None


class ClosureRef(NamedTuple):
    """An import closure remembered under its key and context: the key and its body's
    digest (bodies are shared: modules of one package). `[key, digest]`."""

    key: str
    digest: str

    def to_json(self) -> list[str]:
        return [self.key, self.digest]

    @staticmethod
    def of_json(name: str, v: Any) -> ClosureRef | None:
        ok = isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], str)
        return ClosureRef(v[0], v[1]) if ok else None


class Member(NamedTuple):
    """A closure's member file (an absolute path), its module and its stamp as text."""

    file: str
    module: str
    is_pkg: bool
    stamp: str


class Searched(NamedTuple):
    """A directory a closure's lookups searched, its stamp as text (None: absent), the
    names looked up in it and the stamps of the paths that decided them (those present)."""

    path: str
    stamp: str | None
    tails: list[str]
    present: dict[str, str]


class ClosureBody(NamedTuple):
    """What a remembered import closure depends on (`HashCache._holds`). `[members, dirs]`."""

    members: tuple[Member, ...]
    dirs: tuple[Searched, ...]

    def to_json(self) -> list[Any]:
        return [[list(m) for m in self.members], [list(d) for d in self.dirs]]

    def digest(self) -> str:
        return hashlib.sha256(_dumps(self.to_json())).hexdigest()

    @staticmethod
    def of_json(name: str, v: Any) -> ClosureBody | None:
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and isinstance(v[1], list)):
            return None
        members, dirs = [], []
        for m in v[0]:
            if not (isinstance(m, list) and len(m) == 4 and isinstance(m[0], str) and isinstance(m[1], str)
                    and isinstance(m[2], bool) and isinstance(m[3], str) and os.path.isabs(m[0])):
                return None
            members.append(Member._make(m))
        for d in v[1]:
            if not (isinstance(d, list) and len(d) == 4 and isinstance(d[0], str)
                    and (d[1] is None or isinstance(d[1], str)) and _strs(d[2]) and isinstance(d[3], dict)
                    and all(isinstance(s, str) for s in d[3].values())):
                return None
            dirs.append(Searched._make(d))
        return ClosureBody(tuple(members), tuple(dirs))


def _load_body(name: str, v: Any) -> ClosureBody | None:
    return ClosureBody.of_json(name, v)


def _to_json(rec: Any) -> Any:
    return rec.to_json()


class FileHash(NamedTuple):
    """An installed file's SHA-256 under its stamp. `[*stamp, sha256]`."""

    stamp: Stamp
    sha256: str

    def to_json(self) -> list[Any]:
        return [*self.stamp, self.sha256]

    @staticmethod
    def of_json(name: str, v: Any) -> FileHash | None:
        ok = isinstance(v, list) and len(v) == 6 and isinstance(v[5], str)
        return FileHash(v[:5], v[5]) if ok else None


def _doc(data: bytes, limit: int, fmt: int) -> dict[str, Any] | None:
    """The object in `data` when it is one of format `fmt` (None: damaged or another)."""
    try:
        doc = parse_json(data, limit)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == fmt else None


class HashesFile(NamedTuple):
    """`filehashes.json`: installed files' SHA-256s by path (torch's 14,000: loaded only
    when a distribution's stamps changed)."""

    files: Records[FileHash]

    @classmethod
    def of(cls, files: Any = None) -> HashesFile:
        return cls(Records(files, FileHash.of_json, _to_json))

    @classmethod
    def loads(cls, data: bytes, limit: int) -> HashesFile | None:
        doc = _doc(data, limit, FACTS_FORMAT)
        return None if doc is None else cls.of(doc.get("files"))

    def dumps(self) -> bytes:
        return _dumps({"format": FACTS_FORMAT, "files": self.files.to_json()})


class PlanFacts(NamedTuple):
    """`planfacts.json`, what a no-op build reads: of parser `parser` (`hashcache.parser_id`),
    distributions' facts by where (`DistRecord`), source files' by "kind:path" (`Sourced`),
    import closures by key and context (`ClosureRef`) and their bodies by digest."""

    parser: str
    dists: Records[DistRecord]
    sources: Records[Sourced[Any]]
    closures: Records[ClosureRef]
    bodies: Records[ClosureBody]

    @classmethod
    def of(cls, parser: str, doc: dict[str, Any] | None = None) -> PlanFacts:
        d = doc or {}
        return cls(parser, Records(d.get("dists"), DistRecord.of_json, _to_json),
                   Records(d.get("sources"), Sourced.of_json, _to_json),
                   Records(d.get("closures"), ClosureRef.of_json, _to_json),
                   Records(d.get("closure_bodies"), _load_body, _to_json))

    @classmethod
    def loads(cls, data: bytes, limit: int, parser: str) -> PlanFacts | None:
        """The facts in `data` when of this format and of `parser` (None: damaged, another
        format or another parser's: planned afresh and written anew)."""
        doc = _doc(data, limit, FACTS_FORMAT)
        if doc is None or not all(isinstance(doc.get(k, {}), dict) for k in ("dists", "sources")):
            return None
        return cls.of(parser, doc) if doc.get("parser") == parser else None

    def live_digests(self) -> set[str]:
        """The digests of the bodies some remembered closure names."""
        return {r.digest for k in self.closures.names() if (r := self.closures.get(k)) is not None}

    def dumps(self) -> bytes:
        """The file's bytes, with only the closure bodies some closure names."""
        live = self.live_digests()
        return _dumps({"format": FACTS_FORMAT, "parser": self.parser, "dists": self.dists.to_json(),
                       "sources": self.sources.to_json(), "closures": self.closures.to_json(),
                       "closure_bodies": {k: v for k, v in self.bodies.to_json().items() if k in live}})


class ParserFacts(NamedTuple):
    """One parser's facts in the planning memory: parsed facts by "kind:sha256", the rest as
    in `PlanFacts` (closures and bodies None: not written, as when the file would be over
    its bound)."""

    parsed: Records[SourceFacts | TopNames | PathEffect]
    dists: Records[DistRecord]
    closures: Records[ClosureRef] | None
    bodies: Records[ClosureBody] | None

    @classmethod
    def of(cls, doc: Any = None, closures: bool = True) -> ParserFacts:
        d = doc if isinstance(doc, dict) else {}
        return cls(Records(d.get("parsed"), parsed_of, _to_json),
                   Records(d.get("dists"), DistRecord.of_json, _to_json),
                   Records(d.get("closures"), ClosureRef.of_json, _to_json) if closures else None,
                   Records(d.get("bodies"), _load_body, _to_json) if closures else None)

    def update(self, other: ParserFacts) -> None:
        """`other`'s facts over these (each where it was, new ones last)."""
        pairs: list[tuple[Records[Any] | None, Records[Any] | None]] = [
            (self.parsed, other.parsed), (self.dists, other.dists), (self.closures, other.closures),
            (self.bodies, other.bodies)]
        for mine, theirs in pairs:
            if mine is not None and theirs is not None:
                mine.update(theirs)

    def to_json(self) -> dict[str, Any]:
        out = {"parsed": self.parsed.to_json(), "dists": self.dists.to_json()}
        if self.closures is not None and self.bodies is not None:
            out.update(closures=self.closures.to_json(), bodies=self.bodies.to_json())
        return out


class MemoryFile(NamedTuple):
    """`planmemory.json`: each parser's facts (`ParserFacts`), oldest first; those of other
    parsers (other versions of cutecc) carried through as read."""

    parsers: dict[str, Any]

    @classmethod
    def loads(cls, data: bytes, limit: int) -> MemoryFile | None:
        """The memory in `data` (None: damaged or another format)."""
        doc = _doc(data, limit, MEMORY_FORMAT)
        if doc is None:
            return None
        held = doc.get("parsers")
        return cls({k: v for k, v in held.items() if isinstance(v, dict)} if isinstance(held, dict) else {})

    def facts(self, parser: str) -> ParserFacts:
        return ParserFacts.of(self.parsers.get(parser))

    def dumps(self, parser: str, facts: ParserFacts, keep: int) -> bytes:
        """The file's bytes with `facts` as `parser`'s (the newest), holding `keep` parsers'."""
        parsers = {k: v for k, v in self.parsers.items() if k != parser}
        parsers[parser] = facts.to_json()
        while len(parsers) > keep:
            del parsers[next(iter(parsers))]
        return _dumps({"format": MEMORY_FORMAT, "parsers": parsers})
