"""What a compile's read set needs no key for, and whether byte code is its source.

The exempt list of `cutecc.build.read_set` (its module docstring says why each is there),
the worker's temporary files (only the generated wrappers in the wrappers' directory), and
the comparison of a keyed source's `.pyc` with the source compiled: the import trusts a
`.pyc` whose header names the source's mtime and size, whatever code it holds.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path

from cutecc.store import homes

_STDLIB = os.path.normpath(sysconfig.get_paths()["stdlib"])
_HERE = os.path.normpath(__file__)

_LOCALE = ("/usr/share/locale/", "/usr/lib/locale/", "/usr/share/zoneinfo/", "/usr/share/i18n/",
           "/usr/lib/x86_64-linux-gnu/gconv/", "/usr/lib/aarch64-linux-gnu/gconv/", "/usr/lib/gconv/",
           "/usr/lib64/gconv/")
_SYSTEM_LIBS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")
_INTERPRETER = (sys.executable, os.path.realpath(sys.executable))
_CUTECC = os.path.dirname(os.path.dirname(_HERE)) + os.sep


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


_BESIDE = os.path.dirname(_CUTECC.rstrip(os.sep)) + os.sep  # where cutecc's metadata lies beside it


def _cutecc_metadata(path: str) -> bool:
    """Whether `path` is in cutecc's own distribution metadata beside its package (an
    editable checkout's `cutecc.egg-info/`, an install's `cutecc-VERSION.dist-info/`), which
    `importlib.metadata.entry_points()` reads when torch looks for its plugins."""
    if not path.startswith(_BESIDE):
        return False
    top = path[len(_BESIDE):].split(os.sep, 1)[0]
    return top == "cutecc.egg-info" or (top.startswith("cutecc-") and top.endswith(".dist-info"))


def exempt(path: str, temp_dirs: tuple[str, ...] = ()) -> str | None:
    """Why `path` (absolute, normalised) needs no key (None: it does): the short list of
    the module docstring."""
    if any(_under(path, p) for p in ("/proc", "/sys", "/dev")):
        return "the kernel's pseudo-files"
    if path in ("/etc/ld.so.cache", "/etc/localtime"):
        return "the dynamic loader's cache" if path.endswith("cache") else "timezone data"
    if path.startswith(_LOCALE):
        return "locale and timezone data"
    if _under(path, _STDLIB) and "/site-packages/" not in path[len(_STDLIB):] + "/":
        return "the standard library"
    if path in _INTERPRETER or (
            _under(path, os.path.normpath(sys.base_prefix)) and "-packages/" not in path
            and ".so" in os.path.basename(path)):
        return "the interpreter"
    if path.startswith(_SYSTEM_LIBS) and ".so" in os.path.basename(path) \
            and "-packages/" not in path:
        return "the system's shared libraries"
    if path.startswith(_CUTECC) or path == _CUTECC[:-1] or _cutecc_metadata(path):  # (listed too)
        return "cutecc's own package"
    if _in_temp(path, temp_dirs):
        return "the worker's temporary files"
    return None


_WRAPPER = re.compile(r"(__pycache__/)?cutecc_wrapper_[0-9a-f]{16}(\.py|\.[a-z0-9_-]+(\.opt-[12])?\.pyc)")


def _in_temp(path: str, temps: tuple[str, ...]) -> bool:
    """Whether `path` is one of the worker's temporary files: under the staging directory or
    the store, or a generated wrapper (`cutecc_wrapper_*.py`, its byte code) in the wrappers'
    directory, which holds whatever else this user put there (that is not exempt)."""
    wraps = str(homes.wrappers())
    for t in temps:
        if t == wraps:
            if path == t or (_under(path, t) and _WRAPPER.fullmatch(path[len(t) + 1:])):
                return True
        elif path.startswith(t) if t.endswith("-") else _under(path, t):  # "-": a tempfile prefix
            return True
    return False


def temp_dirs(staging: Path | None, store_root: str | None) -> tuple[str, ...]:
    """The directories a worker writes and reads back: the staging directory, the generated
    wrappers' (`cutecc.build.compiler._wrapper_file`), the PTX dumps' and the store."""
    out = [str(homes.wrappers()), os.path.join(homes.temp_dir(), "cutecc-ptx-")]
    # absolute as the hook records them (a store named relative to the build's directory);
    # cutecc's own homes a compile uses: another platform's link inputs (pinned wheels whose
    # pins are key inputs, checked on every use) and zig's cache (zig's version is keyed)
    out += [os.path.normpath(os.path.abspath(str(p)))
            for p in (staging, store_root, homes.platform_libs(), homes.zig()) if p is not None]
    return tuple(out)


def _source_of(pyc: str) -> str | None:
    """The source a `__pycache__/NAME.TAG.pyc` was compiled from."""
    d, name = os.path.split(pyc)
    if os.path.basename(d) != "__pycache__" or not name.endswith(".pyc"):
        return None
    return os.path.join(os.path.dirname(d), name.split(".", 1)[0] + ".py")


_BYTE_CODE: dict[tuple[str, int, int, int, int], bool] = {}  # (pyc, its and source's stamps) -> same


def _byte_code_is_source(pyc: str, source: str) -> bool:
    """Whether byte code `pyc` holds `source` compiled: the import trusts a `.pyc` whose
    header names the source's mtime and size, so a keyed source's byte code is compiled
    again and compared (a project's few files; once per stamps per process)."""
    import importlib.util
    import marshal

    try:
        ps, ss = os.stat(pyc), os.stat(source)
    except OSError:
        return True  # gone since: what was read is no longer there to check (nothing left)
    memo = (pyc, ps.st_mtime_ns, ps.st_size, ss.st_mtime_ns, ss.st_size)
    got = _BYTE_CODE.get(memo)
    if got is None:
        try:
            with open(pyc, "rb") as f:
                data = f.read()
            with open(source, "rb") as f:
                src = f.read()
            flags = int.from_bytes(data[4:8], "little")
            if flags & 1:  # hash-based byte code: its header carries the source's hash
                got = data[8:16] == importlib.util.source_hash(src)
            else:
                opt = pyc.rsplit(".opt-", 1)[1].split(".")[0] if ".opt-" in pyc else ""
                level = {"": 0, "1": 1, "2": 2}.get(opt, 0)
                got = marshal.loads(data[16:]) == compile(src, source, "exec", dont_inherit=True,
                                                          optimize=level)
        except (OSError, ValueError, EOFError, TypeError, SyntaxError):
            got = False
        _BYTE_CODE[memo] = got
    return got
