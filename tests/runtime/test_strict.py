"""Strict sharding under an explicit mesh: a call whose inputs are split where the kernel's
shard rule does not allow is refused, naming the kernel, the sharding and the collective XLA
would insert (or, by the manifest's `reshard` choice, warned about once, or allowed); never
a silent all-gather.

The rule's arithmetic on PartitionSpecs here; in a child process with four CPU devices
(`strict_child.py`), the whole dispatch of loaded kernels under `jax.set_mesh` of an
Explicit mesh, whose custom calls are lowered for the CPU by a stand-in: what is refused
and what runs, eagerly and under `jax.jit`, with the HLO's collectives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cutecc.errors import CallError
from cutecc.runtime.strict import Reshard, check, reshards

CHILD = Path(__file__).with_name("strict_child.py")
REPO = Path(__file__).resolve().parents[2]
ROWS = ("m", None)  # expw_rows: x (m, d) split along m only
QKV = ("b", None, "h", None)  # attention: split along batch and heads


def one(spec, factors=ROWS, shape=(64, 16), sizes=None):
    return reshards(["x"], [shape], [spec], [factors], sizes or {"x": 4})


def test_a_split_the_rule_declares_costs_nothing() -> None:
    assert one(("x", None)) == [] and one(()) == [] and one((None, None)) == []
    assert one(None) == []  # not a mesh sharding
    assert reshards(["q"], [(8, 24, 8, 16)], [(None, None, "x", None)], [QKV], {"x": 4}) == []


def test_a_split_elsewhere_is_named_with_the_all_gather_it_would_cost() -> None:
    (r,) = one((None, "x"))
    assert r == Reshard("x", (None, "x"), (None, None), "all-gather", ("x",))
    assert r.describe() == ('input "x" is sharded P(None, \'x\'), the kernel computes on P(None, None): '
                            "XLA would insert an all-gather over mesh axes 'x'")
    (r,) = one(("x", None), factors=(None, None))  # no rule: every split is gathered
    assert r.collective == "all-gather" and r.needed == (None, None)
    (r,) = reshards(["q"], [(8, 24, 8, 16)], [(None, ("x", "y"), None, None)], [QKV], {"x": 2, "y": 2})
    assert r.axes == ("x", "y") and r.collective == "all-gather"


def test_a_split_moved_to_another_dimension_is_an_all_to_all() -> None:
    # q picks "x" for the batch; k, split along its heads by "x", must move it to the batch
    found = reshards(["q", "k"], [(8, 24, 8, 16)] * 2, [("x", None, None, None), (None, None, "x", None)],
                     [QKV, QKV], {"x": 4})
    assert [(r.operand, r.collective, r.needed) for r in found] == [
        ("k", "all-to-all", ("x", None, None, None))]


def test_size_one_axes_and_further_splits_need_no_collective() -> None:
    assert one((None, "one"), sizes={"x": 4, "one": 1}) == []
    # x split over a, the rule computes on (a, c) (q took both): each device slices locally
    specs = [(("a", "c"), None, None, None), ("a", None, None, None)]
    found = reshards(["q", "k"], [(8, 24, 8, 16)] * 2, specs, [QKV, QKV], {"a": 2, "c": 2})
    assert found == []


def test_the_policy_refuses_warns_once_or_allows() -> None:
    found = one((None, "x"))
    with pytest.raises(CallError) as err:
        check("k", "error", ("m",), found)
    assert err.value.where == 'kernel "k"'
    for part in ("explicit mesh", "P(None, 'x')", "all-gather", "shard = ['m']", "along m", "jax.shard_map",
                 'reshard = "warn"'):
        assert part in err.value.message, part
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            check("k_warned_once", "warn", ("m",), found)
        check("k_warned_once", "warn", ("m",), reshards(["w"], [(16,)], [("x",)], [(None,)], {"x": 4}))
        check("k", "allow", ("m",), found)
        check("k", "error", ("m",), [])
    assert [str(w.message).count("all-gather") for w in caught] == [1, 1]
    assert all('kernel "k_warned_once"' in str(w.message) for w in caught)


def test_four_devices_under_an_explicit_mesh_refuse_or_run_as_the_manifest_says(train_cache: Path) -> None:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(CHILD), str(train_cache)], capture_output=True, text=True,
                       env=env, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    checks = {c["check"]: c for c in map(json.loads, lines)}
    assert r.returncode == 0, f"after {list(checks)}:\n{r.stderr[-5000:]}"
    assert set(checks) == {
        "rule, declared split, jit", "rule, declared split, eager", "rule, other split, jit",
        "rule, other split, eager", "no rule, split", "no rule, replicated", "warn", "allow, no rule",
        "allow, no rule, replicated", "inside shard_map", "auto mesh unchanged",
        "auto mesh, no rule: refused unless allowed"}
    bad = [c for c in checks.values() if not c["ok"]]
    assert not bad, bad
