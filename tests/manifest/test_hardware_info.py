"""The DSL's own device queries (`cutlass.utils.HardwareInfo`) made while a launcher is
traced, answered on this CPU host from the hardware profile (issue 48, item 9), keyed for
the code that names them and for no other kernel. Toy kernels under tmp_path; the builds
compile with the real DSL (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TOY_KERNEL, opts

from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan

ASKS = '''\
import json
import os

import cutlass
import cutlass.cute as cute
from cutlass.utils import HardwareInfo

from toy.ops import scale


def _answers():
    hw = HardwareInfo()
    got = {"clusters_1": hw.get_max_active_clusters(1), "sms": hw.get_device_multiprocessor_count(),
           "l2": hw.get_l2_cache_size_in_bytes()}
    if os.environ.get("ASK_CLUSTERS_2"):
        got["clusters_2"] = hw.get_max_active_clusters(2)
    with open(os.environ["HW_RECORD"], "w") as f:
        json.dump(got, f)
    return got


@cute.jit
def persistent(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream):
    got = _answers()  # asked while the launcher is traced, as FA4's tile schedulers do
    scale(x, out, factor, stream, 64 if got["sms"] > 100 else 128)
'''

UNNAMED = '''\
import cutlass
import cutlass.cute as cute
import cutlass.utils

from toy.ops import scale


@cute.jit
def persistent(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream):
    sms = cutlass.utils.HardwareInfo().get_device_multiprocessor_count()
    scale(x, out, factor, stream, 64 if sms > 100 else 128)
'''

ARGS = '''args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
'''


def _project(root: Path, profile: str = "h100", extra: str = "") -> Path:
    for rel, text in {"toy/__init__.py": "", "toy/ops.py": TOY_KERNEL, "pub/__init__.py": "",
                      "pub/asks.py": ASKS, "pub/unnamed.py": UNNAMED}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "kernels.toml").write_text(
        f'archs = ["sm_90a"]\nprofile = "{profile}"\n'
        f'\n[kernel.asks]\nentry = "pub.asks:persistent"\n{ARGS}'
        f'\n[kernel.plain]\nentry = "toy.ops:scale"\nconstants = {{ threads = 64 }}\n{ARGS}' + extra)
    return root / "kernels.toml"


def test_the_answers_are_keyed_for_code_that_names_hardware_info_only(tmp_path: Path) -> None:
    manifest = _project(tmp_path)
    h100 = {p.kernel.name: p for p in plan(load_manifest(manifest))}
    device = h100["asks"].inputs["device"]
    assert device["multi_processor_count"] == 132 and device["L2_cache_size"] == 52428800
    assert "device" not in h100["plain"].inputs  # an unused answer moves no key
    # a profile's cluster answers are keyed where declared, and only there
    manifest.write_text(manifest.read_text().replace('profile = "h100"', 'profile = "mine"')
                        + '\n[hardware.mine]\narch = "sm_90a"\nsm_count = 132\nl2_bytes = 52428800\n'
                        'max_active_clusters_2 = 66\n')
    mine = {p.kernel.name: p for p in plan(load_manifest(manifest))}
    assert mine["asks"].inputs["device"]["max_active_clusters_2"] == 66
    assert mine["asks"].key != h100["asks"].key and mine["plain"].key == h100["plain"].key


@pytest.mark.usefixtures("dsl")
def test_a_launcher_asking_hardware_info_while_traced_builds_on_a_cpu_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.commands.build import build
    from cutecc.manifest import BUILTIN_PROFILES

    record = tmp_path / "answers.json"
    monkeypatch.setenv("HW_RECORD", str(record))
    manifest = _project(tmp_path)
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False, kernels=("asks",))
    by = {o.planned.kernel.name: o for o in report.outcomes}
    assert by["asks"].status == "built", by["asks"].error
    h100 = BUILTIN_PROFILES["h100"]
    assert json.loads(record.read_text()) == {"clusters_1": h100["sm_count"], "sms": h100["sm_count"],
                                              "l2": h100["l2_bytes"]}
    # a cluster size the profile does not answer fails the build, naming the fact to add
    monkeypatch.setenv("ASK_CLUSTERS_2", "1")
    manifest.write_text(manifest.read_text().replace('profile = "h100"', 'profile = "mine"')
                        + '\n[hardware.mine]\narch = "sm_90a"\nsm_count = 120\nl2_bytes = 1024\n')
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False, kernels=("asks",))
    err = {o.planned.kernel.name: o for o in report.outcomes}["asks"].error or ""
    assert "get_max_active_clusters(2) was asked" in err and \
        "add max_active_clusters_2 = ... to [hardware.mine]" in err, err
    manifest.write_text(manifest.read_text() + "max_active_clusters_2 = 60\n")
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False, kernels=("asks",))
    assert {o.planned.kernel.name: o for o in report.outcomes}["asks"].status == "built"
    assert json.loads(record.read_text()) == {"clusters_1": 120, "sms": 120, "l2": 1024, "clusters_2": 60}


@pytest.mark.usefixtures("dsl")
def test_a_query_the_key_does_not_hold_fails_saying_how_to_name_it(tmp_path: Path) -> None:
    from cutecc.commands.build import build

    manifest = _project(tmp_path)
    manifest.write_text(manifest.read_text().replace("pub.asks:persistent", "pub.unnamed:persistent"))
    assert "device" not in {p.kernel.name: p for p in plan(load_manifest(manifest))}["asks"].inputs
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False, kernels=("asks",))
    err = {o.planned.kernel.name: o for o in report.outcomes}["asks"].error or ""
    assert "its key holds no device answers" in err and "from cutlass.utils import HardwareInfo" in err, err
    assert "DynamicLibNotFoundError" not in err
