"""A kernel's declared fallback at run time: the plain function that serves a call no build
fits (or any call, where this GPU's arch has no build), what it costs to take it, and
the record of each use.

Framework-free: the JAX front end (`cutecc.runtime.dispatch`) and the PyTorch one
(`cutecc.torch`) both ask `Fallback.serve` once `KernelBase.select` has found no build
(`NoBuildFits`). The function's closure is checked and run at the first miss only (a
deploy host that never misses never reads it), from bytes that match the lock's pins, or
without a lock the newest build's (`cutecc.runtime.fallback_code`); its result is checked
against the kernel's contract read through the call (`check_result`). Each use warns once
per call signature (`FallbackWarning`) and is counted in the cache's `misses.json`
(`cutecc.store.misses`); `strict` (`load(strict=True)` or `$CUTECC_STRICT=1`, read by the
load) turns every use into the error a kernel without a fallback raises.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from cutecc.contract import expr
from cutecc.contract.args import CallingConvention, args_from_json
from cutecc.contract.fallbacks import FRONT_ENDS, FallbackRef
from cutecc.errors import CallError, CuteccError, FallbackWarning, NoBuildFits
from cutecc.runtime.fallback_code import load_function
from cutecc.runtime.project import same_path
from cutecc.store.misses import Miss, miss_of, record_miss
from cutecc.store.view import Entry, StoreView


class Fallback:
    """The fallback `ref` of kernel `kernel` loaded for `arch`.

    `roots`: where its closure's files are looked for (`cutecc.runtime.fallback_code`; then
    `sys.path`), each checked against `ref`'s pins, which `pinned_by` names (the lock, or
    the newest build's record); `misses_root`: the cache to count misses in (None: a pack or
    read-only cache, counted nowhere); `call_keywords`: the names of the call keywords
    its entries record, of every arch (their values name a signature; a runtime scalar's
    value does not);
    `contracts`: the calling conventions of the kernel's entries, which a result is checked
    against (`check_result`); `strict`: every use is an error instead, `strict_by` naming
    what asked for that (`load(strict=True)`, `$CUTECC_STRICT`)."""

    def __init__(self, kernel: str, ref: FallbackRef, *, arch: str, strict: bool,
                 misses_root: Path | None, call_keywords: Collection[str] = (),
                 strict_by: str = "load(strict=True)",
                 roots: Sequence[Path] = (), pinned_by: str = "the lock",
                 contracts: Sequence[CallingConvention] = ()) -> None:
        self.kernel = kernel
        self.ref = ref
        self.arch = arch
        self.strict = strict
        self.strict_by = strict_by
        self.misses_root = misses_root
        self.call_keywords = frozenset(call_keywords)
        self.roots = tuple(roots)
        self.pinned_by = pinned_by
        self.contracts = tuple(contracts)
        self._fn: Callable[..., Any] | None = None
        self._warned: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<cutecc fallback {self.ref.ref} of kernel {self.kernel}>"

    def function(self) -> Callable[..., Any]:
        """The fallback function, its closure checked and run from the checked bytes on first use."""
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    roots = [*self.roots, *(Path(p or ".") for p in sys.path if isinstance(p, str))]
                    where = f'kernel "{self.kernel}", fallback {self.ref.ref}'
                    self._fn = load_function(self.ref, roots, where, self.pinned_by)
        return self._fn

    def check_result(self, out: Any, arrays_sig: Sequence[tuple[str, tuple[Any, ...]]],
                     dtype_name: Callable[[Any], str]) -> None:
        """CallError naming the fallback unless `out` is what the call's contract returns: as
        many results, each of the rank, dtype and extents the kernel's contract gives for
        these arrays (`expected`; a static extent or dtype the call changed may be either)."""
        if not self.contracts:
            return
        where = f'kernel "{self.kernel}", fallback {self.ref.ref}'
        whys = []
        for conv in self.contracts:
            why = result_problem(conv, out, arrays_sig, dtype_name)
            if why is None:
                return
            whys.append(why)
        raise CallError(f"the fallback returned {whys[0]}; a fallback must return what the kernel "
                        "does", where=where)

    def serve(self, arrays: Sequence[Any], kwargs: Mapping[str, Any], keywords: Mapping[str, Any],
              miss: NoBuildFits, arrays_sig: list[tuple[str, tuple[Any, ...]]], no_builds: bool,
              note: str = "") -> tuple[Any, Use]:
        """The fallback's result for a call no build serves (`miss` says why), after the
        strict check, and the `Use` that warns and counts it once the call really happens
        (`Use.record`: PyTorch's eager call at once; JAX's when the call is lowered into a
        program or run eagerly, never for a trace that only computes shapes, see
        `cutecc.runtime.fallback_mark`). `kwargs` are all the call's keywords (the fallback
        takes them); `keywords` the call keywords the kernel told apart among them
        (one-value axes included), which with those of `call_keywords` name the signature
        a miss records (a runtime scalar's value does not); `arrays_sig` is the arrays'
        (dtype name, shape); `no_builds`: the kernel has no build usable on this arch at
        all. `note`: why no just-in-time build serves it either (`load(jit=True)`), said in
        the warning."""
        if self.strict:
            raise NoBuildFits(f"{miss.message}\n(strict, {self.strict_by}: the declared fallback "
                              f"{self.ref.ref} is not served)", where=miss.where)
        reason = f"no build for {self.arch}" if no_builds else "no built variant fits"
        keywords = {**{k: v for k, v in kwargs.items() if k in self.call_keywords}, **keywords}
        m = miss_of(self.kernel, self.arch, arrays_sig, keywords, reason)
        said = reason if no_builds else f"{reason} on {self.arch}"
        text = (f'cutecc kernel "{self.kernel}" {m.signature}: {said}; served by its fallback '
                f"{self.ref.ref} (`cutecc misses --toml` prints the variants that would cover it)"
                + (f"; {note}" if note else ""))
        return self.function()(*arrays, **kwargs), Use(self, m, text)

    def _record(self, m: Miss, text: str, once: bool) -> None:
        """Warn of `m` at its signature's first use in this process, and count it (with
        `once`, at that first use only)."""
        with self._lock:
            first = m.ident not in self._warned
            self._warned.add(m.ident)
        if first:
            warnings.warn(text, FallbackWarning, stacklevel=caller_stacklevel())
        if self.misses_root is not None and (first or not once):
            record_miss(self.misses_root, m)


class Use:
    """One use of a fallback: the miss it is counted as and the warning it gives, recorded
    by `record` when the call really happens. Equal (and hashed) by the fallback and the
    miss's signature, so JAX may carry it as a primitive's parameter."""

    __slots__ = ("fallback", "miss", "text")

    def __init__(self, fallback: Fallback, miss: Miss, text: str) -> None:
        self.fallback, self.miss, self.text = fallback, miss, text

    def _ident(self) -> tuple[Any, ...]:
        return (id(self.fallback), self.miss.ident, self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Use) and other.fallback is self.fallback and other._ident() == self._ident()

    def __hash__(self) -> int:
        return hash(self._ident())

    def __repr__(self) -> str:
        return f"<cutecc fallback use: {self.miss.kernel}{self.miss.signature}>"

    def record(self, once: bool = False) -> None:
        """Warn once per signature and process (`FallbackWarning`) and count the use in the
        cache's misses record; with `once`, counted at the signature's first use in this
        process only (PyTorch records every eager call)."""
        self.fallback._record(self.miss, self.text, once)


_FRAMEWORKS = frozenset({"cutecc", "jax", "jaxlib", "torch"})


def caller_stacklevel() -> int:
    """The `stacklevel` that names, from the function calling `warnings.warn`, the first
    frame of the caller's own code (not cutecc's nor a framework's: a fallback's use and a
    copy are warned of deep in JAX's lowering)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2  # level 1 is the function that warns, 2 its caller
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if not isinstance(name, str) or name.partition(".")[0] not in _FRAMEWORKS:
            return level
        frame, level = frame.f_back, level + 1
    return 1


def _results(out: Any, n: int) -> list[Any] | None:
    if n == 1:
        return [out] if hasattr(out, "shape") and hasattr(out, "dtype") else None
    if isinstance(out, (tuple, list)) and len(out) == n:
        return list(out)
    return None


def _describe(out: Any, dtype_name: Callable[[Any], str]) -> str:
    if hasattr(out, "shape") and hasattr(out, "dtype"):
        try:
            return f"{dtype_name(out)}{list(out.shape)}"
        except (TypeError, ValueError):
            return f"{out.dtype}{list(out.shape)}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} of {len(out)}"
    return type(out).__name__


def result_problem(conv: CallingConvention, out: Any, arrays_sig: Sequence[tuple[str, tuple[Any, ...]]],
                   dtype_name: Callable[[Any], str]) -> str | None:
    """Why `out` is not what a call of `conv`'s contract on arrays `arrays_sig` ((dtype,
    shape) each) returns, or None. The contract is read through the call: a symbol takes
    the extent the call's arrays bind; a static extent or a dtype of an input takes the
    call's there too (or keeps its own: either is accepted); an inout result is its input."""
    visible = conv.visible
    results = _results(out, len(visible))
    if results is None or len(arrays_sig) != len(conv.inputs):
        count = f"{len(visible)} array(s)" if len(visible) != 1 else "one array"
        return f"{_describe(out, dtype_name)}, where the call returns {count}"
    env: dict[str, Any] = {}
    statics: dict[int, set[Any]] = {}
    dtypes: dict[str, set[str]] = {}
    for t, (dt, shape) in zip(conv.inputs, arrays_sig):
        dtypes.setdefault(t.dtype, set()).add(dt)
        if len(shape) != len(t.extents):
            continue
        kernel_shape: list[Any] = [None] * len(shape)
        for j, p in enumerate(t.held):
            kernel_shape[p] = shape[j]
        for d, n in zip(t.extents, kernel_shape):
            if isinstance(d, int):
                statics.setdefault(d, set()).add(n)
            elif expr.is_symbol(d):
                env.setdefault(d, n)
    by_name = {t.name: a for t, a in zip(conv.inputs, arrays_sig)}
    for t, r in zip(visible, results):
        got_dtype, got_shape = _describe_dtype(r, dtype_name), tuple(r.shape)
        want: list[set[Any] | None]
        if t.role == "inout" and t.name in by_name:
            want_dtypes, want = {by_name[t.name][0]}, [{n} for n in by_name[t.name][1]]
        else:
            want_dtypes = {t.dtype, *dtypes.get(t.dtype, ())}
            dims = [t.shape[p] for p in t.held]
            if t.reduce == "sum":
                dims = dims[1:]
            want = [_extent_values(d, env, statics) for d in dims]
        shown = f"{t.name}: {got_dtype}{list(got_shape)}"
        if got_dtype not in want_dtypes:
            return f"{shown}, where the contract gives {' or '.join(sorted(want_dtypes))}"
        if len(got_shape) != len(want):
            return f"{shown}, where the contract gives rank {len(want)}"
        for i, (n, ok) in enumerate(zip(got_shape, want)):
            try:
                if ok is not None and not any(bool(n == w) for w in ok):
                    return (f"{shown}, where the contract gives dimension {i} "
                            + " or ".join(map(str, sorted(ok, key=str))))
            except Exception:  # noqa: BLE001 - a symbolic extent no comparison decides
                continue
    return None


def _describe_dtype(a: Any, dtype_name: Callable[[Any], str]) -> str:
    try:
        return dtype_name(a)
    except (TypeError, ValueError):
        return str(a.dtype)


def _extent_values(d: Any, env: Mapping[str, Any], statics: Mapping[int, set[Any]]) -> set[Any] | None:
    """The values a result's extent `d` may take for a call (None: not decided here)."""
    if isinstance(d, int):
        return {d, *statics.get(d, ())}
    if expr.is_symbol(d):
        return {env[d]} if d in env else None
    if not all(n in env for n in expr.names(d)):
        return None
    try:
        return {expr.evaluate(d, env, minimum=min, maximum=max)}
    except Exception:  # noqa: BLE001 - a derived extent the call's arrays cannot evaluate
        return None


def declared_fallback(framework: str, name: str, fn: Any, entries: list[Entry], store: StoreView,
                      locked: Any, target: str, strict: bool, misses_root: Path | None,
                      manifest: Path | None = None, roots: list[Path] | None = None,
                      own: bool = False, strict_by: str = "load(strict=True)") -> Fallback | None:
    """The kernel's declared fallback for this front end, or None: under a lock, the one its
    lines record (its closure must hash as they pin it); else the one the newest build (of
    `manifest` or of the keys served, when the load is one project's, `own`: a manifest's or
    a project's lock's; never another project's) records for any arch the kernel has
    entries of (a build for another GPU declares what serves this one), pinned by that
    record. Its closure is looked for first in `roots`, then in that build's python_path
    (then `sys.path`). Nothing of it is read here."""
    field = FRONT_ENDS.get(framework, "fallback")
    ref: FallbackRef | None = None
    found_roots: tuple[str, ...] = ()
    newest, served = "", {e.key for e in entries}
    for arch in sorted({str(e.recorded.arch) for e in entries}):
        try:
            gen = store.generation_fallbacks(name, arch)
            if (gen is not None and (own or manifest is not None)
                    and not (manifest is not None and same_path(gen.manifest, manifest))
                    and not served & set(gen.keys or ())):
                continue  # another project's build of this name (a moved checkout's own keys pass)
            found = gen.fallback(field) if gen is not None and gen.built_at >= newest else None
            if gen is not None and found is not None:
                ref, newest, found_roots = found, gen.built_at, gen.roots
        except CuteccError as e:  # someone else's record, or a malformed one: no fallback
            if locked is None:
                fn.unusable += (f"fallback recorded for {arch}: {e.message}",)
    if locked is not None:  # the lock's pins decide; a build's python_path only says where to look
        ref = next((dict(le.fallbacks)[field] for le in locked.entries
                    if le.kernel == name and field in dict(le.fallbacks)), None)
    if ref is None:
        return None
    names = {k for e in entries for k in e.recorded.call}
    pins = locked.by_key() if locked is not None else {}
    contracts = []  # what its results are checked against: the entries' contracts
    for entry in entries:
        try:
            if entry.key not in pins or pins[entry.key].mismatch(entry) is None:
                contracts.append(CallingConvention.of(args_from_json(entry.meta.args)))
        except (KeyError, TypeError, ValueError):
            continue
    return Fallback(name, ref, arch=target, strict=strict, strict_by=strict_by, misses_root=misses_root,
                    call_keywords=names,
                    roots=[*(roots or ()), *(Path(r) for r in found_roots)], contracts=contracts,
                    pinned_by="the lock" if locked is not None else "the newest build")
