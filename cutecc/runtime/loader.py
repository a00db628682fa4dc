"""`cutecc.load`: find the entries built for this device and expose one callable per kernel.

Loading lists the kernels' names only: the store's index (`by-kernel/<name>/<key>`), or
the lock file's lines. A kernel's entries are found through its own records, and their
metadata read and checked, at the kernel's first use; no library is opened until its
first call, and then only after its SHA-256 matches. So a load costs the same at 10 or
10,000 entries, and the kernels a program never touches cost nothing. Entries that
cannot run here (another arch or host platform, another artifact format, an incompatible
tvm-ffi) are set aside with the reason, which a call of that kernel reports.

Importing this module imports no framework: what JAX (`cutecc.load`) or PyTorch
(`cutecc.torch.load`) adds is a `FrontEnd`, so both select, check and verify alike.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.archs import check_device_arch, driver_version, gpu_arch, runs_on
from cutecc.contract.composite_line import CompositeLine
from cutecc.errors import CuteccError, WorkError
from cutecc.runtime import jit_hook
from cutecc.runtime.calls import Build, KernelBase
from cutecc.runtime.fallback import declared_fallback
from cutecc.runtime.package import FALLBACK_DIR
from cutecc.runtime.project import (
    Project,
    ambiguous,
    current_build,
    find_project,
    lock_beside,
    not_this_project,
    read_selection,
    same_path,
    selected_lines,
    several_builders,
)
from cutecc.runtime.runtime_settings import RuntimeSettings
from cutecc.runtime.usable import ptx_problem, record_problem, tvm_ffi_series, why_unusable
from cutecc.store.build_records import ManifestRecord
from cutecc.store.view import Entry, StoreView


class KernelSet:
    """The kernels of a cache usable on one arch; `kernels.NAME(*arrays, **scalars)`.

    Each kernel's entries are found, checked (key, lock, arch, toolchain) and turned into
    builds on the kernel's first use; whether a kernel exists is asked of the index for
    that name alone (`has`), and the whole list of names is read only when something asks
    for it (iteration, `len`, `problems`), so loading costs the same whatever the size of
    the cache and the kernels a program never touches cost nothing.
    """

    def __init__(self, root: Path, arch: str, resolve: Callable[[str], Any],
                 names: Callable[[], Iterable[str]], has: Callable[[str], bool],
                 notes: Callable[[], list[str]] = list) -> None:
        self.root = root
        self.arch = arch
        self._resolve = resolve
        self._list = names
        self._has = has
        self._notes = notes  # records set aside while listing (a composite unreadable here)
        self._all: frozenset[str] | None = None
        self._kernels: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def _names(self) -> frozenset[str]:
        if self._all is None:
            self._all = frozenset(self._list())
        return self._all

    def _exists(self, name: str) -> bool:
        return name in self._kernels or (name in self._all if self._all is not None
                                         else self._has(name))

    def _kernel(self, name: str) -> Any:
        fn = self._kernels.get(name)
        if fn is None:
            with self._lock:
                fn = self._kernels.get(name)
                if fn is None:
                    fn = self._kernels[name] = self._resolve(name)
                    fn._owner = self
        return fn

    @property
    def problems(self) -> list[str]:
        """Every entry set aside, as `kernel: variant@arch (key): why` (checks all kernels),
        then every record set aside while listing the kernels, with why."""
        names = sorted(self._names)
        return [f"{n}: {w}" for n in names for w in self._kernel(n).unusable] + self._notes()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if not self._exists(name):
            raise AttributeError(
                f"no kernel {name!r} in {self.root} (kernels: "
                f"{', '.join(sorted(self._names)) or 'none'})")
        return self._kernel(name)

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def get(self, name: str) -> Any:
        return self._kernel(name) if self._exists(name) else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._exists(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"<cutecc KernelSet {sorted(self._names)} for {self.arch} from {self.root}>"

    def register_all(self) -> list[str]:
        """Register every usable build (e.g. before deserializing a `jax.export`ed program)."""
        return [b.register(n) for n in sorted(self._names) for b in self._kernel(n).builds]

    def disabled_safety_checks(self) -> list[Any]:
        """What `jax.export.export(..., disabled_checks=...)` needs for these kernels."""
        import jax

        from cutecc.runtime.library import target_name

        return [jax.export.DisabledSafetyCheck.custom_call(target_name(b.key))
                for n in sorted(self._names) for b in self._kernel(n).builds]


@dataclass(frozen=True)
class FrontEnd:
    """What a framework adds to loading: `kernel(name, builds, backward=, grad=, unusable=,
    arch=)` makes one kernel's callable, `composite(name, launches, inputs, outputs)` a
    composite's (None: not offered), `kernel_set` the set's class, and this process's GPU
    as `device_arch()` (`sm_90`, None without one) and `device_kind()` (the name tuning
    results are recorded under)."""

    framework: str
    kernel: Callable[..., Any]
    composite: Callable[..., Any] | None
    kernel_set: type[KernelSet]
    device_arch: Callable[[RuntimeSettings], str | None]
    device_kind: Callable[[RuntimeSettings], str | None]


def device_arch(given: RuntimeSettings | None = None) -> str | None:
    """The arch a JAX load serves by default: `$CUTECC_ARCH` (as `given` read it; None: read
    now), else the first GPU's (`cutecc.archs.gpu_arch`), else None."""
    rs = RuntimeSettings.from_environment() if given is None else given
    return check_device_arch(rs.arch, rs.where("arch")) if rs.arch else gpu_arch()


def _jax() -> FrontEnd:
    from cutecc.runtime.dispatch import CompositeFn, KernelFn
    from cutecc.runtime.tuning import device_kind

    return FrontEnd("JAX", KernelFn, CompositeFn, KernelSet, device_arch, device_kind)


def load(cache_dir: str | Path | None = None, *, arch: str | None = None,
         kernels: tuple[str, ...] | list[str] | None = None,
         manifest: str | Path | None = None, strict: bool = False,
         lock: str | Path | None = None, package: str | None = None,
         trusted_keys: list[str | Path] | None = None, allow_unsigned: bool = False,
         jit: bool | None = None) -> KernelSet:
    """Load the kernels of a cache for this device (or for `arch`, e.g. to lower on a CPU).

    Given no lock, manifest or package, the load is the project's it is called from (the
    nearest directory at or above the working directory holding a `kernels.lock` or
    `kernels.toml`) when the cache holds a build of it, as if `manifest=` named it;
    otherwise each kernel offers the entries of its newest build (per arch), so variants
    removed from the manifest are not callable after a rebuild, and a kernel name that
    several manifests built with other keys is an error naming them
    (`cutecc.runtime.project`). `kernels` restricts which kernels are exposed (a composite
    named there brings the kernels it launches); a `manifest` uses exactly the entries its
    lock (`kernels.lock` beside it) names, or without one those of its recorded build whose
    sources are the files as they are now (none: an error, run `cutecc build`), and offers
    the composites its builds recorded. A key this process already loaded from other bytes (another cache,
    pack or lock) is refused at the call, naming both (`cutecc.runtime.library`).
    `strict` raises if any entry of those kernels cannot be used here instead of setting
    it aside, and makes a call no build serves an error even where the kernel declares a
    fallback (`$CUTECC_STRICT=1` does the latter alone; `cutecc.runtime.fallback`).
    `lock` (a `kernels.lock`): use exactly the entries it names (any the cache lacks is an
    error) and refuse a kernel whose library's recorded SHA-256 differs from the lock's.
    `package`: an installed `cutecc pack` wheel, found without importing it; its `_cutecc/`
    tree and lock are used, and nothing is written into it.
    A lock (given or a pack's) must be signed by one of `trusted_keys` (public key files;
    else `$CUTECC_TRUSTED_KEYS`) before any of its lines is believed, unless the deployer
    opts out with `allow_unsigned=True` (or `$CUTECC_ALLOW_UNSIGNED=1`).
    `jit` (development; None: `$CUTECC_JIT`): a call no built variant fits compiles the
    variant that serves it into this cache, with the key `cutecc build` gives it, and is
    served by it (the builder `cutecc.load` registers: `cutecc.runtime.jit_hook`). Needs the
    DSL (an error at load without it); excludes a lock, a pack, a read-only cache and `strict`.
    Every setting of the environment a load serves by is read here, once
    (`cutecc.runtime.runtime_settings`, `docs/settings.md`): one set later changes nothing
    of what this load serves; the keywords given win over the variables.
    """
    return load_with(_jax(), cache_dir, arch=arch, kernels=kernels, manifest=manifest, strict=strict,
                     lock=lock, package=package, trusted_keys=trusted_keys,
                     allow_unsigned=allow_unsigned, jit=jit)


def load_with(front: FrontEnd, cache_dir: str | Path | None = None, *, arch: str | None = None,
              kernels: tuple[str, ...] | list[str] | None = None,
              manifest: str | Path | None = None, strict: bool = False,
              lock: str | Path | None = None, package: str | None = None,
              trusted_keys: list[str | Path] | None = None,
              allow_unsigned: bool = False, jit: bool | None = None) -> KernelSet:
    """`load` for a framework's `front` end: the same sources, checks and selection. The
    environment is read here, once, into the settings the load serves by (`RuntimeSettings`),
    the keywords given winning over it."""
    rs = RuntimeSettings.from_environment(arch=arch, strict=strict, jit=jit, trusted_keys=trusted_keys,
                                          allow_unsigned=allow_unsigned)
    record_use = not rs.read_only
    plain = cache_dir is None  # the user's own cache (or $CUTECC_CACHE_DIR): a plain load's
    use_jit = _jit_wanted(front, rs, strict=strict, pinned=lock is not None or package is not None)
    if lock is None and package is None:
        _no_keys_without_a_lock(rs)
    if package is not None:
        if cache_dir is not None or lock is not None:
            raise CuteccError("package= excludes cache_dir and lock (a pack has its own)",
                              where="cutecc.load")
        from cutecc.lock.lockfile import LOCK_NAME
        from cutecc.runtime.package import package_root

        cache_dir = package_root(package)
        lock, record_use = cache_dir / LOCK_NAME, False
    store = StoreView(cache_dir)

    def loaded(b: Build) -> Build:
        """Build `b` as this load serves it: its use recorded or not, its library loaded by
        the settings read."""
        return dataclasses.replace(b, record_use=b.record_use and record_use, sync_check=rs.sync_check,
                                   tvm_ffi_interop=rs.tvm_ffi_interop)

    if not store.entries_dir.is_dir():
        raise WorkError("no kernel cache here; run `cutecc build` first", where=str(store.root))
    store.require()  # of this format: an older cache has no index and no runtime libraries
    target = check_device_arch(arch, rs.where("arch")) if arch is not None else front.device_arch(rs)
    if target is None:
        raise WorkError(f"no GPU is visible to {front.framework}: pass arch= (or set CUTECC_ARCH) to load "
                        "kernels for lowering without one", where="cutecc.load")
    driver = driver_version(rs.driver_version)  # judges PTX entries (None without a driver: not judged)
    chosen, chosen_path = None, None  # a project's lock: which entries serve (`runtime.project`)
    stranger: Project | None = None  # a plain load's project that this cache holds no build of
    records: list[ManifestRecord] | None = None  # every manifest's record, read at need
    if manifest is None and lock is None and package is None:
        proj = find_project()
        if proj is not None and proj.known_to(store):
            manifest, chosen_path = proj.manifest, proj.lock
        elif proj is not None and plain:
            stranger = proj  # its kernels' names are never served from another project's build
    elif manifest is not None and lock is None:
        chosen_path = lock_beside(Path(manifest).resolve())
    if chosen_path is not None:
        chosen = read_selection(chosen_path)
    asked: set[str] | None = set(kernels) if kernels else None
    wanted = None if asked is None else set(asked)  # the kernels whose entries are looked up
    planned: set[str] | None = None  # a manifest's: exactly these keys
    mpath: Path | None = None
    recorded: ManifestRecord | None = None
    if manifest is not None:
        mpath = Path(manifest).resolve()
        if chosen is None:  # without a lock: the build that is its current plan
            recorded = current_build(store, mpath)
    locked = None
    if lock is not None:
        from cutecc.lock.lockfile import read_trusted_lock

        locked = read_trusted_lock(lock, trusted_keys=rs.trusted_keys, allow_unsigned=rs.allow_unsigned)
    set_aside: dict[str, str] = {}  # composite records that cannot be read, and why
    # where a fallback's pinned closure is looked for first (`cutecc.runtime.fallback_code`)
    fallback_roots = [store.root / FALLBACK_DIR] if package is not None else []
    if lock is not None and package is None:
        fallback_roots.append(Path(lock).resolve().parent)
    if mpath is not None:
        fallback_roots.append(mpath.parent)

    def composite_line(name: str) -> CompositeLine | None:
        """Composite `name` as defined here: under a lock (or a pack's) the lock's own line,
        signed with it (the cache's record, which the lock does not vouch for, never decides
        what runs there); else the cache's record of a build (of `manifest`, when given). A
        record that cannot be read as one is set aside with why, never raised."""
        if front.composite is None:
            return None
        if locked is not None:
            return locked.composite(name)
        try:
            rec = store.composite(name)
        except (trust.Untrusted, OSError) as e:
            why = e.why if isinstance(e, trust.Untrusted) else f"unreadable: {e.strerror}"
            set_aside[name] = f"composite {name} ({store.layout.composite(name)}): {why}; set aside"
            return None
        if rec is None or (mpath is not None and not same_path(rec.manifest, mpath)):
            return None
        try:
            return rec.line(str(store.composites_dir))
        except CuteccError:
            return None  # a malformed record offers nothing, as an unreadable one

    def is_kernel(name: str) -> bool:
        by_lock = locked if locked is not None else chosen
        if by_lock is not None:
            return any(le.kernel == name for le in by_lock.entries)
        return name in recorded.kernels() if recorded is not None else bool(store.kernel_keys(name))

    if asked is not None and wanted is not None:  # a composite asked for brings what it launches
        for name in sorted(asked):
            line = None if is_kernel(name) else composite_line(name)
            if line is not None:
                wanted.discard(name)
                wanted.update(line.launches)
    if recorded is not None:
        wanted = set(recorded.kernels()) if wanted is None else wanted & recorded.kernels()
        planned = {key for name in wanted for key in recorded.keys_of(name)}
    absent: dict[str, list[str]] = {}  # a project lock's keys this cache lacks, per kernel
    series = tvm_ffi_series()
    pinned: dict[str, Any] = {}
    if locked is not None:
        lines: dict[str, list[str]] = {}
        for le in locked.entries:
            if (wanted is None or le.kernel in wanted) and (planned is None or le.key in planned):
                lines.setdefault(le.kernel, []).append(le.key)
        missing_keys = [le for le in locked.entries if le.key in set().union(*lines.values())
                        and not store.has(le.key)]
        if missing_keys:
            n = len(missing_keys)
            raise WorkError(f"{n} locked entr{'y' if n == 1 else 'ies'} not in the cache: "
                            + ", ".join(f"{le.label} {le.key[:12]}" for le in missing_keys)
                            + "; run `cutecc build`", where=str(store.root))
        pinned = locked.by_key()
    elif chosen is not None:  # exactly what the project's lock names, of the kernels wanted
        assert chosen_path is not None  # read from it
        lines, absent = selected_lines(chosen, chosen_path, wanted, store)
        pinned = chosen.by_key()
    elif planned is not None:  # exactly the manifest's newest build (all of it must be there)
        assert recorded is not None and wanted is not None  # set with `planned`
        lines = {name: sorted(recorded.keys_of(name)) for name in wanted}
        for key in sorted(planned):
            if not store.has(key):
                raise WorkError(f"entry {key[:12]} of the manifest's newest build is not in the "
                                "cache (removed since); run `cutecc build`", where=str(store.root))
    newest = lock is None and planned is None and chosen is None  # each kernel's newest build
    if not newest:
        def names() -> Iterable[str]:
            return lines

        def keys_of(name: str) -> list[str]:
            return lines.get(name, [])
    else:
        def names() -> Iterable[str]:
            return [n for n in store.kernel_names() if wanted is None or n in wanted]

        def keys_of(name: str) -> list[str]:
            return store.kernel_keys(name) if wanted is None or name in wanted else []
    if wanted:
        missing = sorted(n for n in wanted if not keys_of(n))
        if missing:
            raise WorkError(f"no entries for kernel(s) {', '.join(missing)}; run `cutecc build`",
                            where=str(store.root))

    def composite(name: str) -> CompositeLine | None:
        """A composite kernel offered here: asked for (or nothing was asked), defined here
        (`composite_line`), no kernel of its own name, and its launches kernels loaded here."""
        if asked is not None and name not in asked:
            return None
        line = composite_line(name)
        if line is None or keys_of(name) or not all(keys_of(n) for n in line.launches):
            return None
        return line

    def composite_names() -> Iterable[str]:
        return [c.name for c in locked.composites] if locked is not None else store.composite_names()

    def all_names() -> Iterable[str]:
        return sorted({*names(), *(n for n in composite_names() if composite(n))})

    def resolve(name: str) -> Any:
        line = composite(name)
        if line is not None and front.composite is not None:
            return front.composite(name, line.launches, line.inputs, line.outputs)
        nonlocal records
        if newest:  # one name, several projects' builds: none is picked silently
            records = store.manifest_records() if records is None else records
            several = several_builders(records, name)
            if several:
                raise ambiguous(name, several, store)
            if stranger is not None and name in stranger.declared:
                raise not_this_project(name, stranger, records, store)
        entries, unreadable = _entries_of(store, name, keys_of(name), newest)
        unreadable += absent.get(name, [])
        fn = _kernel_fn(front, name, entries, target, series, pinned, loaded, unreadable, driver)
        fn.tuning = _tuning(name, fn, store, locked, target, series, loaded,
                            lambda: front.device_kind(rs), driver)
        fn._fallback = declared_fallback(front.framework, name, fn, entries, store, locked, target,
                                         rs.strict, misses_root=store.root if record_use else None,
                                         manifest=mpath, roots=fallback_roots, own=chosen is not None,
                                         strict_by=rs.where("strict"))
        if use_jit:
            fn._jit = jit_hook.jit_hook(store, mpath, target, series, driver,
                                        rs.where("strict") if rs.strict else None, loaded)
        return fn

    ks = front.kernel_set(store.root, target, resolve, all_names,
                          lambda name: bool(keys_of(name)) or composite(name) is not None,
                          notes=lambda: sorted(set_aside.values()))
    if strict:
        problems = ks.problems
        if problems:
            raise WorkError("entries unusable here:\n  " + "\n  ".join(problems),
                            where=str(store.root))
    return ks


def _jit_wanted(front: FrontEnd, rs: RuntimeSettings, *, strict: bool, pinned: bool) -> bool:
    """Whether just-in-time builds are on: `jit=` if given, else `$CUTECC_JIT` (which a
    lock or pack load ignores: they pin what runs), as `rs` read them. On, they need the
    DSL, the JAX front end and a cache this process may write, and exclude `strict`: else an
    error at load."""
    given = rs.where("jit")
    if not rs.jit or (pinned and given != "jit=True"):
        return False
    why = None
    if front.framework != "JAX":
        why = f"just-in-time builds serve the JAX front end only, not {front.framework}"
    elif pinned:
        why = "a lock or a pack pins exactly what runs: load the cache (or a manifest) to build into it"
    elif strict:
        why = "strict=True makes every miss an error"
    elif rs.read_only:
        why = f"{rs.where('read_only')} forbids writing the cache"
    else:
        import importlib.util

        if importlib.util.find_spec("cutlass") is None:
            why = ("the DSL (nvidia-cutlass-dsl, the build extra) is not installed here: build "
                   "ahead of time with `cutecc build`, or install `cutecc[build]`")
        elif jit_hook.registered() is None:
            why = ("no just-in-time builder is registered: load through `cutecc.load`, which "
                   "registers the build side's (`cutecc.build.jit`)")
    if why:
        raise WorkError(f"{given}: {why}", where="cutecc.load")
    return True


def _entries_of(store: StoreView, name: str, keys: list[str],
                newest: bool) -> tuple[list[Entry], list[str]]:
    """The entries of kernel `name` under `keys`, and why any could not be read. A key
    whose entry is gone (removed since it was listed) is skipped, and so is one whose
    metadata names another kernel (a misplaced index record: `cutecc verify --fix`). With
    `newest`, only the kernel's newest build generation per arch (`cutecc build` records
    it; a kernel and arch with no record keep all their entries)."""
    out, unreadable = [], []
    generations: dict[str, frozenset[str] | None] = {}
    for key in keys:
        try:
            e = store.get(key)
        except CuteccError as err:
            unreadable.append(f"{key[:12]}: {err.message}")
            continue
        if e is None or e.recorded.kernel != name:
            continue
        if newest:
            arch = str(e.recorded.arch)
            if arch not in generations:
                generations[arch] = store.generation(name, arch)
            current = generations[arch]
            if current is not None and key not in current:
                continue
        out.append(e)
    return out, unreadable


def _kernel_fn(front: FrontEnd, name: str, entries: list[Entry], target: str, series: str,
               pinned: dict[str, Any], loaded: Callable[[Build], Build], unreadable: list[str],
               driver: tuple[int, int] | None = None) -> KernelBase:
    """One kernel's callable: per variant the build that runs best here, the newest of
    equals (an edited kernel's older entry stays in the cache until gc); entries that
    cannot be used here are kept as reasons. An entry that differs from the lock file
    refuses the whole kernel."""
    best: dict[str, tuple[tuple[int, str], Build]] = {}
    unusable: list[str] = list(unreadable)
    backward: str | None = None
    grad: dict[str, Any] | None = None  # a named pairing (grad.args), see KernelFn
    refused = False
    for e in entries:
        why = pinned[e.key].mismatch(e) if e.key in pinned else None
        if why:
            refused = True
        else:
            why = why_unusable(e, target, series) or ptx_problem(e, driver)
        if why:
            unusable.append(f"{e.recorded.variant}@{e.recorded.arch} ({e.key[:12]}): {why}")
            continue
        rec = e.meta  # checked (why_unusable): typed from here on
        try:
            b = Build.of(rec, e.path)
        except (KeyError, TypeError, ValueError) as err:
            unusable.append(f"{e.key[:12]}: malformed metadata ({err!r})")
            continue
        b = loaded(b)
        score = (runs_on(b.arch, target), rec.built_at or "")
        if b.variant not in best or score > best[b.variant][0]:
            best[b.variant] = (score, b)
        backward = rec.backward
        grad = rec.key_inputs.get("grad") or grad
    builds = [] if refused else [b for _, (_, b) in sorted(best.items())]
    return front.kernel(name, builds, backward=backward, grad=grad, unusable=unusable, arch=target)


def _no_keys_without_a_lock(rs: RuntimeSettings) -> None:
    """Trusted keys check a lock's signature; with no lock (nor pack) they would check
    nothing, and a deployer who set them expects a check: an error says what to pass."""
    given = rs.where("trusted_keys") if rs.given("trusted_keys") else None
    if given:
        raise CuteccError(f"{given} is set, but nothing loaded here is signed: pass lock= (a signed "
                          "kernels.lock) or package= (a signed pack) for the keys to check, or drop "
                          f"{given.rstrip('=')} to load the cache as it is", where="cutecc.load")


def _tuning(name: str, fn: KernelBase, store: StoreView, locked: Any, target: str, series: str,
            loaded: Callable[[Build], Build], device_kind: Callable[[], str | None],
            driver: tuple[int, int] | None = None) -> Any:
    """The kernel's table of tuned winners: the lock's results (with a lock), else the
    cache's records of its default entries; None when nothing was tuned."""
    from cutecc.contract.pinned import Tuned
    from cutecc.runtime.tuning import TuningTable, line_problem, read_cached, sibling_problem

    bases = {b.key: b for b in fn.builds}
    if locked is not None:
        lines = [t for t in locked.tuning if t.kernel == name and t.base in bases]
    else:
        lines = []
        for key in bases:
            try:
                records = read_cached(store.root, key)
            except trust.Untrusted as e:  # a record someone else could have written picks nothing
                fn.unusable += (f"tuning records of {key[:12]}: {e.message}; the default "
                                "configuration serves every bucket",)
                continue
            lines += [r.line for r in records]
    if not lines:
        return None

    def winner(t: Tuned) -> Build | None:
        e = store.get(t.winner)
        if e is None:
            why: str | None = "not in the cache"
        else:
            why = why_unusable(e, target, series) or t.mismatch(e.meta) or ptx_problem(e, driver)
        if why is None and e is not None:
            base = store.get(t.base)
            why = "its default configuration is not in the cache" if base is None else (
                record_problem(base) or line_problem(t, base.meta, e.meta)
                or sibling_problem(base.meta, e.meta))
        if why is None and e is not None:
            return loaded(Build.of(e.meta, e.path))
        fn.unusable += (f"tuned winner {t.winner_variant}@{t.arch} ({t.winner[:12]}) for {t.bucket} "
                        f"on {t.device}: {why}",)
        return None

    return TuningTable(name, lines, winner, device_kind)
