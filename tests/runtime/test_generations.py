"""Loading what the manifest says: after a manifest change and a
rebuild, a plain `cutecc.load()` offers only the newest build of each kernel and
`load(manifest=)` exactly that manifest's planned entries; an older entry stays callable
through a lock that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import fake_compile, opts

import cutecc
import cutecc.commands.build
from cutecc.commands.build import build
from cutecc.errors import CuteccError
from cutecc.store import Store

# A build links the toolchain's runtime library with zig, even around the stand-in compile:
# skipped where only the runtime is installed (CI's newest-JAX environment).
pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

MANIFEST = """\
archs = ["sm_90a"]

[kernel.scale]
entry = "toy.ops:scale"
args = [
  {{ name = "x", dtype = "float32", shape = ["n"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
  {{ kind = "stream" }},
]
constants = {{ threads = "$threads" }}
variants = {{ threads = {threads} }}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy/__init__.py").write_text("")
    (tmp_path / "toy/ops.py").write_text("def scale(x, out, stream, threads=128):\n    pass\n")
    import cutecc.build.executors.local

    monkeypatch.setattr(cutecc.build.executors.local, "compile_all",
                        lambda *a, remote=None, limits=None: fake_compile(*a))
    m = tmp_path / "kernels.toml"
    m.write_text(MANIFEST.format(threads=[64, 128]))
    return m


def _variants(ks: Any) -> list[str]:
    return sorted(b.variant for b in ks.scale.builds)


def test_a_rebuilt_kernel_offers_only_its_current_variants(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build(project, opts(cache_dir=cache))
    assert first.ok and first.count("built") == 2
    old_lock = tmp_path / "old.lock"
    (project.parent / "kernels.lock").rename(old_lock)
    project.write_text(MANIFEST.format(threads=[128, 256]))  # 64 removed, 256 added
    assert build(project, opts(cache_dir=cache)).ok
    assert len(list(Store(cache).entries())) == 3  # the old entry stays until gc
    assert _variants(cutecc.load(cache, arch="sm_90a")) == ["threads=128", "threads=256"]
    assert _variants(cutecc.load(cache, arch="sm_90a", manifest=project)) == ["threads=128", "threads=256"]
    # asked for by lock, the older entry is still callable
    old = cutecc.load(cache, arch="sm_90a", lock=old_lock, allow_unsigned=True)
    assert _variants(old) == ["threads=128", "threads=64"]


def test_load_manifest_uses_exactly_that_manifests_entries(project: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    assert build(project, opts(cache_dir=cache)).ok
    other = tmp_path / "other"
    other.mkdir()
    (other / "toy").symlink_to(project.parent / "toy")
    (other / "kernels.toml").write_text(MANIFEST.format(threads=[32]))
    assert build(other / "kernels.toml", opts(cache_dir=cache)).ok  # same kernel name, newer build
    monkeypatch.chdir(other)  # the project it is called from decides
    assert _variants(cutecc.load(cache, arch="sm_90a")) == ["threads=32"]
    monkeypatch.chdir(project.parent)
    assert _variants(cutecc.load(cache, arch="sm_90a")) == ["threads=128", "threads=64"]
    monkeypatch.chdir(tmp_path.parent)  # in neither project, nothing decides: an error naming both
    with pytest.raises(CuteccError, match="2 manifests"):
        cutecc.load(cache, arch="sm_90a").scale  # noqa: B018
    assert _variants(cutecc.load(cache, arch="sm_90a", manifest=project)) == ["threads=128", "threads=64"]
    project.write_text(MANIFEST.format(threads=[64]))  # edited, not rebuilt
    # its lock still names what serves it; without one, no build recorded these bytes
    assert _variants(cutecc.load(cache, arch="sm_90a", manifest=project)) == ["threads=128", "threads=64"]
    (project.parent / "kernels.lock").unlink()
    with pytest.raises(CuteccError, match="never built into this cache"):
        cutecc.load(cache, arch="sm_90a", manifest=project)
