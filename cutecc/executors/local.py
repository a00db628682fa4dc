"""The local executor: this machine's spawned process pools, one per arch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cutecc import workers
from cutecc.workers import DEFAULT_LIMITS, BuildJob, Limits, Result

if TYPE_CHECKING:
    from collections.abc import Callable

    from cutecc.remote import RemoteConfig


def compile_all(jobs: list[BuildJob], store_root: Path, n: int,
                on_result: Callable[[BuildJob, Result], None],
                remote: RemoteConfig | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
    """`workers.compile_all`: one pool of `n` processes per arch, each compile bounded."""
    workers.compile_all(jobs, store_root, n, on_result, remote, limits)
