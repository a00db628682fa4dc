"""examples/kernels.toml (issue 10): the published kernels are declared with no adapter
module, and the manifest is valid on its own (no DSL or kernel library needed to read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutecc.contract import NoneArg, ScalarArg, StreamArg, StructArg, TensorArg
from cutecc.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_examples_hold_no_python_of_their_own() -> None:
    assert sorted(p.name for p in EXAMPLES.iterdir()) == ["README.md", "kernels.toml"]


def test_examples_manifest_declares_the_three_published_launchers() -> None:
    m = load_manifest(EXAMPLES / "kernels.toml")
    entries = {k.name: k.entry for k in m.kernels}
    assert entries == {
        "quack_rmsnorm": "quack.rmsnorm:RMSNorm",
        "quack_cross_entropy": "quack.cross_entropy:CrossEntropy",
        "fa4_fwd": "flash_attn.cute.flash_fwd_sm90:FlashAttentionForwardSm90",
    }
    assert all(k.archs == ("sm_90a",) for k in m.kernels)
    assert m.env_for("sm_90a") == {"QUACK_ARCH": "sm_90a"}  # quack's launch config on a CPU host


def test_rmsnorm_and_xent_list_every_launcher_parameter_in_order() -> None:
    m = load_manifest(EXAMPLES / "kernels.toml")
    kinds = {k.name: [type(a) for a in k.variants[0].args] for k in m.kernels}
    T, N, S, St = TensorArg, NoneArg, ScalarArg, StreamArg
    assert kinds["quack_rmsnorm"] == [T, T, N, N, T, N, T, N, S, St]
    assert kinds["quack_cross_entropy"] == [T, T, N, T, N, N, N, S, St]


def test_fa4_causal_variants_share_one_contract_and_symbolic_lengths() -> None:
    fa4 = load_manifest(EXAMPLES / "kernels.toml").kernel("fa4_fwd")
    assert sorted(v.id for v in fa4.variants) == ["dtype=bfloat16,d=128,causal=False",
                                                  "dtype=bfloat16,d=128,causal=True"]
    a, b = (v.args for v in fa4.variants)
    assert a == b  # only the factory's is_causal differs: `causal` must be a call keyword
    assert {dict(v.factory_args)["is_causal"] for v in fa4.variants} == {False, True}
    q = a[0]
    assert isinstance(q, TensorArg) and q.shape == ("b", "s_q", "h", 128)
    aux = next(x for x in a if isinstance(x, StructArg))
    assert aux.param == "aux_data" and aux.type == "flash_attn.cute.utils:AuxData"


def test_fa4_declares_a_tuning_space_of_its_own_knobs_over_four_sequence_buckets() -> None:
    """FA4's Hopper knobs per bucket of s_k: the default is what FA4's interface picks for
    head_dim 128 on sm_90 (and what `cutecc build` builds), queries as long as keys."""
    fa4 = load_manifest(EXAMPLES / "kernels.toml").kernel("fa4_fwd")
    spec = fa4.tuning
    assert spec is not None and [b.extent for b in spec.buckets] == ["s_k"]
    assert len(spec.buckets[0].edges) >= 4
    assert dict(spec.sizes) == {"b": 4, "h": 16, "s_q": "s_k"}
    assert dict(spec.scalars) == {"softmax_scale": 0.08838834764831845}
    for v in fa4.variants:
        fa = dict(v.factory_args)
        assert (fa["tile_m"], fa["tile_n"], fa["num_stages"], fa["intra_wg_overlap"], fa["mma_pv_is_rs"]) == (
            128, 128, 2, True, True)
    cands = dict(fa4.candidates)
    assert sorted(cands) == sorted(v.id for v in fa4.variants)
    for cs in cands.values():
        assert len(cs) == 11 and all(dict(c.factory_args)["tile_n"] % 16 == 0 for c in cs)
        fas = [dict(c.factory_args) for c in cs]
        assert all(fa["intra_wg_overlap"] or fa["mma_pv_is_rs"] for fa in fas)


def test_tune_dry_run_prints_the_examples_plan_with_no_gpu() -> None:
    """Planning keys each candidate, so it finds the kernel libraries' modules (without
    importing them): it needs the `examples` extra installed, as CI has it."""
    import importlib.util
    import json
    import subprocess
    import sys

    if not all(importlib.util.find_spec(m) for m in ("flash_attn", "quack")):
        pytest.skip("the examples extra (flash-attn-4, quack-kernels) is not installed")

    cmd = [sys.executable, "-m", "cutecc.cli", "tune", str(EXAMPLES / "kernels.toml"), "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fa4_fwd[dtype=bfloat16,d=128,causal=True]@sm_90a: 12 candidates x 4 buckets" in r.stdout
    assert "2 tuned variant(s), 24 candidates" in r.stdout
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    doc = json.loads(r.stdout)
    assert list(doc["kernels"]) == ["fa4_fwd"] and len(doc["kernels"]["fa4_fwd"]) == 24 and doc["built"] == 0


def test_fa4s_tuning_default_is_the_builds_own_entry() -> None:
    """`tune` plans the tuned kernels only; their defaults must keep the whole build's keys,
    or recorded winners name a base the build never made and never apply."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("flash_attn", "quack")):
        pytest.skip("the examples extra (flash-attn-4, quack-kernels) is not installed")
    from cutecc.plan import plan
    from cutecc.tuning.plan import items

    m = load_manifest(EXAMPLES / "kernels.toml")
    built = {(p.kernel.name, p.variant.id, p.arch): p.key for p in plan(m)}
    bases = {(it["kernel"], it["variant"], it["arch"]): it["base"] for it in items(m)}
    assert bases and all(built[k] == key for k, key in bases.items())
