"""Shared fixtures: the toy project, and real builds made once per session.

The keyed store makes sharing builds safe: a test that needs a built cache copies the
session's (sources are keyed by their path relative to the manifest, so the copy keeps
its keys).

`slow` has one rule: a test is slow when it compiles kernels through the DSL, which it
says by requesting the `dsl` fixture (as an argument, through a fixture that requests it,
or with `pytest.mark.usefixtures("dsl")`), or by using one of the session builds below
that a GPU host may take prebuilt. The marker is derived here; no test sets it by hand.
So `pytest -m "not slow"` never compiles (the quick selection, CONTRIBUTING.md "On a fresh machine").
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_cache import add_entries, fake_cache  # noqa: F401  (fixtures: the store's, entry's and ship's tests)
from helpers import REPO, Toy, build_toy, fake_compile, run_cli, write_fallback_project, write_toy_project

# What compiles: `dsl`, and the session builds that read a prebuilt cache from the
# environment when one is given (so they cannot request `dsl`: the GPU host has no DSL).
COMPILING_FIXTURES = frozenset({"dsl", "example_cache", "layout_cache", "train_cache", "examples_build",
                                "fault_cache"})  # the last: tests/gpu/test_faults_gpu.py
# What needs the examples extra (torch, quack-kernels, flash-attn-4, triton): marked `extra`,
# which CI runs again once it has added the extra to the README's install (`pytest -m extra`).
# A module that imports torch at its top is marked by hand (`pytestmark`): without torch it
# is skipped before its tests exist.
EXTRA_FIXTURES = frozenset({"examples_extra", "examples_build", "grace_examples"})
# The user's planning memory (cutecc/toolchain/planmemory.py) is off in tests, and in the CLI
# they run: a test's planning starts from its own cache alone, and no test writes into the
# user's cache directory. tests/toolchain/test_plan_memory.py turns it on where it is tested.
os.environ.setdefault("CUTECC_PLAN_MEMORY", "off")
# Likewise no compile service is kept between builds (cutecc/build/executors/service.py): a
# test's build leaves no process behind; tests/build/test_resident_service.py keeps them.
os.environ.setdefault("CUTECC_SERVICE_IDLE", "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if EXTRA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.extra)
        if COMPILING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid}: `slow` is derived (tests/conftest.py); request "
                                    "the `dsl` fixture instead of marking a test slow by hand")


def _imported_from(module: object, roots: tuple[str, ...]) -> bool:
    """Whether `module` was imported from under one of `roots` (its file, or a package's path)."""
    places = [getattr(module, "__file__", None) or ""]
    with contextlib.suppress(TypeError):  # not a path list (torch's `torch.classes` answers any attribute)
        places += list(getattr(module, "__path__", None) or ())
    return any(isinstance(p, str) and p.startswith(roots) for p in places)


def _closure_finders() -> list[Any]:
    """The finders a pinned fallback's closure is served by (`cutecc.runtime.fallback_code`),
    once that module is imported: they claim the closure's module names for the process."""
    fc = sys.modules.get("cutecc.runtime.fallback_code")
    return [] if fc is None else [fc._FINDER, fc._PARENTS]


def _finder_state(f: Any) -> tuple[Any, ...]:
    return dict(f.files), set(f.paths), set(f.roots), None if f.parents is None else set(f.parents)


@pytest.fixture(autouse=True)
def isolated_imports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test leaves `sys.path` as it found it, the names a pinned fallback's closure
    claims (`cutecc.runtime.fallback_code`'s finders, on `sys.meta_path`) too, and no module it imported
    from a test's temporary directory (a toy project's `toy`, `pub`, ...): the next test that
    writes a package of the same name imports its own, whatever ran before it. Modules
    imported from anywhere else (the package, its dependencies) stay, as re-importing them
    would cost seconds and split their state."""
    path, meta_path, before = list(sys.path), list(sys.meta_path), set(sys.modules)
    finders = {id(f): _finder_state(f) for f in _closure_finders()}
    yield
    sys.path[:] = path
    for f in _closure_finders():
        if f in sys.meta_path and f not in meta_path:  # (other importers added stay: six's, say)
            sys.meta_path.remove(f)
        files, paths, project_roots, parents = finders.get(id(f), ({}, set(), set(), None if f.parents is None
                                                            else set()))
        f.files.clear()
        f.files.update(files)
        f.paths.clear()
        f.paths.update(paths)
        f.roots.clear()
        f.roots.update(project_roots)
        if parents is not None:
            f.parents.clear()
            f.parents.update(parents)
    roots = (str(tmp_path_factory.getbasetemp()), str(tmp_path_factory.getbasetemp().resolve()))
    for name in [m for m in sys.modules if m not in before]:
        if _imported_from(sys.modules[name], roots):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture(scope="session")
def dsl() -> None:
    """Declares that a test or fixture compiles kernels through the DSL: the test is marked
    slow, and skipped where the build extra is not installed."""
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")


@pytest.fixture
def toy_project(tmp_path: Path) -> Path:
    """A project with one small kernel (two variants), not built; returns its manifest path."""
    return write_toy_project(tmp_path / "proj")


@pytest.fixture
def fallback_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fallback project (`helpers.write_fallback_project`) in tmp_path/proj: builds
    compile stand-ins (`helpers.fake_compile`), its fallback module is importable, and
    $CUTECC_STRICT is unset. Returns its manifest; its cache goes in tmp_path/cache."""
    import cutecc.build.executors.local

    manifest = write_fallback_project(tmp_path / "proj")
    monkeypatch.setattr(cutecc.build.executors.local, "compile_all",
                        lambda *a, remote=None, limits=None: fake_compile(*a))
    monkeypatch.syspath_prepend(str(tmp_path / "proj"))
    monkeypatch.delenv("CUTECC_STRICT", raising=False)
    mods = ("toyfb", "toyfb.ref", "toyfb.ops")
    for m in mods:
        sys.modules.pop(m, None)
    yield manifest
    for m in mods:
        sys.modules.pop(m, None)


@pytest.fixture(scope="session")
def toy_builds(dsl: None, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Toy]:
    """`toy_builds(threads=(64, 128), archs=None, lock=True)`: the toy project built once per
    session for those arguments (copy it before changing anything: `.copy(tmp_path)`)."""
    made: dict[tuple[object, ...], Toy] = {}

    def get(threads: tuple[int, ...] = (64, 128), archs: tuple[str, ...] | None = None,
            lock: bool = True) -> Toy:
        args = (threads, archs, lock)
        if args not in made:
            made[args] = build_toy(tmp_path_factory.mktemp("toy"), threads, archs, lock)
        return made[args]

    return get


@pytest.fixture(scope="session")
def toy_cache(toy_builds: Callable[..., Toy]) -> Toy:
    """The toy project (threads=64 and 128, sm_90a, locked) built once per session."""
    return toy_builds()


@pytest.fixture
def built(toy_cache: Toy, tmp_path: Path) -> Toy:
    """A private copy of the session's toy build, free to change (same keys: sources are
    hashed by their path relative to the manifest)."""
    return toy_cache.copy(tmp_path, cache="c")


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
def examples_extra() -> None:
    """Declares that a test needs the examples extra installed (the published kernels'
    libraries, and torch): marked `extra`, skipped with the reason where it is absent."""
    for mod in ("quack", "flash_attn.cute", "torch"):
        pytest.importorskip(mod, reason="the examples extra (quack-kernels, flash-attn-4, torch) is "
                            "not installed")


@pytest.fixture(scope="session")
def examples_build(tmp_path_factory: pytest.TempPathFactory, examples_extra: None) -> Path:
    """examples/kernels.toml (published kernels, forward and backward) built once for sm_90a.

    Set CUTECC_EXAMPLES_CACHE to reuse a cache built beforehand (the GPU suite does); else
    it needs the build extra and the examples extra (quack-kernels, flash-attn-4, torch).
    """
    pre = os.environ.get("CUTECC_EXAMPLES_CACHE")
    if pre:
        return Path(pre)
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    cache = tmp_path_factory.mktemp("examples-cache")
    r = run_cli("build", str(REPO / "examples" / "kernels.toml"), "--cache-dir", str(cache),
                "--no-lock")
    assert r.returncode == 0, r.stderr + r.stdout
    return cache
