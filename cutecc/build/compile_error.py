"""Where a kernel's compile failed: the innermost frame of the project's or a published
package's code in the exception's traceback, and the whole traceback, escaped.

The DSL runs a kernel's Python while it traces it, so an error in the kernel (a misspelt
`cute.math` function, a store of the wrong dtype) is raised a few frames below the
kernel's own line, inside the DSL. The line that matters is the innermost frame that is
neither the DSL's (`cutlass`), nor cutecc's (its generated wrapper included), nor the
standard library's; the DSL's frames below it are only counted. The chain of causes is
searched from the deepest, so an error the DSL wraps still points at the kernel.

Tracebacks carry text from the user's files (source lines, messages): every character that
is not printable is escaped before it reaches a terminal.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_MAX_CHAIN = 16  # causes followed at most
# The DSL's top-level modules (its MLIR bindings, and the CUDA bindings it calls), whose
# frames are counted as the DSL's.
_DSL_MODULES = frozenset({"cutlass", "cutlass_dsl", "_mlir", "cuda"})
_MAX_TRACEBACK = 64 * 1024  # characters of traceback kept


@dataclass(frozen=True)
class KernelFrame:
    """The innermost frame of the kernel's code: its file (relative to the working directory
    when under it), line, source line (escaped) and what ran below it (`below`: frame counts
    by top-level package, innermost last)."""

    file: str
    line: int
    source: str
    below: tuple[tuple[str, int], ...]

    @property
    def place(self) -> str:
        return f"{self.file}:{self.line}"

    def summary(self) -> str:
        """`(+4 frames in cutlass)`, or "" when the error was raised in the kernel's line."""
        if not self.below:
            return ""
        return "(+" + ", ".join(f"{n} frame{'s' * (n != 1)} in {pkg}" for pkg, n in self.below) + ")"


def escaped(text: str) -> str:
    """`text` on one line: every character that is not printable, escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def escaped_lines(text: str) -> str:
    """`text` with its line breaks kept and every other unprintable character escaped."""
    return "\n".join(escaped(line) for line in text.split("\n"))


def chain(e: BaseException) -> list[BaseException]:
    """`e` and the exceptions it was raised from or during, outermost first."""
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(out) < _MAX_CHAIN:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return out


def kernel_frame(e: BaseException) -> KernelFrame | None:
    """The innermost frame of the kernel's code in `e`'s chain (the deepest cause first):
    the project's own (a file under the working directory that no installed package holds)
    where there is one, else a published package's (a library's kernel, or code the
    project's calls into); None when none is the kernel's (the DSL refused the call before
    the kernel ran)."""
    for project_only in (True, False):
        found = _innermost(e, project_only)
        if found is not None:
            return found
    return None


def _innermost(e: BaseException, project_only: bool) -> KernelFrame | None:
    cwd = os.path.abspath(os.getcwd()) if project_only else ""
    for exc in reversed(chain(e)):
        frames = _frames(exc.__traceback__)
        for i in range(len(frames) - 1, -1, -1):
            filename, line, module = frames[i]
            if _owner(filename, module) is None and (not project_only or _in_project(filename, cwd)):
                below: dict[str, int] = {}
                for f, _, m in frames[i + 1:]:
                    pkg = _owner(f, m) or m.partition(".")[0] or "?"
                    below[pkg] = below.get(pkg, 0) + 1
                return KernelFrame(escaped(_shown(filename)), line, escaped(_source(filename, line)),
                                   tuple(below.items()))
    return None


def traceback_text(e: BaseException) -> str:
    """The whole traceback of `e` and its causes, escaped, bounded."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip("\n")
    if len(text) > _MAX_TRACEBACK:
        text = "... (cut)\n" + text[-_MAX_TRACEBACK:]
    return escaped_lines(text)


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    out = []
    while tb is not None:
        frame = tb.tb_frame
        name = frame.f_globals.get("__name__")
        out.append((frame.f_code.co_filename, tb.tb_lineno or 0, name if isinstance(name, str) else ""))
        tb = tb.tb_next
    return out


def _owner(filename: str, module: str) -> str | None:
    """Whose frame this is when it is not the kernel's: "cutlass" (the DSL), "cutecc", or
    "python" (the standard library, or code with no file); None for the kernel's code."""
    top = module.partition(".")[0]
    if top.startswith("cutecc"):  # cutecc's own, and the wrapper it generates
        return "cutecc"
    if top in _DSL_MODULES:
        return "cutlass"
    if not filename or filename.startswith("<"):
        return "python"
    path = os.path.abspath(filename)
    if any(path.startswith(root + os.sep) for root in _dsl_roots()):
        return "cutlass"
    if any(path.startswith(root + os.sep) for root in _stdlib_roots()) \
            and not any(path.startswith(root + os.sep) for root in _package_roots()):
        return "python"
    return None


def _in_project(filename: str, cwd: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(cwd + os.sep) and not any(path.startswith(root + os.sep)
                                                     for root in _package_roots())


def _dsl_roots() -> tuple[str, ...]:
    """The directories the DSL's packages are imported from (its `_mlir` too)."""
    roots = []
    for name in ("cutlass", "cutlass._mlir"):
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None)
        if isinstance(f, str):
            roots.append(os.path.dirname(os.path.abspath(f)))
    return tuple(roots)


def _stdlib_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.abspath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths)


def _package_roots() -> tuple[str, ...]:
    """Where installed packages live (inside the standard library's folder on some systems)."""
    paths = sysconfig.get_paths()
    return tuple(os.path.abspath(paths[k]) for k in ("purelib", "platlib") if k in paths)


def _shown(filename: str) -> str:
    """`filename` relative to the working directory when under it (the project's own
    files, as an editor opens them), else as it is."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return filename


def _source(filename: str, line: int) -> str:
    """The frame's source line (stripped, bounded), "" when its file cannot be read."""
    return linecache.getline(filename, line).strip()[:200]
