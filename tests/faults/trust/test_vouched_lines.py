"""A build signs, and the runtime and `verify` serve, only lines that were checked.

Seen, for a kernel whose variants differ only in a call
keyword (FA4's `causal`): a tuning line naming the sibling variant as the winner survived
`cutecc build --sign-key` (kept verbatim and re-signed), and `load(lock=...)` then lowered
`attn(x, causal=False)` to the `causal=True` library; a planted cache record did the same
and `cutecc verify` called the cache healthy. `cutecc build --kernel K --sign-key` kept the
other kernels' lock lines verbatim, one edited to another SHA-256 and size, and signed them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from call_keyword_kernels import OPS
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.commands.verify import verify
from cutecc.errors import CuteccError
from cutecc.lock import signing
from cutecc.lock.lockfile import read_lock
from cutecc.runtime.library import target_name
from cutecc.store.tuning_records import TuningResult, TuningResults

pytestmark = pytest.mark.usefixtures("dsl")


MANIFEST = '''archs = ["sm_90a"]

[kernel.attn]
entry = "fa.ops:attn"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
constants = { causal = "$causal" }
variants = { causal = [false, true] }

[kernel.other]
entry = "fa.ops:attn"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
constants = { causal = false }
'''
DEVICE = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vouched")
    (root / "fa").mkdir()
    (root / "fa/__init__.py").write_text("")
    (root / "fa/ops.py").write_text(OPS)
    (root / "kernels.toml").write_text(MANIFEST)
    report = build(root / "kernels.toml", opts(cache_dir=root / "cache", jobs=2))
    assert report.ok, [o.error for o in report.outcomes]
    return root


@pytest.fixture
def project(built: Path, tmp_path: Path) -> Path:
    shutil.copytree(built, tmp_path / "p", symlinks=True)
    return tmp_path / "p"


@pytest.fixture
def key_pair(tmp_path: Path) -> tuple[Path, Path]:
    return signing.keygen(tmp_path / "ci")


def _lines(project: Path) -> dict[str, dict]:
    doc = json.loads((project / "kernels.lock").read_text())
    return {f"{e['kernel']}[{e['variant']}]": e for e in doc["entries"]}


def _sibling_tuning_line(project: Path) -> dict:
    """A tuning line that serves attn[causal=False]'s calls with attn[causal=True]'s library."""
    lines = _lines(project)
    base, win = lines["attn[causal=False]"], lines["attn[causal=True]"]
    return {"kernel": "attn", "variant": base["variant"], "arch": "sm_90a", "device": DEVICE,
            "rule": "floor", "bucket": "n=1", "base": base["key"], "winner": win["key"],
            "winner_variant": win["variant"],
            **{f: win[f] for f in ("library", "sha256", "size", "symbol", "backward", "contract", "runtime")}}


def _plant_in_lock(project: Path, line: dict) -> None:
    doc = json.loads((project / "kernels.lock").read_text())
    doc["tuning"] = [line]
    (project / "kernels.lock").write_text(json.dumps(doc, indent=1))


def _lowered_target(ks: object, causal: bool) -> list[str]:
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    text = jax.jit(lambda x: ks.attn(x, causal=causal)).trace(x).lower(  # type: ignore[attr-defined]
        lowering_platforms=("cuda",)).as_text()
    return re.findall(r"stablehlo.custom_call @(\w+)", text)


def test_a_signing_build_drops_a_tuning_line_whose_winner_has_other_call_keywords(
        project: Path, key_pair: tuple[Path, Path]) -> None:
    _plant_in_lock(project, _sibling_tuning_line(project))
    report = build(project / "kernels.toml", opts(cache_dir=project / "cache", sign_key=key_pair[0]))
    assert report.ok
    assert read_lock(project / "kernels.lock").tuning == ()
    assert len(report.dropped_tuning) == 1
    # the manifest declares no tuning space: nothing is a candidate of attn[causal=False]
    assert "is not a candidate the manifest plans" in report.dropped_tuning[0], report.dropped_tuning
    assert any("dropped the tuning line attn[causal=False]" in w for w in report.warnings())


def test_load_serves_the_default_when_a_signed_lock_names_a_sibling_as_winner(
        project: Path, key_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The line is signed by the deployer's own key (a careless or compromised builder):
    the signature vouches for the bytes, not for the pairing, which load checks itself."""
    monkeypatch.setenv("CUTECC_DEVICE_KIND", DEVICE)
    _plant_in_lock(project, _sibling_tuning_line(project))
    signing.sign_file(project / "kernels.lock", signing.read_private_key(key_pair[0]), "lock")
    ks = cutecc.load(project / "cache", arch="sm_90a", lock=project / "kernels.lock",
                     trusted_keys=[key_pair[1]])
    lines = _lines(project)
    assert _lowered_target(ks, False) == [target_name(lines["attn[causal=False]"]["key"])]
    assert _lowered_target(ks, True) == [target_name(lines["attn[causal=True]"]["key"])]
    assert any("call keywords causal=True" in p for p in ks.problems), ks.problems


def test_a_planted_cache_record_serves_nothing_and_verify_names_it(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTECC_DEVICE_KIND", DEVICE)
    line = _sibling_tuning_line(project)
    path = project / "cache/tuning/results" / f"{line['base']}.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(TuningResults((TuningResult.parse(line, "planted", "line"),)).dumps())
    ks = cutecc.load(project / "cache", arch="sm_90a")
    assert _lowered_target(ks, False) == [target_name(line["base"])]
    report = verify(project / "cache")
    bad = [p for p in report.problems if p.kind == "bad-tuning"]
    assert report.exit_code == 1 and len(bad) == 1, report.problems
    assert "call keywords causal=True" in bad[0].detail
    fixed = verify(project / "cache", fix=True)
    assert fixed.ok and not path.exists()
    assert verify(project / "cache").ok


def test_a_partial_signing_build_refuses_to_sign_an_edited_line_it_keeps(
        project: Path, key_pair: tuple[Path, Path]) -> None:
    doc = json.loads((project / "kernels.lock").read_text())
    for e in doc["entries"]:
        if e["kernel"] == "attn" and e["variant"] == "causal=True":
            e["sha256"], e["size"] = "ab" * 32, e["size"] + 1
    (project / "kernels.lock").write_text(json.dumps(doc, indent=1))
    before = (project / "kernels.lock").read_bytes()
    with pytest.raises(CuteccError) as e:
        build(project / "kernels.toml", opts(cache_dir=project / "cache", sign_key=key_pair[0]),
              kernels=("other",))
    assert e.value.exit_code == 1
    assert "refusing to sign" in e.value.message and "attn[causal=True]@sm_90a" in e.value.message
    assert (project / "kernels.lock").read_bytes() == before
    assert not (project / "kernels.lock.sig").exists()
    # unsigned, the edited line is refused too: a partial build keeps only what the cache backs
    with pytest.raises(CuteccError, match="attn\\[causal=True\\]@sm_90a"):
        build(project / "kernels.toml", opts(cache_dir=project / "cache"), kernels=("other",))


def test_a_signing_build_refuses_a_kept_line_whose_entry_is_not_in_the_cache(
        project: Path, key_pair: tuple[Path, Path]) -> None:
    key = _lines(project)["attn[causal=True]"]["key"]
    shutil.rmtree(project / "cache/entries" / key[:2] / key)
    with pytest.raises(CuteccError, match="refusing to sign.*not in the cache"):
        build(project / "kernels.toml", opts(cache_dir=project / "cache", sign_key=key_pair[0]),
              kernels=("other",))
    # unsigned, a line this cache lacks is kept as it was (another host may hold it)
    report = build(project / "kernels.toml", opts(cache_dir=project / "cache"), kernels=("other",))
    assert report.ok and key in {e.key for e in read_lock(project / "kernels.lock").entries}


def test_a_signing_build_hashes_every_library_it_signs(project: Path, key_pair: tuple[Path, Path]) -> None:
    """A no-op build finds its hits by their index records; before it signs, it reads
    every library back and hashes it, so a library altered in place is not signed."""
    key = _lines(project)["other[default]"]["key"]
    lib = project / "cache/entries" / key[:2] / key / "kernel.so"
    data = bytearray(lib.read_bytes())
    data[-1] ^= 1
    lib.write_bytes(bytes(data))
    with pytest.raises(CuteccError, match="refusing to sign.*other\\[default\\]@sm_90a.*altered"):
        build(project / "kernels.toml", opts(cache_dir=project / "cache", sign_key=key_pair[0]))
    assert not (project / "kernels.lock.sig").exists()


def test_a_composite_record_is_read_under_the_trust_rules_and_never_under_a_lock(
        project: Path) -> None:
    """A composite's record decides which launches a call runs: a record behind a link (or
    someone else's) is refused, and a lock offers only the composites it pins itself (its
    own signed lines, none here), never the cache's record."""

    record = {"format": 1, "name": "both", "launches": ["other"], "inputs": ["x"],
              "outputs": ["out"], "manifest": str(project / "kernels.toml")}
    d = project / "cache/composites"
    d.mkdir()
    (project / "elsewhere.json").write_text(json.dumps(record))
    (d / "both.json").symlink_to(project / "elsewhere.json")
    ks = cutecc.load(project / "cache", arch="sm_90a")
    assert "both" not in ks  # set aside, by name, and the kernel set still serves the rest
    assert any("both.json" in p and "link" in p for p in ks.problems), ks.problems
    (d / "both.json").unlink()
    (d / "both.json").write_text(json.dumps(record))
    assert "both" in cutecc.load(project / "cache", arch="sm_90a")
    locked = cutecc.load(project / "cache", arch="sm_90a", lock=project / "kernels.lock",
                         allow_unsigned=True)
    assert "both" not in locked


def test_pack_refuses_a_lock_whose_tuning_line_serves_a_sibling(project: Path, tmp_path: Path) -> None:
    """`cutecc pack --lock` ships (and may sign) the lock's tuning lines: the same rule as
    `build` and `load` holds there, with no manifest at hand (the cache's entries decide)."""
    from cutecc.commands.pack import pack

    _plant_in_lock(project, _sibling_tuning_line(project))
    with pytest.raises(CuteccError, match="tuning line attn\\[causal=False\\].*call keywords causal=True"):
        pack(name="p", version="1.0", lock=project / "kernels.lock", out=tmp_path / "out",
             cache_dir=project / "cache")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
