"""Each cubin's SM is read back from its ELF header and checked against the key's arch
before an entry is published: a library holding code for another GPU (a worker whose DSL
targeted the wrong arch) is refused at build and never reaches the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import opts
from helpers import planted_cubin as planted

from cutecc import cubin


@pytest.mark.parametrize(("image", "sm"), [
    (planted(90, 8, 0x6000004), 90),  # what the DSL writes for sm_90a (CUDA 12.8+ ABI)
    (planted(100, 8), 100),
    (planted(90, 7, 0x400 | 0x800), 90),  # the older ABI: sm_90a's accelerator flag beside it
    (planted(80, 7, 0x400), 80),
    (planted(90, 9), None),  # an ABI version this does not know
])
def test_the_sm_is_read_from_the_header(image: bytes, sm: int | None) -> None:
    assert cubin.sm_of(image) == sm


def test_a_library_with_a_cubin_of_another_sm_has_a_problem() -> None:
    lib = b"host code" + planted(90) + b"more host code"
    assert cubin.arch_problem(lib, "sm_90a") is None and cubin.arch_problem(lib, "sm_90") is None
    assert cubin.arch_problem(lib, "sm_100a") == "cubin 0 is for sm_90, the key's arch is sm_100a (sm_100)"
    two = lib + planted(80)
    assert "cubin 1 is for sm_80" in str(cubin.arch_problem(two, "sm_90a"))
    assert "records no SM" in str(cubin.arch_problem(b"x" + planted(90, 9), "sm_90a"))


def test_a_build_handed_a_wrong_arch_cubin_refuses_to_publish(tmp_path: Path, toy_project: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """build_one with the compiler and linker standing in: the planted library's cubin is
    for sm_80 while the key says sm_90a, so the entry fails and nothing is published; the
    same build handed a cubin of the key's SM publishes it."""
    pytest.importorskip("ziglang", reason="the runtime library is linked with zig")
    import cutecc.build.compiler
    import cutecc.build.linker
    from cutecc.build.workers import BuildJob, build_one
    from cutecc.commands.build import build
    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan
    from cutecc.store import Store

    cache = tmp_path / "cache"
    assert build(toy_project, opts(cache_dir=cache), dry_run=True).ok  # makes the cache
    Store(cache).ensure()
    manifest = load_manifest(toy_project)
    job = BuildJob.of(plan(manifest, ("sm_90a",))[0], manifest)
    sm = {"value": 80}

    def compile_to_object(cjob: Any, staging: Path) -> Path:
        (staging / "k.o").write_bytes(b"object")
        return staging / "k.o"

    def link(obj: Path, out: Path, *a: Any, **kw: Any) -> None:
        out.write_bytes(b"\x7fELF host library" + planted(sm["value"]))

    monkeypatch.setattr(cutecc.build.compiler, "compile_to_object", compile_to_object)
    monkeypatch.setattr(cutecc.build.linker, "link", link)
    # build_one in this test process: what the process read before (other tests' planted
    # files) is no compile's read set (tests/faults/test_read_set.py checks that in workers)
    monkeypatch.setenv("CUTECC_INTERNAL_AUDIT", "off")
    res = build_one(job, str(cache))
    assert res.status == "failed" and "refusing to publish: cubin 0 is for sm_80, the key's arch is sm_90a" \
        in str(res.error)
    assert Store(cache).get(job.key) is None and not list((cache / "tmp").iterdir())
    sm["value"] = 90
    assert build_one(job, str(cache)).status == "built" and Store(cache).get(job.key) is not None



PTX = b"//\n// Generated\n//\n\n.version 9.4\n.target sm_80\n.address_size 64\n\0"


def test_a_portable_ptx_library_carries_ptx_of_its_target_and_no_cubin() -> None:
    """`compute_80`: the PTX's `.target` is read instead of a cubin's SM."""
    lib = b"host code" + PTX + b"more host code"
    assert cubin.ptx_targets(lib) == ["sm_80"]
    assert cubin.arch_problem(lib, "compute_80") is None
    assert cubin.arch_problem(lib, "compute_90") == (
        "its PTX targets sm_80, the key's arch is compute_90 (.target sm_90)")
    assert cubin.arch_problem(b"host code", "compute_80") == "it carries no PTX, the key's arch is compute_80"
    both = lib + planted(80)
    assert cubin.arch_problem(both, "compute_80") == (
        "it carries 1 cubin(s), the key's arch compute_80 is portable PTX only")
