"""Composites are kernels wherever kernels are selected (`load(manifest=...)`,
`load(kernels=[a composite])`), and `verify` checks each library's ELF machine against its
entry's platform.

Before the fix: under `load(manifest=...)` a composite of that manifest was not in the
kernel set (so `jax.grad` through a composite's backward failed there);
`load(kernels=["both"])` raised "no entries for kernel(s) both; run `cutecc build`"; and an
aarch64 library under an x86-64 entry was "healthy" to verify (it fails only at dlopen)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import cutecc
from cutecc.commands.verify import verify
from cutecc.store.build_records import CompositeRecord

from .fake_store import add, new_store


def _composite(manifest: str) -> CompositeRecord:
    return CompositeRecord("both", ("k", "j"), ("x",), ("out",), manifest)


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    """A cache holding kernels k and j and composite `both` (k then j), as a build of
    `kernels.toml` records them, and that manifest."""
    store, rt = new_store(tmp_path / "cache")
    k, j = add(store, rt, "k", "a"), add(store, rt, "j", "a")
    manifest = tmp_path / "kernels.toml"
    manifest.write_text("# the manifest these were built from\n")
    store.record_manifest(manifest.resolve(), hashlib.sha256(manifest.read_bytes()).hexdigest(),
                          {"k": {"sm_90a": [k.key]}, "j": {"sm_90a": [j.key]}}, partial=False)
    store.record_composite(_composite(str(manifest.resolve())))
    return store.root, manifest


def test_a_manifests_composites_load_under_that_manifest(built: tuple[Path, Path], tmp_path: Path) -> None:
    root, manifest = built
    ks = cutecc.load(root, arch="sm_90a", manifest=manifest)
    assert list(ks) == ["both", "j", "k"] and "both" in ks
    assert ks.both is not None and type(ks.both).__name__ == "CompositeFn"
    other = tmp_path / "other.toml"  # another manifest's composite is not this one's
    other.write_text("# another\n")
    cutecc.load(root, arch="sm_90a")  # (the cache as a whole still has it)
    from cutecc.store.writer import Store

    Store(root).record_composite(_composite(str(other.resolve())))
    assert "both" not in cutecc.load(root, arch="sm_90a", manifest=manifest)


def test_a_composite_can_be_asked_for_by_name(built: tuple[Path, Path]) -> None:
    root, manifest = built
    for kw in ({}, {"manifest": manifest}):
        ks = cutecc.load(root, arch="sm_90a", kernels=["both"], **kw)
        assert "both" in ks and type(ks.both).__name__ == "CompositeFn", kw
        assert {"j", "k"} <= set(ks)  # what it launches comes with it


def test_verify_checks_each_librarys_machine_against_its_platform(tmp_path: Path) -> None:
    store, rt = new_store(tmp_path / "cache")
    good = add(store, rt, "k", "a", machine="x86_64")
    bad = add(store, rt, "k", "b", machine="aarch64")  # under an x86_64 entry (the default platform)
    assert json.loads((bad.path / "meta.json").read_text()).get("platform", "x86_64") == "x86_64"
    report = verify(store.root)
    found = [p for p in report.problems if p.key == bad.key]
    assert found and found[0].kind == "malformed", report.problems
    assert "aarch64" in found[0].detail and "x86_64" in found[0].detail, found[0].detail
    assert not [p for p in report.problems if p.key == good.key]
    fixed = verify(store.root, fix=True)
    assert fixed.ok and not bad.path.exists() and good.path.exists()
