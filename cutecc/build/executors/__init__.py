"""Who compiles a build's misses: the executor seam.

`local` (the default) is this machine's process pools, one per arch
(`cutecc.build.executors.local`); `ray` submits one task per miss to a Ray cluster
(`cutecc.build.executors.ray`). Both are an `Executor` (the protocol the build pipeline,
`cutecc.build.builder`, takes): each runs the same `workers.build_one` for each job and calls the
same `on_result(job, result)` as each finishes, so a build reports alike whoever compiled.
Chosen by `cutecc build --executor`, else `$CUTECC_EXECUTOR`, else the manifest's `[build]`;
Ray is imported only when asked for (`pip install 'cutecc[ray]'`). Either way each compile is
bounded in time and, if asked, memory (`compile_limits`): one past its limit is stopped and reported failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from cutecc import settings
from cutecc.build.executors.local import LocalExecutor
from cutecc.build.executors.ray import RayExecutor
from cutecc.build.workers import DEFAULT_COMPILE_TIMEOUT, DEFAULT_LIMITS, BuildJob, Limits, OnResult
from cutecc.errors import CuteccError

if TYPE_CHECKING:
    from cutecc.ship.remote import RemoteConfig

KINDS = ("local", "ray")


@runtime_checkable
class Executor(Protocol):
    """Who compiles a build's misses: what the build pipeline's compile stage takes
    (`cutecc.build.executors.local.LocalExecutor`, `cutecc.build.executors.ray.RayExecutor`)."""

    @property
    def kind(self) -> str:
        """Its name in reports ("local", "ray")."""
        ...

    def compile_all(self, jobs: list[BuildJob], store_root: Path, workers: int, on_result: OnResult,
                    remote: RemoteConfig | None = None) -> None:
        """Build every job into the store at `store_root`, up to `workers` at a time;
        `on_result` sees each as it finishes, in this process. With a writable `remote`,
        whoever built an entry uploads it."""
        ...


def choose(kind: str | None = None, ray_address: str | None = None, *,
           default_kind: str | None = None, default_address: str | None = None,
           limits: Limits = DEFAULT_LIMITS) -> LocalExecutor | RayExecutor:
    """The executor asked for (by a flag or `$CUTECC_EXECUTOR`, read at the edge:
    `cutecc.settings.BuildOptions`), else by the manifest's `[build]` table (`default_kind`,
    `default_address`); local when none says. Each compile within `limits` (`compile_limits`)."""
    kind = (kind or "").strip() or None
    address = ray_address or None
    if kind is None and default_kind:  # the manifest's choice, with its own cluster
        kind, address = default_kind, address or default_address
    kind = (kind or "local").strip().lower()
    if kind not in KINDS:
        raise CuteccError(f'unknown executor "{kind}" (known: {", ".join(KINDS)})',
                          where=f"--executor or {settings.EXECUTOR.where}")
    if address and kind != "ray":
        raise CuteccError("a Ray address needs --executor ray", where="--ray-address")
    if kind == "ray":
        return RayExecutor(address, limits)
    return LocalExecutor(limits)


def compile_limits(seconds: float | None = None, memory: int | None = None, *,
                   default_seconds: float | None = None, default_memory: int | None = None) -> Limits:
    """What one compile may take: as asked (a flag or `$CUTECC_COMPILE_TIMEOUT` /
    `$CUTECC_COMPILE_MEMORY`, checked at the edge: `cutecc.settings.BuildOptions`), else the
    manifest's `[build]` (`default_*`, checked when it was parsed), else an hour and no
    memory limit. 0 turns a limit off."""
    secs = seconds if seconds is not None else default_seconds
    mem = memory if memory is not None else default_memory
    if memory is None and default_memory and default_memory < 1 << 26:
        raise CuteccError(f"{default_memory}: under 64M, too little for any compile",
                          where="[build] compile_memory")
    return Limits(DEFAULT_COMPILE_TIMEOUT if secs is None else secs or None, mem or None)
