"""The manifest (`kernels.toml`, or `[tool.cutecc]` in `pyproject.toml`), parsed once.

Everything is validated here, before anything is compiled: the result is a tree of
frozen dataclasses the rest of cutecc trusts. Every error is a `CuteccError` naming
the file and the key path, e.g. `kernel "rmsnorm", args[2].dtype: unknown dtype "f8"`.

Schema (format 1), top level (or under `[tool.cutecc]`):
  format = 1                      optional; the manifest format version
  archs = ["sm_90a"]              default target architectures
  platforms = ["x86_64"]          host platforms of the libraries (default: the build
                                  host's; "aarch64" for Grace hosts: cutecc.platforms)
  profile = "h100"                default hardware profile (facts a launcher may need, as
                                  "$hw.<fact>" and as the answers to torch.cuda's device
                                  queries while the build constructs it: cutecc.devicequery)
  python_path = ["."]             dirs, relative to the manifest, to import entries from
  compile_options = ""            extra `cute.compile` options
  [env]                           environment the build workers set before any import
                                  (NAME = "value"; "$arch" is the worker's target); keyed
  [build]                         where this project builds (flags and $CUTECC_* override):
    executor = "local" | "ray"    ray_address = "ray://host:10001"
    remote = "s3://bucket/prefix" a shared cache, read-only here: writing stays an explicit
                                  --remote-write / $CUTECC_REMOTE_WRITE=1 (CI's choice)
    compile_timeout = 3600        seconds one compile may run before it is stopped (0: none)
    compile_memory = "16G"        data memory one compile may use (default: no limit)
    pins = "requirements.txt"     the file pinning the build environment (hashes): named
                                  when a build finds other distributions than its lock's
  [hardware.NAME]                 custom hardware profiles: key = int | float | str
  [kernel.NAME]                   one table per kernel:
    entry = "pkg.module:attr"     a @cute.jit launcher, or a factory if factory_args is set;
                                  "pkg.module:attr[i]" indexes into it (the factory's result
                                  when factory_args is set): a factory returning a tuple
    factory_args = {..}           keyword arguments the factory is called with; values (here,
                                  in constants and const args) are numbers, strings, bools,
                                  arrays (tuples) or typed tables: {dtype = "bfloat16"},
                                  {dsl = "cutlass.Int32", value = 5}, {import = "m:Name"},
                                  {call = "m:f", args = [..], kwargs = {..}}, {none = true}
    args = [..]                   the launcher's arguments in its own order:
      {name, dtype, shape, role = "input"|"output"|"inout"|"scratch", zero, buffer, layout, align,
       may_alias}
        a tensor; an output's or scratch's extent may be derived, an expression over symbols,
        "$param"s and "$hw.fact"s (`cutecc.expr`); scratch is allocated (zero = true: zeroed)
        and dropped by the runtime;
        layout = "row-major" (default) | "column-major" | [stride order, 0 = stride 1];
        or mode = [..] (cutlass_call's): dimension i is dimension mode[i] of the array the
        caller holds, which the call takes and returns as held (no transpose);
        stride = [..]: per dimension an int or a symbol (a runtime stride; facts in symbols);
        runtime = [i, ..]: static or derived extents compiled as runtime values of their own;
        align = bytes or "$param";
        buffer = [..] (input/inout): the shape of the padded array passed, of which the
        kernel sees the `shape` block at its origin with the buffer's strides (`lda`);
        may_alias = "x" (output): the kernel may write it in input x's memory (it reads each
        element before writing it): `ks.k.in_place(..)` lets XLA reuse x's buffer
      {kind = "scalar", name, dtype, default}    a runtime scalar (keyword at the JAX side);
        with value = <int or expression> instead, derived: the runtime computes and passes it
      {kind = "none"}   {kind = "stream"}   {kind = "tuple", items = [..]}
      {kind = "const", value = V}                a compile-time value in the launcher's order
      {kind = "struct", type = "pkg.mod:Name", fields = {f = <arg>, ..}}  a NamedTuple/dataclass
      any argument may carry param = "NAME": passed by that keyword; undeclared parameters
      in between keep their Python defaults
    constants = {..}              compile-time keyword arguments of the launcher
    derive = {p = {axis = {value = v, ..}}}   a parameter that follows one axis (no axis itself)
    symbols = {n = {divisibility = 8}}   facts about symbolic extents (checked at call time);
                                  a divisibility may be a "$param" (per variant)
    variants = {param = [..]}     a matrix; "$param" in dtype/shape/constants/factory_args;
                                  values are numbers, strings, bools or, for a whole axis,
                                  import references {import = "pkg.mod:Name"} (Python
                                  objects; "$param" then stands in typed values only)
                                  a parameter that the input tensors cannot tell apart is
                                  a call keyword: `ks.k(q, causal=True)`
    archs, profile, compile_options   per-kernel overrides
    grad = {backward = "NAME"}    pair with a backward kernel for jax.grad (args, returns:
                                  by name; nondiff, stop_gradient: returned outputs whose
                                  cotangent the backward does not take, see cutecc.cotangents)
    tune = {..}                   a tuning space for `cutecc tune` (see cutecc.manifest.tune_space)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import keyword
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cutecc import dtypes, expr
from cutecc.archs import is_arch
from cutecc.contract import (
    RESHARD,
    ROLES,
    Arg,
    CallingConvention,
    ConstArg,
    Dim,
    NoneArg,
    ScalarArg,
    StreamArg,
    Stride,
    StrideSymbol,
    StructArg,
    TensorArg,
    TupleArg,
    flat_leaves,
    may_alias_problem,
    shard_problem,
)
from cutecc.cotangents import COTANGENT, STOP_GRADIENT, undeclared
from cutecc.errors import CuteccError
from cutecc.manifest import tune_space as space
from cutecc.manifest.model import BuildSettings, Composite, Kernel, Manifest, Variant
from cutecc.manifest.model import Value as _Value
from cutecc.names import KERNEL_SET_RESERVED, call_name_problem, kernel_name_problem
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
from cutecc.remote_url import parse_url
from cutecc.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MANIFEST_FORMAT = 1
MANIFEST_NAMES = ("kernels.toml", "pyproject.toml")
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_VARIANTS_PER_KERNEL = 10_000
MAX_TUPLE_DEPTH = 8  # launchers take tuples of tensors, not trees; deeper is a mistake
# Matched in full (`fullmatch`): a `$` anchor would accept a trailing newline.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT = rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*"
# An entry may index into what it names (`mod:factory[1]`: the second launcher of the tuple
# a factory returns; the factory is called first when factory_args is set).
ENTRY_RE = re.compile(rf"{_IMPORT}(\[(0|[1-9][0-9]{{0,5}})\])*")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A kernel is an attribute of the loaded kernel set: these names are the set's own.
RESERVED_KERNEL_NAMES = KERNEL_SET_RESERVED
MAX_STATIC_EXTENT = 2**31 - 1  # extents and strides are 32-bit in the compiled layouts
MAX_ALIGN = 256  # bytes: beyond any vector or TMA alignment the DSL asks for
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

# Facts every built-in profile shares (what torch's device properties report).
_SM_COMMON = {"smem_per_block": 49152, "max_threads_per_sm": 2048, "regs_per_sm": 65536, "warp_size": 32}
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "h100": {"arch": "sm_90a", "sm_count": 132, "max_smem_per_block": 232448,
             "l2_bytes": 52428800, "max_cluster_size": 8, "name": "NVIDIA H100 80GB HBM3",
             "memory_bytes": 81559 << 20, "smem_per_sm": 233472, **_SM_COMMON},
    "h200": {"arch": "sm_90a", "sm_count": 132, "max_smem_per_block": 232448,
             "l2_bytes": 62914560, "max_cluster_size": 8, "name": "NVIDIA H200",
             "memory_bytes": 143771 << 20, "smem_per_sm": 233472, **_SM_COMMON},
    "a100": {"arch": "sm_80", "sm_count": 108, "max_smem_per_block": 166912,
             "l2_bytes": 41943040, "max_cluster_size": 1, "name": "NVIDIA A100-SXM4-80GB",
             "memory_bytes": 81920 << 20, "smem_per_sm": 167936, **_SM_COMMON},
    "b200": {"arch": "sm_100a", "sm_count": 148, "max_smem_per_block": 232448,
             "l2_bytes": 132120576, "max_cluster_size": 16, "name": "NVIDIA B200",
             "memory_bytes": 183359 << 20, "smem_per_sm": 233472, **_SM_COMMON},
}

_TOP_KEYS = {"format", "archs", "platforms", "profile", "python_path", "compile_options", "hardware",
             "kernel", "env", "build"}
_BUILD_KEYS = {"executor", "ray_address", "remote", "compile_timeout", "compile_memory", "pins"}
EXECUTORS = ("local", "ray")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KERNEL_KEYS = {"entry", "factory_args", "args", "constants", "variants", "archs", "profile",
                "compile_options", "grad", "description", "symbols", "tune", "derive", "shard",
                "reshard", "fallback", "fallback_torch"}
MAX_DIVISIBILITY = 1 << 16
_TENSOR_KEYS = {"kind", "name", "role", "dtype", "shape", "runtime", "buffer", "layout", "mode", "align",
                "param", "zero", "saved", "reduce", "broadcast", "may_alias", "stride"}
_SCALAR_KEYS = {"kind", "name", "dtype", "default", "param", "value"}


class _Ctx:
    """Where we are in the file, for error messages."""

    def __init__(self, file: Path) -> None:
        self.file = str(file)

    def fail(self, path: str, message: str) -> CuteccError:
        return CuteccError(_one_line(message), where=self.file, key_path=_one_line(path))


def _one_line(text: str) -> str:
    """`text` with control characters escaped: a name quoted from the file (a TOML key may
    hold a newline) must not break the one-line error."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


# Loading ---------------------------------------------------------------------------


def find_manifest(start: Path | None = None) -> Path:
    """The project's manifest: `kernels.toml`, else a `pyproject.toml` with `[tool.cutecc]`,
    in `start` (default: the working directory) or the nearest directory above it, as
    ruff and uv find their configuration."""
    base = (start or Path.cwd()).absolute()
    for d in (base, *base.parents):
        for name in MANIFEST_NAMES:
            p = d / name
            try:
                if p.is_file() and (name == "kernels.toml" or b"[tool.cutecc" in p.read_bytes()):
                    return p
            except OSError:
                continue
    raise CuteccError(f"no kernels.toml (or pyproject.toml with [tool.cutecc]) in {base} or any "
                      "directory above it; pass --manifest, or run `cutecc init`")


def load_manifest(path: str | Path, *, kernels: tuple[str, ...] = ()) -> Manifest:
    """Read and validate a manifest; `kernels` restricts it to those names (and grads)."""
    path = Path(path).resolve()
    ctx = _Ctx(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CuteccError(f"cannot read manifest: {e.strerror}", where=str(path)) from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CuteccError(f"manifest is {len(raw)} bytes, over the {MAX_MANIFEST_BYTES} limit",
                          where=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CuteccError(f"not UTF-8 (byte {e.start})", where=str(path)) from None
    try:
        doc = tomllib.loads(text)
    except ValueError as e:  # TOMLDecodeError, or a value the parser refuses (a 5,000-digit int)
        raise CuteccError(f"invalid TOML: {str(e)[:300]}", where=str(path)) from None
    except RecursionError:  # tomllib recurses per nesting level of arrays and inline tables
        raise CuteccError("arrays or tables nested too deeply to parse", where=str(path)) from None
    if path.name == "pyproject.toml":
        tool = doc.get("tool", {})
        doc = tool.get("cutecc") if isinstance(tool, dict) else None
        if not isinstance(doc, dict):
            raise CuteccError("no [tool.cutecc] table", where=str(path))
        prefix = "tool.cutecc."
    else:
        prefix = ""
    try:
        manifest = _parse(doc, path, ctx, prefix)
    except RecursionError:
        raise CuteccError("values nested too deeply", where=str(path)) from None
    return manifest.select(kernels) if kernels else manifest


def parse_document(doc: dict[str, Any], path: Path, prefix: str = "") -> Manifest:
    """A manifest from its parsed TOML document (`prefix`: "tool.cutecc." for a
    pyproject.toml's table), checked as `load_manifest` checks a file: for a tool that
    tries an edit of a manifest (`cutecc misses --toml`) before printing it."""
    path = Path(path)
    return _parse(doc, path, _Ctx(path), prefix)


def _parse(doc: dict[str, Any], path: Path, ctx: _Ctx, prefix: str) -> Manifest:
    _no_unknown(ctx, doc, _TOP_KEYS, prefix.rstrip(".") or "<top level>")
    fmt = doc.get("format", MANIFEST_FORMAT)
    if type(fmt) is not int or fmt != MANIFEST_FORMAT:  # `true == 1` in Python
        raise ctx.fail(f"{prefix}format",
                       f"manifest format {fmt!r} is not supported (this cutecc reads {MANIFEST_FORMAT})")
    archs = _archs(ctx, f"{prefix}archs", doc.get("archs", ["sm_90a"]))
    plats = _platforms(ctx, f"{prefix}platforms", doc.get("platforms", [BUILD_PLATFORM]))
    profiles = dict(BUILTIN_PROFILES)
    hw = doc.get("hardware", {})
    if not isinstance(hw, dict):
        raise ctx.fail(f"{prefix}hardware", "must be a table of profiles")
    for pname, prof in hw.items():
        kp = f"{prefix}hardware.{pname}"
        if not isinstance(prof, dict):
            raise ctx.fail(kp, "a hardware profile must be a table")
        for fk, fv in prof.items():
            if not isinstance(fv, (int, float, str)) or isinstance(fv, bool):
                raise ctx.fail(f"{kp}.{fk}", f"must be a number or string, got {_tname(fv)}")
        profiles[pname] = {**profiles.get(pname, {}), **prof}
    profile = _str(ctx, f"{prefix}profile", doc.get("profile", "h100"))
    if profile not in profiles:
        raise ctx.fail(f"{prefix}profile", f'unknown hardware profile "{profile}" '
                       f"(known: {', '.join(sorted(profiles))})")
    pp = doc.get("python_path", ["."])
    if not isinstance(pp, list) or not all(isinstance(p, str) for p in pp):
        raise ctx.fail(f"{prefix}python_path", "must be a list of directory strings")
    python_path = tuple((path.parent / p).resolve() for p in pp)
    copts = _str(ctx, f"{prefix}compile_options", doc.get("compile_options", ""))
    env = doc.get("env", {})
    if not isinstance(env, dict):
        raise ctx.fail(f"{prefix}env", "must be a table of NAME = \"value\"")
    for ek, ev in env.items():
        if not ENV_NAME_RE.fullmatch(ek):
            raise ctx.fail(f"{prefix}env.{ek}", "not an environment variable name")
        if not isinstance(ev, str) or "\0" in ev:
            raise ctx.fail(f"{prefix}env.{ek}", f"must be a string, got {_tname(ev)}")
        if ek == "CUTE_DSL_ARCH":
            raise ctx.fail(f"{prefix}env.{ek}", "the target arch comes from archs (or --arch)")

    ktab = doc.get("kernel", {})
    if not isinstance(ktab, dict):
        raise ctx.fail(f"{prefix}kernel", "must be a table of kernels ([kernel.NAME])")
    if not ktab:
        raise ctx.fail(f"{prefix}kernel", "the manifest declares no kernels")
    kernels = []
    composites: list[Composite] = []
    for name, kdoc in ktab.items():
        kp = f'kernel "{name}"'
        why = kernel_name_problem(name)  # an attribute of the kernel set, a directory
        if why:
            raise ctx.fail(kp, f"{why}; rename the kernel")
        if not isinstance(kdoc, dict):
            raise ctx.fail(kp, "must be a table")
        if "launches" in kdoc:
            composites.append(_composite(ctx, kp, name, kdoc))
            continue
        kernels.append(_kernel(ctx, kp, name, kdoc, archs, profile, profiles, copts))
    conventions = _check_composites(ctx, composites, kernels)
    _check_grads(ctx, kernels, conventions)
    return Manifest(path, python_path, tuple(kernels), tuple(sorted(env.items())),
                    _build_settings(ctx, f"{prefix}build", doc.get("build", {})), tuple(composites),
                    plats)


def _composite(ctx: _Ctx, kp: str, name: str, kdoc: dict[str, Any]) -> Composite:
    """`[kernel.NAME] launches = [..], inputs = [..], outputs = [..]`."""
    _no_unknown(ctx, kdoc, {"launches", "inputs", "outputs", "description"}, kp)
    out = []
    for key in ("launches", "inputs", "outputs"):
        v = kdoc.get(key)
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and NAME_RE.fullmatch(x)
                                                       for x in v):
            raise ctx.fail(f"{kp}, {key}", "must be a non-empty array of names")
        if len(set(v)) != len(v):
            raise ctx.fail(f"{kp}, {key}", "names something twice")
        out.append(tuple(v))
    return Composite(name, *out)


def _check_composites(ctx: _Ctx, composites: list[Composite],
                      kernels: list[Kernel]) -> dict[str, CallingConvention]:
    """Each launch is a kernel of the manifest (not a composite; its first variant's
    contract stands for all), each launch input is a composite input or an earlier launch's
    result, and each output some launch's result (a composite input too, once a launch has
    written it in place: FA4's postprocess writes dq over dout's buffer). Returns each
    composite's convention, for grad pairing."""
    by_name = {k.name: k for k in kernels}
    out = {}
    for c in composites:
        kp = f'kernel "{c.name}"'
        have: dict[str, TensorArg | None] = dict.fromkeys(c.inputs)
        written: set[str] = set()  # launch results, those written in place (inout) included
        for i, ln in enumerate(c.launches):
            k = by_name.get(ln)
            if k is None:
                raise ctx.fail(f"{kp}, launches[{i}]", f'no kernel "{ln}" in the manifest'
                               + (" (a composite cannot launch a composite)"
                                  if ln in {x.name for x in composites} else ""))
            conv = k.variants[0].convention
            for t in conv.inputs:
                if t.name not in have:
                    raise ctx.fail(f"{kp}, launches[{i}]", f'"{ln}" takes "{t.name}", which is no '
                                   "input of the composite and no result of an earlier launch")
                if have[t.name] is None:
                    have[t.name] = t
            for t in conv.results:
                have[t.name] = t
                written.add(t.name)
        unused = [n for n in c.inputs if have[n] is None]
        if unused:
            raise ctx.fail(f"{kp}, inputs", f'"{unused[0]}" is taken by no launch')
        for i, n in enumerate(c.outputs):
            if n not in written:
                raise ctx.fail(f"{kp}, outputs[{i}]", f'"{n}" is no launch result')
        ins = tuple(t for t in (have[n] for n in c.inputs) if t is not None)
        res = tuple(dataclasses.replace(t, role="output", saved=False, may_alias=None)
                    for t in (have[n] for n in c.outputs) if t is not None)
        out[c.name] = CallingConvention(ins, res, (), ())
    return out


def _build_settings(ctx: _Ctx, kp: str, doc: Any) -> BuildSettings:
    """The `[build]` table, checked; values are strings a build's flags would take."""
    if not isinstance(doc, dict):
        raise ctx.fail(kp, "must be a table (executor, ray_address, remote, compile_timeout, "
                       "compile_memory, pins)")
    _no_unknown(ctx, doc, _BUILD_KEYS, kp)
    limits: dict[str, Any] = {}
    t = doc.get("compile_timeout")
    if t is not None:
        if type(t) not in (int, float) or not 0 <= t < float("inf"):
            raise ctx.fail(f"{kp}.compile_timeout", "must be a number of seconds (0: no limit)")
        limits["compile_timeout"] = float(t)
    if doc.get("compile_memory") is not None:
        m = doc["compile_memory"]
        try:
            limits["compile_memory"] = parse_size(m if type(m) is int and m >= 0 else str(m))
        except CuteccError as e:
            raise ctx.fail(f"{kp}.compile_memory", e.message) from None
    got = {k: _str(ctx, f"{kp}.{k}", v).strip() for k, v in doc.items() if k not in limits}
    if "executor" in got and got["executor"] not in EXECUTORS:
        raise ctx.fail(f"{kp}.executor", f'unknown executor "{got["executor"]}" '
                       f"(known: {', '.join(EXECUTORS)})")
    if "pins" in got and (not got["pins"] or "\n" in got["pins"] or len(got["pins"]) > 500):
        raise ctx.fail(f"{kp}.pins", "must name a requirements file, relative to the manifest")
    if "ray_address" in got and got.get("executor") != "ray":
        raise ctx.fail(f"{kp}.ray_address", 'a Ray address needs executor = "ray"')
    if "remote" in got:
        try:
            parse_url(got["remote"])
        except CuteccError as e:
            raise ctx.fail(f"{kp}.remote", e.message) from None
    named: dict[str, Any] = {k: v or None for k, v in got.items()}
    return BuildSettings(**named, **limits)


def _kernel(ctx: _Ctx, kp: str, name: str, kdoc: dict[str, Any], archs: tuple[str, ...],
            profile: str, profiles: dict[str, dict[str, Any]], copts: str) -> Kernel:
    _no_unknown(ctx, kdoc, _KERNEL_KEYS, kp)
    if "entry" not in kdoc:
        raise ctx.fail(kp, 'missing "entry" ("package.module:attr")')
    entry = _str(ctx, f"{kp}, entry", kdoc["entry"])
    if not ENTRY_RE.fullmatch(entry):
        raise ctx.fail(f"{kp}, entry", f'"{entry}" is not of the form "package.module:attr" '
                       '(or "package.module:attr[i]", an index into what it names or returns)')
    k_archs = _archs(ctx, f"{kp}, archs", kdoc["archs"]) if "archs" in kdoc else archs
    k_profile = _str(ctx, f"{kp}, profile", kdoc.get("profile", profile))
    if k_profile not in profiles:
        raise ctx.fail(f"{kp}, profile", f'unknown hardware profile "{k_profile}"')
    k_copts = _str(ctx, f"{kp}, compile_options", kdoc.get("compile_options", copts))
    if "args" not in kdoc:
        raise ctx.fail(kp, 'missing "args" (the launcher\'s arguments in its own order)')
    if not isinstance(kdoc["args"], list):
        raise ctx.fail(f"{kp}, args", "must be an array of argument tables")
    constants = _table(ctx, f"{kp}, constants", kdoc.get("constants", {}))
    factory = kdoc.get("factory_args")
    if factory is not None:
        factory = _table(ctx, f"{kp}, factory_args", factory)
    axes, refs = _variant_axes(ctx, f"{kp}, variants", kdoc.get("variants", {}))
    hw = profiles[k_profile]
    grad = kdoc.get("grad")
    backward = None
    grad_args = grad_returns = None
    grad_nondiff: tuple[str, ...] = ()
    grad_stop: tuple[str, ...] = ()
    if grad is not None:
        if not isinstance(grad, dict) or "backward" not in grad or not set(grad) <= {
                "backward", "args", "returns", "nondiff", STOP_GRADIENT}:
            raise ctx.fail(f"{kp}, grad", 'must be a table { backward = "KERNEL" } (optionally '
                           "args = [names], returns = [input names], nondiff = [output names], "
                           "stop_gradient = [output names])")
        backward = _str(ctx, f"{kp}, grad.backward", grad["backward"])
        for key in ("returns", "nondiff", STOP_GRADIENT):
            if key in grad and "args" not in grad:
                raise ctx.fail(f"{kp}, grad.{key}", "needs grad.args (the backward's inputs by name)")
        for key in ("args", "returns", "nondiff", STOP_GRADIENT):
            if key in grad:
                v = grad[key]
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise ctx.fail(f"{kp}, grad.{key}", "must be an array of names")
        grad_args = tuple(grad["args"]) if "args" in grad else None
        grad_returns = tuple(grad["returns"]) if "returns" in grad else None
        grad_nondiff = tuple(grad.get("nondiff", ()))
        grad_stop = tuple(grad.get(STOP_GRADIENT, ()))

    derive = _derive(ctx, f"{kp}, derive", kdoc.get("derive", {}), axes)
    followed = {axis for axis, _ in derive.values()}  # an axis a derived parameter follows is used
    _check_used(ctx, kp, tuple(a for a in axes if a[0] not in followed), kdoc)
    _check_used(ctx, kp, tuple((d, ()) for d in derive), kdoc, "derive")
    symbols, wide = _symbols(ctx, f"{kp}, symbols", kdoc.get("symbols", {}))
    tuning = None if "tune" not in kdoc else space.parse(ctx.fail, f"{kp}, tune", kdoc["tune"],
                                                          {a for a, _ in axes})
    if tuning is not None:
        _check_used(ctx, f"{kp}, tune", tuning.params, kdoc, "params")
        clash = sorted(set(derive) & {p for p, _ in tuning.params})
        if clash:
            raise ctx.fail(f"{kp}, derive.{clash[0]}", "is also a tuning parameter: tune it or derive it")

    def resolve(point: tuple[tuple[str, _Value], ...], env: dict[str, Any]) -> Variant:
        vctx = f"{kp}, variant {_point_id(point)}" if point else kp
        at = dict(point)
        env = {**{d: table[_value_key(at[axis])] for d, (axis, table) in derive.items()}, **env}
        env = {k: {"import": x} if k in refs else x for k, x in env.items()}
        vsymbols = _variant_symbols(ctx, f"{vctx}, symbols", symbols, env, hw)
        args = tuple(_with_divisibility(_arg(ctx, f"{vctx}, args[{i}]", a, env, hw), vsymbols, wide)
                     for i, a in enumerate(kdoc["args"]))
        _check_args(ctx, vctx, args)
        unused = set(symbols) - {s for t in flat_leaves(args) if isinstance(t, TensorArg)
                                 for s in (*t.symbols, *t.stride_symbols)}
        if unused:
            raise ctx.fail(f"{kp}, symbols.{sorted(unused)[0]}", "names no symbolic extent of "
                           f"the arguments{' of variant ' + _point_id(point) if point else ''}")
        consts = tuple((k, _value(ctx, f"{vctx}, constants.{k}", v, env, hw))
                       for k, v in constants)
        fargs = None if factory is None else tuple(
            (k, _value(ctx, f"{vctx}, factory_args.{k}", v, env, hw)) for k, v in factory)
        return Variant(name, point, args, consts, fargs)

    variants, pending, total = [], [], 0
    for point in _points(axes):
        if tuning is None:
            variants.append(resolve(point, dict(point)))
            continue
        # The default configuration is the variant itself: same id, same key as untuned.
        v = resolve(point, {**dict(point), **dict(tuning.default)})
        space.check(ctx.fail, f"{kp}, tune", tuning, dict(point), v.convention)
        variants.append(v)
        cands = tuple(resolve(point + p, {**dict(point), **dict(p)})
                      for p in space.iter_points(tuning, dict(point)))
        total += len(cands) + 1
        if total > MAX_VARIANTS_PER_KERNEL:
            raise ctx.fail(f"{kp}, tune", f"over {MAX_VARIANTS_PER_KERNEL} candidates")
        pending.append(cands)
    fallbacks = {}
    for fk in ("fallback", "fallback_torch"):
        if fk in kdoc:
            ref = _str(ctx, f"{kp}, {fk}", kdoc[fk])
            if not IMPORT_RE.fullmatch(ref):
                raise ctx.fail(f"{kp}, {fk}", f'"{ref}" is not of the form "package.module:function" '
                               "(a plain function with the kernel's calling convention)")
            fallbacks[fk] = ref
    shard = kdoc.get("shard", [])
    if not isinstance(shard, list) or not all(isinstance(x, str) for x in shard):
        raise ctx.fail(f"{kp}, shard", "must be an array of symbolic extents")
    for v in variants:
        why = shard_problem(v.convention, tuple(shard))
        if why:
            raise ctx.fail(f"{kp}, shard", why + (f" (variant {v.id})" if v.params else ""))
    reshard = kdoc.get("reshard", "error")
    if reshard not in RESHARD:
        raise ctx.fail(f"{kp}, reshard", f"must be one of {', '.join(map(repr, RESHARD))}, not {reshard!r}")
    keyed = _call_keywords(ctx, kp, axes, variants)
    # A candidate stands in for its default variant: it answers the same call keywords.
    candidates = tuple((v.id, tuple(dataclasses.replace(c, call=v.call) for c in cands))
                       for v, cands in zip(keyed, pending))
    return Kernel(name, entry, k_archs, k_profile, k_copts, keyed, backward, tuning, candidates,
                  hardware=tuple(sorted(hw.items())), grad_args=grad_args, grad_returns=grad_returns,
                  grad_nondiff=grad_nondiff, grad_stop=grad_stop, shard=tuple(shard), reshard=reshard,
                  fallback=fallbacks.get("fallback"), fallback_torch=fallbacks.get("fallback_torch"))

def _symbols(ctx: _Ctx, kp: str, v: Any) -> tuple[dict[str, int | str], frozenset[str]]:
    """`symbols = { n = { divisibility = 8, bits = 64 } }`: per symbolic extent, what it is a
    multiple of; and the symbols compiled as 64-bit integers (extents of 2^31 and more)."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of symbol = { divisibility = k, bits = 32 | 64 }")
    out: dict[str, int | str] = {}
    wide = set()
    for name, facts in v.items():
        if not NAME_RE.fullmatch(name):
            raise ctx.fail(f"{kp}.{name}", "not a valid symbol name")
        if not isinstance(facts, dict):
            raise ctx.fail(f"{kp}.{name}", f"must be a table {{ divisibility = k }}, got {_tname(facts)}")
        _no_unknown(ctx, facts, {"divisibility", "bits"}, f"{kp}.{name}")
        bits = facts.get("bits", 32)
        if type(bits) is not int or bits not in (32, 64):
            raise ctx.fail(f"{kp}.{name}.bits", f"must be 32 or 64, got {bits!r}")
        if bits == 64:
            wide.add(name)
        k = facts.get("divisibility", 1)
        if isinstance(k, str) and _REF_RE.fullmatch(k):  # "$param": resolved per variant
            out[name] = k
            continue
        _check_divisibility(ctx, f"{kp}.{name}.divisibility", k)
        out[name] = k
    return out, frozenset(wide)


def _check_divisibility(ctx: _Ctx, kp: str, k: Any) -> int:
    if type(k) is not int or not 1 <= k <= MAX_DIVISIBILITY:
        raise ctx.fail(kp, f"must be an int from 1 to {MAX_DIVISIBILITY} or a \"$param\", got {k!r}")
    return k


def _variant_symbols(ctx: _Ctx, kp: str, symbols: dict[str, int | str], env: dict[str, Any],
                     hw: dict[str, Any]) -> dict[str, int]:
    """The kernel's `symbols` divisibilities for one variant: a "$param" (a variant or
    derived parameter, e.g. 16 bytes in elements of the variant's dtype) substituted."""
    def one(n: str, k: int | str) -> int:
        if isinstance(k, int):
            return k
        where = f"{kp}.{n}.divisibility"
        return _check_divisibility(ctx, where, _subst(ctx, where, k, env, hw))
    return {n: one(n, k) for n, k in symbols.items()}


def _with_divisibility(a: Arg, symbols: dict[str, int], wide: frozenset[str] = frozenset()) -> Arg:
    """`a` with the divisibility of each tensor dimension's array extent (the buffer's,
    when padded: a padded logical extent is bound, and checked, where it is unpadded)
    from the kernel's `symbols`."""
    if isinstance(a, TensorArg):
        div = tuple(expr.multiple_of(d, symbols) if expr.is_derived(d) else
                    symbols.get(d, 1) if isinstance(d, str) else 1 for d in a.extents)
        a = dataclasses.replace(a, divisibility=div if any(k > 1 for k in div) else None)
        w = tuple(i for i, d in enumerate(a.extents) if d in wide)
        if a.stride is not None:
            a = dataclasses.replace(a, stride=tuple(
                StrideSymbol(d.name, symbols.get(d.name, 1), 64 if d.name in wide else 32)
                if isinstance(d, StrideSymbol) else d for d in a.stride))
        return dataclasses.replace(a, wide=w or None)
    if isinstance(a, TupleArg):
        return dataclasses.replace(a, items=tuple(_with_divisibility(i, symbols, wide) for i in a.items))
    if isinstance(a, StructArg):
        return dataclasses.replace(a, fields=tuple((k, _with_divisibility(f, symbols, wide))
                                                   for k, f in a.fields))
    return a


def _selects(v: Variant) -> str:
    """What a call's arrays select a variant by: the input tensors' contract as the arrays
    show it: their extents (a padded tensor's buffer's) and the symbols padded views take,
    not the static logical extents of padded dimensions (variants differing in those are
    told apart by a call keyword, `ks.k(x, k=64)`)."""
    return repr([(t.dtype, t.extents, tuple((i, t.shape[i]) for i in t.padded if isinstance(t.shape[i], str)),
                  t.order, t.divisibility, t.align) for t in v.convention.inputs])


def _call_value(x: _Value) -> tuple[bool, _Value]:
    """A keyword value as a call compares it: `True` and `1` differ, `1` and `1.0` do not."""
    return (isinstance(x, bool), x)


def _call_keywords(ctx: _Ctx, kp: str, axes: Any, variants: list[Variant]) -> tuple[Variant, ...]:
    """The variants with their call keywords set: a parameter is a call keyword when two
    variants that differ only in it take the same input tensors (FA4's `causal`). Two
    variants no call can tell apart (same inputs, same keyword values) are an error."""
    names = [n for n, _ in axes]
    keywords = []
    for p in names:
        seen: set[tuple[str, str]] = set()
        for v in variants:
            g = (_selects(v), repr([x for x in v.params if x[0] != p]))
            if g in seen:
                keywords.append(p)
                break
            seen.add(g)
    scalars = {s.name for v in variants for s in v.convention.scalars}
    for p in keywords:
        why = call_name_problem(p)  # `ks.k(x, p=...)`: a keyword of KernelFn.__call__
        if why:
            raise ctx.fail(f"{kp}, variants.{p}", f"{why}; rename the parameter")
        if p in scalars:
            raise ctx.fail(f"{kp}, variants.{p}", f'call keyword "{p}" is also the name of a '
                           "runtime scalar; rename one")
    out = []
    first: dict[tuple[str, tuple[tuple[bool, _Value], ...]], Variant] = {}
    for v in variants:
        call = tuple((p, x) for p, x in v.params if p in keywords)
        told = (_selects(v), tuple(_call_value(x) for _, x in call))
        if told in first:
            raise ctx.fail(f"{kp}, variants", f'variants "{first[told].id}" and "{v.id}" cannot be '
                           "told apart by any call: same input tensors and the same call "
                           f"keywords ({', '.join(keywords) or 'none'})")
        first[told] = v
        out.append(dataclasses.replace(v, call=call))
    return tuple(out)


def _variant_axes(ctx: _Ctx, kp: str, v: Any
                  ) -> tuple[tuple[tuple[str, tuple[_Value, ...]], ...], frozenset[str]]:
    """The variant matrix's axes, and the names of those whose values are import references
    (`op = [{ import = "pkg.mod:Double" }, ..]`: Python objects such as operator classes or
    enum members). A reference's value is its text ("pkg.mod:Double"): it names the variant
    and is what a call keyword compares; "$op" stands for `{ import = "pkg.mod:Double" }`."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of parameter = [values]")
    axes = []
    refs = set()
    total = 1
    for k, vals in v.items():
        if not NAME_RE.fullmatch(k) or keyword.iskeyword(k):
            raise ctx.fail(f"{kp}.{k}", "a variant parameter must be an identifier, not a Python keyword")
        if not isinstance(vals, list) or not vals:
            raise ctx.fail(f"{kp}.{k}", "must be a non-empty array of values")
        is_ref = isinstance(vals[0], dict)
        for i, x in enumerate(vals):
            if isinstance(x, dict) and set(x) == {"import"}:
                if not isinstance(x["import"], str) or not IMPORT_RE.fullmatch(x["import"]):
                    raise ctx.fail(f"{kp}.{k}[{i}].import",
                                   f'must be "package.module:attr", got {x["import"]!r}')
                if not is_ref:
                    raise ctx.fail(f"{kp}.{k}[{i}]", "an axis of plain values cannot mix in an "
                                   "import reference: give it an axis of its own")
            elif isinstance(x, dict) or not isinstance(x, (int, float, str, bool)):
                raise ctx.fail(f"{kp}.{k}[{i}]", "must be a number, string, bool or "
                               f'{{ import = "pkg.mod:Name" }}, got {_tname(x)}')
            elif is_ref:
                raise ctx.fail(f"{kp}.{k}[{i}]", "an axis of import references takes only "
                               '{ import = ... } values')
        if is_ref:
            vals = [x["import"] for x in vals]
            refs.add(k)
        if len(set(map(repr, vals))) != len(vals):
            raise ctx.fail(f"{kp}.{k}", "repeats a value")
        total *= len(vals)
        axes.append((k, tuple(vals)))
    if total > MAX_VARIANTS_PER_KERNEL:
        raise ctx.fail(kp, f"expands to {total} variants, over the {MAX_VARIANTS_PER_KERNEL} limit")
    return tuple(axes), frozenset(refs)


def _value_key(v: _Value) -> str:
    """A variant value as a `derive` table writes it as a key: `true`, `64`, `bfloat16`."""
    return json.dumps(v) if isinstance(v, bool) else str(v)


def _derive(ctx: _Ctx, kp: str, v: Any, axes: Any) -> dict[str, tuple[str, dict[str, _Value]]]:
    """`derive = { tile_m = { causal = { false = 80, true = 64 } } }`: parameters whose value
    follows one variant axis's, by a table with a value for each of the axis's values (FA4's
    backward tile for causal and non-causal attention). They are no axis of their own: they
    name no variant and are no call keyword; "$tile_m" stands where "$param" may."""
    if not isinstance(v, dict):
        raise ctx.fail(kp, "must be a table of parameter = { axis = { value = derived value } }")
    values = {name: vals for name, vals in axes}
    out = {}
    for name, spec in v.items():
        if not NAME_RE.fullmatch(name) or keyword.iskeyword(name):
            raise ctx.fail(f"{kp}.{name}", "a derived parameter must be an identifier, not a Python keyword")
        if name in values:
            raise ctx.fail(f"{kp}.{name}", "is a variant axis already")
        if not isinstance(spec, dict) or len(spec) != 1:
            raise ctx.fail(f"{kp}.{name}", "must be a table with one variant axis: "
                           "{ axis = { value = derived value, .. } }")
        (axis, table), = spec.items()
        if axis not in values:
            raise ctx.fail(f"{kp}.{name}.{axis}",
                           f'names no variant axis (axes: {", ".join(values) or "none"})')
        if not isinstance(table, dict):
            raise ctx.fail(f"{kp}.{name}.{axis}", f"must be a table of {axis} value = derived value")
        keys = [_value_key(x) for x in values[axis]]
        for k, x in table.items():
            if k not in keys:
                raise ctx.fail(f"{kp}.{name}.{axis}.{k}", f'is no value of "{axis}" ({", ".join(keys)})')
            if not isinstance(x, (int, float, str, bool)):
                raise ctx.fail(f"{kp}.{name}.{axis}.{k}",
                               f"must be a number, string or bool, got {_tname(x)}")
        missing = [k for k in keys if k not in table]
        if missing:
            raise ctx.fail(f"{kp}.{name}.{axis}", f'has no value for {axis} = {missing[0]}')
        out[name] = (axis, dict(table))
    return out


def _points(axes: tuple[tuple[str, tuple[_Value, ...]], ...]) -> Iterator[tuple[tuple[str, _Value], ...]]:
    names = [a[0] for a in axes]
    for combo in itertools.product(*(a[1] for a in axes)):
        yield tuple(zip(names, combo))


def _point_id(point: tuple[tuple[str, _Value], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in point)


def _check_used(ctx: _Ctx, kp: str, axes: Any, kdoc: dict[str, Any], table: str = "variants") -> None:
    text = repr((kdoc.get("args"), kdoc.get("constants"), kdoc.get("factory_args"), kdoc.get("symbols")))
    for name, _ in axes:  # "$name" alone, or in a derived extent's or scalar's expression
        if f"'${name}'" not in text and not re.search(rf"\${re.escape(name)}(?![A-Za-z0-9_])", text):
            raise ctx.fail(f"{kp}, {table}.{name}",
                           f'parameter "{name}" is never used (refer to it as "${name}")')


def _subst(ctx: _Ctx, kp: str, v: Any, env: dict[str, Any], hw: dict[str, Any],
           typed: bool = False) -> Any:
    """Resolve "$param" (a variant parameter) and "$hw.key" (a hardware fact). A parameter
    whose values are import references gives its `{"import": ..}` table, only where a typed
    value may stand (`typed`: factory_args, constants, const arguments)."""
    if isinstance(v, str) and v.startswith("$"):
        ref = v[1:]
        if ref.startswith("hw."):
            fact = ref[3:]
            if fact not in hw:
                raise ctx.fail(kp, f'unknown hardware fact "{fact}" (known: {", ".join(sorted(hw))})')
            return hw[fact]
        if ref not in env:
            known = ", ".join(env) or "none"
            raise ctx.fail(kp, f'"{v}" names no variant parameter (parameters: {known})')
        if isinstance(env[ref], dict) and not typed:
            raise ctx.fail(kp, f'"{v}" is an import reference ({env[ref]["import"]}): it can be a '
                           "value of factory_args, constants or a const argument, not stand here")
        return env[ref]
    if not isinstance(v, (int, float, str, bool)):
        raise ctx.fail(kp, f"must be a number, string or bool, got {_tname(v)}")
    return v


_MARKERS = {"dtype": set(), "dsl": {"value"}, "import": set(), "call": {"args", "kwargs"},
            "none": set()}
IMPORT_RE = re.compile(_IMPORT)  # "package.module:attr[.attr]"
DSL_NAME_RE = re.compile(rf"(cutlass\.)?{_IDENT}")


def _value(ctx: _Ctx, kp: str, v: Any, env: dict[str, _Value], hw: dict[str, Any], depth: int = 0) -> Any:
    """A typed manifest value (factory_args, constants, `const` args), "$param"s substituted:
    a number, string or bool as is; an array (a tuple); or a table with one marker:
    `{dtype = "bfloat16"}` (the DSL's numeric class), `{dsl = "cutlass.Int32", value = 5}`
    (a DSL class, or an instance of it), `{import = "pkg.mod:Name"}` (any importable
    object: a class, an enum member), `{call = "pkg.mod:f", args = [..], kwargs = {..}}`
    (its result), `{none = true}` (None)."""
    if depth > MAX_TUPLE_DEPTH:
        raise ctx.fail(kp, f"values nested more than {MAX_TUPLE_DEPTH} deep")
    if isinstance(v, list):
        return [_value(ctx, f"{kp}[{i}]", x, env, hw, depth + 1) for i, x in enumerate(v)]
    if not isinstance(v, dict):
        return _subst(ctx, kp, v, env, hw, typed=True)  # "$op" may be an import reference
    markers = [k for k in v if k in _MARKERS]
    if len(markers) != 1:
        raise ctx.fail(kp, "a typed value is a table with exactly one of "
                       f"{', '.join(sorted(_MARKERS))} (got {', '.join(sorted(v)) or 'an empty table'})")
    m = markers[0]
    _no_unknown(ctx, v, {m, *_MARKERS[m]}, kp)
    out: dict[str, Any] = {}
    if m == "dtype":
        raw = _subst(ctx, f"{kp}.dtype", v["dtype"], env, hw)
        dt = dtypes.canonical(raw) if isinstance(raw, str) else None
        if dt is None:
            raise ctx.fail(f"{kp}.dtype", f'unknown dtype {raw!r} (known: {", ".join(dtypes.DTYPES)})')
        out["dtype"] = dt
    elif m == "dsl":
        name = _subst(ctx, f"{kp}.dsl", v["dsl"], env, hw)
        if not isinstance(name, str) or not DSL_NAME_RE.fullmatch(name):
            raise ctx.fail(f"{kp}.dsl",
                           f'must name a cutlass attribute such as "cutlass.Int32", got {name!r}')
        out["dsl"] = name if name.startswith("cutlass.") else f"cutlass.{name}"
        if "value" in v:
            out["value"] = _value(ctx, f"{kp}.value", v["value"], env, hw, depth + 1)
    elif m in ("import", "call"):
        target = _subst(ctx, f"{kp}.{m}", v[m], env, hw, typed=True)
        if isinstance(target, dict):  # { import = "$op" }, op an axis of import references
            target = target["import"]
        if not isinstance(target, str) or not IMPORT_RE.fullmatch(target):
            raise ctx.fail(f"{kp}.{m}", f'must be "package.module:attr", got {target!r}')
        out[m] = target
        if m == "call":
            args = v.get("args", [])
            kwargs = v.get("kwargs", {})
            if not isinstance(args, list):
                raise ctx.fail(f"{kp}.args", "must be an array")
            if not isinstance(kwargs, dict):
                raise ctx.fail(f"{kp}.kwargs", "must be a table")
            out["args"] = [_value(ctx, f"{kp}.args[{i}]", x, env, hw, depth + 1) for i, x in enumerate(args)]
            out["kwargs"] = {k: _value(ctx, f"{kp}.kwargs.{k}", x, env, hw, depth + 1)
                             for k, x in kwargs.items()}
    else:
        if v["none"] is not True:
            raise ctx.fail(f"{kp}.none", "must be true")
        out["none"] = True
    return out


def _arg(ctx: _Ctx, kp: str, a: Any, env: dict[str, _Value], hw: dict[str, Any],
         depth: int = 0) -> Arg:
    arg = _arg_kind(ctx, kp, a, env, hw, depth)
    param = a.get("param") if isinstance(a, dict) else None
    if param is not None:
        if not isinstance(param, str) or not NAME_RE.fullmatch(param) or keyword.iskeyword(param):
            raise ctx.fail(f"{kp}.param", f"{param!r} is not a valid keyword argument name")
        arg = dataclasses.replace(arg, param=param)
    return arg


def _arg_kind(ctx: _Ctx, kp: str, a: Any, env: dict[str, _Value], hw: dict[str, Any],
              depth: int = 0) -> Arg:
    if not isinstance(a, dict):
        raise ctx.fail(kp, f"an argument must be a table, got {_tname(a)}")
    kind = a.get("kind", "tensor")
    if kind == "stream":
        _no_unknown(ctx, a, {"kind", "param"}, kp)
        return StreamArg()
    if kind == "none":
        _no_unknown(ctx, a, {"kind", "param"}, kp)
        return NoneArg()
    if kind == "const":
        _no_unknown(ctx, a, {"kind", "value", "param"}, kp)
        if "value" not in a:
            raise ctx.fail(kp, 'missing "value" (a compile-time value)')
        return ConstArg(_value(ctx, f"{kp}.value", a["value"], env, hw))
    if kind == "struct":
        _no_unknown(ctx, a, {"kind", "type", "fields", "param"}, kp)
        t = _str(ctx, f"{kp}.type", a.get("type"))
        if not IMPORT_RE.fullmatch(t):
            raise ctx.fail(f"{kp}.type", 'must name a NamedTuple or dataclass as '
                           f'"package.module:Name", got "{t}"')
        fields = a.get("fields", {})
        if not isinstance(fields, dict):
            raise ctx.fail(f"{kp}.fields", "must be a table of field = argument")
        if depth >= MAX_TUPLE_DEPTH:
            raise ctx.fail(kp, f"structs nested more than {MAX_TUPLE_DEPTH} deep")
        for fk in fields:
            if not NAME_RE.fullmatch(fk) or keyword.iskeyword(fk):
                raise ctx.fail(f"{kp}.fields.{fk}", "a field name must be an identifier")
        return StructArg(t, tuple((fk, _arg(ctx, f"{kp}.fields.{fk}", fv, env, hw, depth + 1))
                                  for fk, fv in fields.items()))
    if kind == "tuple":
        _no_unknown(ctx, a, {"kind", "items", "param"}, kp)
        items = a.get("items")
        if not isinstance(items, list) or not items:
            raise ctx.fail(f"{kp}.items", "a tuple needs a non-empty array of items")
        if depth >= MAX_TUPLE_DEPTH:
            raise ctx.fail(kp, f"tuples nested more than {MAX_TUPLE_DEPTH} deep")
        return TupleArg(tuple(_arg(ctx, f"{kp}.items[{i}]", x, env, hw, depth + 1)
                              for i, x in enumerate(items)))
    if kind == "scalar":
        _no_unknown(ctx, a, _SCALAR_KEYS, kp)
        name = _name(ctx, kp, a)
        why = call_name_problem(name, "runtime scalar")  # a keyword of the kernel's call
        if why:
            raise ctx.fail(f"{kp}.name", why)
        dt = _dtype(ctx, f"{kp}.dtype", a, env, hw)
        if dt not in dtypes.SCALAR_DTYPES:
            allowed = ", ".join(dtypes.SCALAR_DTYPES)
            raise ctx.fail(f"{kp}.dtype", f'a runtime scalar must be one of {allowed}, got "{dt}"')
        default = a.get("default")
        if "value" in a:
            if default is not None:
                raise ctx.fail(f"{kp}.value", "a derived scalar (value) has no default: the "
                               "runtime computes it")
            return ScalarArg(name, dt, None, value=_scalar_expr(ctx, f"{kp}.value", a["value"], dt,
                                                                 env, hw))
        if default is not None:
            ok = isinstance(default, bool) if dt == "bool" else (
                isinstance(default, (int, float)) and not isinstance(default, bool)
                and (dt.startswith("float") or isinstance(default, int)))
            if not ok:
                raise ctx.fail(f"{kp}.default", f"{default!r} is not a {dt}")
            lo, hi = _INT_RANGE.get(dt, (None, None))
            if lo is not None and not lo <= default <= hi:
                raise ctx.fail(f"{kp}.default", f"{default} is out of the range of {dt} ({lo}..{hi})")
            if dt == "float32" and isinstance(default, float) and abs(default) > 3.4028234663852886e38:
                raise ctx.fail(f"{kp}.default", f"{default} is out of the range of float32")
        return ScalarArg(name, dt, default)
    if kind != "tensor":
        raise ctx.fail(f"{kp}.kind", f'unknown argument kind "{kind}" '
                       "(tensor, scalar, none, stream, tuple, const, struct)")
    _no_unknown(ctx, a, _TENSOR_KEYS, kp)
    name = _name(ctx, kp, a)
    role = a.get("role", "input")
    if role not in ROLES:
        raise ctx.fail(f"{kp}.role", f'unknown role "{role}" (input, output, inout, scratch)')
    saved, reduce = a.get("saved", False), a.get("reduce")
    if type(saved) is not bool or (saved and role != "output"):
        raise ctx.fail(f"{kp}.saved", "only an output may be saved for the backward (saved = true), "
                       f"got {saved!r}" + ("" if role == "output" else f" on an {role}"))
    if reduce is not None and (reduce != "sum" or role != "output"):
        raise ctx.fail(f"{kp}.reduce", 'only an output may be reduced, by "sum" (over its leading '
                       f"axis), got {reduce!r}" + ("" if role == "output" else f" on an {role}"))
    if saved and reduce is not None:
        raise ctx.fail(f"{kp}.reduce", "a saved output is handed to the backward as written: "
                       "it cannot be reduced")
    may_alias = a.get("may_alias")
    if may_alias is not None and (not isinstance(may_alias, str) or role != "output"):
        raise ctx.fail(f"{kp}.may_alias", 'only an output may be written in an input\'s memory: '
                       f'may_alias = "<input name>", got {may_alias!r}'
                       + ("" if role == "output" else f" on an {role}"))
    zero = a.get("zero", False)
    if type(zero) is not bool or (zero and role != "scratch"):
        raise ctx.fail(f"{kp}.zero", 'only a scratch tensor (role = "scratch") may be zeroed: '
                       f"zero = true, got {zero!r}" + ("" if role == "scratch" else f" on an {role}"))
    dt = _dtype(ctx, f"{kp}.dtype", a, env, hw)
    if "shape" not in a:
        raise ctx.fail(kp, 'missing "shape" (a list of ints and symbol names)')
    shape = a["shape"]
    if not isinstance(shape, list):
        raise ctx.fail(f"{kp}.shape", f"must be an array, got {_tname(shape)}")
    dims = _dims(ctx, f"{kp}.shape", shape, env, hw, derived=role in ("output", "scratch"))
    runtime = _runtime_dims(ctx, f"{kp}.runtime", a["runtime"], dims, role) if "runtime" in a else None
    if runtime is not None and ("buffer" in a or "broadcast" in a):
        raise ctx.fail(f"{kp}.runtime", "a padded or broadcast tensor's extents are read from its buffer")
    if role == "scratch" and "buffer" in a:
        raise ctx.fail(f"{kp}.buffer", "a scratch tensor cannot be padded (the runtime allocates it)")
    buffer = _buffer(ctx, kp, a, dims, role, env, hw) if "buffer" in a else None
    bcast = _broadcast(ctx, f"{kp}.broadcast", a["broadcast"], dims, role) if "broadcast" in a else None
    if bcast is not None:
        if "buffer" in a:
            raise ctx.fail(f"{kp}.broadcast", "a broadcast tensor cannot be padded too (buffer)")
        buffer = tuple(1 if i in bcast else d for i, d in enumerate(dims))
    if "mode" in a:
        if "layout" in a:
            raise ctx.fail(f"{kp}.mode", "give mode or layout, not both (mode = [m, ..] is the "
                           "stride order layout = [rank - 1 - m, ..] of the row-major array passed)")
        order = _mode(ctx, f"{kp}.mode", a["mode"], len(dims))
        if role == "scratch" or reduce is not None:
            raise ctx.fail(f"{kp}.mode", "a mode says how the caller holds an array it passes or gets "
                           "back: not for " + ("scratch" if role == "scratch" else "a reduced output"))
    else:
        order = _order(ctx, f"{kp}.layout", a.get("layout", "row-major"), len(dims))
    stride = _stride(ctx, f"{kp}.stride", a["stride"], dims, role, "buffer" in a or bcast is not None) \
        if "stride" in a else None
    align = _subst(ctx, f"{kp}.align", a.get("align", 16), env, hw)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ctx.fail(f"{kp}.align", f"must be a positive power of two (bytes), got {align!r}")
    if align > MAX_ALIGN:
        raise ctx.fail(f"{kp}.align", f"must be at most {MAX_ALIGN} (bytes), got {align}")
    label = ("row-major" if order is None else
             "column-major" if order == tuple(range(len(dims))) else "strided")
    if reduce is not None and not dims:
        raise ctx.fail(f"{kp}.reduce", "a scalar (rank 0) output has no leading axis to sum over")
    return TensorArg(name, role, dt, dims, label, align, order=order, buffer=buffer, zero=zero,
                     saved=saved, reduce=reduce, broadcast=bcast, may_alias=may_alias,
                     mode="mode" in a and order is not None, stride=stride, runtime=runtime)


def _broadcast(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str) -> tuple[int, ...] | None:
    """`broadcast = [0]`: dimensions the kernel sees with stride 0; the array passed has
    extent 1 there (an input only: a broadcast output would be written by many threads)."""
    if role != "input":
        raise ctx.fail(kp, f"only an input may be broadcast (stride 0), not an {role}")
    if not isinstance(v, list) or not v or not all(type(i) is int for i in v):
        raise ctx.fail(kp, f"must be a non-empty array of dimension indices, got {v!r}")
    if len(set(v)) != len(v) or not all(0 <= i < len(dims) for i in v):
        raise ctx.fail(kp, f"dimensions must be distinct, from 0 to {len(dims) - 1}, got {v!r}")
    return tuple(sorted(v))


_REF_RE = re.compile(r"\$(hw\.)?[A-Za-z_][A-Za-z0-9_]*")


def _expression(ctx: _Ctx, kp: str, text: str, env: dict[str, _Value], hw: dict[str, Any]) -> int | str:
    """A derived extent or scalar: `$param`s and `$hw.fact`s substituted (build-time numbers),
    checked against the grammar (`cutecc.expr`), folded to an int when it reads no symbol,
    else its canonical text."""
    def ref(name: str) -> Any:
        return _subst(ctx, kp, f"${name}", env, hw)
    try:
        text = expr.canonical(expr.substitute(text, ref))
        if not expr.names(text):
            return int(expr.evaluate(text, {}))
    except expr.ExprError as e:
        raise ctx.fail(kp, f"{e} (an expression of ints, symbols, + - * // %, ceil_div(a, b), "
                       "round_up(a, b), min, max, $param and $hw.fact)") from None
    return text


def _scalar_expr(ctx: _Ctx, kp: str, v: Any, dt: str, env: dict[str, _Value],
                 hw: dict[str, Any]) -> int | str:
    """A derived scalar's `value`: an int, "$hw.fact" / "$param", or an expression."""
    if dt not in _INT_RANGE:
        raise ctx.fail(kp, f"a derived scalar must be int32 or int64, not {dt}")
    if isinstance(v, str):
        v = _subst(ctx, kp, v, env, hw) if _REF_RE.fullmatch(v) else _expression(ctx, kp, v, env, hw)
    if type(v) is not int and not isinstance(v, str):
        raise ctx.fail(kp, f"must be an int or an expression string, got {v!r}")
    lo, hi = _INT_RANGE[dt]
    if type(v) is int and not lo <= v <= hi:
        raise ctx.fail(kp, f"{v} is out of the range of {dt} ({lo}..{hi})")
    return v


def _runtime_dims(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str) -> tuple[int, ...]:
    """`runtime = [3]`: dimensions whose extent is static (the call checks it, or computes it
    for an output) or derived (computed per call) but compiled as a runtime value of its own
    that promises no divisibility, as the kernel's own build compiles it (FA4's head
    dimension and rounded lengths, quack's dw partial rows)."""
    if role == "scratch":
        raise ctx.fail(kp, "a scratch tensor is the runtime's own: compile its extents as declared")
    if not isinstance(v, list) or not v or not all(type(i) is int for i in v) \
            or len(set(v)) != len(v) or not all(0 <= i < len(dims) for i in v):
        raise ctx.fail(kp, f"must be an array of distinct dimension indices from 0 to {len(dims) - 1}, "
                       f"got {v!r}")
    for i in v:
        if expr.is_symbol(dims[i]):
            raise ctx.fail(kp, f"dimension {i} ({dims[i]!r}) is a symbol, a runtime value already")
    return tuple(sorted(v))


def _dims(ctx: _Ctx, kp: str, shape: list[Any], env: dict[str, _Value],
          hw: dict[str, Any], derived: bool = False) -> tuple[Dim, ...]:
    """A `shape` or `buffer` array: positive ints (static), symbol names and, where
    `derived` (outputs and scratch), expressions over symbols."""
    dims: list[Dim] = []
    for i, d in enumerate(shape):
        dp = f"{kp}[{i}]"
        if isinstance(d, str) and not _REF_RE.fullmatch(d) and not NAME_RE.fullmatch(d):
            if not derived:
                raise ctx.fail(dp, f'"{d}" is not a valid symbol name (a derived extent, an '
                               "expression, may size only an output or a scratch tensor)")
            d = _expression(ctx, dp, d, env, hw)
            if isinstance(d, str):
                dims.append(d)
                continue
        d = _subst(ctx, dp, d, env, hw)
        if isinstance(d, (bool, float)):
            raise ctx.fail(dp, f"a dimension is an int or a symbol name, got {d!r}")
        if isinstance(d, int) and d <= 0:
            raise ctx.fail(dp, f"a static extent must be positive, got {d}")
        if isinstance(d, int) and d > MAX_STATIC_EXTENT:
            raise ctx.fail(dp, f"a static extent must be at most 2^31-1 (32-bit layouts), got {d}")
        if isinstance(d, str) and not NAME_RE.fullmatch(d):
            raise ctx.fail(dp, f'"{d}" is not a valid symbol name')
        dims.append(d)
    return tuple(dims)


def _buffer(ctx: _Ctx, kp: str, a: dict[str, Any], shape: tuple[Dim, ...], role: str,
            env: dict[str, _Value], hw: dict[str, Any]) -> tuple[Dim, ...] | None:
    """A padded tensor's `buffer`: the shape of the array passed (same rank, logical order),
    each extent at least the logical one where both are static; None when it is the shape."""
    raw = a["buffer"]
    if not isinstance(raw, list):
        raise ctx.fail(f"{kp}.buffer", f"must be an array of extents, got {_tname(raw)}")
    if role == "output":
        raise ctx.fail(f"{kp}.buffer", "an output cannot be padded: the kernel writes only its "
                       "logical part, so the padding handed back would be undefined; declare it "
                       'role = "inout" (the caller passes the buffer, its padding is kept)')
    buffer = _dims(ctx, f"{kp}.buffer", raw, env, hw)
    if len(buffer) != len(shape):
        raise ctx.fail(f"{kp}.buffer", f"has {len(buffer)} extents, the shape {len(shape)}: the "
                       "buffer has the tensor's rank, in the same (logical) dimension order")
    for i, (d, b) in enumerate(zip(shape, buffer)):
        if isinstance(d, int) and isinstance(b, int) and d > b:
            raise ctx.fail(f"{kp}.buffer[{i}]", f"the buffer's extent {b} is smaller than the "
                           f"logical extent {d} (shape[{i}])")
    return None if buffer == shape else buffer


def _order(ctx: _Ctx, kp: str, layout: Any, rank: int) -> tuple[int, ...] | None:
    """A tensor's stride order (0 = the stride-1 dimension), None for row-major."""
    if layout == "row-major":
        return None
    if layout == "column-major":
        order = tuple(range(rank))
    elif isinstance(layout, list):
        if sorted(x for x in layout if type(x) is int) != list(range(rank)) or len(layout) != rank:
            raise ctx.fail(kp, f"a stride order is a permutation of 0..{rank - 1} (one per "
                           f"dimension, 0 = the stride-1 one), got {layout!r}")
        order = tuple(layout)
    else:
        raise ctx.fail(kp, f'must be "row-major", "column-major" or a stride order such as '
                       f"[0, 1], got {layout!r}")
    return None if order == tuple(range(rank - 1, -1, -1)) else order


def _stride(ctx: _Ctx, kp: str, v: Any, dims: tuple[Dim, ...], role: str,
            padded: bool) -> tuple[Stride, ...]:
    """`stride = ["ldx", 1]`: per dimension, the stride the kernel is compiled with, an int
    (static) or a symbol (a runtime value, as published kernels' own builds compile row
    strides; its facts come from `symbols`, see `_with_divisibility`). The array a call
    passes stays dense: the runtime checks its strides against these."""
    if padded or role == "scratch":
        raise ctx.fail(kp, "a padded, broadcast or scratch tensor takes its buffer's strides: "
                       "declare stride on a dense input or output")
    if not isinstance(v, list) or len(v) != len(dims):
        raise ctx.fail(kp, f"must be one stride per dimension ({len(dims)}): an int or a symbol name, "
                       f"got {v!r}")
    out: list[Stride] = []
    for i, d in enumerate(v):
        if type(d) is int and d >= 0:
            out.append(d)
        elif isinstance(d, str) and NAME_RE.fullmatch(d):
            if d in dims:
                raise ctx.fail(f"{kp}[{i}]", f'"{d}" is an extent of this tensor; a stride symbol names '
                               "a stride of its own")
            out.append(StrideSymbol(d))
        else:
            raise ctx.fail(f"{kp}[{i}]", f"must be an int (static) or a symbol name (a runtime "
                           f"stride), got {d!r}")
    return tuple(out)


def _mode(ctx: _Ctx, kp: str, mode: Any, rank: int) -> tuple[int, ...] | None:
    """cutlass_call's `mode`: the kernel's dimension i is dimension mode[i] of the (row-major)
    array passed, a view with no copy. As a stride order (what `layout` says): dimension i
    has stride rank `rank - 1 - mode[i]`; None for the identity (row-major). Unlike
    `layout`, the call passes that array as it holds it and gets results in its order
    (`TensorArg.mode`)."""
    if (not isinstance(mode, list) or len(mode) != rank or any(type(m) is not int for m in mode)
            or sorted(mode) != list(range(rank))):
        raise ctx.fail(kp, f"a mode is a permutation of 0..{rank - 1} (kernel dimension i is "
                       f"dimension mode[i] of the array passed), got {mode!r}")
    order = tuple(rank - 1 - m for m in mode)
    return None if order == tuple(range(rank - 1, -1, -1)) else order


def _check_args(ctx: _Ctx, kp: str, args: tuple[Arg, ...]) -> None:
    keywords: list[str] = []
    for i, a in enumerate(args):
        if a.param is not None:
            if a.param in keywords:
                raise ctx.fail(f"{kp}, args[{i}].param", f'keyword "{a.param}" is passed twice')
            keywords.append(a.param)
        elif keywords:
            raise ctx.fail(f"{kp}, args[{i}]", f'a positional argument after keyword "{keywords[-1]}" '
                           "(give it a param too, or move it before)")
    leaves = flat_leaves(args)
    seen: set[str] = set()
    for a in leaves:
        if isinstance(a, (TensorArg, ScalarArg)):
            if a.name in seen:
                raise ctx.fail(f"{kp}, args", f'argument name "{a.name}" is used twice')
            seen.add(a.name)
    if sum(isinstance(a, StreamArg) for a in leaves) > 1:
        raise ctx.fail(f"{kp}, args", "more than one stream argument")
    tensors = [a for a in leaves if isinstance(a, TensorArg)]
    if not any(t.role in ("output", "inout") for t in tensors):
        raise ctx.fail(f"{kp}, args", "no output: at least one tensor needs role "
                       '"output" or "inout"')
    # What a call's arrays bind: the extents of the arrays passed (a padded tensor's buffer).
    bound = {d for t in tensors if t.role in ("input", "inout") for d in t.extents if isinstance(d, str)}
    for t in tensors:
        if t.role in ("output", "scratch"):
            for s in t.symbols:
                if s not in bound:
                    raise ctx.fail(f"{kp}, args ({t.name})",
                                   f'{t.role} extent "{s}" is not the extent of any input, so '
                                   "the runtime cannot compute the output shape")
        for i in t.padded:
            d = t.shape[i]
            if isinstance(d, str) and d not in bound:
                raise ctx.fail(f"{kp}, args ({t.name}).shape[{i}]",
                               f'the logical extent "{d}" of a padded dimension is not the extent '
                               "of any array passed (an unpadded dimension of an input), so neither "
                               "the runtime nor the kernel can know it: make it static or bind it")
    for sc in leaves:
        if isinstance(sc, ScalarArg) and isinstance(sc.value, str):
            for s in expr.names(sc.value):
                if s not in bound:
                    raise ctx.fail(f"{kp}, args ({sc.name}).value",
                                   f'"{s}" is not the extent of any input, so the runtime cannot '
                                   "compute the scalar (known symbols: "
                                   f"{', '.join(sorted(bound)) or 'none'})")
    bad = may_alias_problem(args)
    if bad is not None:
        raise ctx.fail(f"{kp}, args ({bad[0]}).may_alias", bad[1])
    extents = {s for t in tensors for s in t.symbols}
    for t in tensors:
        both = sorted(set(t.stride_symbols) & extents)
        if both:
            raise ctx.fail(f"{kp}, args ({t.name}).stride", f'"{both[0]}" is an extent of the kernel; '
                           "a stride symbol names a stride of its own")
    names = {t.name for t in tensors}
    clash = names & {s for t in tensors for s in t.symbols}
    if clash:
        raise ctx.fail(f"{kp}, args", f'"{sorted(clash)[0]}" is both an argument and a symbol')


def _check_grads(ctx: _Ctx, kernels: list[Kernel],
                 composites: dict[str, CallingConvention] | None = None) -> None:
    by_name = {k.name: k for k in kernels}
    composites = composites or {}
    for k in kernels:
        if not k.backward:
            continue
        kp = f'kernel "{k.name}", grad.backward'
        b = by_name.get(k.backward)
        if b is None and k.backward not in composites:
            raise ctx.fail(kp, f'no kernel "{k.backward}" in the manifest')
        if k.backward == k.name:
            raise ctx.fail(kp, "a kernel cannot be its own backward")
        fc = k.variants[0].convention
        bc = composites[k.backward] if b is None else b.variants[0].convention
        padded = [t.name for v in k.variants for t in v.convention.inputs if t.padded]
        if padded:
            raise ctx.fail(kp, f'forward input "{padded[0]}" is padded (buffer): its gradient would '
                           "be the whole buffer, padding included, which no declared output can "
                           "promise; differentiate a kernel that takes the dense array instead")
        if fc.aliases:
            raise ctx.fail(kp, "in-place forwards cannot be differentiated")
        if k.grad_args is not None:
            _check_named_grad(ctx, f'kernel "{k.name}", grad', k, fc, k.backward, bc)
            continue
        if any(t.saved for t in fc.results):
            raise ctx.fail(kp, f'forward output "{[t.name for t in fc.results if t.saved][0]}" is '
                           "saved for the backward: say what the backward takes by name "
                           '(grad.args = ["x", "rstd", "cotangent.out", ...])')
        want_in = len(fc.inputs) + len(fc.visible)
        if len(bc.inputs) != want_in or len(bc.results) != len(fc.inputs) or fc.aliases:
            raise ctx.fail(kp, f'"{k.backward}" must take the forward inputs then one cotangent per '
                           f"forward output ({want_in} inputs) and return one gradient per "
                           f"forward input ({len(fc.inputs)} outputs); it takes "
                           f"{len(bc.inputs)} and returns {len(bc.results)}"
                           + ("; in-place forwards cannot be differentiated" if fc.aliases else ""))


def _check_named_grad(ctx: _Ctx, kp: str, k: Kernel, fc: CallingConvention, bname: str,
                      bc: CallingConvention) -> None:
    """`grad.args` names forward inputs, forward outputs (saved or not) and cotangents of the
    outputs a call returns, one per backward input; `grad.returns` names a forward input per
    backward result (inputs not named get no gradient: zero)."""
    inputs = [t.name for t in fc.inputs]
    known = [*inputs, *(t.name for t in fc.results), *(COTANGENT + t.name for t in fc.visible)]
    args = k.grad_args or ()
    for i, n in enumerate(args):
        if n not in known:
            raise ctx.fail(f"{kp}.args[{i}]", f'"{n}" is no forward input, output or cotangent '
                           f"(known: {', '.join(known)})")
    if len(args) != len(bc.inputs):
        raise ctx.fail(f"{kp}.args", f'"{bname}" takes {len(bc.inputs)} input(s), grad.args names '
                       f"{len(args)}")
    returns = k.grad_returns if k.grad_returns is not None else tuple(inputs)
    for i, n in enumerate(returns):
        if n not in inputs:
            raise ctx.fail(f"{kp}.returns[{i}]", f'"{n}" is no forward input (inputs: '
                           f"{', '.join(inputs)})")
    if len(set(returns)) != len(returns):
        raise ctx.fail(f"{kp}.returns", "names a forward input twice")
    if len(returns) != len(bc.visible):
        raise ctx.fail(f"{kp}.returns", f'"{bname}" returns {len(bc.visible)} result(s), one per '
                       f"name of grad.returns ({len(returns)}: {', '.join(returns)})")
    _check_declared_cotangents(ctx, kp, k, fc)


def _check_declared_cotangents(ctx: _Ctx, kp: str, k: Kernel, fc: CallingConvention) -> None:
    """Every cotangent or an error: a returned output whose cotangent `grad.args` leaves
    out is declared `nondiff` or `stop_gradient` (else jax.grad of a loss on it would be
    a silent zero); what those lists name is a returned output the backward takes no
    cotangent of, in one list only."""
    returned = [t.name for t in fc.visible]
    saved = {t.name for t in fc.results if t.saved}
    args = k.grad_args or ()
    for key, names in (("nondiff", k.grad_nondiff), (STOP_GRADIENT, k.grad_stop)):
        for i, n in enumerate(names):
            where = f"{kp}.{key}[{i}]"
            if n in saved:
                raise ctx.fail(where, f'"{n}" is saved (not returned): no cotangent ever reaches it, '
                               "leave it out")
            if n not in returned:
                raise ctx.fail(where, f'"{n}" is no output the forward returns (returned: '
                               f"{', '.join(returned) or 'none'})")
            if COTANGENT + n in args:
                raise ctx.fail(where, f'the backward takes "{COTANGENT}{n}" (grad.args): "{n}" is '
                               "differentiable, leave it out")
            if names.index(n) != i:
                raise ctx.fail(where, f'names "{n}" twice')
    both = sorted(set(k.grad_nondiff) & set(k.grad_stop))
    if both:
        raise ctx.fail(f"{kp}.{STOP_GRADIENT}", f'"{both[0]}" is also in grad.nondiff: declare it in '
                       "one of them")
    left = undeclared(returned, args, k.grad_nondiff, k.grad_stop)
    if left:
        n = left[0]
        raise ctx.fail(f"{kp}.args", f'takes no cotangent of returned output "{n}", so jax.grad of a '
                       f'loss on "{n}" would be a silent zero: pass "{COTANGENT}{n}" to the backward, '
                       f'or declare it: nondiff = ["{n}"] (a gradient through it is an error) or '
                       f'stop_gradient = ["{n}"] (its cotangent is dropped)')


# Small validators --------------------------------------------------------------------


def _no_unknown(ctx: _Ctx, d: dict[str, Any], allowed: set[str], kp: str) -> None:
    for k in d:
        if k not in allowed:
            raise ctx.fail(kp, f'unknown key "{k}" (allowed: {", ".join(sorted(allowed))})')


def _str(ctx: _Ctx, kp: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ctx.fail(kp, f"must be a string, got {_tname(v)}")
    return v


def _platforms(ctx: _Ctx, kp: str, v: Any) -> tuple[str, ...]:
    """The manifest's `platforms`: host platforms cutecc builds for, each once."""
    if not isinstance(v, list) or not v:
        raise ctx.fail(kp, f'must be a non-empty array of platforms such as ["{BUILD_PLATFORM}"]')
    out: list[str] = []
    for i, p in enumerate(v):
        if p not in PLATFORMS:
            raise ctx.fail(f"{kp}[{i}]", f"{json.dumps(p) if isinstance(p, str) else _tname(p)} is "
                           f"not a platform cutecc builds for (one of: {', '.join(sorted(PLATFORMS))})")
        if p not in out:
            out.append(p)
    return tuple(out)


def _archs(ctx: _Ctx, kp: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ctx.fail(kp, "must be a non-empty array of architectures such as \"sm_90a\"")
    out = []
    for i, a in enumerate(v):
        if not is_arch(a):
            raise ctx.fail(f"{kp}[{i}]", f'"{a}" is not a GPU architecture such as "sm_90a"')
        if a not in out:
            out.append(a)
    return tuple(out)


def _table(ctx: _Ctx, kp: str, v: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(v, dict):
        raise ctx.fail(kp, f"must be a table, got {_tname(v)}")
    for k in v:
        if not NAME_RE.fullmatch(k) or keyword.iskeyword(k):
            raise ctx.fail(f"{kp}.{k}", "a keyword argument name must be an identifier")
    return tuple(v.items())


def _name(ctx: _Ctx, kp: str, a: dict[str, Any]) -> str:
    if "name" not in a:
        raise ctx.fail(kp, 'missing "name"')
    n = a["name"]
    if not isinstance(n, str) or not NAME_RE.fullmatch(n) or keyword.iskeyword(n):
        raise ctx.fail(f"{kp}.name", f"{n!r} is not a valid identifier")
    if n.startswith("cutecc_"):
        raise ctx.fail(f"{kp}.name", 'names starting with "cutecc_" are reserved')
    return n


def _dtype(ctx: _Ctx, kp: str, a: dict[str, Any], env: dict[str, _Value], hw: dict[str, Any]) -> str:
    if "dtype" not in a:
        raise ctx.fail(kp.rsplit(".", 1)[0], 'missing "dtype"')
    raw = _subst(ctx, kp, a["dtype"], env, hw)
    if not isinstance(raw, str):
        raise ctx.fail(kp, f"must be a dtype name, got {raw!r}")
    dt = dtypes.canonical(raw)
    if dt is None:
        raise ctx.fail(kp, f'unknown dtype "{raw}" (known: {", ".join(dtypes.DTYPES)})')
    return dt


def _tname(v: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)
