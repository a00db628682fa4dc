"""What the runtime is told from outside a call's arguments: the settings of `cutecc.settings`'
table a load serves by, read once, at the edge, into one frozen typed record.

`RuntimeSettings.from_environment` is the one function under `cutecc/runtime/` that reads
the environment (`tests/architecture/test_runtime_settings.py`): `cutecc.load` and
`cutecc.torch.load` call it once, with their own keyword arguments (which win over the
environment), and hand the record down (the JIT miss hook, the fallbacks, the builds'
library loads); the public functions that answer for a load (`device_arch`, `device_kind`)
take one, else read their own. So a variable set after `load()` changes nothing of what
that load serves (`docs/settings.md`: every runtime setting is read at `load()`).

`$CUTECC_ALLOW_SHARED_CACHE` is not here: it decides every check of `cutecc.trust`, for the
build side and the runtime alike, and is read there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cutecc import settings
from cutecc.archs import check_arch, parse_driver_version


@dataclass(frozen=True)
class RuntimeSettings:
    """The settings a load serves by. `origin` names where each one given came from
    (`jit=True`, `$CUTECC_JIT`), as an error or a refusal names it (`where`)."""

    arch: str | None = None  # the arch to load for (checked as an arch name; None: the GPU's)
    driver_version: tuple[int, int] | None = None  # judges PTX (None: libcuda's; NO_DRIVER: none)
    device_kind: str | None = None  # the device whose tuning records serve without a GPU
    strict: bool = False  # a call no build serves is an error, even where a fallback is declared
    jit: bool = False  # a miss compiles the variant that serves it (development)
    read_only: bool = False  # write nothing to the cache: no use recorded, no miss counted
    sync_check: bool = False  # each kernel waits for its stream (no CUDA graphs then)
    trusted_keys: tuple[Path, ...] = ()  # the public keys a lock must verify with
    allow_unsigned: bool = False  # accept a lock no trusted key signed
    tvm_ffi_interop: bool = False  # let tvm-ffi import torch and cuda-python when cutecc imports it
    origin: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def where(self, name: str) -> str:
        """Where setting `name` was given, as an error names it (its variable when not given)."""
        return dict(self.origin).get(name) or READ_AT_LOAD[name].where

    def given(self, name: str) -> bool:
        """Whether setting `name` was given (by a keyword or the environment)."""
        return name in dict(self.origin)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, *, arch: str | None = None,
                         strict: bool = False, jit: bool | None = None,
                         trusted_keys: Sequence[str | os.PathLike[str]] | None = None,
                         allow_unsigned: bool = False) -> RuntimeSettings:
        """The settings: each keyword a load was given (`load(arch=, strict=True, jit=,
        trusted_keys=, allow_unsigned=True)`) else its variable, read now, checked and typed
        (a bad value is a CuteccError naming the variable). A keyword given leaves its
        variable unread."""
        env = os.environ if environ is None else environ
        got: dict[str, object] = {}
        origin: list[tuple[str, str]] = []

        def take(name: str, value: object, where: str) -> None:
            got[name] = value
            origin.append((name, where))

        if arch is not None:
            take("arch", arch, "cutecc.load arch")  # checked by the load, as a device's arch
        elif settings.ARCH.text(env):
            take("arch", check_arch(settings.ARCH.text(env), settings.ARCH.where), settings.ARCH.where)
        if settings.DRIVER_VERSION.text(env):
            take("driver_version", parse_driver_version(settings.DRIVER_VERSION.text(env),
                                                        settings.DRIVER_VERSION.where),
                 settings.DRIVER_VERSION.where)
        if settings.DEVICE_KIND.read(env):
            take("device_kind", settings.DEVICE_KIND.read(env), settings.DEVICE_KIND.where)
        if strict:
            take("strict", True, "load(strict=True)")
        elif settings.STRICT.on(env):
            take("strict", True, settings.STRICT.where)
        if jit is not None:
            if jit:
                take("jit", True, "jit=True")
        elif settings.JIT.on(env):
            take("jit", True, settings.JIT.where)
        for name, row in (("read_only", settings.READ_ONLY), ("sync_check", settings.SYNC_CHECK)):
            if row.on(env):
                take(name, True, row.where)
        if trusted_keys:
            take("trusted_keys", tuple(Path(p) for p in trusted_keys), "trusted_keys=")
        elif settings.TRUSTED_KEYS.text(env):
            paths = (settings.TRUSTED_KEYS.read(env) or "").split(os.pathsep)
            take("trusted_keys", tuple(Path(p) for p in paths if p), settings.TRUSTED_KEYS.where)
        if allow_unsigned:
            take("allow_unsigned", True, "allow_unsigned=True")
        elif settings.ALLOW_UNSIGNED.on(env):
            take("allow_unsigned", True, settings.ALLOW_UNSIGNED.where)
        if settings.TVM_FFI_TORCH.read(env) == "1":
            take("tvm_ffi_interop", True, settings.TVM_FFI_TORCH.where)
        return cls(**got, origin=tuple(origin))  # type: ignore[arg-type]


# each setting's row of the table, read by `from_environment` (`where` names it when not
# given); `docs/settings.md` lists them as read at `load()`
READ_AT_LOAD = {"arch": settings.ARCH, "driver_version": settings.DRIVER_VERSION,
         "device_kind": settings.DEVICE_KIND, "strict": settings.STRICT, "jit": settings.JIT,
         "read_only": settings.READ_ONLY, "sync_check": settings.SYNC_CHECK,
         "trusted_keys": settings.TRUSTED_KEYS, "allow_unsigned": settings.ALLOW_UNSIGNED,
         "tvm_ffi_interop": settings.TVM_FFI_TORCH}
