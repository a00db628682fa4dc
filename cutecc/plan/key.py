"""The cache key: a SHA-256 over everything that decides an artifact's bytes.

Inputs: the kernel's name (the runtime exposes the entry under it), its source (its
module and every project-local module it imports, found as import would (`cutecc.toolchain.modfind`)
by reading `import` statements, never by importing), the installed distributions that
code reaches and the compile-affecting environment (`cutecc.toolchain.dists`), the entry point
and factory arguments, the resolved contract, the constants, the target arch, the
compile options, for code that reaches torch or names the DSL's `HardwareInfo` the answers
its device queries get in the build worker (`cutecc.toolchain.devicequery`, from the
hardware profile), and the toolchain: the
versions of the DSL, tvm-ffi and the CUDA runtime, zig and its target, the host-code pin,
the link recipe (with the native sources' hashes), the key of the runtime library the
kernel links against (which names the static archives' SHA-256), and cutecc's artifact
format; for host code of another platform than the build's (aarch64), that platform and
the pins of the wheels it links against (x86-64 keys name no platform: unchanged). The
build host's C compiler, paths, user, locale, clock and CPU decide no byte, so they are not
inputs (tests/toolchain/test_reproducible.py checks that).
Computing a key imports neither the DSL nor JAX, so the cache-hit path of `cutecc build`
stays cheap.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from cutecc.contract.args import args_to_json
from cutecc.entry.rules import ARTIFACT_FORMAT, compute_key
from cutecc.errors import CuteccError
from cutecc.manifest import Kernel, Variant
from cutecc.plan import sourcefacts
from cutecc.plan.keyed_sources import KeyedFile
from cutecc.platforms import BUILD_PLATFORM
from cutecc.toolchain import devicequery, dists, modfind
from cutecc.toolchain.planfacts import PathEffect, Sourced, SourceFacts, TopNames
from cutecc.toolchain.versions import RECIPE_VERSION, host_target, runtime_key, tool_versions, zig_target


@functools.lru_cache(maxsize=4)
def toolchain(platform: str = BUILD_PLATFORM) -> dict[str, str]:
    """Versions and hashes of everything outside the kernel's source that shapes the
    artifact, as keyed (`cutecc.toolchain.versions` owns each of them), for host code of `platform`.
    The build platform's names no platform (its keys are those of every build before
    platforms existed: its host target and zig target say x86-64); another's names it, its
    host target and zig target, and the pins of the wheels it links against
    (`cutecc.toolchain.targetlibs`) in place of the installed CUDA runtime's and tvm-ffi's versions."""
    out = {"cutecc_artifact_format": str(ARTIFACT_FORMAT), "link_recipe": str(RECIPE_VERSION),
           "host_target": host_target(platform), "runtime": runtime_key(platform)}
    out.update(tool_versions())
    out["zig"] = f"{out.pop('ziglang')} {zig_target(platform)}"
    if platform != BUILD_PLATFORM:
        from cutecc.toolchain.targetlibs import pins

        p = pins(platform)
        out.update({"platform": platform, "nvidia-cuda-runtime": p["nvidia-cuda-runtime"],
                    "apache-tvm-ffi": p["apache-tvm-ffi"].split()[0],
                    "platform_libs": compute_key(p)})
    return out


def toolchain_platform(toolchain: dict[str, Any]) -> str:
    """The host platform a key's toolchain (or an entry's) is for."""
    return str(toolchain.get("platform", BUILD_PLATFORM))


class SourceIndex:
    """Finds and hashes the project-local source files a module depends on."""

    def __init__(self, roots: tuple[Path, ...], cache: dists.HashCache | None = None) -> None:
        self.roots = tuple(roots)
        self._cache = cache or dists.HashCache(None)
        self._digests: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._facts: dict[Path, Sourced[SourceFacts]] = {}
        self._rels: dict[Path, str] = {}
        self._imports: dict[Path, set[str]] = {}
        self._found: dict[str, modfind.Found | None] = {}
        self._closures: dict[str, set[Path]] = {}
        self._local: dict[str, bool] = {}
        self._why: dict[str, str] = {}  # why a module was not found
        self._exec_paths: dict[str, modfind.Executed] = {}  # packages imported to learn __path__
        # per located name: the paths its answer depends on (`modfind.find_module`'s
        # `consulted`, with what decided a parent's `__path__` learned by running it), None
        # when no stamp tells the answer unchanged (a failed child import, another error)
        self._consulted: dict[str, set[tuple[str, str]] | None] = {}
        self._touched: set[str] | None = None  # names located by the closure being walked
        self._context: str | None = None
        self._bases: tuple[list[str], list[str], list[str]] | None = None  # `_rel_of`'s prefixes
        self._paths: dict[str, Path] = {}  # remembered closures' members, as Paths
        self._names: dict[Path, str] = {}  # each closure member's module name
        self._files: dict[str, tuple[KeyedFile, ...]] = {}  # `files`, per module
        self._resolved_roots = [str(Path(r).resolve()) for r in self.roots]
        self._levels = modfind.Levels(self._resolved_roots)  # each lookup level, found once
        # `_find`'s answers by (module, the entry's top level): the path, and the names whose
        # lookups decided it (a walk that takes an answer records them as its own)
        self._finds: dict[tuple[str, str], tuple[Path | None, tuple[str, ...]]] = {}
        # before any lookup: a walk may reuse answers found for an earlier one (`_found`),
        # so what it remembers must not have changed since this, not since the walk began
        self._born = time.time_ns()

    def digest(self, module: str) -> tuple[str, tuple[str, ...]]:
        """(SHA-256 over the module's local dependency closure, the files' relative paths).
        A function of `module` alone: which other kernels the manifest holds changes nothing
        (so `build --kernel`, `tune` and a whole build give one kernel the same key)."""
        if module not in self._digests:
            files = self._closures[module] = self._closure(module)
            h = hashlib.sha256()
            rels = []
            for f in sorted(files, key=lambda p: self._rel(p)):
                rel = self._rel(f)
                rels.append(rel)
                h.update(rel.encode() + b"\0" + self._hash(f).encode() + b"\0")
            self._digests[module] = (h.hexdigest(), tuple(rels))
        return self._digests[module]

    def files(self, module: str) -> tuple[KeyedFile, ...]:
        """The files `module`'s digest read, as a build worker re-checks them after its
        compile (`cutecc.plan.keyed_sources`): path, module name, name in the key, SHA-256."""
        if module not in self._files:
            self.digest(module)
            self._files[module] = tuple(
                KeyedFile(str(f), self._names[f], self._rel(f), self._hash(f))
                for f in sorted(self._closures[module], key=lambda p: self._rel(p)))
        return self._files[module]

    def reached_modules(self, module: str) -> set[str]:
        """Dotted names that `module`'s local closure imports, its own included (each
        `from a import b` counts `a` and `a.b`: `b` may be a module)."""
        self.digest(module)
        out = {module}
        for f in self._closures[module]:
            out |= self._imports.get(f, set())
        return out

    def lacks(self, module: str, attr: str) -> bool:
        """Whether `module`'s source surely defines no top-level `attr` (read, not imported).

        Only a definite answer counts: a module that star-imports, defines `__getattr__` or
        touches `globals()` may make names at run time, so it never "surely lacks" one.
        """
        f = self._member(module) or self._find(module, module.split(".")[0])
        if f is None:
            return False
        if attr in self._facts_of(f).parsed.defs:
            return False  # a `def` or `class` (most entries): the whole tree not needed
        names = self._cache.source(str(f), TopNames, lambda data: sourcefacts.top_names(data, f)).parsed.names
        return names is not None and not {attr, "__getattr__", "globals"} & set(names)

    def _member(self, module: str) -> Path | None:
        """`module`'s own file, from its closure when `digest` took it (a remembered one is
        not located again: a parent whose `__path__` only its import tells would run)."""
        for f in self._closures.get(module, ()):
            if self._names.get(f) == module:
                return f
        return None

    def missing(self, module: str) -> str | None:
        """Why import would not find `module` (None: it would)."""
        if self._locate(module) is not None:
            return None
        return self._why.get(module, "not found")

    def is_local(self, top: str) -> bool:
        """Whether top-level package `top` is keyed by its source (project-local) rather than
        by its installed distribution (see `_is_local`)."""
        return self._is_local(top)

    @property
    def roots_resolved(self) -> tuple[str, ...]:
        """The python_path roots, absolute and resolved, as lookups search them."""
        return tuple(self._resolved_roots)

    def lookup(self, module: str) -> tuple[modfind.Found | None, set[tuple[str, str]] | None]:
        """Where the build worker will find `module` (`_locate`) and what that answer
        depends on (`modfind.find_module`'s `consulted`; None when no stamp tells it)."""
        found = self._locate(module)
        return found, self._consulted.get(module)

    def remember(self, key: str, members: list[tuple[str, str, bool]],
                 consulted: set[tuple[str, str]]) -> None:
        """Remember `members` under `key` (`dists.HashCache.remember_closure`) as a walk of
        this index would: in its context, for lookups made since it was created."""
        self._cache.remember_closure(key, self._closure_context(), members, consulted, self._born)

    def recall(self, key: str) -> list[tuple[str, str, bool]] | None:
        """What `remember` kept under `key`, while nothing it depends on has changed."""
        return self._cache.closure(key, self._closure_context())

    def keyed_file(self, f: Path, module: str) -> KeyedFile:
        """A file that is not Python source (an extension module) keyed by its bytes alone."""
        return KeyedFile(str(f), module, self._rel(f), self._cache.sha256(str(f)))

    def _rel(self, f: Path) -> str:
        """`f`'s name in the key: relative to the python_path root holding it, else to the
        `sys.path` entry holding it (an installed entry package), so a key is the same
        wherever the project or the environment lives."""
        if f not in self._rels:
            self._rels[f] = self._rel_of(f)
        return self._rels[f]

    def _rel_of(self, f: Path) -> str:
        # Path.relative_to, on strings: both sides are normal absolute paths (as Path
        # spells them), so "under" is a prefix ending at a separator (a thousand files of
        # a published library, each against every sys.path entry, on every no-op build).
        roots, entries, envs = self._bases_of()
        text = str(f)
        # Installed code first: a distribution's file is named as it lies in its
        # environment, wherever that environment is (a venv inside the project included).
        if (rel := _shortest_under(text, envs)) is not None:
            return rel
        for r in roots:
            if (rel := _under(text, r)) is not None:
                return Path(rel).as_posix()
        best = _shortest_under(text, entries)
        return best if best is not None else f.as_posix()

    def _bases_of(self) -> tuple[list[str], list[str], list[str]]:
        """The python_path roots, the `sys.path` entries and those that are environments'
        package directories, as absolute strings."""
        if self._bases is None:
            entries = [str(Path(entry or ".").absolute()) for entry in sys.path]
            self._bases = ([str(r) for r in self.roots], entries,
                           [e for e in entries if _holds_installs(e)])
        return self._bases

    def _environments(self) -> list[str]:
        """The `sys.path` entries that are environments' package directories (`_holds_installs`)."""
        return self._bases_of()[2]

    def _hash(self, f: Path) -> str:
        return self._facts_of(f).sha256

    def _path_effect(self, init_file: str) -> str:
        """`modfind.path_effect` of a package's `__init__`, remembered by its stamp."""
        try:
            return self._cache.source(init_file, PathEffect, _path_effect_facts).parsed.effect
        except (OSError, CuteccError):  # unreadable, or over the size cap: only running it tells
            return "unknown"

    def _facts_of(self, f: Path) -> Sourced[SourceFacts]:
        """`f`'s SHA-256 and import statements (`sourcefacts.parse`), read and parsed once per
        change of its stamp (`dists.HashCache.source`), once per index at most. A source under
        no environment's package directory (a project's own) is parsed whole, so a syntax error
        in it is planning's to report, with its line; an installed one is scanned. (Facts are
        remembered by content: bytes scanned as installed elsewhere are served as they were, a
        syntax error in them left to the build's import.)"""
        if f not in self._facts:
            check = _shortest_under(str(f), self._environments()) is None
            self._facts[f] = self._cache.source(str(f), SourceFacts,
                                                lambda data: sourcefacts.parse(data, f, check))
        return self._facts[f]

    def _locate(self, module: str) -> modfind.Found | None:
        """Where import in a fresh process (the build worker) would find `module`
        (python_path first; never what this process already imported): found by reading, and where
        only running a parent package's `__init__` tells its `__path__` (a package that adds
        another distribution's directory at import, as the DSL's `cutlass` adds
        nvidia-cutlass-operators'), by importing that parent in a child process, once per
        index. None when not found; `_why` keeps the reason."""
        if self._touched is not None:
            self._touched.add(module)
        if module not in self._found:
            consulted: set[tuple[str, str]] = set()
            try:
                found: modfind.Found | None = modfind.find_module(
                    module, self._resolved_roots, invalidate=not self._found, resolved=True,
                    allow_exec=True, exec_cache=self._exec_paths, effect_of=self._path_effect,
                    consulted=consulted, imported=False,  # as the build worker will import it
                    levels=self._levels)
                self._consulted[module] = consulted
            except (ImportError, ValueError, OSError, SyntaxError, UnicodeDecodeError) as e:
                found = None
                self._why[module] = str(e) or type(e).__name__
                # a failed child import or a failure outside the search: not kept
                self._consulted[module] = consulted if isinstance(e, modfind.NotFound) and not \
                    isinstance(e, modfind.ExecFailed) else None
            self._found[module] = found
        return self._found[module]

    def _find(self, module: str, entry_top: str) -> Path | None:
        """The source file of `module` if it is local to the closure of an entry in top-level
        package `entry_top` (None: not local, or no source); once per index."""
        hit = self._finds.get((module, entry_top))
        if hit is not None:
            if self._touched is not None:
                self._touched.update(hit[1])
            return hit[0]
        top = module.split(".")[0]
        names: tuple[str, ...] = (top,) if top != entry_top else ()
        path = None
        if not names or self._is_local(top):
            names += (module,)
            found = self._locate(module)
            if found is not None and found.origin and found.origin.endswith(".py"):
                if not os.path.isfile(found.origin):
                    raise CuteccError(_not_in_a_directory(module, found.origin))
                path = Path(found.origin).absolute()  # not resolve(): a symlinked package keeps its path
        self._finds[(module, entry_top)] = (path, names)
        return path

    def _is_local(self, top: str) -> bool:
        """Whether top-level package `top` is project-local: found directly in a root of the
        manifest's python_path (not in an environment there, such as the README's `.venv` at
        the project's root), installed editable, or Python source outside the standard
        library and any environment that no distribution owns (a directory on $PYTHONPATH).
        The top level of the kernel's own entry is local to its closure wherever it is
        installed (`_find`); everything else is keyed by its distribution (`cutecc.toolchain.dists`)."""
        if self._touched is not None:
            self._touched.add(top)  # its answer decides the closure: remembered with it
        if top not in self._local:
            found = self._locate(top)
            places = ([found.origin] if found.origin else found.locations) if found else []
            owners = dists.owners(top)
            self._local[top] = found is not None and (
                any(_top_level_in(Path(p).absolute(), r, top) for p in places for r in self.roots)
                or any(dists.is_editable(n) for n in owners)
                or (not owners and top not in sys.stdlib_module_names and bool(places)
                    and not any(_installed_place(Path(p)) for p in places)))
        return self._local[top]

    def _closure(self, module: str) -> set[Path]:
        """The source files of `module`'s local closure: walked, or as a run before walked
        it while none of the files and directories that walk read has changed since
        (`dists.HashCache.closure`; a published library's closure is thousands of
        lookups, the bulk of a no-op build otherwise)."""
        ckey = "\0".join([module, *self._resolved_roots])
        cached = self._cache.closure(ckey, self._closure_context())
        if cached is not None:
            out: set[Path] = set()
            for f, name, is_pkg in cached:  # one Path per file (published closures share them)
                if (path := self._paths.get(f)) is None:
                    path = self._paths[f] = Path(f)
                    self._imports_of(path, name, is_pkg)
                self._names[path] = name
                out.add(path)
            return out
        self._touched = set()
        try:
            members = self._walk(module)
            touched = self._touched
        finally:
            self._touched = None
        paths: set[tuple[str, str]] = set()
        for name in touched:
            got = self._consulted.get(name)
            if got is None:
                return self._member_paths(members)  # a parent ran: not remembered
            paths |= got
        self._cache.remember_closure(ckey, self._closure_context(), members, paths, self._born)
        return self._member_paths(members)

    def _member_paths(self, members: list[tuple[str, str, bool]]) -> set[Path]:
        """A walk's members as Paths, their module names remembered (`files`)."""
        out = set()
        for f, name, _ in members:
            path = Path(f)
            self._names[path] = name
            out.add(path)
        return out

    def _closure_context(self) -> str:
        """What every answer of the import system also depends on besides the files and
        directories a walk reads: the search path, the finders and path hooks (and the
        files defining them: an editable install's finder holds its mapping), the
        installed distributions (which packages are keyed by source: `_is_local`)."""
        if self._context is None:
            def where(obj: Any) -> list[Any]:
                cls = obj if isinstance(obj, type) else type(obj)
                mod = sys.modules.get(cls.__module__)
                f = getattr(mod, "__file__", None)
                return [cls.__module__, cls.__qualname__, f, dists.path_stamp(f) if f else None]

            # '' (python -c, a REPL, a notebook) and relative entries mean the current
            # directory: a closure found in one is not another's
            search = [os.path.abspath(p) if isinstance(p, str) else str(p) for p in sys.path]
            doc = [sys.version, search, self._resolved_roots,
                   [where(f) for f in sys.meta_path],
                   [getattr(h, "__qualname__", None) or where(h) for h in sys.path_hooks],
                   dists.installed_fingerprint()]
            self._context = hashlib.sha256(json.dumps(doc, default=str).encode()).hexdigest()
        return self._context

    def _walk(self, module: str) -> list[tuple[str, str, bool]]:
        """(file, module name, is a package) of each source file in `module`'s closure."""
        entry_top = module.split(".")[0]
        if self._locate(module) is None:
            raise CuteccError(f'cannot find module "{module}" on the manifest\'s python_path '
                              f"({', '.join(map(str, self.roots))}) or installed: "
                              f"{self._why.get(module, 'not found')}")
        seen: set[Path] = set()
        members: list[tuple[str, str, bool]] = []
        todo = [module]
        done: set[str] = set()
        while todo:
            mod = todo.pop()
            if mod in done:
                continue
            done.add(mod)
            parts = mod.split(".")
            # Parent packages' __init__ run on import too.
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                f = self._find(name, entry_top)
                if f is None or f in seen:
                    continue
                seen.add(f)
                is_pkg = f.name == "__init__.py"
                members.append((str(f), name, is_pkg))
                todo.extend(d for d in self._imports_of(f, name, is_pkg)
                            if self._find(d, entry_top) is not None)
        return members

    def _imports_of(self, f: Path, mod: str, is_pkg: bool) -> set[str]:
        if f not in self._imports:
            pkg = mod if is_pkg else mod.rpartition(".")[0]
            deps: set[str] = set()
            for level, module, names in self._facts_of(f).parsed.imports:
                if names is None:  # import a.b.c
                    deps.add(module)
                    continue
                if level:
                    base_parts = pkg.split(".") if pkg else []
                    base_parts = base_parts[: len(base_parts) - (level - 1)]
                    base = ".".join(base_parts + ([module] if module else []))
                else:
                    base = module
                if base:
                    deps.add(base)
                    deps.update(f"{base}.{a}" for a in names if a != "*")
            self._imports[f] = deps  # all of them: which are local depends on the entry
        return self._imports[f]


def _not_in_a_directory(module: str, origin: str) -> str:
    """Why `module`, found at `origin` (no file there: inside a zip archive on `sys.path`, or
    another path entry that is not a directory), cannot be keyed."""
    holder = Path(origin)
    while holder != holder.parent and not holder.exists():
        holder = holder.parent
    if holder.is_dir():  # removed since it was found
        return f'module "{module}": {origin} is gone (removed while planning?); run the build again'
    what = "a zip archive" if zipfile.is_zipfile(holder) else "not a directory"
    return (f'module "{module}" is found in {holder} ({what}) on sys.path, as {origin}: cutecc '
            "keys project sources only from files in directories; extract the archive into a "
            "directory on the path, or install it as a distribution")


def _under(path: str, base: str) -> str | None:
    """`path` relative to `base` as `Path(path).relative_to(base)` spells it for normal
    absolute paths ("." for `base` itself), None when it is not under `base`."""
    if path == base:
        return "."
    prefix = base if base.endswith("/") else base + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def _shortest_under(path: str, bases: list[str]) -> str | None:
    """`path` relative to the deepest of `bases` holding it (`Path.as_posix`), or None."""
    best: str | None = None
    for base in bases:
        rel = _under(path, base)
        if rel is not None and (best is None or _depth(rel) < _depth(best)):
            best = rel
    return Path(best).as_posix() if best is not None else None


def _depth(rel: str) -> int:
    """How many parts `Path(rel)` has."""
    return 0 if rel == "." else rel.count("/") + 1


def _holds_installs(entry: str) -> bool:
    """Whether `sys.path` entry `entry` is an environment's package directory: one holding
    a distribution's `.dist-info` (site-packages, a --user or --target directory, a conda
    environment's), wherever it lies."""
    try:
        with os.scandir(entry) as it:
            return any(d.name.endswith(".dist-info") and d.is_dir() for d in it)
    except OSError:
        return False


def _path_effect_facts(data: bytes) -> PathEffect:
    return PathEffect(modfind.path_effect(data.decode("utf-8", errors="replace")))


def _installed_place(path: Path) -> bool:
    """Whether `path` lies in an environment's package directory: what is there was
    installed, and its distributions key it (the DSL's `cutlass`, installed under another
    top-level directory through a .pth, has no owner of its own). Source elsewhere that no
    distribution owns (a directory on $PYTHONPATH) is keyed by its content instead."""
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _top_level_in(path: Path, root: Path, top: str) -> bool:
    """Whether `path` (a module's file or package directory) is top-level package `top`
    directly in `root`: a virtual environment inside the project (`.venv/...`) is not the
    project's code, it is keyed by its distributions."""
    return path in (root / f"{top}.py", root / top, root / top / "__init__.py") or (
        path.parent == root and path.stem == top)


def key_inputs(kernel: Kernel, variant: Variant, arch: str, source_digest: str,
               distributions: dict[str, str] | None = None,
               env: dict[str, str] | None = None,
               imports: dict[str, str] | None = None,
               platform: str = BUILD_PLATFORM,
               shadows: dict[str, str] | None = None, asks_device: bool = False) -> dict[str, Any]:
    """The named inputs of one artifact's key (also stored in its metadata), for host code
    of `platform` (its toolchain names it: `toolchain`):
    `distributions` and `env` as `cutecc.toolchain.dists` computes them; `imports`, the source digests
    of project modules that the variant's values and struct types name and the entry's
    closure does not reach (`cutecc.plan.build_plan.references`); `shadows`, the source
    digests of modules found ahead of those the reached distributions install
    (`cutecc.plan.shadows`); `asks_device`, whether the kernel's own modules name the DSL's
    device queries (`cutecc.toolchain.devicequery.asks_hardware_info`)."""
    inputs: dict[str, Any] = {
        "distributions": distributions or {},
        "env": env or {},
        "kernel": kernel.name,  # the runtime exposes an entry under this name
        "entry": kernel.entry,
        "source": source_digest,
        "factory_args": None if variant.factory_args is None else dict(variant.factory_args),
        "args": args_to_json(variant.args),
        "constants": dict(variant.constants),
        "arch": arch,
        "compile_options": kernel.compile_options,
        "toolchain": toolchain(platform),
    }
    if "torch" in (distributions or {}) or asks_device:
        # Its code can ask torch (or the DSL's HardwareInfo) for the GPU: the build worker
        # answers from the profile.
        inputs["device"] = devicequery.answers(dict(kernel.hardware), arch, kernel.profile)
    if imports:  # only when set: kernels whose references the entry reaches keep their keys
        inputs["imports"] = dict(sorted(imports.items()))
    if shadows:  # only when set: where nothing shadows installed code, keys are unchanged
        inputs["shadows"] = dict(sorted(shadows.items()))
    if kernel.grad is not None:  # only when set: grad = { backward } alone keeps its keys
        inputs["grad"] = kernel.grad  # the named pairing the runtime reads from the entry
    if kernel.shard:  # only when set: kernels without a sharding rule keep their keys
        inputs["shard"] = list(kernel.shard)  # the independent symbols the runtime splits on
    if kernel.reshard != "error":  # only when set: strict kernels keep their keys
        inputs["reshard"] = kernel.reshard  # what the runtime does with a call XLA would reshard
    if variant.call:  # only when set: kernels without call keywords keep their keys
        inputs["call"] = dict(variant.call)  # which call reaches this entry
    if variant.relations:  # only when set: kernels without relations keep their keys
        inputs["relations"] = list(variant.relations)  # what the runtime checks at each call
    if variant.from_shapes:  # only when set: kernels without it keep their keys
        inputs["from_shapes"] = dict(variant.from_shapes)  # the axes a call's shapes choose
    return inputs
