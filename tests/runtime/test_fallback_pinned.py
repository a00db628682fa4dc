"""A fallback is held to a kernel's standard: its closure (its module and the project modules
it imports) is pinned file by file in the lock line, checked whole before any of it runs and
run from the checked bytes (a byte-code file stamped to pass for the source is never read);
its result is checked against the kernel's contract read through the call; and its module
is found through the manifest's python_path (issue 44 item 5, issue 48 item 7). Builds are
stand-ins (`helpers.fake_compile`): only the fallback path runs on this CPU host."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FALLBACK, opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CallError, FallbackWarning, NoBuildFits
from cutecc.lock.lockfile import read_lock

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

HELPED = '''\
import jax.numpy as jnp

from toyfb.helper import amp


def scale(x, *, factor=1.0):
    return amp(jnp.sin(x)) * factor
'''


def _built(manifest: Path) -> Path:
    cache = manifest.parent.parent / "cache"
    r = build(manifest, opts(cache_dir=cache))
    assert r.ok, r.warnings()
    return cache


def _locked(manifest: Path, cache: Path) -> Any:
    for m in [m for m in sys.modules if m == "toyfb" or m.startswith("toyfb.")]:
        sys.modules.pop(m)
    return cutecc.load(cache, arch="sm_90a", lock=manifest.parent / "kernels.lock", allow_unsigned=True)


def _x() -> Any:
    return jnp.asarray(np.linspace(-1, 1, 3 * 32, dtype=np.float32).reshape(3, 32))


def test_an_edited_module_is_refused_before_any_of_it_runs(fallback_project: Path, tmp_path: Path) -> None:
    cache = _built(fallback_project)
    marker = tmp_path / "ran"
    ref = fallback_project.parent / "toyfb" / "ref.py"
    ref.write_text(f"open({str(marker)!r}, 'w').close()\n" + FALLBACK)  # a top-level side effect
    ks = _locked(fallback_project, cache)
    with pytest.raises(NoBuildFits) as e:
        ks.scale(_x(), factor=2.0)
    assert not marker.exists()  # nothing of it ran
    assert f"{ref} (SHA-256 " in e.value.message and "is not the file the lock pins" in e.value.message
    assert "toyfb.ref" not in sys.modules


def test_a_byte_code_file_stamped_as_the_source_is_never_run(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    ref = fallback_project.parent / "toyfb" / "ref.py"
    st = ref.stat()
    other = compile("def scale(x, *, factor=1.0):\n    return x * 0 + 42.0\n", str(ref), "exec")
    pyc = Path(importlib.util.cache_from_source(str(ref)))
    pyc.parent.mkdir(exist_ok=True)
    # what import checks of a timestamp .pyc: magic, flags 0, the source's mtime and size
    stamp = [(int(st.st_mtime) & 0xFFFFFFFF), (st.st_size & 0xFFFFFFFF)]
    header = importlib.util.MAGIC_NUMBER + b"".join(n.to_bytes(4, "little") for n in [0, *stamp])
    pyc.write_bytes(header + marshal.dumps(other))
    ks = _locked(fallback_project, cache)
    x = _x()
    with pytest.warns(FallbackWarning):
        out = ks.scale(x, factor=2.0)
    np.testing.assert_allclose(out, np.sin(np.asarray(x)) * 2.0, rtol=1e-6)  # the source's code, not 42


def test_an_edited_imported_helper_is_refused(fallback_project: Path) -> None:
    pkg = fallback_project.parent / "toyfb"
    (pkg / "ref.py").write_text(HELPED)
    (pkg / "helper.py").write_text("def amp(y):\n    return y\n")
    cache = _built(fallback_project)
    lock = read_lock(fallback_project.parent / "kernels.lock")
    line = next(le for le in lock.entries if le.kernel == "scale")
    assert [f.path for f in dict(line.fallbacks)["fallback"].files] == [
        "toyfb/__init__.py", "toyfb/helper.py", "toyfb/ref.py"]
    x = _x()
    with pytest.warns(FallbackWarning):
        got = _locked(fallback_project, cache).scale(x)
    np.testing.assert_allclose(got, np.sin(np.asarray(x)), rtol=1e-6)
    (pkg / "helper.py").write_text("def amp(y):\n    return y * 1000\n")
    with pytest.raises(NoBuildFits, match=r"toyfb/helper.py \(SHA-256 \w+\.\.\.\) is not the file the lock "
                                          r"pins for module toyfb.helper"):
        _locked(fallback_project, cache).scale(x)


def test_a_module_imported_otherwise_is_not_taken_for_the_pinned_one(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    ks = _locked(fallback_project, cache)
    import toyfb.ref  # noqa: F401 - from disk, by the normal import system

    with pytest.raises(NoBuildFits, match=r"module toyfb(\.ref)? is already imported in this process"):
        ks.scale(_x())


@pytest.mark.parametrize(("body", "said"), [
    ("return jnp.zeros((1,), jnp.int8)", r"out: int8\[1\], where the contract gives float32"),
    ("return jnp.zeros((2, 32), jnp.float32)", r"float32\[2, 32\], where the contract gives dimension 0 3"),
    ("return jnp.sin(x), jnp.sin(x)", r"tuple of 2, where the call returns one array"),
])
def test_a_result_outside_the_contract_is_a_call_error(fallback_project: Path, body: str, said: str) -> None:
    (fallback_project.parent / "toyfb" / "ref.py").write_text(
        f"import jax.numpy as jnp\n\n\ndef scale(x, *, factor=1.0):\n    {body}\n")
    ks = cutecc.load(_built(fallback_project), arch="sm_90a")
    with pytest.raises(CallError) as e:  # refused as it is traced: nothing ran, nothing counted
        ks.scale(_x())
    assert 'kernel "scale", fallback toyfb.ref:scale' in str(e.value)
    assert e.value.__class__ is CallError
    import re

    assert re.search(said, e.value.message), e.value.message


def test_the_fallback_is_found_through_the_manifests_python_path(fallback_project: Path) -> None:
    proj = fallback_project.parent
    (proj / "src").mkdir()
    (proj / "toyfb").rename(proj / "src" / "toyfb")  # nothing on sys.path holds it now
    fallback_project.write_text('python_path = ["src"]\n' + fallback_project.read_text())
    cache = _built(fallback_project)
    x = _x()
    for ks in (cutecc.load(cache, arch="sm_90a", manifest=fallback_project),
               cutecc.load(cache, arch="sm_90a"), _locked(fallback_project, cache)):
        with pytest.warns(FallbackWarning):
            np.testing.assert_allclose(ks.scale(x, factor=3.0), np.sin(np.asarray(x)) * 3.0, rtol=1e-6)
        sys.modules.pop("toyfb.ref", None)
        sys.modules.pop("toyfb", None)


def test_a_lock_line_from_before_closures_is_read_and_its_fallback_refused(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    lock = fallback_project.parent / "kernels.lock"
    doc = json.loads(lock.read_bytes())
    for line in doc["entries"]:
        if "fallback" in line:  # as 1518079 wrote it: the module file's SHA-256 alone
            line["fallback"] = {"ref": "toyfb.ref:scale", "sha256": "ab" * 32}
    lock.write_text(json.dumps(doc))
    ks = _locked(fallback_project, cache)
    assert ks.scale.builds  # the lock reads: its entries serve
    with pytest.raises(NoBuildFits, match=r"pins the fallback's module file only .* run `cutecc build`"):
        ks.scale(_x())


def test_the_closure_runs_from_checked_bytes_with_its_imports(fallback_project: Path) -> None:
    pkg = fallback_project.parent / "toyfb"
    (pkg / "ref.py").write_text(HELPED)
    (pkg / "helper.py").write_text("def amp(y):\n    return y * 2\n")
    cache = _built(fallback_project)
    ks = _locked(fallback_project, cache)
    with pytest.warns(FallbackWarning):
        ks.scale(_x())
    mod = sys.modules["toyfb.helper"]
    assert mod.__file__ == str(pkg / "helper.py") and sys.modules["toyfb"].__path__ == []
    assert not os.path.exists(importlib.util.cache_from_source(str(pkg / "helper.py")))  # no byte code


def test_a_helper_imported_by_a_computed_name_is_refused(fallback_project: Path) -> None:
    """The closure is walked from the source's import statements; `importlib.import_module`
    of a computed name found a project module no lock line pins, and an edit of it ran under
    the lock: what runs is what the lock pins, or nothing."""
    proj = fallback_project.parent
    (proj / "toyfb" / "ref.py").write_text(
        "import importlib\n\nimport jax.numpy as jnp\n\n\ndef scale(x, *, factor=1.0):\n"
        "    amp = importlib.import_module('toyfb_' + 'helper').amp\n    return amp(jnp.sin(x)) * factor\n")
    (proj / "toyfb_helper.py").write_text("def amp(y):\n    return y\n")
    cache = _built(fallback_project)
    (proj / "toyfb_helper.py").write_text("def amp(y):\n    return y * 1000\n")  # after the lock
    sys.modules.pop("toyfb_helper", None)
    try:
        with pytest.raises(NoBuildFits, match=r"module toyfb_helper \(.*toyfb_helper.py\) is imported by a "
                                              r"pinned fallback's code but is not in the closure"):
            _locked(fallback_project, cache).scale(_x())
        assert "toyfb_helper" not in sys.modules
    finally:
        sys.modules.pop("toyfb_helper", None)
