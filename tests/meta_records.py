"""Records for tests that publish fake entries (`Store.publish` takes a typed record):
`entry_record` and `runtime_record` make one from the fields a test cares about, the
rest filled with placeholders (a test of the store alone needs no valid entry)."""

from __future__ import annotations

from typing import Any

from cutecc.entry.meta import EntryMeta, RuntimeLink, RuntimeMeta
from cutecc.entry.rules import runtime_soname
from cutecc.platforms import BUILD_PLATFORM

NO_RUNTIME = RuntimeLink("0" * 64, runtime_soname("0" * 64), "0" * 64, 0)


def entry_record(d: dict[str, Any]) -> EntryMeta:
    """The record of an entry with meta.json's fields `d` (its files for the store to add)."""
    rt = d.get("runtime")
    return EntryMeta(
        key=d.get("key", ""), kernel=d["kernel"], variant=d["variant"], arch=d["arch"],
        platform=d.get("platform", BUILD_PLATFORM), symbol=d.get("symbol", "__tvm_ffi_fn"),
        library_name=d.get("library", "kernel.so"), files=(),
        runtime=RuntimeLink(**rt) if rt is not None else NO_RUNTIME,
        backward=d.get("backward"), built_at=d.get("built_at"), build_seconds=d.get("build_seconds", 0.0),
        artifact=d.get("artifact"), ptx_isa=d.get("ptx_isa"), entry=d.get("entry", "fake.mod:fn"),
        params=d.get("params", {}), args=d.get("args", []), toolchain=d.get("toolchain", {}),
        key_inputs=d.get("key_inputs", {}), sources=tuple(d.get("sources", ())))


def runtime_record(d: dict[str, Any]) -> RuntimeMeta:
    """The record of a runtime library with meta.json's fields `d`."""
    return RuntimeMeta(key=d.get("key", ""), library_name=d["library"], files=(),
                       built_at=d.get("built_at"), build_seconds=d.get("build_seconds", 0.0),
                       key_inputs=d.get("key_inputs", {}))
