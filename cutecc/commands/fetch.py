"""`cutecc fetch`: fill a local cache with exactly the entries a lock names, from the
remote cache, for a production host (then `cutecc.load(cache, lock=...)`, or `cutecc pack`).

The lock is checked first like `cutecc.load(lock=...)` checks it: signed by one of the
deployer's trusted keys (`--trusted-key`, `$CUTECC_TRUSTED_KEYS`) unless they opt out
(`--allow-unsigned`, `$CUTECC_ALLOW_UNSIGNED=1`). Its lines then pin every entry: one
already in the cache is kept if it matches its lock line and its files their records; the
others are fetched, each checked against its key (meta.json's key inputs hash to it), its
SHA-256s and its lock line before it is published. So the remote's write access is not
what a deploy trusts; the signed lock is. Unlike a build, a remote that cannot be reached
is an error: there is nothing to fall back on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import settings
from cutecc.commands.report import Report
from cutecc.entry.rules import file_record
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import LockEntry, read_trusted_lock
from cutecc.settings import NOTHING_GIVEN, BuildOptions
from cutecc.ship import remote as remote_cache
from cutecc.store.view import Entry, StoreView, entry_trust_problem
from cutecc.store.writer import Store
from cutecc.units import human_size


@dataclass
class FetchReport(Report):
    """What `fetch` did with each locked entry."""

    cache_dir: Path
    remote: str
    fetched: list[str] = field(default_factory=list)  # "label key"
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # not on the remote
    refused: list[tuple[str, str]] = field(default_factory=list)  # ("label key", why)
    unavailable: str | None = None
    traffic: remote_cache.Traffic = field(default_factory=remote_cache.Traffic)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.refused or self.unavailable)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def warnings(self) -> list[str]:
        out = [f"error: refused {e}: {why}" for e, why in self.refused]
        if self.missing:
            out.append(f"error: {len(self.missing)} locked entr{'y' if len(self.missing) == 1 else 'ies'} "
                       f"not on {self.remote}: {', '.join(self.missing[:10])}"
                       + (" ..." if len(self.missing) > 10 else ""))
        if self.unavailable:
            out.append(f"error: remote cache {self.remote} unavailable: {self.unavailable}")
        return out

    def lines(self, verbose: int = 0) -> list[str]:
        t = self.traffic
        return [f"{len(self.fetched)} fetched, {len(self.present)} already present, "
                f"{len(self.missing)} missing, {len(self.refused)} refused in {self.seconds:.2f}s "
                f"({human_size(t.bytes_down)}, {t.requests} requests; {self.cache_dir})"]

    def to_json(self) -> dict[str, Any]:
        t = self.traffic
        return {"cache_dir": str(self.cache_dir), "remote": self.remote, "fetched": self.fetched,
                "present": self.present, "missing": self.missing,
                "refused": [{"entry": e, "reason": r} for e, r in self.refused],
                "unavailable": self.unavailable, "requests": t.requests, "bytes_down": t.bytes_down,
                "seconds": round(self.seconds, 3)}


def fetch(lock: str | Path, options: BuildOptions = NOTHING_GIVEN, *,
          archs: tuple[str, ...] = (), kernels: tuple[str, ...] = (),
          trusted_keys: list[str | Path] | None = None, allow_unsigned: bool | None = None) -> FetchReport:
    """Fetch the entries `lock` names (only `archs`/`kernels` when given) into the cache
    `options.cache_dir` from the remote `options.remote` (`cutecc.settings.BuildOptions`, read
    at the edge), once the lock's signature verifies (see the module docstring)."""
    t0 = time.perf_counter()
    if options.read_only:
        raise WorkError(f"read-only mode ({settings.READ_ONLY.where}): fetch writes to the cache",
                        where="cutecc fetch")
    cfg = remote_cache.config(options, write=False)
    if cfg is None:
        raise CuteccError(f"no remote cache: give --remote s3://BUCKET/PREFIX or set {settings.REMOTE.where}",
                          where="cutecc fetch")
    lines = read_trusted_lock(lock, trusted_keys=trusted_keys, allow_unsigned=allow_unsigned
                              ).select(archs, kernels).by_key()
    store = Store(options.cache_dir)
    store.ensure()
    report = FetchReport(store.root, cfg.url)
    wanted: dict[str, LockEntry] = {}
    for key, le in sorted(lines.items()):
        name = f"{le.label} {key[:12]}"
        why = _local_problem(store, key, le)
        if why is None:
            report.present.append(name)
        elif why == "absent":
            wanted[key] = le
        else:
            report.refused.append((name, f"{why}; run `cutecc verify --fix` or `cutecc rm {key[:12]}`"))
    conn = remote_cache.Remote(cfg)
    before = conn.traffic
    found = conn.lookup(list(wanted), store,
                        check=lambda key, meta: wanted[key].mismatch(Entry(key, Path(), meta)))
    after = conn.traffic
    report.traffic = remote_cache.Traffic(after.requests - before.requests,
                                          after.bytes_down - before.bytes_down, 0,
                                          after.seconds - before.seconds)
    for key, le in wanted.items():
        name = f"{le.label} {key[:12]}"
        if key in found.fetched:
            report.fetched.append(name)
        elif key in found.refused:
            report.refused.append((name, found.refused[key]))
        elif not found.down:
            report.missing.append(name)
    report.unavailable = found.down
    report.seconds = time.perf_counter() - t0
    return report


def _local_problem(store: StoreView, key: str, le: LockEntry) -> str | None:
    """None if the cache's entry for `key` is the locked one, whole; "absent"; else why not."""
    try:
        entry = store.get(key)
    except CuteccError as e:
        return e.message
    if entry is None:
        return "absent"
    why = le.mismatch(entry) or entry_trust_problem(entry.path, list(entry.recorded.files))
    if why:
        return f"the cache holds another entry under this key: {why}"
    for name, rec in entry.recorded.files.items():
        try:
            if file_record(entry.path / name) != rec:
                return f"{name} differs from its record in meta.json"
        except OSError as e:
            return f"{name}: {e.strerror}"
    return None
