"""Names that collide with the call's own Python signature.

A variant parameter that is a call keyword becomes a keyword of `KernelFn.__call__`, a
runtime scalar too, and a kernel name an attribute of the loaded kernel set. `self` was
accepted and built, then `ax(x, y, self=128)` raised `TypeError: multiple values for
argument 'self'`; `__class__`, `arrays`, `_` and a 300-character name were accepted too.
The manifest refuses them (exit 2, file and key path); an entry read from disk whose call
keywords are such names is set aside with the reason, never served.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest

from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import compute_key
from cutecc.names import CALL_RESERVED, KERNEL_SET_RESERVED, MAX_NAME_CHARS
from cutecc.store.index_record import IndexRecord

from .conftest import ARCH, META, Cache, cli, out, py
from .test_input_edges import manifest, refused

BAD_CALL_NAMES = ["self", "arrays", "scalars", "__class__", "_", "_x", "name", "builds", "select",
                  "a" * 300, "a" * (MAX_NAME_CHARS + 1)]


def _variants(tmp_path: Path, param: str) -> Path:
    """axpy with two variants that differ only in `param` (so it is a call keyword)."""
    path = manifest(tmp_path)
    text = path.read_text().replace("constants = { threads = 256 }",
                                    f'constants = {{ threads = "${param}" }}\n'
                                    f"variants = {{ {param} = [128, 256] }}")
    path.write_text(text)
    return path


def test_a_call_keyword_of_ordinary_name_is_planned(tmp_path: Path) -> None:
    """(Control: the template with a call keyword `threads` plans two entries.)"""
    r = cli("build", _variants(tmp_path, "threads"), "--dry-run", "--cache-dir", tmp_path / "c")
    assert r.returncode == 0 and r.stdout.count("would build axpy[") == 2, out(r)


@pytest.mark.parametrize("name", BAD_CALL_NAMES, ids=lambda n: n if len(n) < 20 else f"{len(n)}chars")
def test_a_call_keyword_that_collides_with_the_call_is_refused(tmp_path: Path, name: str) -> None:
    """A call keyword named as the call's own parameters (`self`), an attribute
    of the kernel object, starting with `_` or over the length cap: exit 2, key path."""
    err = refused(_variants(tmp_path, name), "kernels.toml", f"variants.{name[:40]}")
    assert "call keyword" in err, err


@pytest.mark.parametrize("name", ["self", "_x", "a" * (MAX_NAME_CHARS + 1)],
                         ids=["self", "_x", "long"])
def test_a_runtime_scalar_that_collides_with_the_call_is_refused(tmp_path: Path, name: str) -> None:
    """A runtime scalar is a keyword of the same call (`ax(x, y, alpha=2.0)`)."""
    scalar = f'{{ kind = "scalar", name = "{name}", dtype = "float32", default = 1.0 }}'
    refused(manifest(tmp_path, scalar=scalar), "kernels.toml", "name")


@pytest.mark.parametrize("name", ["k" * (MAX_NAME_CHARS + 1), "k" * 300, "_", "__class__"],
                         ids=["65chars", "300chars", "_", "__class__"])
def test_a_kernel_name_over_the_cap_or_private_is_refused(tmp_path: Path, name: str) -> None:
    """Kernel names are capped and never start with `_`."""
    refused(manifest(tmp_path, name=name), "kernels.toml", name[:40])


def test_the_name_rules_cover_the_runtime_classes() -> None:
    """The constants the manifest checks against (it must not import JAX) cover what the
    runtime's classes really have: every public attribute and every call parameter."""
    pytest.importorskip("jax")
    from cutecc.runtime.dispatch import CompositeFn, KernelFn
    from cutecc.runtime.loader import KernelSet

    fn = KernelFn("k", [])
    mine = {n for n in dir(fn) if not n.startswith("_")}
    mine |= set(inspect.signature(KernelFn.__call__).parameters)
    assert mine <= CALL_RESERVED, sorted(mine - CALL_RESERVED)
    composite = CompositeFn("c", ["k"], ["x"], ["out"])
    mine = {n for n in dir(composite) if not n.startswith("_")}
    mine |= set(inspect.signature(CompositeFn.__call__).parameters)
    assert mine <= CALL_RESERVED, sorted(mine - CALL_RESERVED)
    ks = KernelSet(Path("/nonexistent"), ARCH, lambda n: fn, lambda: [], lambda n: False)
    theirs = {n for n in dir(ks) if not n.startswith("_")}
    assert theirs <= KERNEL_SET_RESERVED, sorted(theirs - KERNEL_SET_RESERVED)


PLANT = r'''
import json, sys
import cutecc
ks = cutecc.load(sys.argv[1], arch=sys.argv[2], kernels=["mul"])
fn = ks.mul
print(json.dumps({"keys": [b.key for b in fn.builds], "keywords": sorted(fn.keywords),
                  "unusable": list(fn.unusable)}))
'''


@pytest.mark.parametrize("name", ["self", "_x", "a" * 300], ids=["self", "_x", "300chars"])
def test_an_entry_whose_call_keyword_collides_is_set_aside(cache: Cache, name: str) -> None:
    """A planted meta.json whose key inputs give it the call keyword `self`
    (self-consistent: the key is recomputed) is unusable with the reason, never served."""
    from cutecc.store import Store

    store = Store(cache.root)
    shutil.rmtree(store.generations_dir, ignore_errors=True)  # hand-made: every entry counts
    old = cache.key("mul", "float32")
    meta = cache.meta(old)
    meta["key_inputs"]["call"] = {name: 128}
    meta["variant"] = f"dtype=float32,{name}=128"  # a variant of its own (not a keyed field)
    new = meta["key"] = compute_key(meta["key_inputs"])
    shutil.copytree(cache.entry(old), cache.entry(new))
    cache.write_meta(new, meta)
    # indexed by hand (the store indexes only records that pass the checks): `load` lists it
    record = store.layout.index_record("mul", new)
    record.write_bytes(IndexRecord(new, "mul", meta["variant"], meta["arch"], None).dumps())
    r = py(PLANT, cache.root, ARCH)
    assert r.returncode == 0, out(r)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert new not in got["keys"] and name not in got["keywords"], got
    assert any(new[:12] in u and "call keyword" in u for u in got["unusable"]), got


def test_the_error_of_a_name_over_the_cap_states_the_cap(tmp_path: Path) -> None:
    """The refusal of a long name says the cap."""
    err = refused(_variants(tmp_path, "a" * 300), "variants")
    assert str(MAX_NAME_CHARS) in err and "300" in err, err


def test_an_entry_whose_runtime_scalar_collides_is_set_aside(cache: Cache) -> None:
    """The same for a runtime scalar read from disk: axpy's `alpha` renamed
    `self` in its contract and key inputs (the key recomputed) is set aside, not served."""
    from cutecc.store import Store

    store = Store(cache.root)
    shutil.rmtree(store.generations_dir, ignore_errors=True)
    old = cache.key("axpy")
    meta = cache.meta(old)
    for args in (meta["args"], meta["key_inputs"]["args"]):
        (scalar,) = [a for a in args if a.get("kind") == "scalar"]
        scalar["name"] = "self"
    new = meta["key"] = compute_key(meta["key_inputs"])
    meta["built_at"] = "2099-01-01T00:00:00+00:00"  # the newest of its variant: it would win
    shutil.copytree(cache.entry(old), cache.entry(new))
    cache.write_meta(new, meta)
    store.index(new, EntryMeta.parse(meta, new), cache.entry(new) / META)
    r = py(PLANT.replace('"mul"', '"axpy"').replace("ks.mul", "ks.axpy"), cache.root, ARCH)
    assert r.returncode == 0, out(r)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert new not in got["keys"], got
    assert any(new[:12] in u and "runtime scalar 'self'" in u for u in got["unusable"]), got
