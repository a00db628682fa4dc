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
  remote entry (`cutecc.ingest`) before publishing them.

With a writable remote cache each task uploads what it built itself. Results stream back
as tasks finish (`ray.wait`), each to the same `on_result` the local executor calls; a
task that fails (or whose worker dies) fails only its own entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc.errors import CuteccError
from cutecc.workers import BuildJob, Result

if TYPE_CHECKING:
    from cutecc.remote import RemoteConfig

TASK_TIMEOUT = 3600.0  # seconds without any task finishing before the rest are failed
MAX_SOURCE_BYTES = 16 << 20  # a kernel's source closure sent to other nodes
Sources = dict[str, bytes]  # relative path -> bytes


def compile_all(jobs: list[BuildJob], store_root: Path, workers: int,
                on_result: Callable[[BuildJob, Result], None], *, remote: RemoteConfig | None = None,
                address: str | None = None, ship: bool = False,
                task_timeout: float = TASK_TIMEOUT) -> None:
    """Build every job as a Ray task; `on_result` sees each as it finishes.

    Connects to the cluster at `address` (`host:6379` from a node of it, or `ray://host:10001`
    through Ray Client), else to the one this process already joined, else starts a local
    one with `workers` CPUs (and stops it at the end). `ship` makes every task act as if it
    ran on another node (as through Ray Client; tests use it on one machine).
    """
    try:
        import ray
    except ImportError:
        raise CuteccError("the ray executor needs Ray: pip install 'cutecc[ray]'",
                          where="--executor ray", exit_code=1) from None
    started = False
    if not ray.is_initialized():
        opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                "logging_level": logging.WARNING}
        try:
            if address:
                ray.init(address=address, **opts)
            else:
                ray.init(num_cpus=max(1, workers), **opts)
        except Exception as e:
            raise CuteccError(f"cannot start or join a Ray cluster: {type(e).__name__}: {e}",
                              where=address or "ray.init", exit_code=1) from None
        started = True
    # Through Ray Client (ray://) this process is no node of the cluster: every task's
    # entry comes back whole, whichever node ran it.
    client = bool(address and address.startswith("ray://")) or _client_connected()
    try:
        _run(ray, jobs, store_root, on_result, remote, ship or client, task_timeout)
    finally:
        if started:
            ray.shutdown()


def _client_connected() -> bool:
    try:
        from ray.util.client import ray as client

        return bool(client.is_connected())
    except Exception:
        return False


def _run(ray: Any, jobs: list[BuildJob], store_root: Path,
         on_result: Callable[[BuildJob, Result], None], remote: RemoteConfig | None, ship: bool,
         task_timeout: float) -> None:
    from cutecc.store import Store

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
            j, str(store_root), driver_node, sent[digest], remote, ship)
        refs[ref] = j
    pending = list(refs)
    try:
        _collect(ray, refs, pending, store, on_result, task_timeout)
    except BaseException:  # Ctrl-C, or the caller's callback failed: the cluster stops too
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise


def _collect(ray: Any, refs: dict[Any, BuildJob], pending: list[Any], store: Any,
             on_result: Callable[[BuildJob, Result], None], task_timeout: float) -> None:
    """Hand each result to `on_result` as its task finishes."""
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
                result, meta_bytes, files = (
                    Result("failed", 0.0, f"Ray task failed: {type(e).__name__}: {_first_line(e)}"),
                    None, None)
            if files is not None and meta_bytes is not None:
                result = _receive(store, job, result, meta_bytes, files)
            on_result(job, result)


def _receive(store: Any, job: BuildJob, result: Result, meta_bytes: bytes,
             files: dict[str, bytes]) -> Result:
    """Publish an entry a task built on another node, every byte checked first, after the
    runtime library it links against (linked here if this cache lacks it: the link is
    reproducible, so it is the one the task linked against, which its record checks)."""
    from cutecc.entry import runtime_record
    from cutecc.ingest import Refused, receive
    from cutecc.remote import DEFAULT_MAX_BLOB
    from cutecc.workers import ensure_runtime

    try:
        rt, _ = ensure_runtime(store, job.key_inputs["toolchain"]["runtime"])
        entry, _ = receive(store, job.key, meta_bytes, files, DEFAULT_MAX_BLOB)
    except Refused as e:
        return Result("failed", result.seconds, f"the entry sent back by its Ray task was refused: {e.why}")
    except (CuteccError, OSError) as e:
        return Result("failed", result.seconds, f"cannot publish the entry sent back: {e}")
    rec = runtime_record(entry.meta)
    if rec is None or rec["sha256"] != rt.meta["files"][rt.meta["library"]]["sha256"]:
        return Result("failed", result.seconds, "the entry sent back links against another runtime "
                      "library than this host links (a toolchain that differs between nodes?)")
    return replace(result, meta=entry.meta)


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# The task (runs in a Ray worker) -------------------------------------------------------


def _task(job: BuildJob, store_root: str, driver_node: str, sources: Sources | str,
          remote: RemoteConfig | None, ship: bool) -> tuple[Result, bytes | None, dict[str, bytes] | None]:
    import ray

    from cutecc.workers import build_one

    t0 = time.perf_counter()
    if os.environ.get("CUTE_DSL_ARCH") != job.arch:  # the runtime environment was not applied
        return Result("failed", 0.0, f"this Ray worker targets {os.environ.get('CUTE_DSL_ARCH')}, "
                      f"not {job.arch}"), None, None
    from cutecc.compiler import set_target

    try:
        set_target(job.arch)
    except RuntimeError as e:
        return Result("failed", 0.0, str(e)), None, None
    if ray.get_runtime_context().get_node_id() == driver_node and not ship:
        return build_one(job, store_root, remote), None, None
    if isinstance(sources, str):
        return Result("failed", 0.0, f"cannot send the kernel's sources to another node: {sources}"), \
            None, None
    from cutecc.store import Store, default_cache_dir

    node_store = Store(default_cache_dir())
    try:
        node_store.ensure()
        src = _materialize(node_store.root / "src", job, sources)
    except (CuteccError, OSError) as e:
        node = ray.get_runtime_context().get_node_id()[:12]
        return Result("failed", time.perf_counter() - t0, f"on node {node}: {e}"), None, None
    result = build_one(replace(job, python_path=(str(src),)), str(node_store.root), remote)
    if result.status == "failed":
        return result, None, None
    d = node_store.entry_dir(job.key)
    meta_bytes = (d / "meta.json").read_bytes()
    files = {name: (d / name).read_bytes() for name in (result.meta or {}).get("files", {})}
    return result, meta_bytes, files


# Kernel sources, for tasks on other nodes ----------------------------------------------


def _source_digest(files: Sources) -> str:
    """The key's source digest of these files (as `cutecc.key.SourceIndex.digest` makes it)."""
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


def _materialize(root: Path, job: BuildJob, files: Sources) -> Path:
    """Write the sources into `root/<source digest>/` (once; checked against the key)."""
    digest = str(job.key_inputs.get("source"))
    if _source_digest(files) != digest:
        raise CuteccError("the sources sent differ from those the key was computed from",
                          where=job.kernel, exit_code=1)
    final = root / digest
    if final.is_dir():
        return final
    tmp = root / f".{digest}.{secrets.token_hex(6)}.tmp"
    tmp.mkdir(parents=True)
    for rel, data in files.items():
        if rel.startswith("/") or ".." in rel.split("/"):
            raise CuteccError(f"bad source path {rel!r}", where=job.kernel, exit_code=1)
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():
            raise
    return final
