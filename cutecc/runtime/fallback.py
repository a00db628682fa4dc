"""A kernel's declared fallback at run time: the plain function that serves a call no build
fits (or any call, where this GPU's arch has no build), what it costs to take it, and
the record of each use.

Framework-free: the JAX front end (`cutecc.runtime.dispatch`) and the PyTorch one
(`cutecc.torch`) both ask `Fallback.serve` once `KernelBase.select` has found no build
(`NoBuildFits`). The function's module is imported at the first miss only (a deploy host
that never misses never imports it); under a lock it must be the module the lock records
(its file's SHA-256). Each use warns once per call signature (`FallbackWarning`) and is
counted in the cache's `misses.json` (`cutecc.store.misses`); `strict` (`load(strict=True)`
or `$CUTECC_STRICT=1`) turns every use into the error a kernel without a fallback raises.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cutecc import environ
from cutecc.contract.fallbacks import FallbackRef
from cutecc.errors import FallbackWarning, NoBuildFits
from cutecc.store.misses import miss_of, record_miss


class Fallback:
    """The fallback `ref` of kernel `kernel` loaded for `arch`.

    `check_digest`: the module's file must hash to `ref.sha256` (a lock's promise);
    `misses_root`: the cache to count misses in (None: a pack or read-only cache, counted
    nowhere); `call_keywords`: the names of the kernel's call keywords (their values name
    a signature; a runtime scalar's value does not)."""

    def __init__(self, kernel: str, ref: FallbackRef, *, arch: str, check_digest: bool, strict: bool,
                 misses_root: Path | None, call_keywords: Collection[str] = ()) -> None:
        self.kernel = kernel
        self.ref = ref
        self.arch = arch
        self.check_digest = check_digest
        self.strict = strict
        self.misses_root = misses_root
        self.call_keywords = frozenset(call_keywords)
        self._fn: Callable[..., Any] | None = None
        self._warned: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<cutecc fallback {self.ref.ref} of kernel {self.kernel}>"

    def function(self) -> Callable[..., Any]:
        """The fallback function, imported on first use (and checked against the lock)."""
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    self._fn = self._import()
        return self._fn

    def _import(self) -> Callable[..., Any]:
        where = f'kernel "{self.kernel}", fallback {self.ref.ref}'
        try:
            mod = importlib.import_module(self.ref.module)
        except ImportError as e:
            raise NoBuildFits(f"cannot import the fallback's module: {e}", where=where) from None
        if self.check_digest:
            origin = getattr(mod, "__file__", None)
            try:
                digest = hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin else None
            except OSError:
                digest = None
            if digest != self.ref.sha256:
                raise NoBuildFits(f"its module {origin or self.ref.module} is not the one the lock records "
                                  f"(SHA-256 {self.ref.sha256[:16]}..., this one "
                                  f"{(digest or 'unreadable')[:16]}...); build again to lock it",
                                  where=where)
        fn: Any = mod
        try:
            for part in self.ref.attr.split("."):
                fn = getattr(fn, part)
        except AttributeError:
            raise NoBuildFits(f"module {self.ref.module} has no {self.ref.attr!r}", where=where) from None
        if not callable(fn):
            raise NoBuildFits(f"{self.ref.attr!r} is a {type(fn).__name__}, not a function", where=where)
        return fn  # type: ignore[no-any-return]

    def serve(self, arrays: Sequence[Any], kwargs: Mapping[str, Any], miss: NoBuildFits,
              arrays_sig: list[tuple[str, tuple[Any, ...]]], no_builds: bool, once: bool = False,
              note: str = "") -> Any:
        """The fallback's result for a call no build serves (`miss` says why), after the
        strict check, the warning and the count. `arrays_sig` is the arrays' (dtype name,
        shape); `no_builds`: the kernel has no build usable on this arch at all. Counted at
        each call (JAX asks once per trace), or with `once` at the signature's first miss
        in this process only (PyTorch asks at every eager call). `note`: why no
        just-in-time build serves it either (`load(jit=True)`), said in the warning."""
        if self.strict or environ.flag(environ.STRICT):
            why = "load(strict=True)" if self.strict else f"${environ.STRICT}"
            raise NoBuildFits(f"{miss.message}\n(strict, {why}: the declared fallback {self.ref.ref} "
                              "is not served)", where=miss.where)
        reason = f"no build for {self.arch}" if no_builds else "no built variant fits"
        keywords = {k: v for k, v in kwargs.items() if k in self.call_keywords}
        m = miss_of(self.kernel, self.arch, arrays_sig, keywords, reason)
        fn = self.function()
        first = m.ident not in self._warned
        if first:
            self._warned.add(m.ident)
            said = reason if no_builds else f"{reason} on {self.arch}"
            warnings.warn(f'cutecc kernel "{self.kernel}" {m.signature}: {said}; '
                          f"served by its fallback {self.ref.ref} (`cutecc misses --toml` prints "
                          "the variants that would cover it)" + (f"; {note}" if note else ""),
                          FallbackWarning, stacklevel=4)
        if self.misses_root is not None and (first or not once):
            record_miss(self.misses_root, m)
        return fn(*arrays, **kwargs)
