"""A shared remote cache on S3 (or anything that speaks its API), through obstore.

Layout under `s3://bucket/prefix`, in the spirit of Bazel's remote cache (an action cache
in front of content-addressed blobs):

    v1/entries/<key>.json    the entry's meta.json, byte for byte
    v1/runtimes/<key>.json   a runtime library's meta.json (entries name theirs by key)
    v1/blobs/<sha256>        the bytes of each file a meta.json records
    v1/planning/<parser>/<sha256>.json   planning facts (`cutecc.ship.planshare`), named
                             by their bytes' SHA-256, of parser `hashcache.parser_id`

Writes are create-only (a put fails if the object exists, and that counts as success:
the key, or the content, is the same), blobs before the entry that names them, and an
entry's runtime library before the entry, so an entry is never visible before its files.
Reads trust nothing: meta.json must describe the key it is filed under and every blob
must hash to its record before anything enters the local cache (`cutecc.ship.ingest`); so
must a runtime library's. Builds only read unless writing is switched on
(`--remote-write`, `$CUTECC_REMOTE_WRITE`). Endpoint and credentials come from the
standard AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_REGION`, `AWS_ALLOW_HTTP=true` for a plain-HTTP server).

Any failure to reach the remote (refused, timed out, denied) marks it down for the rest of
the process: callers fall back to building locally after one warning. obstore is imported
only when a remote is used (`pip install 'cutecc[remote]'`).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cutecc import settings
from cutecc.entry.meta import EntryMeta, FileRec, RuntimeLink
from cutecc.entry.rules import MAX_META_BYTES, is_key
from cutecc.errors import CuteccError
from cutecc.remote_url import parse_url
from cutecc.settings import BuildOptions
from cutecc.ship.ingest import Refused, check_file, check_meta, publish
from cutecc.store.layout import meta_file
from cutecc.store.view import Entry
from cutecc.store.writer import Store

LAYOUT = "v1"
DEFAULT_MAX_BLOB = 64 << 20  # a kernel's library is ~20 KB, a runtime library ~0.8 MB
DEFAULT_TIMEOUT = 30.0
DEFAULT_JOBS = 16
RETRY_DOWN_AFTER = 60.0  # seconds a remote found down is left alone (long-lived workers)
MAX_PLANNING_LISTED = 10_000  # planning bundles listed, at most (the newest few are read)
_PARSER = re.compile(r"[0-9a-f]{16}")  # `hashcache.parser_id`
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RemoteConfig:
    """Where the remote cache is and how to use it (picklable: workers get a copy)."""

    url: str
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root
    write: bool = False
    max_blob: int = DEFAULT_MAX_BLOB
    timeout: float = DEFAULT_TIMEOUT
    jobs: int = DEFAULT_JOBS

    def path(self, *parts: str) -> str:
        """An object's path below the prefix (the store adds the prefix)."""
        return "/".join((LAYOUT, *parts))


def config(options: BuildOptions, default: str | None = None, *, write: bool | None = None
           ) -> RemoteConfig | None:
    """The remote cache `options` ask for (a flag or `$CUTECC_REMOTE`, with its tunables,
    read at the edge), else `default` (the manifest's `[build] remote`); it is written to when
    `write` (else `options.remote_write`) says. None when there is none."""
    url = options.remote if options.remote is not None else default or ""
    if not url.strip():
        return None
    bucket, prefix = parse_url(url, f"--remote or {settings.REMOTE.where}")
    return RemoteConfig(url.strip(), bucket, prefix, options.remote_write if write is None else write,
                        options.remote_max_blob or DEFAULT_MAX_BLOB,
                        options.remote_timeout or DEFAULT_TIMEOUT, options.remote_jobs or DEFAULT_JOBS)


class Unavailable(Exception):
    """The remote cannot be used now (down, timed out, denied); `why` is one line."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Traffic:
    """Requests made, bytes moved and seconds spent talking to the remote."""

    requests: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.requests + other.requests, self.bytes_down + other.bytes_down,
                       self.bytes_up + other.bytes_up, self.seconds + other.seconds)


@dataclass(frozen=True)
class Fetched:
    """An entry found on the remote and published into the local store."""

    key: str
    entry: Entry
    saved: float  # the compile seconds it saved (its recorded build time)


@dataclass(frozen=True)
class Lookup:
    """What looking up some keys on the remote found."""

    fetched: dict[str, Fetched] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)  # key -> why (nothing written)
    down: str | None = None  # why the remote stopped being used, if it did


_STATUS = re.compile(r"status code:? (\d{3})((?: [A-Za-z]+){0,4})")
_S3_CODE = re.compile(r"<Code>([A-Za-z0-9.]{1,64})</Code>")
_S3_MESSAGE = re.compile(r"<Message>([^<]{1,160})</Message>")


def _short(e: BaseException) -> str:
    """The useful part of an obstore error, on one bounded line: its first line without the
    request's URL; for an HTTP error the status and the S3 error's Code and Message (as
    `403 Forbidden, AccessDenied: Access Denied.`), never the raw XML body."""
    full = str(e)
    lines = [ln for ln in full.splitlines() if ln.strip()]
    text = lines[0] if lines else type(e).__name__
    if " - " in text and "Error performing" in text:
        text = text.split(" - ", 1)[1]
    status = _STATUS.search(text)
    if status:
        code, message = _S3_CODE.search(full), _S3_MESSAGE.search(full)
        rest = text[status.end():].split("<", 1)[0].strip(" :")  # a plain-text body
        text = f"HTTP {status.group(1)}{status.group(2)}"
        if code:
            text += f", {code.group(1)}" + (f": {message.group(1).strip()}" if message else "")
        elif rest:
            text += f": {rest}"
    text = "".join(c if c.isprintable() else " " for c in text.split("<", 1)[0]).strip(" :")
    text = text or type(e).__name__
    return text[:200] + ("..." if len(text) > 200 else "")


class Remote:
    """A connection to one remote cache; thread-safe; counts its traffic."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        self.down: str | None = None
        self._down_at = 0.0
        self._store: Any = None
        self._lock = threading.Lock()
        self._traffic = Traffic()
        self._runtimes_pushed: set[str] = set()  # runtime keys this connection made sure of
        self._runtime_locks: dict[str, threading.Lock] = {}  # one fetch of a runtime at a time

    @property
    def traffic(self) -> Traffic:
        return self._traffic

    def _count(self, t: Traffic) -> None:
        with self._lock:
            self._traffic = self._traffic + t

    def _obs(self) -> Any:
        with self._lock:
            if self._store is None:
                try:
                    from obstore.store import S3Store
                except ImportError:
                    raise Unavailable("a remote cache needs obstore: pip install 'cutecc[remote]'"
                                      " (Python >= 3.11)") from None
                t = dt.timedelta(seconds=self.cfg.timeout)
                try:
                    self._store = S3Store(
                        self.cfg.bucket, prefix=self.cfg.prefix or None,
                        # client options given here replace those of the environment
                        client_options={"timeout": t, "connect_timeout": min(t, dt.timedelta(seconds=5)),
                                        "allow_http": settings.switch("AWS_ALLOW_HTTP")},
                        retry_config={"max_retries": 2, "retry_timeout": t,
                                      "backoff": {"init_backoff": dt.timedelta(milliseconds=100),
                                                  "max_backoff": dt.timedelta(seconds=2), "base": 2}})
                except Exception as e:  # bad configuration in the environment
                    raise Unavailable(f"cannot configure the S3 client: {_short(e)}") from None
            return self._store

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one request; a failure to reach the remote marks it down."""
        if self.down:
            if time.monotonic() - self._down_at < RETRY_DOWN_AFTER:
                raise Unavailable(self.down)
            self.down = None
        try:
            self._obs()
        except Unavailable as e:
            self.down, self._down_at = e.why, time.monotonic()
            raise
        t0 = time.perf_counter()
        try:
            return fn()
        except (FileNotFoundError, Refused):
            raise
        except Exception as e:
            if type(e).__name__ == "AlreadyExistsError":
                raise
            self.down = f"{what.split(' ', 1)[0]} {what.rsplit('/', 1)[-1][:16]}...: {_short(e)}"
            self._down_at = time.monotonic()
            raise Unavailable(self.down) from None
        finally:
            self._count(Traffic(requests=1, seconds=time.perf_counter() - t0))

    def _get(self, path: str, limit: int) -> bytes | None:
        """The object's bytes (None if absent), refused if it holds more than `limit`."""
        import obstore

        def get() -> bytes | None:
            try:
                res = obstore.get(self._store, path)
            except FileNotFoundError:
                return None
            size = res.meta.get("size")
            if not isinstance(size, int) or size > limit:
                raise Refused(f"{path}: {size} bytes, over the {limit}-byte limit")
            chunks, total = [], 0
            for chunk in res.stream(min_chunk_size=1 << 20):
                total += len(chunk)
                if total > limit:
                    raise Refused(f"{path}: over the {limit}-byte limit")
                chunks.append(bytes(chunk))
            return b"".join(chunks)

        data = self._call(f"GET {path}", get)
        if data is not None:
            self._count(Traffic(bytes_down=len(data)))
        return data

    def _put(self, path: str, data: bytes) -> bool:
        """Create the object; False when it already existed (left as it was)."""
        import obstore

        def put() -> bool:
            try:
                obstore.put(self._store, path, data, mode="create", use_multipart=False)
            except Exception as e:
                if type(e).__name__ == "AlreadyExistsError":
                    return False
                raise
            return True

        created = self._call(f"PUT {path}", put)
        if created:
            self._count(Traffic(bytes_up=len(data)))
        return bool(created)

    # Planning facts (`cutecc.ship.planshare`) -------------------------------------------

    def planning(self, parser: str, count: int, limit: int,
                 warn: Callable[[str], None]) -> list[tuple[str, bytes]]:
        """The newest `count` bundles of planning facts of `parser` on the remote, each as
        (its name, its bytes): named as a SHA-256, listed at most `limit` bytes (else left
        out with a warning) and read bounded (`_get`). Unchecked (`ingest.check_planning`).
        Raises Unavailable."""
        import obstore

        if not _PARSER.fullmatch(parser):
            return []
        where = self.cfg.path("planning", parser) + "/"

        def listing() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for batch in obstore.list(self._store, where, chunk_size=1000):
                out += batch
                if len(out) >= MAX_PLANNING_LISTED:
                    break
            return out

        found = []
        for m in self._call(f"LIST {where}", listing):
            name = str(m.get("path", "")).rpartition("/")[2].removesuffix(".json")
            if not (_SHA256_HEX.fullmatch(name) and str(m.get("path")) == f"{where}{name}.json"):
                continue  # not one of ours: never read
            size = m.get("size")
            if not isinstance(size, int) or size > limit:
                warn(f"planning facts {name[:16]}... on the remote: {size!r:.20} bytes, over the "
                     f"{limit}-byte limit: ignored")
                continue
            found.append((m.get("last_modified"), name))
        found.sort(key=lambda x: (str(x[0]), x[1]), reverse=True)
        out = []
        for _, name in found[:count]:
            try:
                data = self._get(f"{where}{name}.json", limit)
            except Refused as e:
                warn(f"planning facts {name[:16]}... on the remote: {e.why}: ignored")
                continue
            if data is not None:
                out.append((name, data))
        return out

    def push_planning(self, parser: str, data: bytes) -> bool:
        """Create a bundle of planning facts of `parser`, named by its bytes' SHA-256;
        False when it was there. Raises Unavailable."""
        import hashlib

        if not _PARSER.fullmatch(parser):
            return False
        name = hashlib.sha256(data).hexdigest()
        return self._put(self.cfg.path("planning", parser, f"{name}.json"), data)

    # What builds and `cutecc fetch` use ----------------------------------------------

    def fetch(self, key: str, store: Store, check: Callable[[dict[str, Any]], str | None] | None = None
              ) -> Fetched | None:
        """Find `key` on the remote and publish it into `store`, every byte checked first;
        None if the remote lacks it. `check(meta)` may refuse it too (a lock's pins).
        Raises Refused (nothing written) or Unavailable."""
        if not is_key(key):
            raise Refused(f"{key[:70]!r} is not a cache key")
        data = self._get(self.cfg.path("entries", f"{key}.json"), MAX_META_BYTES)
        if data is None:
            return None
        meta, blobs = check_meta(key, data, self.cfg.max_blob)
        why = check(meta) if check else None
        if why:
            raise Refused(why)
        rec = EntryMeta.parse(meta, key)  # check_meta checked it: typed here
        files = {b.name: self._blob(b) for b in blobs}
        self._fetch_runtime(rec.runtime, store)
        entry, _ = publish(store, key, meta, files)
        return Fetched(key, entry, rec.build_seconds)

    def _fetch_runtime(self, rec: RuntimeLink, store: Store) -> None:
        """Make sure the runtime library an entry records (`rec`) is in `store`: fetched,
        checked against its own meta.json and key and against `rec`, and published, unless
        the store has it. Raises Refused when neither has it."""
        if store.get_runtime(rec.key) is not None:
            return
        with self._lock:
            one = self._runtime_locks.setdefault(rec.key, threading.Lock())
        with one:  # the entries fetched in parallel share a runtime library: download it once
            if store.get_runtime(rec.key) is None:
                self._download_runtime(rec, store)

    def _download_runtime(self, rec: RuntimeLink, store: Store) -> None:
        data = self._get(self.cfg.path("runtimes", f"{rec.key}.json"), MAX_META_BYTES)
        if data is None:
            raise Refused(f"its runtime library {rec.library} is neither on the remote nor in "
                          "the cache")
        try:
            rmeta, blobs = check_meta(rec.key, data, self.cfg.max_blob, runtime=True)
        except Refused as e:
            raise Refused(f"runtime {rec.key[:12]}: {e.why}") from None
        if blobs != (FileRec(rec.library, rec.sha256, rec.size),):
            raise Refused(f"runtime {rec.key[:12]}: its library differs from what the entry records")
        try:
            publish(store, rec.key, rmeta, {b.name: self._blob(b) for b in blobs}, runtime=True)
        except Refused as e:
            raise Refused(f"runtime {rec.key[:12]}: {e.why}") from None

    def _push_runtime(self, entry: Entry, store: Store) -> None:
        """Upload the runtime library `entry` links against (blob, then meta.json), once per
        connection. Raises Refused (not in the local store, or damaged) or Unavailable."""
        rkey = entry.recorded.runtime  # check_meta checked the entry's meta.json
        if rkey is None or rkey in self._runtimes_pushed:
            return
        rdir = store.layout.runtime(rkey)
        raw = _read(meta_file(rdir), MAX_META_BYTES)
        try:
            _, blobs = check_meta(rkey, raw, self.cfg.max_blob, runtime=True)
        except Refused as e:
            raise Refused(f"runtime {rkey[:12]}: {e.why}") from None
        for b in blobs:
            data = _read(rdir / b.name, b.size)
            check_file(b, data)
            self._put(self.cfg.path("blobs", b.sha256), data)
        self._put(self.cfg.path("runtimes", f"{rkey}.json"), raw)
        with self._lock:
            self._runtimes_pushed.add(rkey)

    def _blob(self, b: FileRec) -> bytes:
        data = self._get(self.cfg.path("blobs", b.sha256), b.size)
        if data is None:
            raise Refused(f"{b.name}: blob {b.sha256[:16]}... is missing from the remote")
        check_file(b, data)
        return data

    def push(self, entry: Entry, store: Store) -> bool:
        """Upload an entry of the local store (its files checked against meta.json first):
        blobs, then meta.json. True when this call created the entry on the remote.
        Raises Refused (a damaged local entry) or Unavailable."""
        raw = _read(meta_file(entry.path), MAX_META_BYTES)
        _, blobs = check_meta(entry.key, raw, self.cfg.max_blob)
        self._push_runtime(entry, store)
        for b in blobs:
            data = _read(entry.path / b.name, b.size)
            check_file(b, data)
            self._put(self.cfg.path("blobs", b.sha256), data)
        return self._put(self.cfg.path("entries", f"{entry.key}.json"), raw)

    def lookup(self, keys: Iterable[str], store: Store,
               check: Callable[[str, dict[str, Any]], str | None] | None = None) -> Lookup:
        """Fetch every key the remote has into `store`, `cfg.jobs` requests at a time;
        `check(key, meta)` may refuse an entry (see `fetch`).

        Stops asking once the remote is down (the rest count as absent). Never raises for
        the remote's sake: what went wrong is in the result.
        """
        keys = list(dict.fromkeys(keys))
        fetched: dict[str, Fetched] = {}
        refused: dict[str, str] = {}
        absent: list[str] = []

        def one(key: str) -> None:
            try:
                got = self.fetch(key, store, None if check is None else lambda m: check(key, m))
            except Refused as e:
                refused[key] = e.why
                return
            except Unavailable:
                absent.append(key)
                return
            if got is None:
                absent.append(key)
            else:
                fetched[key] = got

        if keys:
            with ThreadPoolExecutor(min(self.cfg.jobs, len(keys)), thread_name_prefix="cutecc-remote") as ex:
                for fut in [ex.submit(one, k) for k in keys]:
                    fut.result()
        return Lookup(fetched, tuple(absent), refused, self.down)


def _read(path: os.PathLike[str] | str, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{path}: larger than its record")
    return data


# One connection per configuration in each worker process (uploads go through it), so a
# remote found down is not asked again by that process for RETRY_DOWN_AFTER seconds.
_connections: dict[RemoteConfig, Remote] = {}
_connections_lock = threading.Lock()


def connect(cfg: RemoteConfig) -> Remote:
    """This worker process's connection for `cfg` (a build makes its own `Remote`)."""
    with _connections_lock:
        if cfg not in _connections:
            _connections[cfg] = Remote(cfg)
        return _connections[cfg]


@dataclass(frozen=True)
class Pushed:
    """What a worker's upload of one entry did (travels back with its Result)."""

    created: bool = False
    traffic: Traffic = Traffic()
    error: str | None = None  # why the upload did not happen (the build still succeeded)


def push_entry(cfg: RemoteConfig, entry: Entry, store: Store) -> Pushed:
    """Upload one freshly built entry from a worker; never raises."""
    remote = connect(cfg)
    before = remote.traffic
    try:
        created = remote.push(entry, store)
        error = None
    except Unavailable as e:
        created, error = False, f"remote unavailable: {e.why}"
    except Refused as e:
        created, error = False, f"not uploaded: {e.why}"
    except (OSError, CuteccError) as e:
        created, error = False, f"not uploaded: {e}"
    after = remote.traffic
    delta = Traffic(after.requests - before.requests, after.bytes_down - before.bytes_down,
                    after.bytes_up - before.bytes_up, after.seconds - before.seconds)
    return Pushed(created, delta, error)
