"""The miss hook the runtime offers: what a kernel calls at a miss under
`cutecc.load(jit=True)`. The runtime builds nothing and imports nothing of the build side:
a just-in-time builder registers itself here (`register_builder`); the hook asks it for the
variant serving the call, offers the entry to the kernel, warns once per signature and counts
the miss. `cutecc.load` (the top-level package, which fronts the runtime and the build side
alike) registers the build side's, `cutecc.build.jit.JitBuilder`, imported at the first miss
only; a program that loads through `cutecc.runtime.loader` itself registers one, or gets an
error at load naming this.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cutecc.errors import CuteccError
from cutecc.runtime.calls import Build, KernelBase
from cutecc.runtime.usable import ptx_problem, why_unusable
from cutecc.store.misses import Miss
from cutecc.store.view import StoreView


@dataclasses.dataclass(frozen=True)
class Built:
    """A just-in-time build of one call: the entry's key, its variant and arch, whether it
    was compiled now (False: a hit, built by an earlier process or build), and its seconds."""

    key: str
    variant: str
    arch: str
    compiled: bool
    seconds: float


class MissBuilder(Protocol):
    """What a registered builder makes for one cache: `build(miss)` compiles (or finds
    cached) the entry serving the call, or raises a CuteccError saying why none can."""

    def build(self, m: Miss) -> Built: ...


# (cache directory, the manifest load() was given or None) -> a builder for that cache
BuilderFactory = Callable[[Path, "Path | None"], MissBuilder]
_registered: list[BuilderFactory] = []
_lock = threading.Lock()


def register_builder(factory: BuilderFactory) -> None:
    """Make `factory` the just-in-time builder (the last registered serves)."""
    with _lock:
        _registered[:] = [factory]


def registered() -> BuilderFactory | None:
    """The registered builder factory, or None."""
    with _lock:
        return _registered[0] if _registered else None


def jit_hook(store: StoreView, manifest: Path | None, target: str, series: str,
             driver: tuple[int, int] | None, strict_by: str | None = None,
             loaded: Callable[[Build], Build] = lambda b: b) -> Callable[..., str | None]:
    """What a kernel calls at a miss under `load(jit=True)`: build the variant serving the
    call (the registered builder's, made at the first miss only), offer it (as the load
    serves a build: `loaded`), warn once per signature (`JitBuildWarning`) and count the
    miss; None when served, else why not. `strict_by`: what made the load strict
    (`$CUTECC_STRICT`, read by the load): every miss is then left unbuilt."""
    import warnings

    from cutecc.errors import JitBuildWarning
    from cutecc.store.misses import miss_of, record_miss

    state: dict[str, Any] = {}

    def hook(fn: KernelBase, sig: list[tuple[str, tuple[Any, ...]]], keywords: dict[str, Any],
             miss: CuteccError) -> str | None:
        if strict_by is not None:
            return f"off under {strict_by}"
        if "builder" not in state:
            factory = registered()
            if factory is None:
                return "no just-in-time builder is registered (load through `cutecc.load`)"
            state["builder"] = factory(store.root, manifest)
        reason = f"no build for {target}" if not fn.builds else "no built variant fits"
        m = miss_of(fn.name, target, sig, keywords, reason)
        try:
            r = state["builder"].build(m)
        except CuteccError as err:
            return f"{err.where}: {err.message}" if err.where else err.message
        e = store.get(r.key)
        why = "not in the cache after its build" if e is None else (
            why_unusable(e, target, series) or ptx_problem(e, driver))
        if e is None or why:
            return f"entry {r.key[:12]} ({r.variant}@{r.arch}): {why}"
        said = reason if not fn.builds else f"{reason} on {target}"
        fn._add_build(loaded(Build.of(e.meta, e.path)))
        done = "compiled" if r.compiled else "found cached"
        warnings.warn(f'cutecc kernel "{fn.name}" {m.signature}: {said}; {done} variant '
                      f"{r.variant} for {r.arch} just in time ({r.key[:12]}, {r.seconds:.1f}s): add it to "
                      "the manifest (`cutecc misses --toml`)", JitBuildWarning, stacklevel=5)
        record_miss(store.root, dataclasses.replace(
            m, reason=f"{reason}; built just in time: variant {r.variant} for {r.arch}"))
        return None

    return hook
