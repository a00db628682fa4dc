"""A worker process for the fault suite, run as `python store_worker.py ROLE SPEC`.

SPEC is a JSON file the test writes: the cache root, the entries (key and key inputs) the
processes fight over, and the files they coordinate through (`go`, `stop`, a shared
append-only log). Each role drives cutecc's own code (the store, `verify`, `gc`, the
runtime loader) the way concurrent cutecc processes would, and writes what it saw to
`out` as JSON. Entries are small fake libraries with real, self-consistent metadata, so
thousands of publishes cost milliseconds, not compiles.

Roles:
  publish   build every key (in a random order, `passes` times) through `Store.publish`
  read      list entries and re-hash each one (`verify.check_entry`) until `stop`
  load      `cutecc.load` and the runtime's pre-dlopen check (`verified_bytes`) until `stop`
  sweep     `Store.sweep_tmp` and a whole-cache `verify` until `stop`
  remove    `gc --max-size 0` and `Store.remove` of random keys until `stop`
  crash-*   loop an operation until killed: publish then remove every key (`publish`),
            publish then `gc --max-size 0` (`gc`), publish then quarantine (`quarantine`),
            stats.json updates (`stats`), creating new cache directories (`create`)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from cutecc.locks import Busy
from cutecc.store import Store

LIB = "kernel.so"


def _payload(key: str) -> bytes:
    """The library bytes of `key`: the same whoever builds it, 8..72 KiB."""
    size = 8192 + int(key[:4], 16) % 64 * 1024
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def _runtime() -> tuple[str, bytes]:
    """The fake runtime library every fake entry links against: this toolchain's key (so
    its metadata checks like a real one's) and small fixed bytes."""
    from cutecc.plan.key import toolchain

    key = toolchain()["runtime"]
    return key, hashlib.sha256(b"runtime" + key.encode()).digest() * 64


def ensure_runtime(store: Store) -> None:
    """Publish the fake runtime library (as a build does before its workers start)."""
    from cutecc.entry.meta import RuntimeMeta
    from cutecc.entry.rules import runtime_soname
    from cutecc.toolchain.versions import runtime_inputs

    key, data = _runtime()

    def produce(staging: Path) -> RuntimeMeta:
        (staging / runtime_soname(key)).write_bytes(data)
        return RuntimeMeta(key, runtime_soname(key), (),
                           time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), 0.01, runtime_inputs())

    store.publish(key, produce, runtime=True)


def producer(entry: dict[str, Any], log: Path | None, chunks: int, pause: float):
    """A `build` callback for Store.publish writing the fake library in slow chunks."""

    def produce(staging: Path) -> Any:
        if log is not None:
            _append(log, f"B {entry['key']} {os.getpid()}\n")
        data = _payload(entry["key"])
        step = len(data) // chunks + 1
        with open(staging / LIB, "wb") as f:
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                f.flush()
                if pause:
                    time.sleep(pause)
            os.fsync(f.fileno())
        inputs = entry["inputs"]
        from cutecc.entry.meta import EntryMeta, RuntimeLink
        from cutecc.entry.rules import runtime_soname
        from cutecc.platforms import BUILD_PLATFORM

        rkey, rdata = _runtime()
        runtime = RuntimeLink(rkey, runtime_soname(rkey), hashlib.sha256(rdata).hexdigest(), len(rdata))
        return EntryMeta(
            key=entry["key"], kernel="fake", variant=entry["variant"], arch=inputs["arch"],
            platform=BUILD_PLATFORM, symbol="cutecc_kernel", library_name=LIB, files=(), runtime=runtime,
            backward=None, built_at="2026-01-01T00:00:00+00:00", build_seconds=0.01, artifact=None,
            ptx_isa=None, entry=inputs["entry"], params={}, args=inputs["args"],
            toolchain=inputs["toolchain"], key_inputs=inputs, sources=())

    return produce


def _append(log: Path, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one small O_APPEND write: never interleaved
    finally:
        os.close(fd)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.002)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _publish(spec: dict[str, Any], store: Store, out: dict[str, Any]) -> None:
    entries = spec["entries"]
    log = Path(spec["log"])
    rng = random.Random(os.getpid())
    built = 0
    for _ in range(spec.get("passes", 1)):
        for e in rng.sample(entries, len(entries)):
            _, did = store.publish(e["key"], producer(e, log, 4, 0.001))
            built += did
            got = store.get(e["key"])
            if got is None:  # removed meanwhile by a remover: fine; publish returned it whole
                continue
            lib = got.path / LIB
            try:
                if lib.read_bytes() != _payload(e["key"]):
                    out["problems"].append(f"{e['key'][:12]}: published bytes differ")
            except FileNotFoundError:
                pass
    out["built"] = built


def _read(spec: dict[str, Any], store: Store, out: dict[str, Any]) -> None:
    from cutecc.commands.verify import BAD, check_entry

    stop = Path(spec["stop"])
    seen = 0
    while not stop.exists():
        for shard in _dirs(store.entries_dir):
            for d in _dirs(shard):
                before = _inode(d)
                found = [f"{p.kind} {Path(p.path).name}: {p.detail}" for p in check_entry(d, d.name)
                         if p.kind in BAD | {"orphan"}]
                if before is None or _inode(d) != before:
                    continue  # removed (or removed and rebuilt) while we looked: not damage
                if found:
                    out["problems"].append(f"{d.name[:12]}: {found}")  # visible, not whole
                else:
                    seen += 1
    out["observations"] = seen


def _load(spec: dict[str, Any], store: Store, out: dict[str, Any]) -> None:
    import cutecc
    from cutecc.errors import CuteccError
    from cutecc.runtime.library import verified_bytes

    stop = Path(spec["stop"])
    seen = 0
    while not stop.exists():
        try:
            ks = cutecc.load(store.root, arch="sm_90a")
        except CuteccError as e:
            if "no kernel cache here" not in e.message:
                out["problems"].append(f"load: {e}")
            continue
        if ks.problems:
            out["problems"].append(f"set aside: {ks.problems}")
        for b in ks.fake.builds if "fake" in ks else []:
            before = _inode(b.library.parent)
            try:
                data = verified_bytes(b.library, b.sha256, b.size, b.label)
            except CuteccError as e:
                if _inode(b.library.parent) == before and before is not None:
                    out["problems"].append(f"verify before dlopen: {e}")
                continue
            if data != _payload(b.key):
                out["problems"].append(f"{b.key[:12]}: verified bytes are not the payload")
            seen += 1
    out["observations"] = seen


def _sweep(spec: dict[str, Any], store: Store, out: dict[str, Any]) -> None:
    from cutecc.commands.verify import BAD, check_entry, verify

    stop = Path(spec["stop"])
    rounds = 0
    while not stop.exists():
        store.sweep_tmp()
        if store.root.joinpath("format").is_file():
            report = verify(store.root)
            # Nothing may look wrong while builds run: a staging dir is locked by its builder.
            # With removers, an entry removed and rebuilt while verify hashed it can look
            # damaged to that snapshot: such a report must not survive a second look.
            for p in report.problems:
                if spec.get("removers") and p.key and not any(
                        q.kind in BAD for q in check_entry(store.layout.entry(p.key), p.key)
                        if store.layout.entry(p.key).exists()):
                    continue
                out["problems"].append(f"verify: {p.kind} {p.path}: {p.detail}")
        rounds += 1
    out["rounds"] = rounds


def _remove(spec: dict[str, Any], store: Store, out: dict[str, Any]) -> None:
    from cutecc.commands.gc import gc

    stop, log = Path(spec["stop"]), Path(spec["log"])
    rng = random.Random(os.getpid())
    removed = 0
    while not stop.exists():
        if not store.root.joinpath("format").is_file():
            time.sleep(0.005)
            continue
        if rng.random() < 0.5:
            for r in gc(store.root, max_size=0).removed:
                _append(log, f"R {r['key']} {os.getpid()}\n")
                removed += 1
        else:
            key = rng.choice(spec["entries"])["key"]
            try:
                if store.remove(key, timeout=0):
                    _append(log, f"R {key} {os.getpid()}\n")
                    removed += 1
            except Busy:
                pass
        time.sleep(rng.uniform(0, 0.02))
    out["removed"] = removed


def _crash(mode: str, spec: dict[str, Any], store: Store) -> None:
    """Loop `mode` until killed; prints `ready` once the loop is about to start."""
    from cutecc.commands.gc import gc

    entries = spec["entries"]
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        if mode == "stats":
            store.add_stats(hits=1, misses=1, seconds_saved=0.5)
            continue
        if mode == "create":  # a new cache directory, as the first build makes one
            Store(Path(spec["create_in"]) / f"{os.getpid()}.{n}").ensure()
            continue
        for e in entries:
            store.publish(e["key"], producer(e, None, 4, 0.0005))
        if mode == "publish":
            for e in entries:
                store.remove(e["key"])
        elif mode == "gc":
            gc(store.root, max_size=0)
        elif mode == "quarantine":
            for e in entries:
                store.quarantine(e["key"], "fault suite")
        else:
            raise SystemExit(f"unknown crash mode {mode!r}")


def _dirs(path: Path) -> list[Path]:
    try:
        return [Path(d.path) for d in os.scandir(path) if d.is_dir()]
    except OSError:
        return []


def _prepare(role: str) -> None:
    """Import what `role` needs before reporting ready, so every process starts at `go`."""
    import cutecc.commands.gc  # noqa: F401
    import cutecc.commands.verify  # noqa: F401

    if role == "load":
        import cutecc.runtime.library  # noqa: F401  (and JAX, through the runtime)


ROLES = {"publish": _publish, "read": _read, "load": _load, "sweep": _sweep, "remove": _remove}


def main(role: str, spec_path: str, out_path: str | None = None) -> None:
    spec = json.loads(Path(spec_path).read_text())
    store = Store(spec["root"])
    if role.startswith("crash-"):
        store.ensure()
        ensure_runtime(store)
        _crash(role.removeprefix("crash-"), spec, store)
        return
    out: dict[str, Any] = {"role": role, "pid": os.getpid(), "problems": []}
    _prepare(role)
    Path(spec["go"]).with_name(f"ready.{os.getpid()}").write_text("")
    _wait_for(Path(spec["go"]))
    out["start"] = time.time()
    if role == "publish":
        store.ensure()
        ensure_runtime(store)
    ROLES[role](spec, store, out)
    out["end"] = time.time()
    Path(out_path or spec_path + f".{role}.{os.getpid()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
