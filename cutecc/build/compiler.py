"""Compile one (kernel, variant, arch) through the CuTe DSL into an object file.

Runs inside a build worker process: the DSL keeps global state and reads the target
arch (`CUTE_DSL_ARCH`) when it is imported, so each worker serves one arch.

The launcher's own argument order (scalars after outputs, `None` slots, tuples, the
stream anywhere) is bridged once, here: cutecc generates a `@cute.jit` wrapper whose
parameters are in the canonical order `(inputs..., results..., scalars...)` and which
calls the launcher in its order. The wrapper is compiled with the kernel, so no
reordering happens at call time.

The object's bytes must be a function of the key alone. The DSL compiles the kernel's
host-side (x86) code for the build machine's CPU (AVX-512 code on a Zen 4, which also dies
with SIGILL on a deploy host without it), so `pin_host_target` fixes every function to
baseline x86-64. The compile-affecting `CUTE_DSL_*` variables (line info, debug,
optimisation level...) are key inputs (`cutecc.toolchain.dists.compile_env`), and the generated
wrapper's file is named by its content, not by the process, so that even a build with
line info (which records the wrapper's path) gives the same bytes again on its host.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import platforms
from cutecc.archs import dsl_arch
from cutecc.atomic import atomic_write
from cutecc.build import compile_error
from cutecc.build.retarget import RetargetError, retarget
from cutecc.contract import dtypes
from cutecc.contract.args import (
    Arg,
    CallingConvention,
    ConstArg,
    NoneArg,
    ScalarArg,
    StreamArg,
    Stride,
    StructArg,
    TensorArg,
    TupleArg,
    launched,
)
from cutecc.errors import CompileError, WorkError
from cutecc.manifest import Variant, split_entry
from cutecc.platforms import BUILD_PLATFORM
from cutecc.store import homes
from cutecc.toolchain import devicequery
from cutecc.toolchain.versions import HOST_CPU, HOST_FEATURES

# The library exports `__tvm_ffi_<SYMBOL>` (recorded in each entry's metadata): the
# linker's wrapper around the DSL's function, which the object exports as
# `__tvm_ffi_<INNER_SYMBOL>` and the link makes local.
SYMBOL = "cutecc_kernel"
INNER_SYMBOL = "cutecc_impl"
OBJECT = "kernel.o"
# Host code for another platform: the DSL's host IR, retargeted (`cutecc.build.retarget`) and
# compiled by zig (`cutecc.toolchain.versions.host_target` names it in the keys).
IR_FILE = "kernel.ll"


@dataclass(frozen=True)
class CompileJob:
    """One variant to compile, for this process's target arch (see `set_target`)."""

    entry: str
    variant: Variant
    compile_options: str
    python_path: tuple[str, ...]
    device: dict[str, Any] | None = None  # answers to torch's device queries (key input)
    platform: str = BUILD_PLATFORM  # the host platform the library's host code is for
    ptx: bool = False  # embed the kernel's PTX, not its cubin (a `compute_80` target)


def set_target(arch: str) -> None:
    """Make this process's DSL compile for `arch`: before the DSL's first import only (the
    DSL reads its variables then), so one process serves one arch. Sets `CUTE_DSL_ARCH` and
    turns the DSL's file cache off; the other compile-affecting `CUTE_DSL_*` variables stay
    as the build's environment or the manifest's `[env]` set them (they are key inputs).
    Refuses a build host that is not x86-64 (the kernels' host code is x86-64)."""
    arch = dsl_arch(arch)  # `compute_80`: the PTX of the DSL's sm_80 build
    current = os.environ.get("CUTE_DSL_ARCH")
    if "cutlass" in sys.modules:
        if current != arch:
            raise RuntimeError(f"this process's DSL was imported for {current}, not {arch}")
        return
    if platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"cutecc builds on x86-64 hosts only (this is {platform.machine()}): "
                           "the kernels' host code is x86-64")
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"


def pin_host_target(compiled: Any) -> int:
    """Fix the host-side code of a compiled function to `HOST_CPU`/`HOST_FEATURES`: the
    `target_cpu` and `target_features` attributes on every defined `llvm.func` of its
    module, which LLVM prefers to the build machine's CPU. Both are needed: the CPU alone
    keeps the host's features. Returns how many functions were pinned.

    Relies on a DSL internal (the compiled function's `ir_module`, read again by
    `export_to_c`); raises RuntimeError if the DSL no longer offers it, so a DSL upgrade
    cannot silently bring back host-dependent bytes (tests/build/test_compiler.py checks the
    exported object for VEX/EVEX instructions too).
    """
    from cutlass._mlir import ir

    module = getattr(compiled, "ir_module", None)
    if module is None or not hasattr(module, "operation"):
        raise RuntimeError("the DSL's compiled function has no `ir_module`: cutecc cannot pin its "
                           "host code to baseline x86-64 (a DSL change; update cutecc.build.compiler)")
    features = ", ".join(f'"{f}"' for f in HOST_FEATURES)
    pinned = 0
    with module.context:
        cpu = ir.StringAttr.get(HOST_CPU)
        feats = ir.Attribute.parse(f"#llvm.target_features<[{features}]>")
        todo = [module.operation]
        while todo:
            op = todo.pop()
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        o = inner.operation
                        if o.name == "llvm.func" and len(o.regions) and len(o.regions[0].blocks):
                            o.attributes["target_cpu"] = cpu
                            o.attributes["target_features"] = feats
                            pinned += 1
                        if not o.name.startswith("gpu."):  # device code is not host code
                            todo.append(o)
    if pinned == 0:
        raise RuntimeError("found no llvm.func to pin in the DSL's compiled module (a DSL change; "
                           "update cutecc.build.compiler.pin_host_target)")
    return pinned


def _result_param(t: TensorArg) -> str:
    """The wrapper's parameter for a result: an aliased one (inout, zeroed scratch) has
    its operand's name taken, so the result gets its own."""
    return f"cutecc_out_{t.name}" if t.role == "inout" or t.zero else t.name


def _view_lines(t: TensorArg, p: str, conv: CallingConvention) -> list[str]:
    """The wrapper's lines viewing parameter `p` (the dense buffer the call passes, its
    dimensions in `t.perm` order) as the tensor the launcher takes: the logical dimensions
    with the buffer's strides, and for a padded tensor the logical extents (the buffer's
    where unpadded, else static or read from the array that binds the symbol)."""
    if t.order is None and t.buffer is None:
        return []
    modes = [t.perm.index(i) for i in range(len(t.shape))]
    logical = f"cute.select({p}.layout, mode={modes})"
    if t.buffer is None:
        return [f"        cutecc_view_{t.name} = cute.make_tensor({p}.iterator, {logical})\n"]
    buf = f"cutecc_buf_{t.name}"
    extents = []
    for i, (d, b) in enumerate(zip(t.shape, t.buffer)):
        extents.append(f"{buf}.shape[{i}]" if d == b else str(d) if isinstance(d, int)
                       else _extent_of(d, conv))
    stride = f"{buf}.stride"
    if t.broadcast:  # stride 0 where broadcast: every index reads the array's one element there
        stride = "(" + "".join("0, " if i in t.broadcast else f"{buf}.stride[{i}], "
                               for i in range(len(t.shape))) + ")"
    return [f"        {buf} = {logical}\n",
            f"        cutecc_view_{t.name} = cute.make_tensor({p}.iterator, cute.make_layout(("
            + ", ".join(extents) + f",), stride={stride}))\n"]


def _extent_of(symbol: str, conv: CallingConvention) -> str:
    """An expression of the wrapper for a symbolic extent's value: a dimension of an input
    array that has it (the manifest ensures one does)."""
    for u in conv.inputs:
        for j, d in enumerate(u.extents):
            if d == symbol:
                return f"{u.name}.shape[{u.perm.index(j)}]"
    raise ValueError(f'no input array binds the extent "{symbol}"')


def wrapper_source(args: tuple[Arg, ...]) -> str:
    """Python source of the canonical-order `@cute.jit` wrapper for a launcher: `const`
    values are `cutecc_values[i]`, struct types `cutecc_types[j]`, in the order
    `closure_objects` lists them."""
    conv = CallingConvention.of(args)
    counts = {"const": 0, "struct": 0}
    params = ["cutecc_stream"]
    # Scratch comes after the call's own tensors (`ffi_inputs`, `ffi_results`): kernels
    # without it keep their wrapper, and so their bytes.
    params += [f"{t.name}: cute.Tensor" for t in conv.ffi_inputs]
    params += [f"{_result_param(t)}: cute.Tensor" for t in conv.ffi_results]
    params += [f"{s.name}: cutlass.{dtypes.DTYPES[s.dtype].cutlass}" for s in conv.scalars]

    views = []  # a tensor of another layout or padded arrives as its dense buffer: view it
    for t in (*conv.ffi_inputs, *[r for r in conv.ffi_results if r not in conv.ffi_inputs]):
        views += _view_lines(t, _result_param(t) if t.role != "input" else t.name, conv)

    def expr(a: Arg) -> str:
        if isinstance(a, TensorArg):
            if a.order is not None or a.buffer is not None:
                return f"cutecc_view_{a.name}"
            return _result_param(a) if a.role != "input" else a.name
        if isinstance(a, ScalarArg):
            return a.name
        if isinstance(a, NoneArg):
            return "None"
        if isinstance(a, StreamArg):
            return "cutecc_stream"
        if isinstance(a, ConstArg):
            counts["const"] += 1
            return f"cutecc_values[{counts['const'] - 1}]"
        if isinstance(a, StructArg):
            counts["struct"] += 1
            j = counts["struct"] - 1
            return f"cutecc_types[{j}](" + ", ".join(f"{k}={expr(f)}" for k, f in a.fields) + ")"
        inner = ", ".join(expr(i) for i in a.items)
        return f"({inner},)" if len(a.items) == 1 else f"({inner})"

    def passed(a: Arg) -> str:
        return f"{a.param}={expr(a)}" if a.param else expr(a)

    # An input passed for its extents only is a parameter of the wrapper (the custom call's
    # operand) that the launcher never receives.
    call = ", ".join([passed(a) for a in launched(args)] + ["**cutecc_consts"])
    return (
        "# Generated by cutecc: calls the launcher in its own argument order.\n"
        "import cutlass\n"
        "import cutlass.cute as cute\n\n\n"
        "def make(cutecc_launcher, cutecc_consts, cutecc_values=(), cutecc_types=()):\n"
        "    @cute.jit\n"
        f"    def cutecc_entry({', '.join(params)}):\n"
        + "".join(views)
        + f"        cutecc_launcher({call})\n\n"
        "    return cutecc_entry\n"
    )


def import_path(path: str) -> Any:
    """The object `package.module:attr[.attr]` names."""
    mod_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_value(v: Any) -> Any:
    """A manifest value (see `cutecc.manifest.values._value`) as the Python object it stands for."""
    import cutlass

    if isinstance(v, list):
        return tuple(resolve_value(x) for x in v)
    if not isinstance(v, dict):
        return v
    if "dtype" in v:
        return getattr(cutlass, dtypes.DTYPES[v["dtype"]].cutlass)
    if "dsl" in v:
        obj: Any = cutlass
        for part in v["dsl"].split(".")[1:]:
            obj = getattr(obj, part)
        return obj(resolve_value(v["value"])) if "value" in v else obj
    if "import" in v:
        return import_path(v["import"])
    if "call" in v:
        return import_path(v["call"])(*[resolve_value(x) for x in v["args"]],
                                      **{k: resolve_value(x) for k, x in v["kwargs"].items()})
    return None  # {none = true}


def closure_objects(args: tuple[Arg, ...]) -> tuple[list[Any], list[Any]]:
    """The resolved `const` values and struct types of `args`, in wrapper order."""
    values: list[Any] = []
    types: list[Any] = []

    def walk(a: Arg) -> None:
        if isinstance(a, ConstArg):
            values.append(resolve_value(a.value))
        elif isinstance(a, StructArg):
            types.append(import_path(a.type))
            for _, f in a.fields:
                walk(f)
        elif isinstance(a, TupleArg):
            for i in a.items:
                walk(i)

    for a in args:
        walk(a)
    return values, types


def resolve_entry(entry: str, factory_args: tuple[tuple[str, Any], ...] | None) -> Any:
    """Import `package.module:attr`, for a factory call it with its (resolved) arguments,
    then take the entry's indices (`mod:factory[1]`: one launcher of the tuple returned)."""
    path, indices = split_entry(entry)
    obj = import_path(path)
    if factory_args is not None:
        obj = obj(**{k: resolve_value(v) for k, v in factory_args})
    what = "the factory returned" if factory_args is not None else f"{path} is"
    for depth, i in enumerate(indices):
        here = path + "".join(f"[{j}]" for j in indices[: depth + 1])
        if isinstance(obj, (str, bytes)) or not hasattr(obj, "__getitem__") \
                or not hasattr(obj, "__len__"):
            raise TypeError(f"{here}: {what} a {type(obj).__name__}, not a tuple or list to index")
        if i >= len(obj):
            raise IndexError(f"{here}: {what} a {type(obj).__name__} of {len(obj)}, "
                             f"no item {i}")
        obj, what = obj[i], "its item is"
    if isinstance(obj, (tuple, list)) and not callable(obj):  # a published factory's launchers
        here = path + "".join(f"[{j}]" for j in indices)
        n = len(obj)
        raise TypeError(f"{here}: {what} a {type(obj).__name__} of {n}, not a launcher: name one "
                        f'with an index, entry = "{here}[i]" (i from 0 to {n - 1})')
    return obj


def _fake_args(conv: CallingConvention) -> list[Any]:
    import cutlass
    import cutlass.cute as cute

    symbols: dict[str, Any] = {}
    multiple = {d: t.multiple(i) for t in (*conv.ffi_inputs, *conv.ffi_results)
                for i, d in enumerate(t.extents) if isinstance(d, str)}
    wide = {t.extents[i] for t in (*conv.ffi_inputs, *conv.ffi_results) for i in (t.wide or ())}

    def dim(d: int | str) -> Any:
        if isinstance(d, int):
            return d
        if d not in symbols:  # its divisibility reaches the strides derived from it
            make = cute.sym_int64 if d in wide else cute.sym_int
            symbols[d] = make(divisibility=multiple[d])
        return symbols[d]

    def stride(d: Stride) -> Any:
        if isinstance(d, int):
            return d
        if d.name not in symbols:  # one runtime value however many tensors name it
            make = cute.sym_int64 if d.bits == 64 else cute.sym_int
            symbols[d.name] = make(divisibility=d.divisibility)
        return symbols[d.name]

    def tensor(t: TensorArg) -> Any:
        # The dense row-major buffer JAX passes: the array's (a padded tensor's buffer's)
        # dimensions in the declared order (`perm`); the wrapper views it logically. A
        # `runtime` dimension is a symbol of its own (the call checks its static extent).
        rank = len(t.shape)
        dims = tuple(cute.sym_int() if p in (t.runtime or ()) else dim(t.extents[p]) for p in t.perm)
        if t.stride is not None:  # declared strides: runtime values where symbolic
            return cute.runtime.make_fake_tensor(
                getattr(cutlass, dtypes.DTYPES[t.dtype].cutlass), dims,
                tuple(stride(t.stride[p]) for p in t.perm),
                assumed_align=t.align,
            )
        return cute.runtime.make_fake_compact_tensor(
            getattr(cutlass, dtypes.DTYPES[t.dtype].cutlass), dims,
            stride_order=tuple(range(rank - 1, -1, -1)),
            assumed_align=t.align,
        )

    fakes: list[Any] = [cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)]
    fakes += [tensor(t) for t in conv.ffi_inputs]
    fakes += [tensor(t) for t in conv.ffi_results]
    for s in conv.scalars:
        ctype = getattr(cutlass, dtypes.DTYPES[s.dtype].cutlass)
        fakes.append(ctype(s.default if s.default is not None else 0))
    return fakes


def compile_to_object(job: CompileJob, out_dir: Path) -> Path:
    """Compile `job` for this process's target (`set_target`) and export its object file
    into `out_dir`, defining `__tvm_ffi_<INNER_SYMBOL>` (the linker wraps it). For another
    host platform than the build's, the export is the host code's LLVM IR retargeted to
    that platform (`cutecc.build.retarget`), which the linker compiles; IR that cannot be
    retargeted is an error naming the kernel and the construct."""
    if not os.environ.get("CUTE_DSL_ARCH"):
        raise RuntimeError("no target arch: call cutecc.build.compiler.set_target first")
    from cutecc.plan.keyed_sources import front

    front(job.python_path)  # first, where the key looked, even if already on the path
    if job.ptx:
        return _export_ptx(job, out_dir)
    with devicequery.answering(job.device):  # libraries that ask the GPU while built
        compiled = compile_variant(job.entry, job.variant, job.compile_options)
    if job.platform != BUILD_PLATFORM:
        return _export_retargeted(job, compiled, out_dir)
    pin_host_target(compiled)
    obj = out_dir / OBJECT
    compiled.export_to_c(str(obj), function_name=INNER_SYMBOL)
    return obj


# The device code the DSL embeds in the host IR, loaded by `cudaLibraryLoadData`, which
# takes a cubin, a fatbin or NUL-terminated PTX alike.
_BINARY = re.compile(r'^@kernels_binary = internal constant \[(\d+) x i8\] c"[^"\n]*"', re.M)


def _export_ptx(job: CompileJob, out_dir: Path) -> Path:
    """The host IR of `job` compiled with its PTX (the DSL's `--keep-ptx`, read back as
    `compiled.__ptx__`) embedded instead of its cubin, so the CUDA driver compiles it for
    the GPU that loads it (a newer one included). The IR is `_export_retargeted`'s."""
    with tempfile.TemporaryDirectory(prefix="cutecc-ptx-") as dump:
        options = " ".join(o for o in (job.compile_options, "--keep-ptx", f"--dump-dir={dump}") if o)
        with devicequery.answering(job.device):
            compiled = compile_variant(job.entry, job.variant, options)
        ptx = getattr(compiled, "__ptx__", None)
    if not isinstance(ptx, str) or ".target" not in ptx:
        raise RuntimeError("the DSL gave no PTX for --keep-ptx (`__ptx__`; a DSL change: update "
                           "cutecc.build.compiler._export_ptx)")
    ir = _export_retargeted(job, compiled, out_dir)
    text = ir.read_text(encoding="utf-8")
    found = _BINARY.findall(text)
    if len(found) != 1:
        raise RuntimeError(f"the host IR holds {len(found)} embedded device binaries, not one (a DSL "
                           "change: update cutecc.build.compiler._export_ptx)")
    data = ptx.encode() + b"\0"
    body = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in data)
    ir.write_text(_BINARY.sub(lambda _: f'@kernels_binary = internal constant [{len(data)} x i8] c"{body}"',
                              text, count=1), encoding="utf-8")
    return ir


def _export_retargeted(job: CompileJob, compiled: Any, out_dir: Path) -> Path:
    """The host IR of `compiled` (the DSL's `export_to_c` writes LLVM IR for a `.ll` path),
    retargeted to `job.platform`. The IR is exported pinned to baseline x86-64 like an
    object (the DSL optimises it before export, for the CPU the IR names), so it is the
    same on every build host; the pin's CPU becomes the target's baseline one (zig's
    `-mcpu=baseline` too) and its features go."""
    pin_host_target(compiled)
    ir = out_dir / IR_FILE
    compiled.export_to_c(str(ir), function_name=INNER_SYMBOL)
    head = ir.read_bytes()[:4096]
    if head.startswith(b"\x7fELF") or b"target triple" not in head:
        raise RuntimeError("the DSL's export_to_c wrote no LLVM IR for a .ll path (a DSL change; "
                           "update cutecc.build.compiler._export_retargeted)")
    features = ",".join(HOST_FEATURES)
    try:
        text = ir.read_text(encoding="utf-8")
        ir.write_text(retarget(text, platforms.get(job.platform), pinned_cpu=f'"target-cpu"="{HOST_CPU}"',
                               pinned_features=f'"target-features"="{features}"'), encoding="utf-8")
    except (RetargetError, UnicodeDecodeError) as e:
        arch = os.environ.get("CUTE_DSL_ARCH", "?")
        raise WorkError(f'kernel "{job.variant.kernel}", variant {job.variant.id}, arch {arch} '
                        f"({job.entry}): its host code cannot be built for {job.platform}: {e}",
                        where=job.variant.kernel) from None
    return ir


def compile_variant(entry: str, variant: Variant, compile_options: str = "", *,
                    engine: bool = False) -> Any:
    """`cute.compile` of one variant of a launcher for TVM-FFI, in this process, through
    the generated wrapper that takes the canonical order (stream, inputs, results, scalars).
    The DSL must already be importable for the target arch (`CUTE_DSL_ARCH`). Without
    `engine` the result can be exported (`export_to_c`) but not called here: the DSL skips
    its in-process JIT of the host code (and that JIT's second LLVM codegen); the exported
    bytes are the same either way."""
    try:
        return _compile_variant(entry, variant, compile_options, engine)
    except Exception as e:
        raise CompileError(_compile_failure(entry, variant, e), where=variant.kernel,
                           traceback=compile_error.traceback_text(e)) from e


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A launcher parameter the manifest's `args` gave nothing for (Python's own TypeError).
_MISSING = re.compile(r"missing \d+ required positional arguments?: (.*)")


def _compile_failure(entry: str, variant: Variant, e: Exception) -> str:
    """A DSL or launcher exception, told at the kernel's file and line (the innermost frame
    of the project's or a published package's code; `cutecc.build.compile_error`) with the
    manifest values that reached it."""
    arch = os.environ.get("CUTE_DSL_ARCH", "?")
    # The DSL's IR errors colour their text and say what failed on the lines after the
    # first ("... could not build valid IR" / "'cute.copy' op ... alignment ..."): keep those.
    lines = [x.strip() for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
    what = compile_error.escaped(" / ".join(lines[:3])[:400]) or "(no message)"
    values = [f"factory_args.{k} = {json.dumps(v)}" for k, v in variant.factory_args or ()]
    values += [f"constants.{k} = {json.dumps(v)}" for k, v in variant.constants]
    frame = compile_error.kernel_frame(e)
    at = f"{frame.place}: " if frame else ""
    msg = (f'kernel "{variant.kernel}", variant {variant.id}, arch {arch} ({entry}): '
           f"{at}{type(e).__name__}: {what}")
    if frame:
        msg += f"\n  {frame.place}: {frame.source}" + (f"  {frame.summary()}" if frame.summary() else "")
    missing = _MISSING.search(what) if isinstance(e, TypeError) else None
    if missing:
        msg += "\n  hint: " + _missing_hint(variant.kernel, missing.group(1))
    if values:
        msg += "\n  manifest values passed: " + "; ".join(values)
    plain = [x for x in values if _looks_like_dsl_type(x.rpartition(" = ")[2])]
    if plain:
        msg += ("\n  hint: " + plain[0].partition(" = ")[0] + " is a plain string; where the DSL "
                'expects a type, write { dtype = "bfloat16" } or { dsl = "cutlass.BFloat16" }')
    return msg


def _missing_hint(kernel: str, params: str) -> str:
    """What to declare for launcher parameters the call left out (`'stream'`, `'x' and 'y'`)."""
    names = re.findall(r"'([^']*)'", params)
    if names == ["stream"]:
        return (f'the launcher takes a stream: add {{ kind = "stream" }} to kernel.{kernel}.args '
                "where it takes it")
    shown = ", ".join(compile_error.escaped(n) for n in names) or "?"
    return (f"kernel.{kernel}.args gives nothing for the launcher's parameter(s) {shown}: declare "
            'each in the launcher\'s order (a tensor, { kind = "scalar" }, { kind = "stream" }, '
            '{ kind = "none" }, { kind = "const" }...)')


def _looks_like_dsl_type(text: str) -> bool:
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return isinstance(v, str) and (dtypes.canonical(v) is not None or v.removeprefix("cutlass.") in
                                   {d.cutlass for d in dtypes.DTYPES.values()})


def _compile_variant(entry: str, variant: Variant, compile_options: str, engine: bool) -> Any:
    import cutlass.cute as cute

    launcher = resolve_entry(entry, variant.factory_args)
    values, types = closure_objects(variant.args)
    src = _wrapper_file(wrapper_source(variant.args))
    spec = importlib.util.spec_from_file_location(src.stem, src)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[src.stem] = module
    try:
        spec.loader.exec_module(module)
        entry_fn = module.make(launcher, {k: resolve_value(v) for k, v in variant.constants},
                               values, types)
        options = " ".join(o for o in ("--enable-tvm-ffi", compile_options) if o)
        return cute.compile(entry_fn, *_fake_args(variant.convention), options=options,
                            no_jit_engine=not engine)
    finally:
        sys.modules.pop(src.stem, None)


def _wrapper_file(source: str) -> Path:
    """The generated wrapper as a file (the DSL reads a jit's source from its file, and line
    info records its path): one fixed path per wrapper source, the same in every process,
    in a directory of this user's, written atomically."""
    wdir, why = homes.make(homes.WRAPPERS)
    if wdir is None or why is not None:
        raise WorkError(f"the generated wrappers' directory: {why}", where="compile")
    src = wdir / f"cutecc_wrapper_{hashlib.sha256(source.encode()).hexdigest()[:16]}.py"
    atomic_write(src, source.encode(), 0o600)
    return src
