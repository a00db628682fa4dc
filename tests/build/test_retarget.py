"""Retargeting host IR to aarch64: what is refused, what is rewritten, and that the
pinned data layout is the one zig's compiler uses for the target."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from cutecc.build.retarget import RetargetError, retarget
from cutecc.platforms import AARCH64, X86_64

IR = """; ModuleID = 'LLVMDialectModule'
source_filename = "LLVMDialectModule"
target datalayout = "{dl}"
target triple = "x86_64-unknown-linux-gnu"

@kernels_binary = internal constant [4 x i8] c"\\7FELF"

declare i32 @_cudaLaunchKernelEx(ptr, ptr, ptr) local_unnamed_addr

declare void @llvm.lifetime.start.p0(ptr captures(none)) #0

define i32 @__tvm_ffi_cutecc_impl(ptr %0, ptr %1, i32 %2, ptr %3) {{
  %5 = call i32 @_cudaLaunchKernelEx(ptr %0, ptr %1, ptr %3)
  ret i32 %5
}}
{extra}
attributes #0 = {{ nocallback nofree nosync nounwind willreturn memory(argmem: readwrite) }}
"""


def ir(extra: str = "") -> str:
    return IR.format(dl=X86_64.datalayout, extra=extra)


def test_retarget_rewrites_the_triple_and_data_layout_only() -> None:
    out = retarget(ir(), AARCH64)
    assert f'target triple = "{AARCH64.triple}"' in out
    assert f'target datalayout = "{AARCH64.datalayout}"' in out
    assert "x86_64" not in out
    strip = [x for x in ir().splitlines() if not x.startswith("target ")]
    assert strip == [x for x in out.splitlines() if not x.startswith("target ")]


@pytest.mark.parametrize(("extra", "what"), [
    ("declare void @llvm.x86.sse2.pause()", "an x86 intrinsic"),
    ("declare void @take({ ptr, i64 })", "aggregate passed by value to or from the external function @take"),
    ("declare { i64, i64 } @give(ptr)", "external function @give"),
    ("declare void @f([4 x i32])", "external function @f"),
    ("declare void @g(ptr byval(i64) align 8)", "external function @g"),
    ("declare void @h(ptr sret(i64))", "external function @h"),
    ('define void @a() {\n  call void asm sideeffect "pause", ""()\n  ret void\n}', "inline assembly"),
    ('attributes #9 = { "target-cpu"="znver4" }', "a CPU attribute"),
    ("@x = global x86_fp80 0xK00000000000000000000", "x86_fp80"),
    ("define x86_vectorcallcc void @v() {\n  ret void\n}", "an x86 calling convention"),
])
def test_what_cannot_be_retargeted_is_refused_by_name(extra: str, what: str) -> None:
    with pytest.raises(RetargetError, match="line [0-9]+") as e:
        retarget(ir(extra), AARCH64)
    assert what in str(e.value)


def test_only_the_builds_own_cpu_pin_is_replaced_by_the_targets_baseline() -> None:
    pin = {"pinned_cpu": '"target-cpu"="x86-64"', "pinned_features": '"target-features"="+sse2"'}
    out = retarget(ir('attributes #1 = { "target-cpu"="x86-64" "target-features"="+sse2" }'), AARCH64, **pin)
    assert 'attributes #1 = { "target-cpu"="generic" }' in out and "sse2" not in out
    with pytest.raises(RetargetError, match="a CPU attribute"):  # another CPU than the pin's
        retarget(ir('attributes #1 = { "target-cpu"="znver4" "target-features"="+sse2" }'), AARCH64, **pin)
    with pytest.raises(RetargetError, match="a CPU attribute"):  # features the pin did not set
        retarget(ir('attributes #1 = { "target-cpu"="x86-64" "target-features"="+avx512f" }'), AARCH64,
                 **pin)


def test_ir_without_exactly_one_triple_is_refused() -> None:
    with pytest.raises(RetargetError, match="exactly one"):
        retarget(ir().replace('target triple = "x86_64-unknown-linux-gnu"\n', ""), AARCH64)


def test_the_pinned_data_layouts_are_zigs(tmp_path: Path) -> None:
    """The layout written into retargeted IR is what zig's clang emits for each target."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs the build extra (ziglang)")
    zig = Path(next(iter(spec.submodule_search_locations))) / "zig"
    (tmp_path / "x.c").write_text("int x;\n")
    for p in (X86_64, AARCH64):
        out = tmp_path / f"{p.name}.ll"
        r = subprocess.run([str(zig), "cc", "-target", p.zig_target, "-S", "-emit-llvm", "-o", str(out),
                            str(tmp_path / "x.c")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert f'target datalayout = "{p.datalayout}"' in out.read_text(), p.name


class _Compiled:
    """Stands for the DSL's compiled function: `export_to_c` writes the given IR."""

    def __init__(self, text: str) -> None:
        self.text = text

    def export_to_c(self, path: str, function_name: str) -> None:
        assert path.endswith(".ll") and function_name == "cutecc_impl"
        Path(path).write_text(self.text)


def test_a_kernel_whose_host_ir_cannot_be_retargeted_fails_its_build_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import REPO

    from cutecc.build import compiler
    from cutecc.build.compiler import CompileJob, _export_retargeted

    pins: list[object] = []
    monkeypatch.setattr(compiler, "pin_host_target", pins.append)  # the fake has no DSL module
    from cutecc.errors import CuteccError
    from cutecc.manifest import load_manifest

    k = load_manifest(REPO / "kernels.toml").kernels[0]
    job = CompileJob(k.entry, k.variants[0], "", (), platform="aarch64")
    pinned = ir('attributes #1 = { noinline "target-cpu"="x86-64" "target-features"="+sse2" }')
    good = _export_retargeted(job, _Compiled(pinned), tmp_path).read_text()
    assert len(pins) == 1  # exported pinned, so the DSL optimises alike on every build host
    assert f'target triple = "{AARCH64.triple}"' in good
    assert 'attributes #1 = { noinline "target-cpu"="generic" }' in good
    with pytest.raises(RuntimeError, match="wrote no LLVM IR for a .ll path"):  # a DSL that changed
        _export_retargeted(job, _Compiled("\x7fELF\x02\x01 an object"), tmp_path)
    with pytest.raises(CuteccError) as e:
        _export_retargeted(job, _Compiled(ir("declare void @take({ ptr, i64 })")), tmp_path)
    msg = str(e.value)
    assert e.value.exit_code == 1 and f'kernel "{k.name}", variant {k.variants[0].id}' in msg
    assert "cannot be built for aarch64" in msg and "@take" in msg and "line " in msg
