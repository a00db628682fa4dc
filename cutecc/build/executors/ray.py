"""The Ray executor: one Ray task per miss, on an existing cluster or a local one.

Each task carries its arch in its runtime environment (`CUTE_DSL_ARCH`): the DSL fixes
its target when imported, and Ray keeps a separate pool of worker processes per runtime
environment, so a worker never compiles for two archs. Each task runs the same
`workers.build_one` as the local pools:

- on the driver's node it publishes straight into the driver's cache, under the key's
  lock, so a task whose key is already there (another build, another task) does no work;
- on another node it builds into that node's own cache (`$CUTECC_CACHE_DIR` or the user
  cache directory there), from the kernel sources sent with it (checked against the
  key's source digest), and returns the entry's files, which the driver checks like a
  remote entry (`cutecc.ship.ingest`) before publishing them.

With a writable remote cache each task uploads what it built itself. Results stream back
as tasks finish (`ray.wait`), each to the same `on_result` the local executor calls; a
task that fails (or whose worker dies) fails only its own entry.

The driver never believes a task's report: every entry a task built or found is read back
from the driver's own store and checked whole (`ingest.check_stored`); a report that
differs from it fails the entry. Unless this process already joined a cluster, the Ray
driver runs in a child process (`_driver`), so that Ray's messages go to stderr and a
cluster failure (Ray ends its driver when the raylet dies) fails only the entries not yet
reported (one a task published here before it counts, checked), in a report that stays
whole. Without an address that child starts a private local cluster in a fresh directory
of its own (`_private_temp_dir`): it never joins the cluster a shared temporary directory
(`/tmp/ray/ray_current_cluster`) or `$RAY_ADDRESS` names. Each compile is bounded like the
local pools' (`workers.Limits`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc import settings
from cutecc.build.executors import worker_tree
from cutecc.build.workers import DEFAULT_LIMITS, BuildJob, Limits, Result, exit_text
from cutecc.entry.meta import EntryMeta
from cutecc.errors import CuteccError, WorkError
from cutecc.store import homes
from cutecc.store.writer import Store

WORKER_MARK = settings.WORKER_MARK.env  # the mark in what a worker starts

if TYPE_CHECKING:
    from cutecc.ship.remote import RemoteConfig

TASK_TIMEOUT = 3600.0  # seconds without any task finishing before the rest are failed
MAX_SOURCE_BYTES = 16 << 20  # a kernel's source closure sent to other nodes
STOP_GRACE = 30.0  # after the time limit, a task's watchdog process kills its worker
INIT_TIMEOUT = 120.0  # seconds to start or join the cluster (ray.init retries for ever)
Sources = dict[str, bytes]  # relative path -> bytes


@dataclass(frozen=True)
class RayExecutor:
    """A Ray cluster (`ray_address`; None starts a private local one) compiling one task
    per job (`compile_all`), each within `limits`."""

    ray_address: str | None = None
    limits: Limits = DEFAULT_LIMITS
    kind: str = field(default="ray", init=False)

    def compile_all(self, jobs: list[BuildJob], store_root: Path, workers: int,
                    on_result: Callable[[BuildJob, Result], None],
                    remote: RemoteConfig | None = None) -> None:
        """Build every job as a Ray task; `on_result` sees each as it finishes, checked."""
        compile_all(jobs, store_root, workers, on_result, remote=remote, address=self.ray_address,
                    limits=self.limits)


def compile_all(jobs: list[BuildJob], store_root: Path, workers: int,
                on_result: Callable[[BuildJob, Result], None], *, remote: RemoteConfig | None = None,
                address: str | None = None, ship: bool = False,
                task_timeout: float = TASK_TIMEOUT, limits: Limits = DEFAULT_LIMITS) -> None:
    """Build every job as a Ray task; `on_result` sees each as it finishes, checked (and
    named as a Ray task's, `Result.worker`).

    Uses the cluster this process already joined, if any; else runs the Ray driver in a
    child process, which joins the cluster at `address` (`host:6379` from a node of it, or
    `ray://host:10001` through Ray Client) or starts a private local one with `workers` CPUs
    (stopped at the end). `ship` makes every task act as if it ran on another node (as
    through Ray Client; tests use it on one machine).
    """
    try:
        import ray
    except ImportError:
        raise WorkError("the ray executor needs Ray: pip install 'cutecc[ray]'",
                        where="--executor ray") from None
    store = Store(store_root)

    def checked(job: BuildJob, result: Result) -> None:
        on_result(job, replace(_checked(store, job, result), worker="ray"))

    if ray.is_initialized():  # the caller's cluster (a test's, a notebook's)
        _run(ray, jobs, store_root, checked, remote, ship or _client_connected(), task_timeout, limits)
    else:
        _in_driver_process(jobs, store_root, workers, checked, remote, address, ship, task_timeout,
                           limits)


def _checked(store: Any, job: BuildJob, result: Result) -> Result:
    """`result` with the metadata of the entry as the driver's store holds it, checked whole
    (the task's own report is never recorded); failed if the store's entry is refused or
    the report differs from it in anything a lock line pins (`entry.rules.acted_on`)."""
    if result.status == "failed":
        return result
    rec = _stored(store, job.key)
    if isinstance(rec, str):
        return Result("failed", result.seconds, f"the entry its Ray task published was refused: {rec}")
    if result.meta is None or result.meta.acted_on != rec.acted_on:
        return Result("failed", result.seconds, "the Ray task's report differs from the entry it "
                      "published (library, symbol, contract or runtime); not recorded")
    return replace(result, meta=rec)


def _stored(store: Store, key: str) -> EntryMeta | str:
    """The checked metadata of `key`'s entry in the store, or why none is (absent or refused)."""
    from cutecc.ship.ingest import Refused, check_stored

    try:
        return EntryMeta.parse(check_stored(store, key), key)  # check_stored checked it: typed here
    except Refused as e:
        return e.why


def _private_temp_dir() -> str:
    """A fresh directory of this user's (mode 0700) for a private cluster's sessions and
    sockets: in $TMPDIR when short enough for Ray's socket paths (sun_path holds 107
    bytes, Ray adds ~85), else in /tmp."""
    return tempfile.mkdtemp(prefix="cutecc-ray-", dir=homes.short_temp_dir(20))


def _in_driver_process(jobs: list[BuildJob], store_root: Path, workers: int,
                       on_result: Callable[[BuildJob, Result], None], remote: RemoteConfig | None,
                       address: str | None, ship: bool, task_timeout: float, limits: Limits) -> None:
    """Run `_driver` in a spawned child and hand each result it sends to `on_result`; when
    it ends early (the cluster failed, Ray ended it), every entry not reported fails with
    one line saying so, unless the store holds it whole (a task published it first)."""
    import multiprocessing
    import multiprocessing.connection

    ctx = multiprocessing.get_context("spawn")
    temp = None if address else _private_temp_dir()
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_driver, name="cutecc-ray-driver",
                       args=(theirs, jobs, str(store_root), workers, remote, address, ship,
                             task_timeout, limits, temp))
    reported: set[int] = set()
    error = None
    ended = started = False
    try:
        proc.start()
        theirs.close()
        deadline = time.monotonic() + INIT_TIMEOUT
        while not ended:
            ready = multiprocessing.connection.wait(
                [mine, proc.sentinel], None if started else max(0.0, deadline - time.monotonic()))
            if not ready and not started:  # ray.init retries an unreachable address for ever
                error = f"cannot start or join a Ray cluster: no answer within {INIT_TIMEOUT:.0f} s"
                break
            while True:
                try:
                    if not mine.poll():
                        break
                    kind, i, payload = mine.recv()
                except (EOFError, OSError):
                    ended = True
                    break
                if kind == "started":
                    started = True
                elif kind == "result":
                    reported.add(i)
                    on_result(jobs[i], payload)
                elif kind == "error":
                    error = payload
                else:
                    ended = True
            ended = ended or proc.sentinel in ready
        proc.join(60 if started else 0)  # a driver stuck in ray.init is killed below
    finally:  # done, Ctrl-C, or the caller's callback failed: the driver stops its cluster
        if proc.is_alive() and started:
            proc.terminate()
            proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
    if len(reported) == len(jobs):
        return
    if error and error.startswith("cannot start"):  # each entry says so: the report stays whole
        why = f"{error} ({address or 'a private local cluster'}; Ray's messages are on stderr)"
    else:
        how = error or f"its driver ended: {exit_text(proc.exitcode)}"
        why = f"the Ray cluster failed before this task reported ({how}; Ray's messages are on stderr)"
    for i, job in enumerate(jobs):
        if i not in reported:  # what a task published here before the failure still counts
            meta = _stored(Store(store_root), job.key)
            on_result(job, Result("failed", 0.0, why) if isinstance(meta, str) else
                      Result("built", meta.build_seconds, None, meta))


def _driver(conn: Any, jobs: list[BuildJob], store_root: str, workers: int, remote: RemoteConfig | None,
            address: str | None, ship: bool, task_timeout: float, limits: Limits, temp: str | None) -> None:
    """The Ray driver (a spawned child of the build): joins or starts the cluster, runs the
    tasks and sends ("result", job index, Result) for each, then ("done", ...), or
    ("error", ..., one line). Its stdout is stderr: whatever Ray prints is never the
    report's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the build stops it (SIGTERM) on Ctrl-C
    with contextlib.suppress(Exception):
        import ctypes

        # PR_SET_PDEATHSIG: dies with the build (SIGKILL: Ray's SIGTERM handler waits for the
        # interpreter, which a connecting ray.init does not give back); Ray's reaper then
        # stops the cluster it started
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.pop("RAY_ADDRESS", None)  # only an explicit address joins another cluster
    import ray

    opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                            "logging_level": logging.WARNING}
    try:
        if address:
            ray.init(address=address, **opts)
        else:  # "local": a new cluster, never the one a temp directory or $RAY_ADDRESS names
            ray.init(address="local", num_cpus=max(1, workers), _temp_dir=temp, **opts)
    except Exception as e:
        conn.send(("error", -1, f"cannot start or join a Ray cluster: {type(e).__name__}: {_first_line(e)}"))
        return
    conn.send(("started", -1, None))
    index = {id(j): i for i, j in enumerate(jobs)}
    try:
        client = bool(address and address.startswith("ray://")) or _client_connected()
        _run(ray, jobs, Path(store_root), lambda j, r: conn.send(("result", index[id(j)], r)), remote,
             ship or client, task_timeout, limits)
        conn.send(("done", -1, None))
    except Exception as e:  # the cluster failed under us
        with contextlib.suppress(Exception):
            conn.send(("error", -1, f"{type(e).__name__}: {_first_line(e)}"))
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()


def _client_connected() -> bool:
    try:
        from ray.util.client import ray as client

        return bool(client.is_connected())
    except Exception:
        return False


def _run(ray: Any, jobs: list[BuildJob], store_root: Path,
         on_result: Callable[[BuildJob, Result], None], remote: RemoteConfig | None, ship: bool,
         task_timeout: float, limits: Limits) -> None:
    store = Store(store_root)
    driver_node = ray.get_runtime_context().get_node_id()
    task = ray.remote(num_cpus=1, max_retries=1)(_task)
    sent: dict[str, Any] = {}  # source digest -> object ref of the sources, put once
    refs: dict[Any, BuildJob] = {}
    for j in jobs:
        digest = str(j.key_inputs.get("source"))
        if digest not in sent:
            try:
                sent[digest] = ray.put(_read_sources(j))
            except CuteccError as e:
                sent[digest] = ray.put(e.render())  # only a task on another node needs them
        env_vars = {"CUTE_DSL_ARCH": j.arch}
        if j.device is not None:  # other device answers, other worker processes (libraries cache them)
            env_vars["CUTECC_DEVICE_ANSWERS"] = hashlib.sha256(j.worker_kind.encode()).hexdigest()[:16]
        ref = task.options(runtime_env={"env_vars": env_vars},
                           name=f"cutecc {j.kernel}[{j.variant.id}]@{j.arch}").remote(
            j, str(store_root), driver_node, sent[digest], remote, ship, limits)
        refs[ref] = j
    pending = list(refs)
    try:
        _collect(ray, refs, pending, store, on_result, task_timeout, limits)
    except BaseException:  # Ctrl-C, or the caller's callback failed: the cluster stops too
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise


def _collect(ray: Any, refs: dict[Any, BuildJob], pending: list[Any], store: Any,
             on_result: Callable[[BuildJob, Result], None], task_timeout: float, limits: Limits) -> None:
    """Hand each result to `on_result` as its task finishes."""
    t0 = time.monotonic()
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=task_timeout)
        if not done:  # nothing finished for task_timeout: give up on the rest
            for ref in pending:
                ray.cancel(ref, force=True)
                on_result(refs[ref], Result("failed", task_timeout,
                                            f"no Ray task finished within {task_timeout:.0f} s"))
            return
        for ref in done:
            job = refs[ref]
            try:
                result, meta_bytes, files = ray.get(ref)
            except Exception as e:  # the worker died, its environment failed, ...
                late = limits.seconds and time.monotonic() - t0 >= limits.seconds
                hint = f" (it may have run past the {limits.seconds:g} s compile limit)" if late else ""
                result, meta_bytes, files = (
                    Result("failed", 0.0, f"Ray task failed: {type(e).__name__}: {_first_line(e)}{hint}"),
                    None, None)
            if files is not None and meta_bytes is not None:
                result = _receive(store, job, result, meta_bytes, files)
            on_result(job, result)


def _receive(store: Any, job: BuildJob, result: Result, meta_bytes: bytes,
             files: dict[str, bytes]) -> Result:
    """Publish an entry a task built on another node, every byte checked first, after the
    runtime library it links against (linked here if this cache lacks it: the link is
    reproducible, so it is the one the task linked against, which its record checks)."""
    from cutecc.build.workers import ensure_runtime
    from cutecc.ship.ingest import Refused, receive
    from cutecc.ship.remote import DEFAULT_MAX_BLOB

    try:
        rt, _ = ensure_runtime(store, job.key_inputs["toolchain"]["runtime"])
        entry, _ = receive(store, job.key, meta_bytes, files, DEFAULT_MAX_BLOB)
    except Refused as e:
        return Result("failed", result.seconds, f"the entry sent back by its Ray task was refused: {e.why}")
    except (CuteccError, OSError) as e:
        return Result("failed", result.seconds, f"cannot publish the entry sent back: {e}")
    try:  # both checked on arrival: typed here
        same = entry.meta.runtime.sha256 == rt.runtime_meta.library.sha256
    except ValueError:
        same = False
    if not same:
        return Result("failed", result.seconds, "the entry sent back links against another runtime "
                      "library than this host links (a toolchain that differs between nodes?)")
    return replace(result, meta=entry.meta)


def _first_line(e: BaseException) -> str:
    """The last non-empty line of an error, without colour codes (one line of a report)."""
    import re

    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


# The task (runs in a Ray worker) -------------------------------------------------------


def _bounded(limits: Limits, build: Callable[[], Result]) -> Result:
    """`build()` within the compile time limit: run in a thread this task waits for; past the
    limit the task fails by name and its worker, whose compile runs on, ends (a watchdog
    process kills it STOP_GRACE s later should the compile hold the interpreter meanwhile),
    and with it every process the compile started (marked with this task's token:
    `worker_tree`; a Ray worker is not alone in its process group)."""
    from cutecc.build.workers import stopped_error

    if not limits.seconds:
        return build()
    box: list[Result] = []
    token = secrets.token_hex(8)
    os.environ[WORKER_MARK] = token  # what the compile starts carries it

    def stop() -> None:  # once this result is on its way back
        worker_tree.kill_tree(os.getpid(), token, group=False)
        os._exit(1)

    def work() -> None:
        try:
            box.append(build())
        except BaseException as e:
            box.append(Result("failed", 0.0, f"{type(e).__name__}: {e}"))

    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()),
                                 str(limits.seconds + STOP_GRACE), token], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        thread = threading.Thread(target=work, name="cutecc-compile", daemon=True)
        thread.start()
        thread.join(limits.seconds)
        if box:
            return box[0]
        # What the compile started goes now, not with the worker 2 s later: a build whose
        # last task this was may shut Ray down (and this worker with it) before that.
        worker_tree.kill_tree(os.getpid(), token, group=False)
        threading.Timer(2.0, stop).start()
        return Result("failed", limits.seconds, stopped_error(limits))
    finally:
        watchdog.kill()
        watchdog.wait()
        if box:  # the next task in this worker marks its own
            os.environ.pop(WORKER_MARK, None)


# Kills its parent (argv[1]) after argv[2] seconds, unless the parent is gone by then, and
# the processes its compile started (marked with argv[3]: `worker_tree`).
_WATCHDOG = """
import os, signal, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    time.sleep(1.0)
    if os.getppid() != parent:
        sys.exit(0)
os.kill(parent, signal.SIGKILL)
from cutecc.build.executors import worker_tree
worker_tree.kill_tree(parent, sys.argv[3], group=False)
"""


def _task(job: BuildJob, store_root: str, driver_node: str, sources: Sources | str,
          remote: RemoteConfig | None, ship: bool,
          limits: Limits = DEFAULT_LIMITS) -> tuple[Result, bytes | None, dict[str, bytes] | None]:
    import ray

    from cutecc.build.workers import build_one, limit_memory

    t0 = time.perf_counter()
    if os.environ.get("CUTE_DSL_ARCH") != job.arch:  # the runtime environment was not applied
        return Result("failed", 0.0, f"this Ray worker targets {os.environ.get('CUTE_DSL_ARCH')}, "
                      f"not {job.arch}"), None, None
    from cutecc.build.compiler import set_target

    try:
        set_target(job.arch)
    except RuntimeError as e:
        return Result("failed", 0.0, str(e)), None, None
    limit_memory(limits.memory)  # this worker compiles only for cutecc (its job's)
    if ray.get_runtime_context().get_node_id() == driver_node and not ship:
        return _bounded(limits, lambda: build_one(job, store_root, remote)), None, None
    if isinstance(sources, str):
        return Result("failed", 0.0, f"cannot send the kernel's sources to another node: {sources}"), \
            None, None
    from cutecc.store.view import default_cache_dir
    node_store = Store(default_cache_dir())
    try:
        node_store.ensure()
        src = _materialize(node_store, job, sources)
    except (CuteccError, OSError) as e:
        node = ray.get_runtime_context().get_node_id()[:12]
        return Result("failed", time.perf_counter() - t0, f"on node {node}: {e}"), None, None
    # compiled from the checked copy (the closure sent): the worker re-checks its files
    here = tuple(f._replace(path=str(src / f.rel)) for f in job.keyed_files if f.rel in job.sources)
    result = _bounded(limits, lambda: build_one(replace(job, python_path=(str(src),), keyed_files=here),
                                                str(node_store.root), remote))
    if result.status == "failed":
        return result, None, None
    d = node_store.layout.entry(job.key)
    meta_bytes = node_store.layout.entry_meta(job.key).read_bytes()
    files = {f.name: (d / f.name).read_bytes() for f in (result.meta.files if result.meta else ())}
    return result, meta_bytes, files


# Kernel sources, for tasks on other nodes ----------------------------------------------


def _source_digest(files: Sources) -> str:
    """The key's source digest of these files (as `cutecc.plan.key.SourceIndex.digest` makes it)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).hexdigest().encode() + b"\0")
    return h.hexdigest()


def _read_sources(job: BuildJob) -> Sources:
    """The job's source closure, by path relative to its python_path root."""
    out: Sources = {}
    total = 0
    for rel in job.sources:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise CuteccError(f"source {rel} is outside the manifest's python_path", where=job.kernel)
        for root in job.python_path:
            f = Path(root) / rel
            if f.is_file():
                out[rel] = f.read_bytes()
                total += len(out[rel])
                break
        else:
            raise CuteccError(f"source {rel} not found under the python_path", where=job.kernel)
        if total > MAX_SOURCE_BYTES:
            raise CuteccError(f"sources over {MAX_SOURCE_BYTES} bytes", where=job.kernel)
    if _source_digest(out) != job.key_inputs.get("source"):
        raise CuteccError("the sources changed since the build was planned", where=job.kernel)
    return out


def _materialize(store: Store, job: BuildJob, files: Sources) -> Path:
    """Write the sources into the cache's `src/<source digest>/` (once; checked against the key)."""
    digest = str(job.key_inputs.get("source"))
    if _source_digest(files) != digest:
        raise WorkError("the sources sent differ from those the key was computed from",
                        where=job.kernel)
    for rel in files:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise WorkError(f"bad source path {rel!r}", where=job.kernel)
    return store.receive_sources(digest, files)
