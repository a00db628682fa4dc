"""A cache of synthetic entries published through the store itself (no compiler): what the
record-area and loader bookkeeping tests damage. Each entry's library is a bare ELF header
of the machine asked for, so `verify`'s machine check has something to read."""

from __future__ import annotations

import importlib.metadata
import struct
from pathlib import Path
from typing import Any

from meta_records import entry_record, runtime_record

from cutecc.entry.rules import ARTIFACT_FORMAT, compute_key, runtime_soname
from cutecc.store.view import Entry
from cutecc.store.writer import Store

ARCH = "sm_90a"
ARGS = [{"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n"],
         "layout": "row-major", "align": 16},
        {"kind": "tensor", "name": "out", "role": "output", "dtype": "float32", "shape": ["n"],
         "layout": "row-major", "align": 16}]
MACHINES = {"x86_64": 62, "aarch64": 183}


def elf_header(machine: str, tag: str = "") -> bytes:
    """A 64-bit little-endian ELF shared object's header for `machine`, then `tag`."""
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", head, 16, 3, MACHINES[machine])
    return bytes(head) + tag.encode()


def new_store(root: Path) -> tuple[Store, Entry]:
    """An empty cache at `root` with one runtime library entry."""
    store = Store(root)
    store.ensure()
    inputs = {"runtime": "fake", "n": 1}
    rkey = compute_key(inputs)

    def build(staging: Path) -> Any:
        (staging / runtime_soname(rkey)).write_bytes(b"runtime library")
        return runtime_record({"library": runtime_soname(rkey), "key_inputs": inputs,
                "built_at": "2020-01-01T00:00:00+00:00"})

    return store, store.publish(rkey, build, runtime=True)[0]


def add(store: Store, rt: Entry, kernel: str, variant: str, *, library: bytes | None = None,
        machine: str = "x86_64") -> Entry:
    """Publish an entry of `kernel`/`variant` (its library `library`, else an ELF header of
    `machine`), indexed as a build would."""
    lib = rt.doc["library"]
    toolchain = {"runtime": rt.key, "cutecc_artifact_format": str(ARTIFACT_FORMAT),
                 "apache-tvm-ffi": importlib.metadata.version("apache-tvm-ffi")}
    inputs = {"kernel": kernel, "args": ARGS, "arch": ARCH, "entry": "fake.mod:fn",
              "toolchain": toolchain, "source": variant}
    key = compute_key(inputs)

    def build(staging: Path) -> Any:
        data = library if library is not None else elf_header(machine, f"{kernel} {variant}")
        (staging / "kernel.so").write_bytes(data)
        return entry_record({"kernel": kernel, "variant": variant, "symbol": "__tvm_ffi_fn", "arch": ARCH,
                "entry": "fake.mod:fn", "toolchain": toolchain, "args": ARGS, "key_inputs": inputs,
                "library": "kernel.so", "built_at": "2020-01-01T00:00:00+00:00",
                "build_seconds": 1.5, "runtime": {"key": rt.key, "library": lib, **rt.doc["files"][lib]}})

    return store.publish(key, build)[0]
