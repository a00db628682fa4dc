"""Who compiles a build's misses: the executor seam.

`local` (the default) is this machine's process pools, one per arch (`cutecc.workers`);
`ray` submits one task per miss to a Ray cluster (`cutecc.executors.ray`). Every
executor runs the same `workers.build_one` for each job and calls the same
`on_result(job, result)` as each finishes, so a build reports alike whoever compiled.
Chosen by `cutecc build --executor`, else `$CUTECC_EXECUTOR`; Ray is imported only when
asked for (`pip install 'cutecc[ray]'`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cutecc import environ
from cutecc.errors import CuteccError
from cutecc.workers import BuildJob, Result

if TYPE_CHECKING:
    from cutecc.remote import RemoteConfig

KINDS = ("local", "ray")
OnResult = Callable[[BuildJob, Result], None]


@dataclass(frozen=True)
class Executor:
    """Which executor, and where its cluster is (Ray: None starts a local one)."""

    kind: str = "local"
    ray_address: str | None = None

    def compile_all(self, jobs: list[BuildJob], store_root: Path, workers: int, on_result: OnResult,
                    remote: RemoteConfig | None = None) -> None:
        """Build every job; `on_result` sees each as it finishes, in this process."""
        if self.kind == "ray":
            from cutecc.executors import ray

            ray.compile_all(jobs, store_root, workers, on_result, remote=remote,
                            address=self.ray_address)
        else:
            from cutecc.executors import local

            local.compile_all(jobs, store_root, workers, on_result, remote=remote)


def choose(kind: str | None = None, ray_address: str | None = None, *,
           default_kind: str | None = None, default_address: str | None = None) -> Executor:
    """The executor asked for by arguments, else by the environment, else by the manifest's
    `[build]` table (`default_kind`, `default_address`); local when none says."""
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
    return Executor(kind, address)
