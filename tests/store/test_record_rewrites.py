"""A build record that already says what a build would write is not written again (a
no-op build writes no generation, manifest record or composite), and one that would change,
or that readers would not take as it is, is (`cutecc.store.writer`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cutecc.store.writer as writer
from cutecc.store.build_records import CompositeRecord
from cutecc.store.view import StoreView
from cutecc.store.writer import Store

T0 = "2026-01-01T00:00:00+00:00"
T1, T2, T3 = "2026-11-27T04:00:00+00:00", "2026-11-27T05:00:00+00:00", "2026-11-27T06:00:00+00:00"
K1, K2 = "1" * 64, "2" * 64
M = "/w/kernels.toml"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The writer's time: set `clock[0]`."""
    now = [T1]
    monkeypatch.setattr(writer, "now_iso", lambda: now[0])
    return now


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "c")
    s.ensure()
    return s


def _stamp(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_ino, st.st_mtime_ns


def _built_at(path: Path) -> str:
    return json.loads(path.read_bytes())["built_at"]


def test_the_same_generation_is_not_written_again(store: Store, clock: list[str]) -> None:
    store.record_generations("k", {"sm_90a": [K1], "sm_100a": [K2]}, M)
    paths = [store.layout.generation("k", a) for a in ("sm_90a", "sm_100a")]
    before = [_stamp(p) for p in paths]
    clock[0] = T2
    store.record_generations("k", {"sm_90a": [K1], "sm_100a": [K2]}, M)
    assert [_stamp(p) for p in paths] == before and {_built_at(p) for p in paths} == {T1}
    assert StoreView(store.root).generation_manifest("k") == Path(M)


@pytest.mark.parametrize("change", [
    {"per_arch": {"sm_90a": [K1, K2], "sm_100a": [K2]}},  # keys
    {"manifest": "/w/other.toml"},
    {"fallbacks": {"fallback": {"ref": "pkg.mod:fn", "sha256": "ab" * 32}}},
])
def test_a_generation_that_would_change_is_written_whole(store: Store, clock: list[str],
                                                         change: dict) -> None:
    store.record_generations("k", {"sm_90a": [K1], "sm_100a": [K2]}, M)
    clock[0] = T2
    args = {"per_arch": {"sm_90a": [K1], "sm_100a": [K2]}, "manifest": M, "fallbacks": None, **change}
    store.record_generations("k", args["per_arch"], args["manifest"], args["fallbacks"])
    # every arch of the build rewritten: they stay the kernel's newest records together
    assert {_built_at(store.layout.generation("k", a)) for a in ("sm_90a", "sm_100a")} == {T2}


@pytest.mark.parametrize("other_at, rewritten", [(T2, True), (T1, True), (T0, False)])
def test_a_generation_not_newer_than_another_archs_is_written_again(
        store: Store, clock: list[str], other_at: str, rewritten: bool) -> None:
    """Another manifest's build of the kernel for another arch, as new or newer (a tie
    included): the unchanged record is written again, so the newest names this build."""
    store.record_generations("k", {"sm_90a": [K1]}, M)
    clock[0] = other_at
    store.record_generations("k", {"sm_100a": [K2]}, "/w/other.toml")
    clock[0] = T3
    store.record_generations("k", {"sm_90a": [K1]}, M)
    assert _built_at(store.layout.generation("k", "sm_90a")) == (T3 if rewritten else T1)
    assert StoreView(store.root).generation_manifest("k") == Path(M)


@pytest.mark.parametrize("spoil", ["group-writable", "other mode", "link", "damaged"])
def test_a_generation_readers_would_not_take_as_is_is_written_again(
        store: Store, clock: list[str], tmp_path: Path, spoil: str) -> None:
    store.record_generations("k", {"sm_90a": [K1]}, M)
    path = store.layout.generation("k", "sm_90a")
    if spoil == "group-writable":
        path.chmod(0o664)
    elif spoil == "other mode":
        path.chmod(0o600)
    elif spoil == "link":
        (tmp_path / "elsewhere.json").write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.write_bytes(path.read_bytes()[:-5])
    clock[0] = T2
    store.record_generations("k", {"sm_90a": [K1]}, M)
    assert not path.is_symlink() and oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert _built_at(path) == T2


def test_the_same_manifest_record_is_not_written_again(store: Store, clock: list[str]) -> None:
    man = Path(M)
    store.record_manifest(man, "ef" * 32, {"k": {"sm_90a": [K1]}}, partial=False)
    path = store.layout.manifest_record(man)
    before = _stamp(path)
    clock[0] = T2
    store.record_manifest(man, "ef" * 32, {"k": {"sm_90a": [K1]}}, partial=False)
    store.record_manifest(man, "ef" * 32, {"k": {"sm_90a": [K1]}}, partial=True)
    assert _stamp(path) == before and _built_at(path) == T1
    store.record_manifest(man, "ef" * 32, {"j": {"sm_90a": [K2]}}, partial=True)  # adds j
    rec = StoreView(store.root).manifest_entries(man, "ef" * 32)
    assert rec is not None and rec.all_keys() == {K1, K2} and rec.built_at == T2
    clock[0] = T3
    store.record_manifest(man, "01" * 32, {"j": {"sm_90a": [K2]}}, partial=False)  # new bytes
    assert StoreView(store.root).manifest_entries(man, "01" * 32) is not None and _built_at(path) == T3


def test_the_same_composite_is_not_written_again(store: Store) -> None:
    rec = CompositeRecord("c", ("a", "b"), ("x",), ("y",), M)
    store.record_composite(rec)
    path = store.layout.composite("c")
    before = _stamp(path)
    store.record_composite(rec)
    assert _stamp(path) == before
    store.record_composite(CompositeRecord("c", ("a",), ("x",), ("y",), M))
    assert _stamp(path) != before and json.loads(path.read_bytes())["launches"] == ["a"]
