"""A process holds kernel libraries by content: a key already loaded with other bytes (a
second cache, a pack or a signed lock pinning another SHA-256) is refused naming both
sources, never served by the first library loaded under that key.

Before the fix, the second load returned the first library's function: a signed lock
pinning one SHA-256 ran another library's code because another kernel set had loaded the
key first, in either order (`assert first is not second` failed: the same function).
The bookkeeping is tested here without a GPU (the dlopen is replaced by a stand-in that
records which bytes it was given); tests/gpu/test_one_library_per_content.py calls real
libraries."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

import cutecc
from cutecc.errors import CuteccError
from cutecc.runtime import library

from .fake_store import add, elf_header, new_store


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """A fresh registry of loaded libraries; each "dlopen" records the bytes it was given
    and returns a module whose function says which bytes it runs."""
    monkeypatch.setattr(library, "_functions", {})
    monkeypatch.setattr(library, "_registered", {})
    monkeypatch.setattr(library, "ensure_runtime", lambda *a, **k: None)
    opened: list[bytes] = []

    def load_bytes(data: bytes, name: str) -> Any:
        opened.append(data)
        return types.SimpleNamespace(__tvm_ffi_fn=types.SimpleNamespace(runs=data))

    monkeypatch.setattr(library, "_load_bytes", load_bytes)
    fake_jax = types.SimpleNamespace(register_ffi_target=lambda *a, **k: None)
    monkeypatch.setitem(__import__("sys").modules, "jax_tvm_ffi", fake_jax)
    return opened


def _two_caches(tmp_path: Path, same: bool = False) -> tuple[Any, Any]:
    """Kernel `k`'s build `a` in two caches: one key, the libraries' bytes differing
    unless `same`."""
    builds = []
    for name in ("first", "second"):
        store, rt = new_store(tmp_path / name)
        tag = "one" if same or name == "first" else "other"
        add(store, rt, "k", "a", library=elf_header("x86_64", tag))
        (b,) = cutecc.load(store.root, arch="sm_90a").k.builds
        builds.append(b)
    assert builds[0].key == builds[1].key and (builds[0].sha256 == builds[1].sha256) == same
    return builds[0], builds[1]


@pytest.mark.parametrize("order", ["first-then-second", "second-then-first"])
def test_a_key_loaded_with_other_bytes_is_refused_naming_both(tmp_path: Path, loads: list[bytes],
                                                              order: str) -> None:
    a, b = _two_caches(tmp_path)
    if order == "second-then-first":
        a, b = b, a
    first = library.load_function(a.key, a.library, a.sha256, a.size, a.symbol, "k a")
    assert first.runs == a.library.read_bytes()
    with pytest.raises(CuteccError) as err:
        second = library.load_function(b.key, b.library, b.sha256, b.size, b.symbol, "k b")
        assert second is not first, "served the first library's code for other bytes"
    msg = str(err.value)
    assert str(a.library) in msg and str(b.library) in msg, msg
    assert a.sha256[:16] in msg and b.sha256[:16] in msg, msg
    assert len(loads) == 1  # the other bytes were never opened either


def test_registering_a_key_loaded_with_other_bytes_is_refused(tmp_path: Path, loads: list[bytes]) -> None:
    """The JAX path (`Build.register`, what a call lowers to) holds the same rule."""
    a, b = _two_caches(tmp_path)
    assert a.register("k") == library.target_name(a.key)
    with pytest.raises(CuteccError, match="other bytes"):
        b.register("k")
    with pytest.raises(CuteccError, match="other bytes"):  # nor through the function
        library.load_function(b.key, b.library, b.sha256, b.size, b.symbol, "k b")


def test_the_same_bytes_from_another_cache_share_one_library(tmp_path: Path, loads: list[bytes]) -> None:
    a, b = _two_caches(tmp_path, same=True)
    first = library.load_function(a.key, a.library, a.sha256, a.size, a.symbol, "k a")
    assert library.load_function(b.key, b.library, b.sha256, b.size, b.symbol, "k b") is first
    assert b.register("k") == a.register("k")
    assert len(loads) == 1
