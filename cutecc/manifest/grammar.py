"""The manifest's grammar: its names and limits, built-in hardware profiles, the keys each
table takes, the error context (`_Ctx`: file and key path) and the small validators.

The modules of `cutecc.manifest` share the underscored names here among themselves.
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path
from typing import Any

from cutecc.archs import is_arch
from cutecc.errors import CuteccError
from cutecc.names import KERNEL_SET_RESERVED
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS

MANIFEST_FORMAT = 1
MANIFEST_NAMES = ("kernels.toml", "pyproject.toml")
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_VARIANTS_PER_KERNEL = 10_000
MAX_TUPLE_DEPTH = 8  # launchers take tuples of tensors, not trees; deeper is a mistake
# Matched in full (`fullmatch`): a `$` anchor would accept a trailing newline.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT = rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*"
# An entry may index into what it names (`mod:factory[1]`: the second launcher of the tuple
# a factory returns; the factory is called first when factory_args is set).
ENTRY_RE = re.compile(rf"{_IMPORT}(\[(0|[1-9][0-9]{{0,5}})\])*")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A kernel is an attribute of the loaded kernel set: these names are the set's own.
RESERVED_KERNEL_NAMES = KERNEL_SET_RESERVED
MAX_STATIC_EXTENT = 2**31 - 1  # extents and strides are 32-bit in the compiled layouts
MAX_ALIGN = 256  # bytes: beyond any vector or TMA alignment the DSL asks for
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

# Facts every built-in profile shares (what torch's device properties report).
_SM_COMMON = {"smem_per_block": 49152, "max_threads_per_sm": 2048, "regs_per_sm": 65536, "warp_size": 32}
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "h100": {"arch": "sm_90a", "sm_count": 132, "max_smem_per_block": 232448,
             "l2_bytes": 52428800, "max_cluster_size": 8, "name": "NVIDIA H100 80GB HBM3",
             "memory_bytes": 81559 << 20, "smem_per_sm": 233472, **_SM_COMMON},
    "h200": {"arch": "sm_90a", "sm_count": 132, "max_smem_per_block": 232448,
             "l2_bytes": 62914560, "max_cluster_size": 8, "name": "NVIDIA H200",
             "memory_bytes": 143771 << 20, "smem_per_sm": 233472, **_SM_COMMON},
    "a100": {"arch": "sm_80", "sm_count": 108, "max_smem_per_block": 166912,
             "l2_bytes": 41943040, "max_cluster_size": 1, "name": "NVIDIA A100-SXM4-80GB",
             "memory_bytes": 81920 << 20, "smem_per_sm": 167936, **_SM_COMMON},
    "b200": {"arch": "sm_100a", "sm_count": 148, "max_smem_per_block": 232448,
             "l2_bytes": 132120576, "max_cluster_size": 16, "name": "NVIDIA B200",
             "memory_bytes": 183359 << 20, "smem_per_sm": 233472, **_SM_COMMON},
}

_TOP_KEYS = {"format", "archs", "platforms", "profile", "python_path", "compile_options", "hardware",
             "kernel", "env", "build"}
_BUILD_KEYS = {"executor", "ray_address", "remote", "compile_timeout", "compile_memory", "pins", "inputs"}
EXECUTORS = ("local", "ray")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KERNEL_KEYS = {"entry", "factory_args", "args", "constants", "variants", "archs", "profile",
                "compile_options", "grad", "description", "symbols", "tune", "derive", "shard",
                "reshard", "fallback", "fallback_torch", "relations", "from_shapes"}
# What a symbol's divisibility may promise: a power of two its integer can hold, 2^62 for a
# 64-bit symbol (cutlass_call's dynamic layouts carry 2^21 on a 64-bit stride), 2^30 for a
# 32-bit one (the default width).
MAX_DIVISIBILITY = 1 << 62
MAX_DIVISIBILITY_32 = 1 << 30
_TENSOR_KEYS = {"kind", "name", "role", "dtype", "shape", "runtime", "buffer", "layout", "mode", "align",
                "param", "zero", "saved", "reduce", "broadcast", "may_alias", "stride", "present",
                "extents_only"}
_SCALAR_KEYS = {"kind", "name", "dtype", "default", "param", "value"}


class _Ctx:
    """Where we are in the file, for error messages."""

    def __init__(self, file: Path) -> None:
        self.file = str(file)

    def fail(self, path: str, message: str) -> CuteccError:
        return CuteccError(_one_line(message), where=self.file, key_path=_one_line(path))


def _one_line(text: str) -> str:
    """`text` with control characters escaped: a name quoted from the file (a TOML key may
    hold a newline) must not break the one-line error."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
IMPORT_RE = re.compile(_IMPORT)  # "package.module:attr[.attr]"


# Small validators --------------------------------------------------------------------


def _no_unknown(ctx: _Ctx, d: dict[str, Any], allowed: set[str], kp: str) -> None:
    for k in d:
        if k not in allowed:
            raise ctx.fail(kp, f'unknown key "{k}" (allowed: {", ".join(sorted(allowed))})')


def _str(ctx: _Ctx, kp: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ctx.fail(kp, f"must be a string, got {_tname(v)}")
    return v


def _platforms(ctx: _Ctx, kp: str, v: Any) -> tuple[str, ...]:
    """The manifest's `platforms`: host platforms cutecc builds for, each once."""
    if not isinstance(v, list) or not v:
        raise ctx.fail(kp, f'must be a non-empty array of platforms such as ["{BUILD_PLATFORM}"]')
    out: list[str] = []
    for i, p in enumerate(v):
        if p not in PLATFORMS:
            raise ctx.fail(f"{kp}[{i}]", f"{json.dumps(p) if isinstance(p, str) else _tname(p)} is "
                           f"not a platform cutecc builds for (one of: {', '.join(sorted(PLATFORMS))})")
        if p not in out:
            out.append(p)
    return tuple(out)


def _archs(ctx: _Ctx, kp: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ctx.fail(kp, "must be a non-empty array of architectures such as \"sm_90a\"")
    out = []
    for i, a in enumerate(v):
        if not is_arch(a):
            raise ctx.fail(f"{kp}[{i}]", f'"{a}" is not a GPU architecture such as "sm_90a"')
        if a not in out:
            out.append(a)
    return tuple(out)


def _table(ctx: _Ctx, kp: str, v: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(v, dict):
        raise ctx.fail(kp, f"must be a table, got {_tname(v)}")
    for k in v:
        if not NAME_RE.fullmatch(k) or keyword.iskeyword(k):
            raise ctx.fail(f"{kp}.{k}", "a keyword argument name must be an identifier")
    return tuple(v.items())


def _name(ctx: _Ctx, kp: str, a: dict[str, Any]) -> str:
    if "name" not in a:
        raise ctx.fail(kp, 'missing "name"')
    n = a["name"]
    if not isinstance(n, str) or not NAME_RE.fullmatch(n) or keyword.iskeyword(n):
        raise ctx.fail(f"{kp}.name", f"{n!r} is not a valid identifier")
    if n.startswith("cutecc_"):
        raise ctx.fail(f"{kp}.name", 'names starting with "cutecc_" are reserved')
    return n


def _tname(v: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)
