"""Shared fixtures: a tiny kernel project, and real builds made once per session.

The keyed store makes sharing builds safe: a test that needs a built cache copies the
session's (sources are keyed by their path relative to the manifest, so the copy keeps
its keys). A test that uses a fixture which compiles is marked `slow` automatically, so
`pytest -m "not slow"` never compiles.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, TOY_KERNEL, run_cli, toy_manifest, write_toy_project

# Fixtures that compile kernels through the DSL (directly or through another of these).
COMPILING_FIXTURES = frozenset({"example_cache", "toy_cache", "built_once", "built", "toy8", "toy",
                                "train_cache", "examples_build", "layout_cache"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if COMPILING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def toy_project(tmp_path: Path) -> Path:
    """A project with one small kernel (two variants); returns its manifest path."""
    pkg = tmp_path / "proj" / "toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(TOY_KERNEL)
    manifest = tmp_path / "proj" / "kernels.toml"
    manifest.write_text(toy_manifest())
    return manifest


@dataclass(frozen=True)
class ToyBuild:
    """The toy project (threads=64 and 128) and a cache holding its two entries."""

    manifest: Path
    cache: Path

    def copy(self, dest: Path) -> ToyBuild:
        """A private copy of project and cache under `dest`, with the same keys."""
        shutil.copytree(self.manifest.parent, dest / "proj")
        shutil.copytree(self.cache, dest / "c")
        return ToyBuild(dest / "proj" / self.manifest.name, dest / "c")


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory: pytest.TempPathFactory) -> ToyBuild:
    """The toy project built once per session (copy it before changing anything)."""
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    from cutecc.commands.build import build

    base = tmp_path_factory.mktemp("toy-cache")
    manifest = write_toy_project(base / "proj")
    report = build(manifest, cache_dir=base / "c", jobs=2)
    assert report.ok and report.count("built") == 2, report.warnings()
    return ToyBuild(manifest, base / "c")


@pytest.fixture(scope="session")
def example_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's kernels.toml built once for sm_90a into a fresh cache.

    Set CUTECC_TEST_CACHE to reuse a cache built beforehand (the GPU suite does: the
    device machine has no DSL).
    """
    pre = os.environ.get("CUTECC_TEST_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp("example-cache")
    r = run_cli("build", str(REPO / "kernels.toml"), "--cache-dir", str(cache), "--arch", "sm_90a",
                "--no-lock")  # leave the repository's kernels.lock to `cutecc build` runs
    assert r.returncode == 0, r.stderr + r.stdout
    return cache


@pytest.fixture(scope="session")
def layout_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gpu/layout_kernels (layouts, padded buffers, call keywords) built once for sm_90a.

    Set CUTECC_LAYOUT_CACHE to reuse a cache built beforehand (the GPU suite does).
    """
    pre = os.environ.get("CUTECC_LAYOUT_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp("layout-cache")
    r = run_cli("build", str(REPO / "tests" / "gpu" / "layout_kernels" / "kernels.toml"),
                "--cache-dir", str(cache), "--arch", "sm_90a", "--no-lock")
    assert r.returncode == 0, r.stderr + r.stdout
    return cache


@pytest.fixture(scope="session")
def train_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gpu/train_kernels (derived extents and scalars, scratch) built once for sm_90a.

    Set CUTECC_TRAIN_CACHE to reuse a cache built beforehand (the GPU suite does).
    """
    pre = os.environ.get("CUTECC_TRAIN_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp("train-cache")
    r = run_cli("build", str(REPO / "tests" / "gpu" / "train_kernels" / "kernels.toml"),
                "--cache-dir", str(cache), "--arch", "sm_90a", "--no-lock")
    assert r.returncode == 0, r.stderr + r.stdout
    return cache


@pytest.fixture(scope="session")
def examples_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/kernels.toml (published kernels, forward and backward) built once for sm_90a.

    Set CUTECC_EXAMPLES_CACHE to reuse a cache built beforehand (the GPU suite does); else
    it needs the build extra and the examples extra (quack-kernels, flash-attn-4, torch).
    """
    pre = os.environ.get("CUTECC_EXAMPLES_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    for mod in ("quack", "flash_attn.cute"):
        pytest.importorskip(mod, reason="the examples extra (quack-kernels, flash-attn-4) is not installed")
    cache = tmp_path_factory.mktemp("examples-cache")
    r = run_cli("build", str(REPO / "examples" / "kernels.toml"), "--cache-dir", str(cache),
                "--no-lock")
    assert r.returncode == 0, r.stderr + r.stdout
    return cache
