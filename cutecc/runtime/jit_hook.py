"""What a kernel calls at a miss under `cutecc.load(jit=True)`: build the variant serving
the call (the build side, `cutecc.develop.jit`, imported at the first miss only), offer it
to the kernel, warn once per signature and count the miss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.runtime.calls import Build, KernelBase
from cutecc.runtime.usable import ptx_problem, why_unusable
from cutecc.store.view import StoreView


def jit_hook(store: StoreView, manifest: Path | None, target: str, series: str,
              driver: tuple[int, int] | None) -> Callable[..., str | None]:
    """What a kernel calls at a miss under `load(jit=True)`: build the variant serving the
    call (`cutecc.develop.jit`, imported here, at the first miss only), offer it, warn once per
    signature (`JitBuildWarning`) and count the miss; None when served, else why not."""
    import warnings

    from cutecc.errors import JitBuildWarning
    from cutecc.store.misses import miss_of, record_miss

    state: dict[str, Any] = {}

    def hook(fn: KernelBase, sig: list[tuple[str, tuple[Any, ...]]], keywords: dict[str, Any],
             miss: CuteccError) -> str | None:
        from cutecc import settings

        if settings.STRICT.on():
            return f"off under {settings.STRICT.where}"
        if "builder" not in state:
            from cutecc.develop.jit import builder_for  # the build side, behind the opt-in only

            state["builder"] = builder_for(store.root, manifest)
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
        fn._add_build(Build.of(e.meta, e.path))
        done = "compiled" if r.compiled else "found cached"
        warnings.warn(f'cutecc kernel "{fn.name}" {m.signature}: {said}; {done} variant '
                      f"{r.variant} for {r.arch} just in time ({r.key[:12]}, {r.seconds:.1f}s): add it to "
                      "the manifest (`cutecc misses --toml`)", JitBuildWarning, stacklevel=5)
        record_miss(store.root, dataclasses.replace(
            m, reason=f"{reason}; built just in time: variant {r.variant} for {r.arch}"))
        return None

    return hook
