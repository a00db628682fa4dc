"""`cutecc init`: a commented starter manifest and one CuTe DSL kernel to build from.

Writes `kernels.toml`, `starter_kernels/<name>.py` (plus its `__init__.py`),
`requirements.txt` and `requirements.in` into a directory, and refuses to overwrite anything
that is already there. Every installed distribution a kernel reaches is a key input, so a
team's committed kernels.lock reproduces only in the environment it was made in:
`requirements.txt` pins that environment as it is installed here (every distribution of
cutecc's build closure, `name==version`), so installing it reproduces the lock `cutecc build`
writes here; `requirements.in` holds the loose requirements, to re-pin on purpose.
"""

from __future__ import annotations

import keyword
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.atomic import atomic_write
from cutecc.commands.report import Report
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.pins import installed_pins

PACKAGE = "starter_kernels"

_MANIFEST = '''\
# kernels.toml: the CuTe DSL kernels cutecc builds ahead of time.
# `cutecc build` compiles every kernel x variant x arch below into the cache and writes
# kernels.lock; `cutecc list` shows what was built; in JAX, `cutecc.load().{name}(x, factor=2.0)`.
# Reference: docs/manifest.md in the cutecc repository, and `cutecc schema` for editor completion.
format = 1
archs = ["sm_90a"]          # target GPUs; `cutecc build --arch sm_100a` overrides
python_path = ["."]         # where entry modules are imported from, relative to this file

[build]
# The pinned build environment (from requirements.in, see there): a build in another one
# names the distributions that differ, before it compiles, and points here.
pins = "requirements.txt"

[kernel.{name}]
# A @cute.jit launcher, "module:attribute".
entry = "{package}.{name}:{name}"
# The launcher's arguments in its own order. Tensors: dtype and shape (ints are static,
# names symbolic: a shared name means equal extents); role input (default), output or inout.
args = [
  {{ name = "x", dtype = "float32", shape = ["n"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
  {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},  # a call keyword
  {{ kind = "stream" }},    # the launcher's CUDA stream: JAX's is passed
]
# Compile-time (Constexpr) keyword arguments; "$threads" takes each variant's value.
constants = {{ threads = "$threads" }}
# One artifact per value: the call picks the variant whose contract matches.
variants = {{ threads = [128] }}
'''

_KERNEL = '''\
"""A starter CuTe DSL kernel: out[i] = x[i] * factor."""

import cutlass
import cutlass.cute as cute


@cute.kernel
def _{name}_kernel(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * factor


@cute.jit
def {name}(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
           threads: cutlass.Constexpr = 128):
    n = x.shape[0]
    _{name}_kernel(x, out, factor, n).launch(
        grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1], stream=stream)
'''


_REQUIREMENTS = """\
# What this project's build needs, loosely: requirements.txt pins it exactly. To re-pin on
# purpose (newer releases move every key): add what your kernels import below, then
#   uv pip compile requirements.in --generate-hashes -o requirements.txt
# in a fresh environment install that, `cutecc build`, and commit pins and lock together.
{requirements}
"""

_PINS = """\
# The build environment of this project's kernels, pinned as `cutecc init` found it
# installed (cutecc {cutecc}, Python {python}, {platform}). Every installed distribution a
# kernel's code reaches is part of its key, so kernels.lock reproduces only in this
# environment: install exactly these, then cutecc itself (its wheel or checkout) alone:
#   pip install -r requirements.txt && pip install --no-deps CUTECC
# A build elsewhere names the distribution that differs and the pin to change (kernels.toml's
# [build] pins names this file). Add hashes (the same versions; pip then installs only the
# files these hashes name, `pip install --require-hashes -r requirements.txt`):
#   uv pip compile requirements.txt --generate-hashes -o requirements.txt
# Pin what your kernels import too (`name==version`, as installed), and commit this file
# with kernels.lock.
{pins}
"""


def build_requirements() -> list[str]:
    """What cutecc's build side needs (its own dependencies and its `build` extra's), as
    its installed metadata names them, without the extra's marker."""
    import importlib.metadata as md

    out = []
    for r in md.requires("cutecc") or []:
        spec, _, marker = r.partition(";")
        marker = marker.strip()
        if "extra ==" not in marker:
            out.append(r.strip())
        elif marker.replace(" ", "") in ('extra=="build"', "extra=='build'"):
            out.append(spec.strip())
    return out


@dataclass(frozen=True)
class InitReport(Report):
    directory: Path
    written: tuple[Path, ...]

    def to_json(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "written": [str(p) for p in self.written]}

    def lines(self, verbose: int = 0) -> list[str]:
        return [f"wrote {p}" for p in self.written] + [
            f"next: cd {self.directory} && cutecc build"]


def init(directory: str | Path = ".", *, name: str = "scale") -> InitReport:
    """Write the starter manifest and kernel into `directory` (created if needed)."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise CuteccError(f"{name!r} is not a kernel name (a Python identifier not starting "
                          "with _)", where="--name")
    root = Path(directory)
    files = {root / "kernels.toml": _MANIFEST.format(name=name, package=PACKAGE),
             root / PACKAGE / "__init__.py": "",
             root / PACKAGE / f"{name}.py": _KERNEL.format(name=name),
             root / "requirements.txt": _pins_file(),
             root / "requirements.in": _REQUIREMENTS.format(requirements="\n".join(build_requirements()))}
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise WorkError(f"already exists: {', '.join(existing)}; nothing written",
                        where=str(root))
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text.encode())
    except OSError as e:
        raise WorkError(f"cannot write: {e.strerror}", where=str(e.filename or root)) from None
    return InitReport(root, tuple(files))


def _pins_file() -> str:
    import importlib.metadata as md

    try:
        version = md.version("cutecc")
    except md.PackageNotFoundError:
        version = "?"
    return _PINS.format(cutecc=version, python=platform.python_version(),
                        platform=f"{sys.platform} {platform.machine()}",
                        pins="\n".join(installed_pins(build_requirements())))
