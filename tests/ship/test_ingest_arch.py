"""An entry arriving from anywhere (a remote, a pack, a Ray task) whose library holds a
cubin of another SM than its key's arch is refused by the one verifier (`cutecc.ship.ingest`),
as a local build refuses to publish it: code for another GPU is never served."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from fake_cache import ARCH, ARGS, FakeCache
from helpers import planted_cubin as planted
from meta_records import entry_record

from cutecc.entry.rules import META, compute_key
from cutecc.ship.ingest import Refused, check_whole


def _entry(fake_cache: FakeCache, library: bytes) -> tuple[str, bytes, bytes]:
    """(key, meta.json bytes, library bytes) of an entry published with `library`."""
    rt = fake_cache.runtime
    lib = rt.doc["library"]
    toolchain = {"runtime": rt.key, "cutecc_artifact_format": "2"}
    inputs = {"kernel": "k", "args": ARGS, "arch": ARCH, "entry": "fake.mod:fn", "toolchain": toolchain,
              "source": hashlib.sha256(library).hexdigest()}
    key = compute_key(inputs)

    def build(staging: Path) -> Any:
        (staging / "kernel.so").write_bytes(library)
        return entry_record({"kernel": "k", "variant": "default", "symbol": "__tvm_ffi_fn", "arch": ARCH,
                "entry": "fake.mod:fn", "toolchain": toolchain, "args": ARGS, "key_inputs": inputs,
                "library": "kernel.so", "built_at": "2020-01-01T00:00:00+00:00", "build_seconds": 1.0,
                "runtime": {"key": rt.key, "library": lib, **rt.doc["files"][lib]}})

    e, _ = fake_cache.store.publish(key, build)
    return key, (e.path / META).read_bytes(), (e.path / "kernel.so").read_bytes()


def test_an_arriving_entry_with_a_wrong_arch_cubin_is_refused(fake_cache: FakeCache) -> None:
    key, meta, lib = _entry(fake_cache, b"\x7fELF host" + planted(90))
    assert check_whole(key, meta, {"kernel.so": lib}, 1 << 20)["arch"] == "sm_90a"
    key, meta, lib = _entry(fake_cache, b"\x7fELF host" + planted(80))
    with pytest.raises(Refused, match="cubin 0 is for sm_80, the key's arch is sm_90a"):
        check_whole(key, meta, {"kernel.so": lib}, 1 << 20)
