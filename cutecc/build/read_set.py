"""What a compile read, recorded by an audit hook and proven covered by its key before publishing.

A key is a prediction: planning walks the sources a kernel imports and the distributions it
reaches (`cutecc.plan.key`, `cutecc.toolchain.dists`), and every mechanism built for speed
(planning memories, a resident compile service, just-in-time builds) trusts it. This module
checks it against what the compile actually read, as ccache's depend mode or a build
sandbox does:

- **Recorded** (`install`): an audit hook (`sys.addaudithook`, which cannot be removed, so
  it only adds a path to a set) notes every file opened for reading (`open`, `os.open`,
  `io.open_code`: imports), every extension module loaded (`import`'s path), every
  directory an import listed (`os.listdir`, `os.scandir`) and every library `ctypes`
  loaded by path; the libraries mapped into the process (`/proc/self/maps`) are added when
  checked, which covers `dlopen` by name. A worker installs it first thing, before it imports
  the compile side (`serve_spawned`; a Ray worker at its first job). A
  resident or per-build compile service records from its first import and each worker it
  forks inherits that record (the same set, copied by `fork`). A worker that serves several
  jobs checks each against what it read before its first job and during that job
  (`begin_job`), plus any file an earlier job was refused for (it stays in the process);
  what the import of an entry module preloaded for the pool recorded counts only for the
  jobs whose key reaches a module that was being imported then (`preloading`, `_reaching`).
- **Checked** (`problem`), after compile and link, before anything is published: each file
  must be one of
  - the job's keyed closure (`KeyedFile`s: the planned sources, the manifest's declared
    `[build] inputs`; `cutecc.plan.keyed_sources` re-hashes them against the key);
  - a file its RECORD lists of a distribution the key names, whose digest computed now
    (through the store's hash cache: files are stat'ed, re-hashed only when their stamps
    moved) is the key's, or, keyed by RECORD alone, whose content matches its RECORD row;
  - a file of the toolchain's packages (`cutecc.toolchain.versions.TOOL_PACKAGES`) at the
    version the key's toolchain names;
  - byte code (`__pycache__/NAME.*.pyc`) stands for its source, which must be covered;
  - a directory listed must be a `sys.path` entry, a python_path root, or hold a covered file;
  - or one of `EXEMPT` (module `exempt`): the standard library and the interpreter
    (the interpreter's identity is keyed), `/proc`, `/sys`, `/dev`, `/etc/ld.so.cache`,
    locale and timezone data, the system's shared libraries (`.so` files in `/lib`,
    `/usr/lib`: the C runtime the interpreter and the DSL's native code link), cutecc's own
    package, the worker's temporary directories (the staging directory, the generated
    wrappers' and the PTX dumps') and the store (its entries are keyed by their own keys).

  Any other file fails the entry: one line naming the file, the module that read it (the
  innermost frame outside the standard library when it was first read) and what to declare.
- **Digest** (`ReadSet.digest`): a SHA-256 over how each covered file is covered (its name
  in the key: closure path, distribution and RECORD path, toolchain package and path), no
  machine paths, recorded in the entry's metadata; `cutecc verify --deep` compares it with a
  fresh compile's.

`$CUTECC_INTERNAL_AUDIT=off` turns the check (not the recording) off: it exists so the benchmark
(`benchmarks/build_overhead.py --audit on off`) can measure what it costs, and so a test can
build an entry as cutecc did before the check; such an entry records no read-set digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.build.read_exempt import (
    _STDLIB,
    _byte_code_is_source,
    _in_temp,
    _source_of,
    _under,
    exempt,
    temp_dirs,
)
from cutecc.build.read_installed import OWNED_DIRS, Dists, index_installed, installed_byte_code

DIGEST_VERSION = 1

_current: set[str] = set()  # what this process (or job) read: the hook adds here
_baseline: frozenset[str] | None = None  # what it read before its first job
_tainted: set[str] = set()  # files an earlier job was refused for: every later job sees them
_who: dict[str, str] = {}  # the module that first read each path
_startup: dict[str, str] = {}  # what ran before the hook was installed: {path: what read it}
_installed = False
_paused = 0
# what a preloaded entry module's import recorded (`preloading`): each path recorded then and
# never outside one before the first job, with the import chains it was recorded under (the
# modules whose import was running, outermost first, as (name, file)): charged to a job only
# where its key reaches one of those modules (`_reaching`)
_origin: dict[str, set[tuple[tuple[str, str], ...]]] = {}
_preloading: Any = None  # while an entry module is preloaded: the frame importing it
_chains: dict[Any, tuple[tuple[str, str], ...]] = {}  # a module's import frame -> its chain
# the import system's frame that finds and loads one module (its `name`): a module's own file
# and the directories searched for it are read there, before any of its code runs
_FIND_AND_LOAD = getattr(getattr(sys.modules.get("_frozen_importlib"), "_find_and_load", None), "__code__",
                         None)
_OPEN_EVENTS = frozenset({"open"})
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir"})
_HERE = os.path.normpath(__file__)
_PSEUDO = ("/proc/", "/dev/")  # where a path may name another file (/proc/self/root/..., /dev/fd/N)
_DIRS = "\0dir:"  # prefix of a listed directory in the record (no file path starts with NUL)
_REL = "\0rel:"  # prefix of a relative os.open not found against the working directory (dir_fd=)
_EXEC = "\0exec:"  # prefix of a process started (its reads are its own, unseen by the hook)
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn",
                           "os.startfile", "pty.spawn"})
_SPAWN_OK = ("ctypes.util", "cutecc.")  # find_library's ldconfig/gcc; cutecc's own linker (zig cc)
_RECORDED = _OPEN_EVENTS | _LIST_EVENTS | _SPAWN_EVENTS | {"import", "ctypes.dlopen"}


def _spawner() -> str:
    """The module that asked for a process: the innermost frame outside subprocess/os/this."""
    f: Any = sys._getframe(2)
    while f is not None:
        name = str(f.f_globals.get("__name__") or "")
        if name not in ("subprocess", "os", "pty", "cutecc.build.read_set"):
            return name
        f = f.f_back
    return "?"


def _reader() -> str:
    """The module of the innermost frame outside the standard library and this module."""
    f: Any = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith("<") or fn.startswith(_STDLIB) or fn == _HERE):
            return str(f.f_globals.get("__name__") or fn)
        f = f.f_back
    return "?"


def _note(path: Any, prefix: str = "") -> None:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    elif not isinstance(path, str):
        path = os.fspath(path) if isinstance(path, os.PathLike) else None
        if not isinstance(path, str):
            return  # a descriptor: what it names was opened (and noted) before
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    if path.startswith(_PSEUDO):  # /proc/self/root/x, /proc/self/cwd/x, /dev/fd/N: the file it names
        real = os.path.realpath(path)
        if not real.startswith(("/proc/", "/sys/", "/dev/")) and real not in ("/proc", "/sys", "/dev"):
            path = real
    p = prefix + path
    if p not in _current:
        _current.add(p)
        if p not in _who:
            _who[p] = _reader()
        if _preloading is not None:
            _origin[p] = {_chain()}
    elif _origin:
        _again(p)


def _note_exec(cmd: str, who: str) -> None:
    p = _EXEC + cmd
    if p not in _current:
        _current.add(p)
        _who.setdefault(p, who)
        if _preloading is not None:
            _origin[p] = {_chain()}
    elif _origin:
        _again(p)


def _again(p: str) -> None:
    """`p`, recorded before, recorded again: during a preloaded import, under its chain too;
    outside one before the first job, every job's (a job's own reads count anyway)."""
    if _preloading is not None:
        if p in _origin:
            _origin[p].add(_chain())
    elif _baseline is None:
        _origin.pop(p, None)


def _chain() -> tuple[tuple[str, str], ...]:
    """The modules whose import was running when a preloaded import recorded something, up
    to the preload's frame, outermost first, as (name, file): each module being found and
    loaded (its file "": known once loaded) and each whose code runs (its `<module>` frame).
    Each frame's chain is remembered, so a later event walks only up to its innermost one."""
    inner = []
    base: tuple[tuple[str, str], ...] = ()
    f: Any = sys._getframe(1)
    while f is not None and f is not _preloading:
        code = f.f_code
        if code.co_name == "<module>" or code is _FIND_AND_LOAD:
            got = _chains.get(f)
            if got is not None:
                base = got
                break
            inner.append(f)
        f = f.f_back
    for frame in reversed(inner):
        if frame.f_code is _FIND_AND_LOAD:
            base = (*base, (str(frame.f_locals.get("name") or ""), ""))
        else:
            base = (*base, (str(frame.f_globals.get("__name__") or ""), frame.f_code.co_filename))
        _chains[frame] = base
    return base


def _relative(path: str) -> None:
    """`os.open` of a relative path outside the standard library (whose `shutil.rmtree` opens
    directories by `dir_fd`): the event carries no `dir_fd`, so a path that is not there
    against the working directory was opened against some other directory, unseen."""
    caller = sys._getframe(2).f_code.co_filename
    if caller.startswith(_STDLIB) or os.path.lexists(path):
        return
    p = _REL + path
    if p not in _current:
        _current.add(p)
        _who.setdefault(p, _reader())
        if _preloading is not None:
            _origin[p] = {_chain()}
    elif _origin:
        _again(p)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _RECORDED or _paused:  # (most events are attribute reads and frames: one lookup)
        return
    if event in _OPEN_EVENTS:
        path, mode, flags = args
        if isinstance(flags, int):  # open() and os.open() both: written only, or emptied first
            if flags & os.O_ACCMODE == os.O_WRONLY or flags & os.O_TRUNC:
                return
        elif isinstance(mode, str) and ("w" in mode or "x" in mode or ("a" in mode and "+" not in mode)):
            return
        if mode is None and isinstance(path, (str, bytes)) and not os.fsdecode(path).startswith("/"):
            _relative(os.fsdecode(path))
        _note(path)
    elif event in _LIST_EVENTS:
        _note(args[0] if args and args[0] is not None else ".", _DIRS)
    elif event in _SPAWN_EVENTS:
        who = _spawner()
        if not who.startswith(_SPAWN_OK):
            cmd = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[0] if args else "?"
            _note_exec(repr(cmd)[:200], who)
    elif event == "import":
        if len(args) > 1 and args[1]:
            _note(args[1])
    elif event == "ctypes.dlopen" and args and isinstance(args[0], (str, bytes)) \
            and "/" in os.fsdecode(args[0]):
        _note(args[0])


def install() -> None:
    """Start recording in this process (once; later calls do nothing): a worker or compile
    service calls it first thing, before it imports the compile side."""
    global _installed
    if _installed:
        return
    _installed = True
    sys.addaudithook(_hook)
    _startup.update(_before_hook())


def _before_hook() -> dict[str, str]:
    """What ran at interpreter start, before the hook: a `sitecustomize` or `usercustomize`
    outside the standard library (one on `$PYTHONPATH` runs in every worker) and the site
    directories' `.pth` files (whose lines may run code), as {path: what read it}. (Not
    every module imported before: a just-in-time build's worker is forked from the caller's
    process, whose own modules are its business.)"""
    out: dict[str, str] = {}
    for name in ("sitecustomize", "usercustomize"):
        f = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(f, str) and os.path.isabs(f) and not f.startswith(_STDLIB):
            out.setdefault(os.path.normpath(f), f"{name}, run at interpreter start")
    try:
        import site

        sites = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    except (AttributeError, OSError):
        sites = []
    for d in sites:
        with contextlib.suppress(OSError):
            for n in os.listdir(d):
                if n.endswith(".pth"):
                    out.setdefault(os.path.join(d, n), "site, at interpreter start")
    return out


class preloading:  # noqa: N801 (a context manager, used as a function's `with`)
    """While the caller imports the entry modules of its pool ahead of the jobs
    (`cutecc.build.executors.preload`): what each import records keeps the chain of modules
    whose import recorded it, so a job is charged with it only where its key reaches one of
    them (`check`): a process FlashInfer's import starts is not quack's."""

    def __enter__(self) -> None:
        global _preloading
        _preloading = sys._getframe(1)

    def __exit__(self, *exc: object) -> None:
        global _preloading
        _preloading = None
        _chains.clear()


def begin_job() -> None:
    """A worker takes a job: what it read so far (its imports, or its service's) stays the
    base of every job's record; an earlier job's reads are forgotten, except those refused."""
    global _baseline, _current
    if _baseline is None:
        _baseline = frozenset(_current)
    _current = set(_tainted)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing meanwhile: cutecc's own bookkeeping (the toolchain's check, the store,
    the hash cache, this check's own reads), which never decides the compiled bytes."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


def recorded() -> set[str]:
    """Every path recorded for the current job (directories prefixed `_DIRS`), with the
    libraries mapped now."""
    out = set(_current) | set(_baseline or ())
    with paused(), contextlib.suppress(OSError), \
            open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(None, 5)
            name = parts[5].rstrip("\n") if len(parts) == 6 else ""
            if name.startswith("/"):
                out.add(name.removesuffix(" (deleted)"))
    return out


def files_read() -> list[str]:
    """The plain files recorded (no directories, nor the kernel's pseudo-files, whose stamps
    move by themselves): what a resident service stamps."""
    with paused():
        return sorted(p for p in recorded()
                      if not p.startswith((_DIRS, _EXEC, _REL, "/proc/", "/sys/", "/dev/")))


# -- the check ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadSet:
    """A checked read set: the first file no key covers (None: all are) and its one-line
    error, and the digest of how the rest are covered."""

    error: str | None
    digest: str
    files: int


def warm() -> None:
    """Index the installed distributions (`read_installed.index_installed`), unrecorded."""
    with paused():
        index_installed()


def _declare(path: str, roots: tuple[str, ...]) -> str:
    for r in roots:
        if _under(path, r):
            return (f'declare it in the manifest\'s [build] inputs ("{os.path.relpath(path, r)}" '
                    "is under the python_path root " + r + ")")
    return ("declare it in the manifest's [build] inputs (a path relative to the manifest), or install "
            "the package that holds it so that its distribution is keyed")


def check(job: Any, staging: Path | None, store_root: str | None) -> ReadSet:
    """Whether every file this process recorded for `job` is covered by its key (module
    docstring): the first that is not, as one line, and the digest of the covered ones."""
    with paused():
        return _check(job, staging, store_root)


def _check(job: Any, staging: Path | None, store_root: str | None) -> ReadSet:
    temps = temp_dirs(staging, store_root)
    keyed = {os.path.normpath(f.path): f for f in job.keyed_files}
    by_real: dict[str, Any] = {}

    def real_keyed() -> dict[str, Any]:  # the keyed closure by real path, when first asked (a
        if not by_real:  # symlinked package or venv: rare; a realpath per keyed file costs more
            by_real.update((os.path.realpath(p), f) for p, f in keyed.items())  # than a job's check)
        return by_real
    roots = tuple(os.path.normpath(os.path.abspath(p)) for p in job.python_path)
    entries = {os.path.normpath(os.path.abspath(p or ".")) for p in sys.path} | set(roots)
    dists = Dists(job, store_root)
    lines: set[str] = set()
    covered_dirs: set[str] = set()
    dirs: list[str] = []
    error: str | None = None
    bad = ""
    covered: list[str] = []
    charged = _reaching(job, dists)
    for raw in sorted(recorded()):
        if raw not in _current and raw in _origin and not any(map(charged, _origin[raw])):
            continue  # a preloaded import's, of modules this job's compile never imports
        if raw.startswith(_DIRS):
            dirs.append(raw)
            continue
        if raw.startswith(_REL):
            if error is None:
                bad = raw
                error = (f"the compile opened {raw[len(_REL):]!r} (module {_who.get(raw, '?')}) relative "
                         "to a directory descriptor (os.open's dir_fd), which cannot be checked; open it "
                         "by its path")
            continue
        if raw.startswith(_EXEC):
            if error is None:
                bad = raw
                error = (f"the compile started a process ({raw[len(_EXEC):]}, module {_who.get(raw, '?')}), "
                         "whose reads no key can cover; read what it would read in Python, from files "
                         "the key covers (the project's sources or the manifest's [build] inputs)")
            continue
        path, target, why_exempt = _facts_of(raw)
        if why_exempt is not None or (dists.owner(path) is None and _in_temp(path, temps)):
            continue  # (an installed file is never one of the worker's temporary files)
        # read before this job only (an import of its service's or an earlier job's, never read
        # again since): proven once in this process, what it read then is all it holds
        again = raw in _current
        line, why = _covered(target, keyed, real_keyed, dists, again)
        if line is None and target != path:  # byte code of an unlisted source
            line, why = _covered(path, keyed, real_keyed, dists, again)
        if line is not None and target != path and line.startswith("source ") \
                and not _byte_code_vouched(path, target, keyed) and not _byte_code_is_source(path, target):
            line, why = None, (f"it ran the byte code {path}, which is not {target} compiled (a .pyc "
                               "stamped with the source's mtime and size, holding other code): delete it")
        if line is not None:
            lines.add(line)
            covered.append(target)
            continue
        if error is None and os.path.exists(target):  # (a file gone since: nothing read is left)
            who, bad = _who.get(raw, "?"), raw
            error = (f"the compile read {target} (module {who}), which its key does not cover"
                     + (f": {why}" if why else f"; {_declare(target, roots)}"))
    for path, who in sorted(_startup.items()):  # checked, but not in the digest (every process has them)
        if error is not None:
            break
        _, target, why_exempt = _facts_of(path)
        if why_exempt is not None or _in_temp(path, temps) or not os.path.exists(target):
            continue
        line, why = _covered(target, keyed, real_keyed, dists)
        if line is None:
            error = (f"the worker ran {target} ({who}), which its key does not cover"
                     + (f": {why}" if why else f"; {_declare(target, roots)}, or remove it from the "
                        "build's environment (a sitecustomize, or a .pth's import)"))
    for raw in dirs:
        d = os.path.normpath(raw[len(_DIRS):])
        if d in entries or exempt(d, temps) is not None or not os.path.isdir(d):
            continue
        warm()
        if d in OWNED_DIRS:
            continue  # installed files' directory: what an import there finds is an installed file
        if not covered_dirs:  # (only for a directory nothing else covers)
            covered_dirs = {p for f in covered for p in _parents(f)}
        if d in covered_dirs:
            continue
        if error is None:
            bad = raw
            error = (f"the compile listed the directory {d} (module {_who.get(raw, '?')}), which its key "
                     f"does not cover; {_declare(d, roots)}")
    if bad and (bad in _current or bad not in _origin):  # what was read stays in this process:
        _tainted.add(bad)  # every later job of it is refused too (a preloaded import's, as charged)
    # the keyed closure always counts as read: a worker reused for another variant of a kernel
    # does not import its modules again, and its digest must be a fresh compile's
    lines.update(f"source {f.rel}" for f in job.keyed_files)
    h = hashlib.sha256(f"read-set {DIGEST_VERSION}\n".encode())
    for line in sorted(lines):
        h.update(line.encode() + b"\n")
    return ReadSet(error, h.hexdigest(), len(lines))


_FACTS: dict[str, tuple[str, str, str | None]] = {}  # raw path -> (path, target, why exempt)


def _facts_of(raw: str) -> tuple[str, str, str | None]:
    """(the normalised path, the file that stands for it: a `.pyc`'s source, and why it is
    exempt), once per process: a compile service works them out for its record before it
    forks (`prepare`), so its workers check only what they read themselves."""
    got = _FACTS.get(raw)
    if got is None:
        path = os.path.normpath(raw)
        if path.startswith(("/proc/", "/dev/")):  # a file reached through /proc/self/root,
            real = os.path.realpath(raw)  # /proc/self/cwd or /dev/fd: the file itself
            if not any(_under(real, p) for p in ("/proc", "/sys", "/dev")):
                path = real
        src = _source_of(path)
        target = src if src is not None and os.path.exists(src) else path
        got = _FACTS[raw] = (path, target, exempt(path))
    return got


def _byte_code_vouched(pyc: str, source: str, keyed: dict[str, Any]) -> bool:
    """Whether the install that wrote keyed `source` compiled `pyc` from it, as the key saw it
    (`read_installed.installed_byte_code`: by stat, no compile to compare)."""
    f = keyed.get(source)
    return f is not None and installed_byte_code(pyc, source, f.sha256)


def prepare() -> None:
    """In a compile service, after its imports: index the installed distributions and work
    out each recorded file's facts, which the workers it forks inherit."""
    with paused():
        warm()
        for raw in recorded():
            if not raw.startswith((_DIRS, _EXEC, _REL)):
                _facts_of(raw)


def _reaching(job: Any, dists: Dists) -> Callable[[tuple[tuple[str, str], ...]], bool]:
    """Whether `job`'s compile imports a module of an import chain (`_chain`), as its key
    tells: a module of a top-level package its keyed closure holds (the entry's, the
    project's), of a distribution its key names (the toolchain's included), or of the
    standard library, cutecc or another exempt place (any compile may import those). A
    module with no file (a namespace package, whose import reads no file, or one that failed
    to import, which a compile that needs it imports again) is its package's alone. An empty
    chain (recorded outside any module's import: a thread's) is every job's."""
    tops = {f.module.partition(".")[0] for f in job.keyed_files}
    memo: dict[tuple[str, str], bool] = {}

    def reaches(module: tuple[str, str]) -> bool:
        if module not in memo:
            name, path = module
            path = path or str(getattr(sys.modules.get(name), "__file__", None) or "")
            if name.partition(".")[0] in tops:
                memo[module] = True
            elif not path:
                memo[module] = False
            elif not os.path.isabs(path) or exempt(os.path.normpath(path)) is not None:
                memo[module] = True  # (frozen modules: "<frozen ...>")
            else:
                owner = dists.owner(os.path.normpath(path)) or dists.owner(os.path.realpath(path))
                memo[module] = owner is not None and (owner[0] in dists.keyed or owner[0] in dists.tools)
        return memo[module]

    return lambda chain: not chain or any(map(reaches, chain))


def _parents(path: str) -> Iterator[str]:
    d = os.path.dirname(path)
    while d and d != "/":
        yield d
        d = os.path.dirname(d)


def _covered(path: str, keyed: dict[str, Any], real_keyed: Callable[[], dict[str, Any]],
             dists: Dists, again: bool = True) -> tuple[str | None, str | None]:
    """(how the key covers `path`, as a digest line; None and why when it does not);
    `again`: read during this job (an installed file proven before is then stat'ed anew)."""
    f = keyed.get(path)
    owned = None if f is not None else dists.owner(path)
    if f is None and owned is None:  # by its real path (a symlinked package or venv)
        real = os.path.realpath(path)
        if real != path:
            f, owned = real_keyed().get(real), dists.owner(real)
    if f is not None:
        return f"source {f.rel}", None
    if owned is not None:
        return dists.covers(*owned, path, again)
    return None, None


def enabled() -> bool:
    """Whether builds check their read sets (`$CUTECC_INTERNAL_AUDIT` is not "off")."""
    from cutecc import settings

    return settings.AUDIT.text().lower() not in ("0", "off", "no", "false")
