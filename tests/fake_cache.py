"""A cache of synthetic but well-formed entries (their keys hash their key inputs, as a real
build's do), published through the store itself: the store's, entry's and ship's tests need
no compiler (`fake_cache`, `add_entries`: fixtures of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from meta_records import entry_record, runtime_record

from cutecc.entry.rules import compute_key, file_record, runtime_soname
from cutecc.store.view import Entry
from cutecc.store.writer import Store

ARCH = "sm_90a"
LONG_AGO = "2020-01-01T00:00:00+00:00"  # built_at of an entry nobody used since
ARGS = [{"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n"],
         "layout": "row-major", "align": 16},
        {"kind": "tensor", "name": "out", "role": "output", "dtype": "float32", "shape": ["n"],
         "layout": "row-major", "align": 16}]


@dataclass
class FakeCache:
    store: Store
    runtime: Entry

    def add(self, kernel: str, variant: str, *, built_at: str = LONG_AGO) -> Entry:
        """Publish an entry of `kernel`/`variant` linked to the cache's runtime library."""
        rt = self.runtime
        lib = rt.doc["library"]
        toolchain = {"runtime": rt.key, "cutecc_artifact_format": "2"}
        inputs = {"kernel": kernel, "args": ARGS, "arch": ARCH, "entry": "fake.mod:fn",
                  "toolchain": toolchain, "source": variant}
        key = compute_key(inputs)

        def build(staging: Path) -> Any:
            (staging / "kernel.so").write_bytes(f"{kernel} {variant}".encode())
            return entry_record({"kernel": kernel, "variant": variant, "symbol": "__tvm_ffi_fn", "arch": ARCH,
                    "entry": "fake.mod:fn", "toolchain": toolchain, "args": ARGS, "key_inputs": inputs,
                    "library": "kernel.so", "built_at": built_at, "build_seconds": 1.5,
                    "runtime": {"key": rt.key, "library": lib, **rt.doc["files"][lib]}})

        return self.store.publish(key, build)[0]


@pytest.fixture
def fake_cache(tmp_path: Path) -> FakeCache:
    store = Store(tmp_path / "cache")
    store.ensure()
    inputs = {"runtime": "fake", "n": 1}
    rkey = compute_key(inputs)

    def build(staging: Path) -> Any:
        (staging / runtime_soname(rkey)).write_bytes(b"runtime library")
        return runtime_record({"library": runtime_soname(rkey), "key_inputs": inputs, "built_at": LONG_AGO})

    rt, _ = store.publish(rkey, build, runtime=True)
    assert rt.doc["files"][runtime_soname(rkey)] == file_record(rt.path / runtime_soname(rkey))
    return FakeCache(store, rt)


@pytest.fixture
def add_entries(fake_cache: FakeCache) -> Callable[..., list[Entry]]:
    def add(*variants: str, kernel: str = "k", built_at: str = LONG_AGO) -> list[Entry]:
        return [fake_cache.add(kernel, v, built_at=built_at) for v in variants]

    return add
