"""Composite kernels under a lock and in packs, seen from JAX on a CPU: the lock's own signed
line (never the cache's record) makes the composite, `jax.grad` of its forward runs through
it, a pack carries it (installed, or unpacked into a cache), and a line that is altered,
unsigned, launches a kernel the lock does not pin, or whose tensors do not flow through its
launches' contracts is refused.

The kernels are tests/gpu/train_kernels (expw2 paired with the composite expw2_bwd =
bwd_g -> bwd_dxdw), built once per session or taken from CUTECC_TRAIN_CACHE.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.commands.pack import pack
from cutecc.commands.unpack import unpack
from cutecc.contract.composite_line import CompositeLine
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock, lock_for, merge_build, read_lock, write_lock
from cutecc.lock.signing import SIG_SUFFIX, keygen, read_private_key, sign_file
from cutecc.manifest import load_manifest
from cutecc.runtime.library import target_name
from cutecc.store import Store

S = jax.ShapeDtypeStruct
F32 = jnp.float32
MANIFEST = Path(__file__).resolve().parents[1] / "gpu" / "train_kernels" / "kernels.toml"
X, W = S((300, 70), F32), S((70,), F32)


def manifest_composites() -> list[CompositeLine]:
    return [CompositeLine(c.name, c.launches, c.inputs, c.outputs)
            for c in load_manifest(MANIFEST).composites]


def cache_lock(cache: Path, composites: list[CompositeLine] | None = None) -> Lock:
    """The lock of every entry of `cache`, with the manifest's composite lines (as a build
    writes them)."""
    store = Store(cache)
    lock = lock_for([(e.doc["kernel"], e.doc["variant"], e.doc["arch"], e.key)
                     for e in store.entries()], store)
    return lock.with_composites(manifest_composites() if composites is None else composites)


@pytest.fixture(scope="module")
def signed(train_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(lock, private key, public key): the train cache's lock, signed."""
    d = tmp_path_factory.mktemp("locked")
    private, public = keygen(d / "ci")
    lock = d / "kernels.lock"
    write_lock(lock, cache_lock(train_cache))
    sign_file(lock, read_private_key(private), "lock")
    return lock, private, public


def lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def calls_in(text: str, ks) -> list[int]:
    """Which of (expw2, bwd_g, bwd_dxdw) each custom call of `text` runs, in order."""
    keys = [ks.expw2.builds[0].key, ks.bwd_g.builds[0].key, ks.bwd_dxdw.builds[0].key]
    calls = [ln for ln in text.splitlines() if "stablehlo.custom_call" in ln]
    return [[target_name(k) in c for k in keys].index(True) for c in calls]


def grad_lowers_through_the_composite(ks) -> None:
    loss = lambda x, w: (ks.expw2(x, w) ** 2).sum()  # noqa: E731
    gx, gw = jax.eval_shape(jax.grad(loss, argnums=(0, 1)), X, W)
    assert (gx.shape, gw.shape) == ((300, 70), (70,))
    assert calls_in(lower(jax.value_and_grad(loss, argnums=(0, 1)), X, W), ks) == [0, 1, 2]


# The lock's line ---------------------------------------------------------------------------

def test_a_lock_carries_one_line_per_composite_and_reads_it_back(train_cache: Path) -> None:
    lock = cache_lock(train_cache)
    data = lock.dumps()
    doc = json.loads(data)
    assert doc["composites"] == [{"format": 1, "name": "expw2_bwd", "launches": ["bwd_g", "bwd_dxdw"],
                                  "inputs": ["w", "e", "dout"], "outputs": ["dx", "dw"]}]
    assert Lock.loads(data, "x") == lock
    assert b"composites" not in cache_lock(train_cache, []).dumps()  # none: the bytes of before


def test_a_locked_composite_is_offered_and_pairs_as_a_backward(train_cache: Path, signed) -> None:
    lock, _, public = signed
    ks = cutecc.load(train_cache, arch="sm_90a", lock=lock, trusted_keys=[public])
    assert "expw2_bwd" in ks and "expw2_bwd" in list(ks)
    assert "bwd_g -> bwd_dxdw" in repr(ks.expw2_bwd)
    dx, dw = jax.eval_shape(ks.expw2_bwd, W, X, X)
    assert (dx.shape, dw.shape) == ((300, 70), (70,))
    grad_lowers_through_the_composite(ks)


def test_a_lock_without_the_line_names_the_missing_backward(train_cache: Path, tmp_path: Path) -> None:
    lock = tmp_path / "kernels.lock"
    write_lock(lock, cache_lock(train_cache, []))
    ks = cutecc.load(train_cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert "expw2_bwd" not in ks  # the cache's record alone is not believed under a lock
    with pytest.raises(ValueError, match="its backward kernel 'expw2_bwd' is not in this kernel set"):
        jax.eval_shape(jax.grad(lambda x, w: ks.expw2(x, w).sum()), X, W)


def test_under_a_lock_its_line_decides_not_the_caches_record(train_cache: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(train_cache, cache)
    record = cache / "composites" / "expw2_bwd.json"
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "outputs": ["dw", "dx"]}))  # swapped by someone
    assert cutecc.load(cache, arch="sm_90a").expw2_bwd.outputs == ("dw", "dx")
    lock = tmp_path / "kernels.lock"
    write_lock(lock, cache_lock(cache))
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert ks.expw2_bwd.outputs == ("dx", "dw")


def test_an_altered_or_unsigned_composite_line_is_refused(train_cache: Path, signed,
                                                         tmp_path: Path) -> None:
    lock, _, public = signed
    bad = tmp_path / "kernels.lock"
    bad.write_bytes(lock.read_bytes().replace(b'"outputs": ["dx", "dw"]', b'"outputs": ["dw", "dx"]'))
    assert bad.read_bytes() != lock.read_bytes()
    shutil.copy(f"{lock}{SIG_SUFFIX}", f"{bad}{SIG_SUFFIX}")
    with pytest.raises(CuteccError, match="was changed after it was signed"):
        cutecc.load(train_cache, arch="sm_90a", lock=bad, trusted_keys=[public])
    Path(f"{bad}{SIG_SUFFIX}").unlink()
    with pytest.raises(CuteccError, match="is not signed"):
        cutecc.load(train_cache, arch="sm_90a", lock=bad, trusted_keys=[public])


@pytest.mark.parametrize(("line", "key_path", "message"), [
    ({"launches": ["bwd_g", "pad_cols_gone"]}, "composites[0].launches[1]",
     "launches 'pad_cols_gone', a kernel this lock pins no entry of"),
    ({"format": 2}, "composites[0].format", "composite format 2, this cutecc reads 1"),
    ({"name": "expw2"}, "composites[0].name", "named twice"),
    ({"inputs": []}, "composites[0].inputs", "non-empty list"),
    ({"launches": ["bwd_g", "bwd_g"]}, "composites[0].launches", "names something twice"),
    ({"extra": 1}, "composites[0]", "expected the fields"),
])
def test_a_bad_composite_line_refuses_the_lock(train_cache: Path, tmp_path: Path, line: dict,
                                               key_path: str, message: str) -> None:
    doc = json.loads(cache_lock(train_cache).dumps())
    doc["composites"][0].update(line)
    lock = tmp_path / "kernels.lock"
    lock.write_text(json.dumps(doc))
    with pytest.raises(CuteccError, match=message) as err:
        cutecc.load(train_cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert err.value.key_path == key_path and err.value.where == str(lock)


def test_a_selection_keeps_a_composite_only_with_all_its_launches(train_cache: Path) -> None:
    lock = cache_lock(train_cache)
    assert [c.name for c in lock.select(kernels=("expw2", "expw2_bwd", "bwd_g", "bwd_dxdw")).composites] \
        == ["expw2_bwd"]
    assert lock.select(kernels=("expw2", "expw2_bwd", "bwd_g")).composites == ()
    assert lock.select(archs=("sm_100a",)).composites == ()  # nothing pinned for it
    assert lock.with_tuning(()).composites == lock.composites


def test_a_build_locks_the_composites_whose_launches_it_pins(train_cache: Path, tmp_path: Path) -> None:
    full = cache_lock(train_cache, [])
    comps = manifest_composites()
    merged = merge_build(tmp_path / "kernels.lock", full.entries, partial=False, covered=set(),
                         defined=set(), composites=comps)
    assert merged.lock.composites == tuple(comps)
    some = [e for e in full.entries if e.kernel != "bwd_dxdw"]
    merged = merge_build(tmp_path / "kernels.lock", some, partial=False, covered=set(), defined=set(),
                         composites=comps)
    assert merged.lock.composites == ()


def test_a_line_whose_tensors_do_not_flow_is_not_vouched_for(train_cache: Path, tmp_path: Path) -> None:
    from cutecc.ship.vouch import composite_line_problem

    store = Store(train_cache)
    good = cache_lock(train_cache)
    assert composite_line_problem(store, good, good.composites[0], hashed=True, present=True) is None
    swapped = CompositeLine("expw2_bwd", ("bwd_dxdw", "bwd_g"), ("w", "e", "dout"), ("dx", "dw"))
    lock = cache_lock(train_cache, [swapped])
    assert composite_line_problem(store, lock, swapped, hashed=False, present=True) == (
        'launch "bwd_dxdw" takes "g", which is no input of the composite and no result of an '
        "earlier launch")
    path = tmp_path / "kernels.lock"
    write_lock(path, lock)
    with pytest.raises(CuteccError, match='composite expw2_bwd: launch "bwd_dxdw" takes "g"'):
        pack(name="t", version="1", lock=path, cache_dir=train_cache, out=tmp_path, fmt="tar")
    # and the runtime, handed such a line anyway, says so instead of failing on a missing name
    ks = cutecc.load(train_cache, arch="sm_90a", lock=path, allow_unsigned=True)
    with pytest.raises(CuteccError, match='launch "bwd_dxdw" takes "g", which is no input'):
        jax.eval_shape(ks.expw2_bwd, W, X, X)


# Packs ---------------------------------------------------------------------------------------

def test_an_installed_pack_offers_the_composite_and_its_pairing(train_cache: Path, signed, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lock, private, public = signed
    report = pack(name="locked-train", version="1.0", lock=lock, kernels=("expw2",),
                  cache_dir=train_cache, out=tmp_path / "dist", sign_key=private)
    assert {e.kernel for e in report.lock.entries} == {"expw2", "bwd_g", "bwd_dxdw"}
    assert [c.name for c in report.lock.composites] == ["expw2_bwd"]
    site = tmp_path / "site"
    with zipfile.ZipFile(report.path) as zf:
        zf.extractall(site)
        init = zf.read("locked_train/__init__.py").decode()
    assert "'expw2_bwd'" in init  # a module attribute like the kernels
    monkeypatch.syspath_prepend(str(site))
    ks = cutecc.load(package="locked_train", arch="sm_90a", trusted_keys=[public])
    assert sorted(ks) == ["bwd_dxdw", "bwd_g", "expw2", "expw2_bwd"]
    grad_lowers_through_the_composite(ks)


def test_an_unpacked_pack_records_the_composite_in_the_cache(train_cache: Path, signed,
                                                              tmp_path: Path) -> None:
    lock, private, public = signed
    report = pack(name="locked-train", version="1.0", lock=lock, kernels=("expw2",),
                  cache_dir=train_cache, out=tmp_path / "dist", sign_key=private, fmt="tar")
    cache = tmp_path / "deploy"
    got = unpack(report.path, cache, trusted_keys=[public])
    assert got.ok and got.composites == ["expw2_bwd"] and len(got.imported) == 3
    grad_lowers_through_the_composite(cutecc.load(cache, arch="sm_90a"))
    with tarfile.open(report.path) as tf:
        packed = tf.extractfile("_cutecc/kernels.lock").read()  # type: ignore[union-attr]
    (tmp_path / "kernels.lock").write_bytes(packed)
    ks = cutecc.load(cache, arch="sm_90a", lock=tmp_path / "kernels.lock", allow_unsigned=True)
    grad_lowers_through_the_composite(ks)
    assert read_lock(tmp_path / "kernels.lock").composites == Lock.loads(packed, "x").composites
