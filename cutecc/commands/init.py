"""`cutecc init`: a commented starter manifest and one CuTe DSL kernel to build from.

Writes `kernels.toml`, `starter_kernels/<name>.py` (plus its `__init__.py`) and
`requirements.in` (the build environment to pin: every installed distribution a kernel
reaches is a key input, so a team's committed kernels.lock reproduces only in pinned
environments) into a directory, and refuses to overwrite anything that is already there.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.atomic import atomic_write
from cutecc.commands.report import Report
from cutecc.errors import CuteccError, WorkError

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
# The build environment of this project's kernels. Every installed distribution their code
# reaches is part of their keys, so kernels.lock reproduces only in one environment: pin it
# whole, with hashes, and commit the pins with kernels.lock.
#   uv pip compile requirements.in --generate-hashes -o requirements.txt
# CI installs exactly that, then cutecc itself (a checkout or its wheel) without dependencies:
#   pip install --require-hashes -r requirements.txt && pip install --no-deps CUTECC
# Refresh on purpose, pins and locks together: the same compile with --upgrade, then
# `cutecc build`, and commit both files. Add what your kernels import below.
{requirements}
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
