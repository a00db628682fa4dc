"""Planning facts where CI machines meet (issue 45): source files' parsed facts carried by the
remote cache, so the second machine of a team parses none of what the first parsed.

A fact is what `cutecc.plan.sourcefacts.parse` gave for some bytes, filed under "source:" and
the SHA-256 of those bytes, in bundles of one parser's (`hashcache.parser_id`: the cutecc and
Python that parse) under `v1/planning/<parser>/<bundle's SHA-256>.json` (`Remote.planning`).
Planning looks a file up by the SHA-256 of the bytes it read itself (`HashCache.source`, which
keys those bytes), so a fact never stands for other bytes; what it says of them (the imports,
the top-level `def` and `class` names) is trusted as the remote's entries are, by whoever may
write to it.

- fetched when planning first meets a file neither the cache nor the user's planning memory
  knows (`attach`: a no-op build asks nothing), the newest BUNDLES bundles, each bounded
  (MAX_BUNDLE_BYTES), named by its SHA-256 and checked whole by the one verifier
  (`cutecc.ship.ingest.check_planning`); one that fails is ignored with a warning; a remote
  that cannot be reached is marked down (`Remote.down`: the build says so once, `down_line`):
  planning parses what the remote did not answer, with the same keys;
- pushed after planning, when remote writing is on: the facts the run used that no bundle
  read held, as one new bundle (create-only, as every remote write).

Installed distributions' digests are not carried: where their RECORD vouches for their files
(`cutecc.toolchain.recordstat`) the digest is a function of the RECORD that planning computes
in the pass that stats the files anyway, and where it does not, the files must be hashed.
Import closures are not carried either: which file a module name finds depends on the
machine's paths, and a closure is remembered under its files' stamps (`HashCache.closure`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from cutecc.ship.ingest import PLANNING_FORMAT, Refused, check_planning
from cutecc.ship.remote import Remote, RemoteConfig, Unavailable
from cutecc.toolchain.hashcache import HashCache
from cutecc.toolchain.planfacts import SourceFacts

MAX_BUNDLE_BYTES = 32 << 20  # the published manifest's 1,041 sources: 1.25 MB
BUNDLES = 8  # the newest read


def attach(cfg: RemoteConfig, hashes: HashCache, warn: Callable[[str], None]) -> Remote | None:
    """Let `hashes`' planning memory ask the remote `cfg` for sources' facts it lacks (the
    remote read once, when first needed); the connection, for `push`. None: no memory (an
    in-run cache) or records not trusted (`cutecc verify --deep`)."""
    memory = hashes.memory
    if memory is None or not hashes.trust_records:
        return None
    remote = Remote(cfg)
    memory.share(lambda: fetch(remote, memory.parser, warn))
    return remote


def fetch(remote: Remote, parser: str, warn: Callable[[str], None]) -> dict[str, SourceFacts]:
    """The sources' facts of `parser` in the remote's newest bundles, each bundle checked
    (`check_planning`); a newer bundle's fact first. Never raises for the remote's sake (one
    that cannot be reached is left marked down: `down_line`)."""
    try:
        bundles = remote.planning(parser, BUNDLES, MAX_BUNDLE_BYTES, warn)
    except Unavailable:
        return {}
    out: dict[str, SourceFacts] = {}
    for name, data in bundles:
        try:
            facts = check_planning(name, data, parser, MAX_BUNDLE_BYTES)
        except Refused as e:
            warn(f"planning facts {name[:16]}... on the remote: {e.why}: ignored")
            continue
        for k, v in facts.items():
            out.setdefault(k, v)
    return out


def bundle(parser: str, facts: Mapping[str, SourceFacts]) -> bytes:
    """A bundle's bytes (what `check_planning` reads), its facts in name order."""
    return json.dumps({"format": PLANNING_FORMAT, "parser": parser,
                       "parsed": {k: facts[k].to_json() for k in sorted(facts)}},
                      separators=(",", ":")).encode()


def push(remote: Remote | None, hashes: HashCache, warn: Callable[[str], None]) -> int:
    """Upload the sources' facts `hashes`' run used that the remote's bundles lack, as new
    bundles (each within MAX_BUNDLE_BYTES); how many facts went up. Never raises for the
    remote's sake (one that cannot be reached is left marked down: `down_line`)."""
    memory = hashes.memory
    if remote is None or memory is None:
        return 0
    new = memory.unshared()
    if not new or remote.down:
        return 0
    sent, todo = 0, [dict(sorted(new.items()))]
    try:
        while todo:
            part = todo.pop()
            data = bundle(memory.parser, part)
            if len(data) > MAX_BUNDLE_BYTES and len(part) > 1:
                items = list(part.items())
                todo += [dict(items[: len(items) // 2]), dict(items[len(items) // 2:])]
            elif len(data) <= MAX_BUNDLE_BYTES:
                remote.push_planning(memory.parser, data)
                sent += len(part)
    except Unavailable:
        pass
    return sent


def down_line(remote: Remote | None) -> str | None:
    """The one line to warn with when the remote could not be reached for planning facts
    (None: it could, or it was not asked); the build says it only where its entries' lookup
    and uploads did not say so already (one warning a build)."""
    if remote is None or not remote.down:
        return None
    return f"remote cache {remote.cfg.url} unavailable for planning facts ({remote.down}); parsed here"
