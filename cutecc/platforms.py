"""Host platforms: the CPU a kernel library's host code runs on, beside the GPU arch.

A kernel library holds GPU code (for an arch) and host code (for a platform): the TVM-FFI
entry that checks the arguments and launches the kernel. cutecc builds on x86-64 only (the
DSL's compiler runs there), and emits host code for `x86_64` (the object the DSL exports)
or for `aarch64` (Grace hosts: the DSL's LLVM IR of the host code, retargeted, see
`cutecc.build.retarget`). The runtime serves only entries of the platform it runs on.

Importing this imports neither the DSL nor JAX: the runtime reads `host_platform`.
"""

from __future__ import annotations

import json
import platform as _platform
import struct
from dataclasses import dataclass

from cutecc.errors import InputError


@dataclass(frozen=True)
class Platform:
    """How cutecc emits host code for one platform."""

    name: str  # the name in manifests, keys, entries and lock lines
    zig_target: str  # `zig cc -target`: the CPU family and the newest glibc the output may need
    triple: str  # the LLVM target triple of retargeted host IR
    datalayout: str  # the LLVM data layout of that triple (what zig's clang emits for it)
    elf_machine: int  # e_machine of its ELF files
    wheel_arch: str  # the arch part of its manylinux wheel tags
    cpu: str  # the baseline CPU its host code is compiled for (LLVM's name)


X86_64 = Platform("x86_64", "x86_64-linux-gnu.2.28", "x86_64-unknown-linux-gnu",
                  "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128",
                  62, "x86_64", "x86-64")
AARCH64 = Platform("aarch64", "aarch64-linux-gnu.2.28", "aarch64-unknown-linux-gnu",
                   "e-m:e-p270:32:32-p271:32:32-p272:64:64-i8:8:32-i16:16:32-i64:64-i128:128-n32:64-S128-Fn32",
                   183, "aarch64", "generic")
PLATFORMS = {p.name: p for p in (X86_64, AARCH64)}
BUILD_PLATFORM = X86_64.name  # where builds run, and the host code a build emits unless told
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_platform() -> str:
    """This process's platform name (`x86_64`, `aarch64`), or the machine's own name
    when cutecc builds for no such platform (then no entry matches it)."""
    m = _platform.machine()
    return _MACHINES.get(m.lower(), m)


def get(name: str) -> Platform:
    """The platform named `name` (a name `check_platform` accepted)."""
    return PLATFORMS[name]


def check_platform(text: object, where: str) -> str:
    """`text` if it names a platform cutecc builds for, else an InputError naming `where`."""
    if isinstance(text, str) and text in PLATFORMS:
        return text
    shown = json.dumps(text) if isinstance(text, str) else repr(text)
    raise InputError(f"{shown} is not a platform cutecc builds for (one of: "
                     f"{', '.join(sorted(PLATFORMS))})", where=where)


def suffix(name: str) -> str:
    """What a label adds for a platform: nothing for the build platform (so the labels of
    x86-64 entries read as they always did), `/aarch64` otherwise."""
    return "" if name == BUILD_PLATFORM else f"/{name}"


def machine_problem(head: bytes, platform: str) -> str | None:
    """Why a library whose first bytes are `head` cannot be loaded on `platform`'s hosts
    (its ELF machine is another's), or None; also None when `head` is no ELF header (the
    hash check and the loader say what that is) or the platform is unknown here."""
    if len(head) < 20 or head[:4] != b"\x7fELF" or platform not in PLATFORMS:
        return None
    (got,) = struct.unpack_from("<H" if head[5] != 2 else ">H", head, 18)
    if got == PLATFORMS[platform].elf_machine:
        return None
    names = {p.elf_machine: p.name for p in PLATFORMS.values()}
    return (f"its ELF machine is {names.get(got, f'number {got}')}, but the entry is for {platform} "
            "hosts: it cannot be loaded there; rebuild it")
