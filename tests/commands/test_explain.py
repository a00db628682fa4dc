"""`cutecc explain`: cached or not, and for a miss which key inputs changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import TOY_KERNEL, toy_manifest

from cutecc.cli import main
from cutecc.commands.explain import Difference, differences, explain
from cutecc.errors import CuteccError
from cutecc.store import Store

pytestmark = pytest.mark.usefixtures("dsl")


def test_everything_cached(built) -> None:
    out = explain("scale", built.manifest, cache_dir=built.cache)
    assert [(x.variant, x.cached) for x in out] == [("threads=64", True), ("threads=128", True)]
    assert {x.key for x in out} == {e.key for e in built.store.entries()}


def test_editing_a_constant_names_constants(built) -> None:
    built.manifest.write_text(toy_manifest(threads=(64, 256)))
    x64, x256 = explain("scale", built.manifest, cache_dir=built.cache)
    assert x64.cached and not x256.cached
    # threads is also a call keyword (the variants take the same tensors): keyed as such
    assert [d.input for d in x256.differences] == ["call", "constants"]
    c, d = x256.differences
    assert c.planned == {"threads": 256} and c.cached in ({"threads": 64}, {"threads": 128})
    assert d.planned == {"threads": 256} and d.cached in ({"threads": 64}, {"threads": 128})


def test_editing_the_kernel_source_names_source_against_the_same_variant(built) -> None:
    ops = built.manifest.parent / "toy" / "ops.py"
    ops.write_text(TOY_KERNEL + "\n# an edit\n")
    out = explain("scale", built.manifest, cache_dir=built.cache)
    entries = built.entries()
    for x in out:
        assert not x.cached and [d.input for d in x.differences] == ["source"]
        assert x.closest == entries[x.variant].key  # fewest differences: the same variant
        assert x.differences[0].cached == entries[x.variant].doc["key_inputs"]["source"]


def test_another_arch_names_arch_and_variant_filters(built) -> None:
    [x] = explain("scale", built.manifest, variant="threads=128", arch="sm_80", cache_dir=built.cache)
    assert (x.variant, x.arch, x.cached) == ("threads=128", "sm_80", False)
    assert x.differences == (Difference("arch", "sm_90a", "sm_80"),)
    with pytest.raises(CuteccError, match='no variant "threads=7".*threads=128') as err:
        explain("scale", built.manifest, variant="threads=7", cache_dir=built.cache)
    assert err.value.exit_code == 2
    with pytest.raises(CuteccError, match='no kernel "nope"'):
        explain("nope", built.manifest, cache_dir=built.cache)


def test_no_cached_entry_of_the_kernel(built, tmp_path: Path) -> None:
    Store(tmp_path / "empty").ensure()  # an empty cache (a path with none is an error)
    out = explain("scale", built.manifest, cache_dir=tmp_path / "empty")
    assert all(not x.cached and x.closest is None for x in out)


def test_toolchain_differences_are_named_per_package() -> None:
    old = {"arch": "sm_90a", "toolchain": {"nvidia-cutlass-dsl": "4.8.0", "cc": "gcc 12"}}
    new = {"arch": "sm_90a", "toolchain": {"nvidia-cutlass-dsl": "4.8.1", "cc": "gcc 12"}}
    assert differences(old, new) == (Difference("toolchain.nvidia-cutlass-dsl", "4.8.0", "4.8.1"),)


def test_cli_explain(built) -> None:
    built.manifest.write_text(toy_manifest(threads=(64, 256)))
    args = ["explain", "scale", str(built.manifest), "--cache-dir", str(built.cache)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("scale[threads=64]@sm_90a ") and lines[0].endswith(": cached")
    assert "scale[threads=256]@sm_90a" in lines[1] and "miss" in lines[1]
    assert lines[3].strip() in ('constants: {"threads":64} -> {"threads":256}',
                                'constants: {"threads":128} -> {"threads":256}')
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["entries"][1]["differences"][1]["input"] == "constants"
