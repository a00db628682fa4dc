"""Every directory cutecc keeps on a machine, named here and nowhere else (issue 46).

- `cache`: the built entries; `$CUTECC_CACHE_DIR` (or `--cache-dir`), else
  `~/.cache/cutecc/v<STORE_FORMAT>`;
- `planning`: what planning learned, for every cache; `$CUTECC_PLAN_MEMORY` (`off`: none),
  else `~/.cache/cutecc/planning-v1`;
- `platform-libs`: another platform's pinned link inputs; `$CUTECC_PLATFORM_LIBS`, else
  `~/.cache/cutecc/platform-libs-v1`;
- `zig`: zig's own cache (its libc stubs); `$ZIG_GLOBAL_CACHE_DIR`, else `~/.cache/cutecc/zig-v1`;
- `wrappers`: the generated wrappers a compile imports; `<tmp>/cutecc-wrap-v1-<uid>`;
- `services`: resident compile services' sockets; `<run>/cutecc-services-v1-<uid>`, `<run>`
  being `$XDG_RUNTIME_DIR`, else `<tmp>` (`$TMPDIR`, else /tmp).

`~/.cache` is the platform's user cache directory (XDG on Linux, through platformdirs); each
name carries its format's version, as uv's cache buckets do, so a cutecc whose home changes
format takes a new name and never reads the old one's. The cache's version is the store's
format (a cutecc of another format keeps its own `vN/` beside it).

One owner-and-link check (`why_not_mine`): a home cutecc makes or writes is a directory of
this user's, never a link (`services` also closed to others). No home is a key input, nor
decides a byte: the link inputs are pinned by digest and checked on every use, zig's version
is keyed and its cache decides no output byte, a wrapper's path is in no output (builds with
another `$HOME` and `$TMPDIR` give the same bytes: tests/toolchain/test_reproducible.py); so
moving a home moves no key. The read set exempts the platform libs' and zig's homes and the
wrappers in theirs (`cutecc.build.read_exempt`), wherever they are.

Homes an older cutecc kept under other names (`legacy()`: `~/.cache/cutecc-planning`,
`cutecc-platform-libs`, `cutecc-zig`, `<tmp>/cutecc-wrap-<uid>`,
`<run>/cutecc-services-<uid>`) are left as they are: an older cutecc may still run beside
this one (`platform-libs` takes a pinned wheel from the old one's `wheels/` rather than fetch
it again, checked as any). `cutecc gc` removes each once nothing in it changed for
`LEGACY_GRACE_S` (or its `--older-than`, if given). `cutecc env` lists every home with its
size, the legacy ones still on disk too (`listing`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cutecc import settings
from cutecc.entry.rules import STORE_FORMAT

CACHE, PLANNING, PLATFORM_LIBS, ZIG, WRAPPERS, SERVICES = (
    "cache", "planning", "platform-libs", "zig", "wrappers", "services")
NAMES = (CACHE, PLANNING, PLATFORM_LIBS, ZIG, WRAPPERS, SERVICES)
PLATFORM_LIBS_VAR = settings.PLATFORM_LIBS.env
ZIG_VAR = "ZIG_GLOBAL_CACHE_DIR"  # zig's own (`settings.FOREIGN`)
# The variable that names each home, where one does.
VARIABLES = {CACHE: settings.CACHE_DIR.env, PLANNING: settings.PLAN_MEMORY.env,
             PLATFORM_LIBS: PLATFORM_LIBS_VAR,
             ZIG: ZIG_VAR, WRAPPERS: "TMPDIR", SERVICES: "XDG_RUNTIME_DIR"}
WHAT = {CACHE: "the built entries", PLANNING: "what planning learned, for every cache",
        PLATFORM_LIBS: "another platform's pinned link inputs", ZIG: "zig's own cache",
        WRAPPERS: "the generated wrappers a compile imports",
        SERVICES: "resident compile services' sockets"}
USED = ".used"  # in zig's home: touched at each link, what `prune` ages it by
LEGACY_GRACE_S = 7 * 86400.0  # a legacy home unchanged this long is an older cutecc's no more
SOCKET_GRACE_S = 60.0  # a socket no one listens on this long after it was made is a dead one's


def user_cache() -> Path:
    """`~/.cache/cutecc`: the platform's user cache directory for cutecc (XDG on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("cutecc", appauthor=False))


def temp_dir() -> str:
    """The system's temporary directory (`$TMPDIR`, else /tmp), normalized."""
    return os.path.normpath(tempfile.gettempdir())


def short_temp_dir(longest: int) -> str:
    """`temp_dir()` where its path has at most `longest` bytes, else /tmp (a socket's path
    in it must stay short)."""
    base = temp_dir()
    return base if len(os.fsencode(base)) <= longest else "/tmp"


def cache() -> Path:
    """The default cache: `$CUTECC_CACHE_DIR`, else `v<STORE_FORMAT>` in `user_cache()`."""
    env = settings.CACHE_DIR.read()
    return Path(env).expanduser() if env else user_cache() / f"v{STORE_FORMAT}"


def planning() -> Path | None:
    """The planning memory's directory: `$CUTECC_PLAN_MEMORY`, else `planning-v1`; None when
    that variable is `off`."""
    env = settings.PLAN_MEMORY.read()
    if env == "off":
        return None
    return Path(env) if env else user_cache() / "planning-v1"


def platform_libs() -> Path:
    """Another platform's link inputs: `$CUTECC_PLATFORM_LIBS`, else `platform-libs-v1`."""
    env = settings.PLATFORM_LIBS.read()
    return Path(env) if env else user_cache() / "platform-libs-v1"


def zig() -> Path:
    """zig's own cache: `$ZIG_GLOBAL_CACHE_DIR`, else `zig-v1`."""
    env = os.environ.get("ZIG_GLOBAL_CACHE_DIR")
    return Path(env) if env else user_cache() / "zig-v1"


def wrappers() -> Path:
    """The generated wrappers' directory: `cutecc-wrap-v1-<uid>` in `temp_dir()`."""
    return Path(temp_dir()) / f"cutecc-wrap-v1-{os.getuid()}"


def services() -> Path:
    """The resident services' sockets: `cutecc-services-v1-<uid>` in `$XDG_RUNTIME_DIR`, else
    in `temp_dir()`."""
    return Path(os.environ.get("XDG_RUNTIME_DIR") or temp_dir()) / f"cutecc-services-v1-{os.getuid()}"


def path_of(name: str) -> Path | None:
    """The home `name` (one of NAMES) as the environment names it now; None where turned off."""
    return {CACHE: cache, PLANNING: planning, PLATFORM_LIBS: platform_libs, ZIG: zig,
            WRAPPERS: wrappers, SERVICES: services}[name]()


def legacy() -> dict[str, Path]:
    """What an older cutecc kept under an unversioned name, by the home that replaces it; only
    where this home is at its default (a variable that names it leaves the old one alone)."""
    out: dict[str, Path] = {}
    base = user_cache().parent
    for name in (PLANNING, PLATFORM_LIBS, ZIG):
        if not {PLANNING: settings.PLAN_MEMORY.read, PLATFORM_LIBS: settings.PLATFORM_LIBS.read,
                ZIG: lambda: os.environ.get("ZIG_GLOBAL_CACHE_DIR")}[name]():
            out[name] = base / f"cutecc-{name}"
    out[WRAPPERS] = Path(temp_dir()) / f"cutecc-wrap-{os.getuid()}"
    out[SERVICES] = Path(os.environ.get("XDG_RUNTIME_DIR") or temp_dir()) / f"cutecc-services-{os.getuid()}"
    return out


def why_not_mine(path: Path, *, private: bool = False) -> str | None:
    """Why `path` is not a home cutecc may use, or None: it must be a directory (never a
    link) owned by this user, and with `private` one no one else may enter."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if private and st.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make(name: str) -> tuple[Path | None, str | None]:
    """The home `name`, made (mode 0700) where missing, and checked (`why_not_mine`): (its
    path, None), or (its path or None, why it cannot be used)."""
    path = path_of(name)
    if path is None:
        return None, "turned off"
    with contextlib.suppress(OSError):
        path.mkdir(parents=name not in (WRAPPERS, SERVICES), exist_ok=True, mode=0o700)
    return path, why_not_mine(path, private=name == SERVICES)


def _walk(path: Path) -> tuple[int, float]:
    """(bytes of the files under `path`, the newest mtime there), never following a link."""
    total, newest = 0, 0.0
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        newest = st.st_mtime
        if not stat.S_ISDIR(st.st_mode):
            return (0 if stat.S_ISLNK(st.st_mode) else st.st_size), newest
        for root, dirs, files in os.walk(path):
            for f in [*files, *dirs]:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(root, f))
                    newest = max(newest, st.st_mtime)
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return total, newest


def size(path: Path) -> int:
    """Bytes of the files under `path`, never following a link; 0 where absent."""
    return _walk(path)[0]


@dataclass(frozen=True)
class Home:
    """One home as `cutecc env` shows it: its name, path (None: turned off), the variable that
    sets it, what it holds, its bytes, and whether it exists."""

    name: str
    path: str | None
    variable: str
    holds: str
    bytes: int
    exists: bool


def listing(cache_dir: Path | None = None) -> list[Home]:
    """Every home, with its size; `cache_dir` the cache this run names (else the default),
    then any legacy home still on disk (named `<home> (older cutecc)`)."""
    out = []
    for name in NAMES:
        p = cache_dir if name == CACHE and cache_dir is not None else path_of(name)
        out.append(Home(name, None if p is None else str(p), VARIABLES[name], WHAT[name],
                        0 if p is None else size(p), p is not None and p.is_dir()))
    for name, p in legacy().items():
        if os.path.lexists(p):
            out.append(Home(f"{name} (older cutecc)", str(p), "", "left by an older cutecc: "
                            "`cutecc gc` removes it", size(p), True))
    return out


@dataclass(frozen=True)
class Removed:
    """What `prune` removed (or, dry, would): the home, the path, its bytes and why."""

    home: str
    path: str
    bytes: int
    why: str


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def mark_used(home: Path) -> None:
    """Note a use of zig's home (its `.used` mtime), what `prune` ages it by."""
    with contextlib.suppress(OSError):
        os.close(os.open(home / USED, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.utime(home / USED)


def _live_socket(path: Path) -> bool:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def prune(older_than: float | None, pinned: frozenset[str] | None, dry_run: bool) -> list[Removed]:
    """What `cutecc gc` removes outside the cache: each legacy home nothing changed in for
    `older_than` (else LEGACY_GRACE_S); the platform link inputs no pin of this cutecc
    names (`pinned`: the relative paths of what it does; None: leave that home alone);
    sockets no service listens on; and with `older_than` (seconds, by the clock) the
    wrappers, the planning memory and zig's cache unused that long. A home that is not this
    user's directory (`why_not_mine`) is never touched."""
    out: list[Removed] = []
    clock = time.time()

    def drop(home: str, p: Path, why: str) -> None:
        n = size(p)
        if not dry_run:
            _remove(p)
        out.append(Removed(home, str(p), n, why))

    for name, p in legacy().items():
        if why_not_mine(p) is None and _walk(p)[1] < clock - (older_than or LEGACY_GRACE_S):
            drop(name, p, "left by an older cutecc under an unversioned name")
    cutoff = None if older_than is None else clock - older_than
    libs = platform_libs()
    if pinned is not None and why_not_mine(libs) is None:
        for area in sorted(d for d in libs.iterdir() if d.is_dir() and not d.is_symlink()):
            for item in sorted(area.iterdir()):
                rel = f"{area.name}/{item.name}"
                # a dot name is an extraction under way; a directory in wheels/ a download
                if item.name.startswith(".") or rel in pinned or (area.name == "wheels" and item.is_dir()):
                    continue
                drop(PLATFORM_LIBS, item, "a wheel, or files extracted from one, that this cutecc "
                     "pins no more")
    run = services()
    if why_not_mine(run, private=True) is None:
        for sock in sorted(run.glob("*.sock")):
            st = os.lstat(sock)
            if stat.S_ISSOCK(st.st_mode) and st.st_mtime < clock - SOCKET_GRACE_S and not _live_socket(sock):
                drop(SERVICES, sock, "no service listens on it")
    if cutoff is None:
        return out
    wraps = wrappers()
    if why_not_mine(wraps) is None:
        made = [*wraps.glob("cutecc_wrapper_*.py"), *wraps.glob("__pycache__/cutecc_wrapper_*.pyc")]
        for f in sorted(made):
            if os.lstat(f).st_mtime < cutoff:
                drop(WRAPPERS, f, "unused for the age")
    memory = planning()
    if memory is not None and why_not_mine(memory) is None:
        for f in sorted(memory.iterdir()):
            if f.is_file() and not f.is_symlink() and os.lstat(f).st_mtime < cutoff:
                drop(PLANNING, f, "unused for the age")
    z = zig()
    if why_not_mine(z) is None:
        try:
            used = os.lstat(z / USED).st_mtime
        except OSError:
            used = os.lstat(z).st_mtime
        if used < cutoff and any(z.iterdir()):
            drop(ZIG, z, "no link used it for the age (zig makes it again in a few seconds)")
    return out
