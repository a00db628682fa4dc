"""Who compiles a build's misses: the executor seam.

`local` (the default) is this machine's process pools, one per arch
(`cutecc.build.executors.local`); `ray` submits one task per miss to a Ray cluster
(`cutecc.build.executors.ray`). Both are an `Executor` (the protocol the build pipeline,
`cutecc.build.builder`, takes): each runs the same `workers.build_one` for each job and calls the
same `on_result(job, result)` as each finishes, so a build reports alike whoever compiled.
Chosen by `cutecc build --executor`, else `$CUTECC_EXECUTOR`; Ray is imported only when
asked for (`pip install 'cutecc[ray]'`). Either way each compile is bounded in time and,
if asked, memory (`compile_limits`): one past its limit is stopped and reported failed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cutecc import environ
from cutecc.build.executors.local import LocalExecutor
from cutecc.build.executors.ray import RayExecutor
from cutecc.build.workers import DEFAULT_COMPILE_TIMEOUT, DEFAULT_LIMITS, BuildJob, Limits, OnResult
from cutecc.errors import CuteccError
from cutecc.units import parse_size

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
    """The executor asked for by arguments, else by the environment, else by the manifest's
    `[build]` table (`default_kind`, `default_address`); local when none says. Each
    compile within `limits` (`compile_limits`)."""
    kind = kind or os.environ.get(environ.EXECUTOR, "").strip() or None
    address = ray_address or os.environ.get(environ.RAY_ADDRESS) or None
    if kind is None and default_kind:  # the manifest's choice, with its own cluster
        kind, address = default_kind, address or default_address
    kind = (kind or "local").strip().lower()
    if kind not in KINDS:
        raise CuteccError(f'unknown executor "{kind}" (known: {", ".join(KINDS)})',
                          where=f"--executor or ${environ.EXECUTOR}")
    if address and kind != "ray":
        raise CuteccError("a Ray address needs --executor ray", where="--ray-address")
    if kind == "ray":
        return RayExecutor(address, limits)
    return LocalExecutor(limits)


_OFF = ("0", "off", "none", "no")


def compile_limits(seconds: str | float | None = None, memory: str | int | None = None, *,
                   default_seconds: str | float | None = None,
                   default_memory: str | int | None = None) -> Limits:
    """What one compile may take: from the arguments (flags), else `$CUTECC_COMPILE_TIMEOUT` /
    `$CUTECC_COMPILE_MEMORY`, else the manifest's `[build]` (`default_*`), else an hour and no
    memory limit. Seconds > 0, a size such as `8G`; 0 or `off` turns a limit off."""
    def pick(given: Any, var: str, default: Any) -> Any:
        if given is not None and str(given).strip():
            return given, f"--{var.lower().removeprefix('cutecc_').replace('_', '-')}"
        env = os.environ.get(var, "").strip()
        return (env, f"${var}") if env else (default, f"[build] {var.lower().removeprefix('cutecc_')}")

    t, where = pick(seconds, environ.COMPILE_TIMEOUT, default_seconds)
    secs: float | None = DEFAULT_COMPILE_TIMEOUT
    if t is not None:
        text = str(t).strip().lower()
        try:
            secs = None if text in _OFF else float(text) or None
        except ValueError:
            secs = -1.0
        if secs is not None and not 0 < secs < float("inf"):
            raise CuteccError(f'"{t}" is not a number of seconds (0 or off: no limit)', where=where)
    m, where = pick(memory, environ.COMPILE_MEMORY, default_memory)
    mem = None if m is None or str(m).strip().lower() in _OFF else parse_size(m, where) or None
    if mem is not None and mem < 1 << 26:
        raise CuteccError(f"{m}: under 64M, too little for any compile", where=where)
    return Limits(secs, mem)
