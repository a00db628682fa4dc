"""The manifest as the rest of cutecc sees it: frozen records, every value already checked.

`cutecc.manifest.parse` builds these from `kernels.toml` (or `[tool.cutecc]`); nothing
downstream re-validates them. Imports neither the DSL nor JAX.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.contract.args import Arg, CallingConvention
from cutecc.contract.cotangents import STOP_GRADIENT
from cutecc.errors import CuteccError
from cutecc.manifest.tune_space import TuneSpec
from cutecc.platforms import BUILD_PLATFORM

Value = int | float | bool | str  # a variant parameter's, a constant's or a call keyword's value
_INDEX_RE = re.compile(r"\[([0-9]+)\]")


@dataclass(frozen=True)
class Variant:
    """One point of a kernel's variant matrix, fully resolved."""

    kernel: str
    params: tuple[tuple[str, Value], ...]
    args: tuple[Arg, ...]
    constants: tuple[tuple[str, Value], ...]
    factory_args: tuple[tuple[str, Value], ...] | None
    # The variant parameters a call names by keyword (those the input tensors cannot
    # tell apart), with this variant's values; see `_call_keywords`.
    call: tuple[tuple[str, Value], ...] = ()
    # `relations = ["ls == l * $split_k"]`: equalities between the inputs' extents a call
    # must hold, `$param`s resolved (canonical "lhs == rhs" texts; `cutecc.contract.expr.relation`)
    relations: tuple[str, ...] = ()
    # `from_shapes`: the variant axes a call's shapes choose, each with its expression over
    # input extents (`cutecc.contract.expr`): a call reaches this variant where each gives
    # this variant's value of the axis.
    from_shapes: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        if not self.params:
            return "default"
        return ",".join(f"{k}={v}" for k, v in self.params)

    @property
    def convention(self) -> CallingConvention:
        return CallingConvention.of(self.args)


@dataclass(frozen=True)
class Kernel:
    name: str
    entry: str
    archs: tuple[str, ...]
    profile: str
    compile_options: str
    variants: tuple[Variant, ...]
    backward: str | None = None
    tuning: TuneSpec | None = None
    # per variant id, its tuning candidates other than itself (the default configuration)
    candidates: tuple[tuple[str, tuple[Variant, ...]], ...] = ()
    # the facts of its hardware profile (`profile`): what device queries are answered with
    hardware: tuple[tuple[str, Any], ...] = ()
    # grad.args / grad.returns: the backward's inputs by name (forward inputs, forward
    # outputs saved or not, "cotangent.<output>") and which forward input each of its
    # results is the gradient of. None: inputs then cotangents, one gradient per input.
    grad_args: tuple[str, ...] | None = None
    grad_returns: tuple[str, ...] | None = None
    # grad.nondiff / grad.stop_gradient: returned outputs whose cotangent the backward does
    # not take, declared so (`cutecc.contract.cotangents`). nondiff follows from grad.args (the
    # runtime derives it), so only stop_gradient, a choice, is stored with the entries.
    grad_nondiff: tuple[str, ...] = ()
    grad_stop: tuple[str, ...] = ()
    # `shard = ["b", "h"]`: symbolic extents the kernel is independent along, so a call
    # under several devices may run per shard of them (`cutecc.runtime.sharding`)
    shard: tuple[str, ...] = ()
    # `reshard = "error" | "warn" | "allow"`: under an explicit mesh, a call whose inputs are
    # split where `shard` does not allow (so XLA would insert a collective before it) is an
    # error (the default), one warning, or allowed (`cutecc.runtime.strict`)
    reshard: str = "error"
    # `fallback = "pkg.mod:fn"` (and `fallback_torch` for cutecc.torch): a plain function
    # with the kernel's calling convention, served where no build fits a call. Not part
    # of the key (it changes no artifact); recorded in the lock and the build records.
    fallback: str | None = None
    fallback_torch: str | None = None

    @property
    def grad(self) -> dict[str, Any] | None:
        """The named pairing as stored in entries (and keyed), None when not declared."""
        if self.grad_args is None:
            return None
        pairing: dict[str, Any] = {"backward": self.backward, "args": list(self.grad_args),
                                   "returns": None if self.grad_returns is None else list(self.grad_returns)}
        if self.grad_stop:  # only when set: pairings without it keep their keys
            pairing[STOP_GRADIENT] = list(self.grad_stop)
        return pairing

    @property
    def module(self) -> str:
        return self.entry.split(":", 1)[0]


def split_entry(entry: str) -> tuple[str, tuple[int, ...]]:
    """An entry as ("package.module:attr[.attr]", the indices into what that names):
    `"m:pair[1]"` -> `("m:pair", (1,))`."""
    cut = entry.find("[")
    if cut < 0:
        return entry, ()
    return entry[:cut], tuple(int(i) for i in _INDEX_RE.findall(entry[cut:]))


@dataclass(frozen=True)
class Composite:
    """A kernel declared as an ordered list of launches of other kernels (each built and
    keyed as any kernel), sharing tensors by name: the call's `inputs`, then each launch's
    results (saved ones too), from which `outputs` are returned. Nothing of its own is
    built; `cutecc build` records it in the cache (`composites/NAME.json`) for the runtime."""

    name: str
    launches: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"launches": list(self.launches), "inputs": list(self.inputs),
                "outputs": list(self.outputs)}


@dataclass(frozen=True)
class BuildSettings:
    """The manifest's `[build]` table: defaults for where a build runs. Command-line flags
    and `$CUTECC_EXECUTOR` / `$CUTECC_RAY_ADDRESS` / `$CUTECC_REMOTE` take precedence."""

    executor: str | None = None
    ray_address: str | None = None
    remote: str | None = None
    compile_timeout: float | None = None  # 0: no limit; None: not set here
    compile_memory: int | None = None  # 0: no limit; None: not set here
    pins: str | None = None  # the requirements file pinning the build environment (as written)
    # files (globs, relative to the manifest) that a kernel's compile reads besides its modules:
    # keyed by content (`cutecc.plan.build_plan.declared_inputs`), checked by `cutecc.build.read_set`
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    path: Path
    python_path: tuple[Path, ...]
    kernels: tuple[Kernel, ...]
    env: tuple[tuple[str, str], ...] = ()
    build: BuildSettings = BuildSettings()
    composites: tuple[Composite, ...] = ()
    platforms: tuple[str, ...] = (BUILD_PLATFORM,)  # host platforms of the libraries

    def env_for(self, arch: str) -> dict[str, str]:
        """The `[env]` a build worker for `arch` sets ("$arch" substituted)."""
        return {k: v.replace("$arch", arch) for k, v in self.env}

    @property
    def root(self) -> Path:
        return self.path.parent

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        known = ", ".join(k.name for k in self.kernels) or "none"
        raise CuteccError(f'no kernel "{name}" (kernels: {known})', where=str(self.path))

    def select(self, kernels: tuple[str, ...] | list[str]) -> Manifest:
        """This manifest restricted to `kernels` and their backward kernels (an unknown
        name is an error naming the manifest)."""
        wanted = set(kernels)
        comps = {c.name: c for c in self.composites}
        for name in kernels:
            if name in comps:
                wanted |= set(comps[name].launches)
                continue
            back = self.kernel(name).backward  # raises for unknown names
            if back in comps:
                wanted |= set(comps[back].launches) | {back}
            elif back:
                wanted.add(back)
        return dataclasses.replace(self, kernels=tuple(k for k in self.kernels if k.name in wanted),
                                   composites=tuple(c for c in self.composites if c.name in wanted))
