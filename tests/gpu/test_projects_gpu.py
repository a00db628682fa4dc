"""Two projects, one kernel name, one cache, on a real GPU: `cutecc.load()` called in each
project's directory (tests/gpu/project_kernels/a and b, whose `scale` differ by one line)
calls that project's own kernel, correct on fresh random inputs, eagerly and under
`jax.jit`; in a directory of neither, the name is an error naming both manifests and
`manifest=`, the argument that picks. The cache comes from `$CUTECC_PROJECTS_CACHE`
(tests/gpu/prepare.sh builds both projects into CACHES/projects, each writing its
kernels.lock): on the device the projects sit at another path than the one they were built
from, so each is found through its lock (`cutecc.runtime.project`)."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

import cutecc
from cutecc.lock.lockfile import read_lock

from .conftest import rand

pytestmark = pytest.mark.gpu
PROJECTS = Path(__file__).resolve().parent / "project_kernels"
# each project's scale, as its source says: a's out = x * factor, b's out = x * factor + x
EXPECTED = {"a": lambda x, f: x * f, "b": lambda x, f: x * f + x}


@pytest.fixture(scope="module")
def cache() -> Path:
    pre = os.environ.get("CUTECC_PROJECTS_CACHE")
    if not pre or not Path(pre).is_dir():
        pytest.skip("CUTECC_PROJECTS_CACHE is not set to a cache of tests/gpu/project_kernels/a "
                    "and b (tests/gpu/prepare.sh)")
    return Path(pre)


@pytest.mark.parametrize("project", ["a", "b"])
def test_a_load_in_a_project_directory_calls_its_own_kernel(
        cache: Path, project: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECTS / project / "projk")  # below the project's root, as a script may be
    ks = cutecc.load(cache)
    lock = read_lock(PROJECTS / project / "kernels.lock")
    assert [b.key for b in ks.scale.builds] == [le.key for le in lock.entries]
    for n in (1, 1000, 4099):
        x, f = rand(rng, (n,), "float32"), float(rng.uniform(0.5, 2.0))
        want = EXPECTED[project](np.asarray(x), np.float32(f))
        np.testing.assert_allclose(np.asarray(ks.scale(x, factor=f)), want, rtol=1e-6, atol=1e-6)
        got = jax.jit(lambda a, f=f: ks.scale(a, factor=f))(x)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_in_neither_project_the_name_is_an_error_naming_both(cache: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cutecc.CuteccError) as err:
        cutecc.load(cache).scale  # noqa: B018
    msg = str(err.value)
    assert "a/kernels.toml" in msg and "b/kernels.toml" in msg and "manifest=" in msg
