"""A pack carries what serves a miss: the pinned closure of each fallback its lock names
(issue 44). Installed with pip into a directory that holds nothing of the project, the pack
serves a call no build fits from its own checked bytes; a closure file changed since the
build is refused at pack time."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import PY, REPO, Toy, opts, run_cli

from cutecc.commands.build import build
from cutecc.commands.pack import pack
from cutecc.errors import WorkError

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("dsl")

REF = "import jax.numpy as jnp\n\nfrom toy.amp import amp\n\n\ndef scale(x, *, factor=1.0, threads=None):\n" \
      "    return amp(x) * jnp.asarray(factor, x.dtype)\n"

CALL = """\
import json, warnings
import jax.numpy as jnp
import toy_fb
ks = toy_fb.load(arch="sm_90a", allow_unsigned=True)
x = jnp.arange(8, dtype=jnp.float16)  # no variant takes float16: the fallback serves
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    out = ks.scale(x, factor=2.0)
import sys
print(json.dumps({"out": [float(v) for v in out], "dtype": str(out.dtype),
                  "warned": [str(m.message) for m in w],
                  "toy": sys.modules["toy.ref"].__file__}))
"""


@pytest.fixture
def with_fallback(toy_cache: Toy, tmp_path: Path) -> Toy:
    """The toy's build with `fallback = "toy.ref:scale"` declared (toy.ref imports toy.amp), rebuilt."""
    toy = toy_cache.copy(tmp_path)
    pkg = toy.manifest.parent / "toy"
    (pkg / "ref.py").write_text(REF)
    (pkg / "amp.py").write_text("def amp(y):\n    return y + 1\n")
    toy.manifest.write_text(toy.manifest.read_text().replace(
        'entry = "toy.ops:scale"', 'entry = "toy.ops:scale"\nfallback = "toy.ref:scale"'))
    r = build(toy.manifest, opts(cache_dir=toy.cache))
    assert r.ok and r.count("built") == 0, [o.status for o in r.outcomes]
    return toy


def test_an_installed_pack_serves_a_miss_from_its_own_fallback(with_fallback: Toy, tmp_path: Path) -> None:
    toy = with_fallback
    rep = pack(name="toy-fb", version="1.0.0", lock=toy.lock, cache_dir=toy.cache, out=tmp_path / "dist",
               with_runtime=False)
    names = zipfile.ZipFile(rep.path).namelist()
    assert {"toy_fb/_cutecc/fallbacks/toy/__init__.py", "toy_fb/_cutecc/fallbacks/toy/ref.py",
            "toy_fb/_cutecc/fallbacks/toy/amp.py"} <= set(names)
    assert rep.sizes["fallbacks"]["entries"] == 3
    site = tmp_path / "site"
    subprocess.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(rep.path)], check=True, timeout=300)
    # a deploy host: the pack and cutecc, nothing of the project (run from elsewhere)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop("CUTECC_STRICT", None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tree = site / "toy_fb" / "_cutecc"
    before = snapshot(tree)
    r = subprocess.run([PY, "-c", CALL], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["out"] == [(v + 1) * 2.0 for v in range(8)] and got["dtype"] == "float16"
    assert any("served by its fallback toy.ref:scale" in m for m in got["warned"])
    assert got["toy"] == str(site / "toy_fb" / "_cutecc" / "fallbacks" / "toy" / "ref.py")
    # its fallbacks/ is the pack's own: `cutecc verify` finds it healthy, and neither the
    # call nor verify wrote into it (no miss recorded, no use mark, no locks/)
    v = run_cli("verify", "--cache-dir", str(tree), "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["problems"] == [], v.stdout + v.stderr
    assert snapshot(tree) == before


def test_a_closure_changed_since_the_build_is_not_packed(with_fallback: Toy, tmp_path: Path) -> None:
    toy = with_fallback
    amp = toy.manifest.parent / "toy" / "amp.py"
    amp.write_text("def amp(y):\n    return y - 1\n")
    said = r"cannot pack its fallback: .*toy/amp.py \(SHA-256 \w+\.\.\.\) is not the file its lock line pins"
    with pytest.raises(WorkError, match=said + " for module toy.amp"):
        pack(name="toy-fb", version="1.0.0", lock=toy.lock, cache_dir=toy.cache, out=tmp_path / "dist",
             with_runtime=False)
