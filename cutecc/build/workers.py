"""One entry's work: compile, link and publish it (`build_one`), whoever runs it.

Every executor (`cutecc.build.executors`: this machine's process pools, or Ray) runs
`build_one` for each job, in a process whose DSL targets the job's arch. It publishes its
entry into the store under the key's lock, so two builds never build one key twice, only
once the sources it compiled are checked to be those its key read (`keyed_sources`), and
returns the entry's metadata so the lock file is written without reading back what was
just published. With a writable remote cache, the worker that built an entry also uploads
it (`cutecc.ship.remote`); an upload that fails is reported, never a failed build. Kernel
libraries link against the toolchain's runtime library, which `ensure_runtime` publishes
(once, under its own key's lock) before any worker needs it. Each compile is bounded
(`Limits`); the executors enforce the time limit, `limit_memory` the memory one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from cutecc import settings
from cutecc.build import artifact, read_set
from cutecc.contract.args import args_to_json
from cutecc.entry.meta import EntryMeta, RuntimeLink, RuntimeMeta
from cutecc.entry.rules import LIBRARY, runtime_soname
from cutecc.errors import CompileError, CuteccError, WorkError
from cutecc.manifest import Manifest, Variant
from cutecc.plan import keyed_sources
from cutecc.plan.build_plan import Planned
from cutecc.plan.key import toolchain, toolchain_platform
from cutecc.plan.keyed_sources import KeyedFile
from cutecc.store.writer import Store
from cutecc.units import human_size, now_iso

if TYPE_CHECKING:
    from cutecc.ship.remote import Pushed, RemoteConfig

# errnos that mean "the cache cannot take the artifact" (not a compile error): no traceback
_STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES,
                             errno.EPERM, errno.EIO})
DEFAULT_COMPILE_TIMEOUT = 3600.0  # seconds one compile may run (FA4-sized ones take ~1 min)
COMPILE_TIMEOUT_VAR, COMPILE_MEMORY_VAR = settings.COMPILE_TIMEOUT.env, settings.COMPILE_MEMORY.env
_OUT_OF_MEMORY = ("MemoryError", "Cannot allocate memory", "bad_alloc")
_memory_limit: int | None = None  # this worker's, once `limit_memory` set it


@dataclass(frozen=True)
class BuildJob:
    """Everything a worker needs to build one entry (picklable; no manifest object)."""

    kernel: str
    entry: str
    variant: Variant
    compile_options: str
    python_path: tuple[str, ...]
    key: str
    key_inputs: dict[str, Any]
    sources: tuple[str, ...]
    backward: str | None
    env: tuple[tuple[str, str], ...] = ()  # the manifest's [env] for this arch
    # the source files the key read: checked again after the compile (`keyed_sources`)
    keyed_files: tuple[KeyedFile, ...] = ()

    @property
    def arch(self) -> str:
        return str(self.key_inputs["arch"])

    @property
    def platform(self) -> str:
        """The host platform of the library's host code (its toolchain names it)."""
        return toolchain_platform(self.key_inputs["toolchain"])

    @property
    def device(self) -> dict[str, Any] | None:
        """The answers its device queries get (`cutecc.toolchain.devicequery`), when keyed."""
        return self.key_inputs.get("device")

    @property
    def worker_kind(self) -> str:
        """What a worker process is set up for: the arch, and the device answers (libraries
        cache what they asked, so builds with other answers get other processes)."""
        return self.arch + ("" if self.device is None else " " + json.dumps(self.device, sort_keys=True))

    @classmethod
    def of(cls, p: Planned, manifest: Manifest) -> BuildJob:
        return cls(p.kernel.name, p.kernel.entry, p.variant, p.kernel.compile_options,
                   tuple(str(x) for x in manifest.python_path), p.key, p.inputs, p.sources,
                   p.kernel.backward, tuple(manifest.env_for(p.arch).items()), p.keyed_files)


@dataclass(frozen=True)
class Result:
    """A worker's answer: built, cached (another process had it) or failed."""

    status: str
    seconds: float
    error: str | None = None
    meta: EntryMeta | None = None  # the published entry's checked metadata (for the lock)
    pushed: Pushed | None = None  # what uploading it to the remote cache did, if asked to
    # where its time went (`cutecc.build.timings.ENTRY_PARTS`), and what ran it ("fork", "spawn", "ray")
    timings: dict[str, float] = field(default_factory=dict)
    worker: str | None = None
    traceback: str | None = None  # a compile error's whole traceback, escaped (`-v`, `--json`)


OnResult = Callable[[BuildJob, Result], None]  # what an executor calls as each job finishes


class Limits(NamedTuple):
    """What one compile may take: `seconds` of wall time from when its worker takes it, and
    `memory` bytes of data (RLIMIT_DATA: heap and private mappings, what a runaway compile
    grows; not address space, of which the DSL maps ~2.3 times its resident size); None
    is no limit. Chosen by `cutecc.build.executors.compile_limits`."""

    seconds: float | None = DEFAULT_COMPILE_TIMEOUT
    memory: int | None = None


DEFAULT_LIMITS = Limits()


def stopped_error(limits: Limits) -> str:
    """The error of a compile stopped at the time limit (one line)."""
    return (f"stopped: its compile ran past the {limits.seconds:g} s limit "
            f"(${COMPILE_TIMEOUT_VAR}, [build] compile_timeout, --compile-timeout)")


def exit_text(code: int | None) -> str:
    """How a process ended, from its exit status (negative: the signal)."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def died_error(code: int | None, limits: Limits) -> str:
    """The error of a compile whose worker died (`code`: its exit status), naming the memory limit."""
    hint = (f"; it may have run past the {human_size(limits.memory)} memory limit "
            f"(${COMPILE_MEMORY_VAR})" if limits.memory else "")
    return f"build worker died ({exit_text(code)}){hint}"


def _memory_hint(error: str) -> str:
    """`error`, naming the memory limit when it reads like running out of memory under one."""
    if _memory_limit and any(m in error for m in _OUT_OF_MEMORY):
        return (f"{error}\n  (over the compile memory limit of {human_size(_memory_limit)}: "
                f"${COMPILE_MEMORY_VAR}, [build] compile_memory, --compile-memory)")
    return error


def limit_memory(memory: int | None) -> None:
    """Lower this process's data limit (RLIMIT_DATA) to `memory` bytes; never raise it."""
    global _memory_limit
    if not memory:
        return
    import resource

    _memory_limit = memory
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = memory if hard == resource.RLIM_INFINITY else min(memory, hard)
    if soft == resource.RLIM_INFINITY or cap < soft:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))

def _check_toolchain(planned: dict[str, Any]) -> dict[str, str]:
    now = toolchain(toolchain_platform(planned))
    if now != planned:  # the key would not describe what builds the artifact
        changed = sorted(k for k in {*planned, *now} if planned.get(k) != now.get(k))
        raise WorkError(f"the toolchain changed after the build was planned ({', '.join(changed)});"
                        " run the build again", where="build")
    return now


def runtime_platform(key: str) -> str:
    """The platform whose runtime library this toolchain keys `key` (an error if none)."""
    from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
    from cutecc.toolchain.versions import runtime_key

    ours = runtime_key(BUILD_PLATFORM)
    if key == ours:
        return BUILD_PLATFORM
    for name in PLATFORMS:
        try:
            if name != BUILD_PLATFORM and key == runtime_key(name):
                return name
        except CuteccError:  # no pins for this DSL: not that platform's
            continue
    raise WorkError(f"runtime library {key[:12]} is not this toolchain's ({ours[:12]});"
                    " run the build again", where="build")


def ensure_runtime(store: Store, key: str) -> tuple[Any, bool]:
    """The runtime library entry of `key` (this toolchain's), linked and published if the
    store lacks it: (entry, built). Its `used` file is touched, so `cutecc gc` keeps it while
    builds use it."""
    from cutecc.build.linker import link_runtime
    from cutecc.store.view import touch_used
    from cutecc.toolchain.versions import runtime_inputs

    platform = runtime_platform(key)

    def produce(staging: Path) -> RuntimeMeta:
        t0 = time.perf_counter()
        link_runtime(staging, key, platform)
        return RuntimeMeta(key, runtime_soname(key), (), now_iso(), round(time.perf_counter() - t0, 3),
                           runtime_inputs(platform))

    entry, built = store.publish(key, produce, runtime=True)
    try:
        entry.runtime_meta  # noqa: B018  (checked once, kept on the entry)
    except ValueError as e:
        raise WorkError(f"runtime library {key[:12]}: {e}; run `cutecc verify --fix`",
                        where=str(entry.path)) from None
    touch_used(entry.path)
    return entry, built


def build_one(job: BuildJob, store_root: str, remote: RemoteConfig | None = None) -> Result:
    """Compile, link and publish one entry (in a worker whose DSL targets `job.arch`);
    then, with a writable `remote`, upload it if this call built it."""
    from cutecc.archs import is_ptx
    from cutecc.build.compiler import SYMBOL, CompileJob, compile_to_object
    from cutecc.build.linker import link
    from cutecc.cubin import arch_problem, ptx_isa

    t0 = time.perf_counter()
    read_set.install()  # (a worker installed it at its start; here for one that did not)
    read_set.begin_job()
    store = Store(store_root)
    parts: dict[str, float] = {}

    def produce(staging: Path) -> EntryMeta:
        with read_set.paused():  # cutecc's bookkeeping: checked against the key, not by it
            now = _check_toolchain(job.key_inputs["toolchain"])
            runtime, _ = ensure_runtime(store, now["runtime"])  # normally the build published it
        rt = runtime.runtime_meta.library  # ensure_runtime checked the metadata
        t1 = time.perf_counter()
        keyed_sources.evict_stale(job.keyed_files)  # a reused worker imports what was keyed
        obj = compile_to_object(CompileJob(job.entry, job.variant, job.compile_options,
                                           job.python_path, job.device, job.platform,
                                           ptx=is_ptx(job.arch)), staging)
        compiled = artifact.digest(obj)  # what the DSL compiled, for `cutecc verify --deep`
        t2 = time.perf_counter()
        link(obj, staging / LIBRARY, SYMBOL, entry=job.entry, arch=job.arch, key=job.key,
             runtime=runtime.path / rt.name, platform=job.platform)
        parts["compile"], parts["link"] = t2 - t1, time.perf_counter() - t2
        obj.unlink()
        with read_set.paused():
            changed = keyed_sources.problem(job.keyed_files)  # compiled what was keyed, or nothing
        if changed:
            raise WorkError(f"not published: {changed}", where=job.kernel)
        digest = None
        if read_set.enabled():  # every file the compile read is covered by the key, as it saw it
            t3, c3 = time.perf_counter(), time.thread_time()
            checked = read_set.check(job, staging, store_root)
            parts["audit"] = time.perf_counter() - t3
            parts["audit_cpu"] = time.thread_time() - c3  # (its cost on a shared host: CPU, not wall)
            if checked.error is not None:
                raise WorkError(f"not published: {checked.error}", where=job.kernel)
            digest = checked.digest
        library = (staging / LIBRARY).read_bytes()
        wrong = arch_problem(library, job.arch)
        if wrong:  # never published: the key would name code for another GPU
            raise WorkError(f"refusing to publish: {wrong}",
                            where=f"{job.kernel}[{job.variant.id}]@{job.arch}")
        # the PTX ISA a driver must JIT-compile (`.version`), read as the check read `.target`
        return EntryMeta(
            key=job.key, kernel=job.kernel, variant=job.variant.id, arch=job.arch,
            platform=job.platform, symbol=SYMBOL, library_name=LIBRARY, files=(),
            runtime=RuntimeLink(runtime.key, rt.name, rt.sha256, rt.size),
            backward=job.backward, built_at=now_iso(),
            build_seconds=round(time.perf_counter() - t0, 3),
            artifact=compiled, ptx_isa=ptx_isa(library) if is_ptx(job.arch) else None,
            entry=job.entry, params=dict(job.variant.params), args=args_to_json(job.variant.args),
            toolchain=now, key_inputs=job.key_inputs, sources=tuple(job.sources), read_set=digest)

    try:
        entry, built = store.publish(job.key, produce)
    except CuteccError as e:
        return Result("failed", time.perf_counter() - t0, _memory_hint(e.render()),
                      traceback=e.traceback if isinstance(e, CompileError) else None)
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRORS:  # a full or read-only cache
            where = f" ({e.filename})" if e.filename else ""
            return Result("failed", time.perf_counter() - t0,
                          f"cannot write the artifact into {store.root}: {e.strerror}{where}")
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return Result("failed", time.perf_counter() - t0,
                      _memory_hint(f"{type(e).__name__}: {e}\n{''.join(tb[-6:])}"))
    seconds = time.perf_counter() - t0
    if parts:
        parts["publish"] = max(0.0, seconds - parts["compile"] - parts["link"] - parts.get("audit", 0.0))
    pushed = None
    if built and remote is not None and remote.write:
        from cutecc.ship.remote import push_entry

        pushed = push_entry(remote, entry, store)
    try:  # what this call published is whole; what another process had, checked here
        meta = entry.meta
    except ValueError as e:
        return Result("failed", seconds,
                      f"cached entry {job.key[:12]} refused: {e}; run `cutecc verify --fix`")
    return Result("built" if built else "cached", seconds, None, meta, pushed, parts)


def with_startup(result: Result, worker: str, startup: float | None) -> Result:
    """`result` naming the `worker` kind that ran it and, for a worker's first entry, the
    seconds its start took (process and imports)."""
    timings = dict(result.timings)
    if startup is not None:
        timings = {"startup": startup, **timings}
    return replace(result, timings=timings, worker=worker)
