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
                                  queries, and the DSL's HardwareInfo, while the build
                                  constructs it: cutecc.toolchain.devicequery)
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
    inputs = ["data/*.json"]      files a compile reads besides modules (globs, relative to
                                  the manifest): keyed by content (docs/keys.md)
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
        "$param"s and "$hw.fact"s (`cutecc.contract.expr`); scratch is allocated (zero = true: zeroed)
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
        element before writing it): `ks.k.in_place(..)` lets XLA reuse x's buffer;
        present = "$p" (input): optional, by a bool axis: its false variants are built with
        None in the slot, reached by a call passing None there (or leaving it out)
      {kind = "scalar", name, dtype, default}    a runtime scalar (keyword at the JAX side);
        with value = <int or expression> instead, derived: the runtime computes and passes it
      {kind = "none"}   {kind = "stream"}   {kind = "tuple", items = [..]}
      {kind = "const", value = V}                a compile-time value in the launcher's order
      {kind = "struct", type = "pkg.mod:Name", fields = {f = <arg>, ..}}  a NamedTuple/dataclass
      any argument may carry param = "NAME": passed by that keyword; undeclared parameters
      in between keep their Python defaults
    constants = {..}              compile-time keyword arguments of the launcher
    derive = {p = {axis = {value = v, ..}}}   a parameter that follows one axis (no axis itself)
    from_shapes = {vec = "gcd(n, 4)"}   axes a call's extents choose (an expression over
                                  input symbols): the call reaches the variant of its value
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
                                  cotangent the backward does not take, see cutecc.contract.cotangents)
    tune = {..}                   a tuning space for `cutecc tune` (see cutecc.manifest.tune_space)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError, ManifestErrors
from cutecc.manifest.grammar import (
    _BUILD_KEYS,
    _TOP_KEYS,
    BUILTIN_PROFILES,
    ENV_NAME_RE,
    EXECUTORS,
    MANIFEST_FORMAT,
    MANIFEST_NAMES,
    MAX_MANIFEST_BYTES,
    _archs,
    _Ctx,
    _no_unknown,
    _platforms,
    _str,
    _tname,
)
from cutecc.manifest.kernel import _composite, _kernel
from cutecc.manifest.model import BuildSettings, Composite, Manifest
from cutecc.manifest.rules import Errors, _check_composites, _check_grads
from cutecc.names import kernel_name_problem
from cutecc.platforms import BUILD_PLATFORM
from cutecc.remote_url import parse_url
from cutecc.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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
    errors: Errors = []  # each kernel's first error: all are reported at once
    for name, kdoc in ktab.items():
        kp = f'kernel "{name}"'
        try:
            why = kernel_name_problem(name)  # an attribute of the kernel set, a directory
            if why:
                raise ctx.fail(kp, f"{why}; rename the kernel")
            if not isinstance(kdoc, dict):
                raise ctx.fail(kp, "must be a table")
            if "launches" in kdoc:
                composites.append(_composite(ctx, kp, name, kdoc))
                continue
            kernels.append(_kernel(ctx, kp, name, kdoc, archs, profile, profiles, copts))
        except CuteccError as e:
            errors.append((name, e))
    conventions = _check_composites(ctx, composites, kernels, errors, {n for n, _ in errors})
    _check_grads(ctx, kernels, conventions, errors, {n for n, _ in errors})  # composites' too
    try:
        settings = _build_settings(ctx, f"{prefix}build", doc.get("build", {}))
    except CuteccError as e:  # [build] sits before or after the kernels in the file
        keys = list(doc)
        before = "build" in keys and "kernel" in keys and keys.index("build") < keys.index("kernel")
        errors.append(("" if before else "\0", e))
    _raise_all(errors, list(ktab))
    return Manifest(path, python_path, tuple(kernels), tuple(sorted(env.items())), settings,
                    tuple(composites), plats)


MAX_REPORTED_ERRORS = 20  # errors one run reports; the rest are counted


def _raise_all(errors: Errors, order: list[str]) -> None:
    """Raise the errors collected, in file order (by kernel; "" before the kernels, "\0"
    after them): one as itself, several as one `ManifestErrors` (at most
    `MAX_REPORTED_ERRORS` named)."""
    if not errors:
        return
    place = {n: i for i, n in enumerate(order)}
    ranked = sorted(errors, key=lambda x: -1 if x[0] == "" else place.get(x[0], len(order)))
    if len(ranked) == 1:
        raise ranked[0][1]
    shown = [e for _, e in ranked[:MAX_REPORTED_ERRORS]]
    raise ManifestErrors(shown, len(ranked) - len(shown))


def _build_settings(ctx: _Ctx, kp: str, doc: Any) -> BuildSettings:
    """The `[build]` table, checked; values are strings a build's flags would take."""
    if not isinstance(doc, dict):
        raise ctx.fail(kp, "must be a table (executor, ray_address, remote, compile_timeout, "
                       "compile_memory, pins, inputs)")
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
    inputs = _inputs(ctx, f"{kp}.inputs", doc.get("inputs", []))
    got = {k: _str(ctx, f"{kp}.{k}", v).strip() for k, v in doc.items() if k not in limits and k != "inputs"}
    if "executor" in got and got["executor"] not in EXECUTORS:
        raise ctx.fail(f"{kp}.executor", f'unknown executor "{got["executor"]}" '
                       f"(known: {', '.join(EXECUTORS)})")
    if "pins" in got and (not got["pins"] or not got["pins"].isprintable() or len(got["pins"]) > 500):
        # printed in the build's advice: printable text only
        raise ctx.fail(f"{kp}.pins", "must name a requirements file, relative to the manifest")
    if "ray_address" in got and got.get("executor") != "ray":
        raise ctx.fail(f"{kp}.ray_address", 'a Ray address needs executor = "ray"')
    if "remote" in got:
        try:
            parse_url(got["remote"])
        except CuteccError as e:
            raise ctx.fail(f"{kp}.remote", e.message) from None
    named: dict[str, Any] = {k: v or None for k, v in got.items()}
    return BuildSettings(**named, **limits, inputs=inputs)


def _inputs(ctx: _Ctx, kp: str, v: Any) -> tuple[str, ...]:
    """`[build] inputs`: relative paths or globs inside the manifest's directory."""
    if not isinstance(v, list) or len(v) > 1000:
        raise ctx.fail(kp, "must be an array of paths (globs), relative to the manifest")
    out = []
    for i, p in enumerate(v):
        p = p.strip() if isinstance(p, str) else p  # (checked as it will be used: " /etc/x" is absolute)
        if not isinstance(p, str) or not p or len(p) > 500 or any(ord(c) < 32 for c in p) \
                or p.startswith(("/", "~")) or ".." in p.replace("\\", "/").split("/"):
            raise ctx.fail(f"{kp}[{i}]", "must be a path (or glob) relative to the manifest, inside "
                           "its directory")
        out.append(p)
    return tuple(out)
