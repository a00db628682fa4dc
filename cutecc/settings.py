"""Every setting cutecc takes from outside a call's arguments: one table, one row each.

A row (`Setting`) names the environment variable, the command-line flag that sets the same
thing (if any), the manifest's `[build]` key (if any), how its value reads, its default and
one line of what it does. Where a setting can be given several ways, the first given wins:
the flag, else the environment variable, else the `[build]` key, else the default.

The environment is read here and nowhere else in cutecc (`tests/architecture/test_settings.py`
greps the package), at the edge: the command line and `cutecc.load` read it, the build takes
what they read as a typed record (`BuildOptions`, from `BuildOptions.from_environment`) and
fills what is left from the manifest's `[build]` (`cutecc.build.builder.settings`). The
references `docs/settings.md` and `docs/cli.md` are written from this table and the click
parser (`python -m cutecc.cli.docs`).

To add a setting: add a row below (with `option=` and a field of `BuildOptions`, checked in
`_typed`, if the build takes it; its flag through `cutecc.cli.options.setting_option`), then
run `python -m cutecc.cli.docs` to rewrite the references.

Internal rows (`internal=True`, their variables named `CUTECC_INTERNAL_*`) are hooks for
tests and measurements, or what cutecc sets for its own processes: not settings; they are
listed apart, as such, and may change without notice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from cutecc.errors import CuteccError

_OFF = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One setting: where it can be given, how it reads, what it does."""

    env: str  # the environment variable
    what: str  # what it does, one line (the reference's)
    kind: str = "text"  # how it reads: switch, seconds, size, count, path, paths, choice, url, text
    default: str = ""  # what holds when nothing sets it, in words
    flag: str | None = None  # the command-line option that sets the same (its commands take it)
    key: str | None = None  # the manifest's `[build]` key that sets the same
    group: str = "build"  # the reference's section: build, remote, signing, runtime, homes
    option: str | None = None  # the `BuildOptions` field it fills (`BuildOptions.from_environment`)
    internal: bool = False  # a hook for tests, measurements or cutecc's own processes

    def read(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's value (None: unset)."""
        return (os.environ if environ is None else environ).get(self.env)

    def text(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's value, stripped ("" when unset)."""
        return (self.read(environ) or "").strip()

    def on(self, environ: Mapping[str, str] | None = None) -> bool:
        """A switch: on unless unset or "", 0, false, no or off."""
        return self.text(environ).lower() not in _OFF

    @property
    def where(self) -> str:
        """How an error names the variable."""
        return f"${self.env}"


def _row(*args: str, **kw: object) -> Setting:
    s = Setting(*args, **kw)  # type: ignore[arg-type]
    TABLE.append(s)
    return s


TABLE: list[Setting] = []

# build ----------------------------------------------------------------------------------
CACHE_DIR = _row("CUTECC_CACHE_DIR", "The cache directory.", "path",
                 "the user cache directory's `cutecc`", flag="--cache-dir", group="build")
READ_ONLY = _row("CUTECC_READ_ONLY", "Write nothing to the cache: a build's miss is an error, "
                 "`load` records no use.", "switch", "off", flag="--read-only", option="read_only")
EXECUTOR = _row("CUTECC_EXECUTOR", "Where misses compile: `local` processes or `ray` tasks.",
                "choice", "local", flag="--executor", key="executor", option="executor")
RAY_ADDRESS = _row("CUTECC_RAY_ADDRESS", "The Ray cluster to submit to.",
                   "url", "a private local cluster", flag="--ray-address", key="ray_address",
                   option="ray_address")
COMPILE_TIMEOUT = _row("CUTECC_COMPILE_TIMEOUT", "Seconds one compile may run before it is stopped "
                       "(0 or off: no limit).", "seconds", "3600", flag="--compile-timeout",
                       key="compile_timeout", option="compile_timeout")
COMPILE_MEMORY = _row("CUTECC_COMPILE_MEMORY", "The data memory one compile may use, e.g. 16G "
                      "(0 or off: no limit).", "size", "no limit", flag="--compile-memory",
                      key="compile_memory", option="compile_memory")
SERVICE_IDLE = _row("CUTECC_SERVICE_IDLE", "Seconds a resident compile service waits for the next "
                    "build (0 or off: one service per build).", "seconds", "300; 0 where $CI is set")
SERVICE_MAX = _row("CUTECC_SERVICE_MAX", "Resident compile services kept at once per user: a new one "
                   "retires the least recently used.", "count", "2")
PLAN_MEMORY = _row("CUTECC_PLAN_MEMORY", "Where planning facts are remembered for every cache "
                   "(off: nowhere).", "path",
                   "`planning-v1` in cutecc's user cache directory (`cutecc.store.homes`)")
WORKERS = _row("CUTECC_WORKERS", "How local build workers start: `fork` from the compile service, "
               "or `spawn`.", "choice", "fork where safe")
# remote ---------------------------------------------------------------------------------
REMOTE = _row("CUTECC_REMOTE", "The shared remote cache, s3://BUCKET/PREFIX (endpoint and "
              "credentials from the AWS_* variables).", "url", "none", flag="--remote", key="remote",
              group="remote", option="remote")
REMOTE_WRITE = _row("CUTECC_REMOTE_WRITE", "Builds upload what they compile to the remote.", "switch",
                    "off", flag="--remote-write", group="remote", option="remote_write")
REMOTE_MAX_BLOB = _row("CUTECC_REMOTE_MAX_BLOB", "The largest blob accepted from the remote.", "size",
                       "64M", group="remote", option="remote_max_blob")
REMOTE_TIMEOUT = _row("CUTECC_REMOTE_TIMEOUT", "Seconds one remote request may take.", "seconds", "30",
                      group="remote", option="remote_timeout")
REMOTE_JOBS = _row("CUTECC_REMOTE_JOBS", "Parallel remote requests.", "count", "16", group="remote",
                   option="remote_jobs")
# signing --------------------------------------------------------------------------------
SIGNING_KEY = _row("CUTECC_SIGNING_KEY", "The private key `build`, `tune` and `pack` sign locks "
                   "with.", "path", "none: unsigned", flag="--sign-key", group="signing", option="sign_key")
TRUSTED_KEYS = _row("CUTECC_TRUSTED_KEYS", "Public keys a lock must verify with (paths, "
                    "`:`-separated).", "paths", "none", flag="--trusted-key", group="signing")
ALLOW_UNSIGNED = _row("CUTECC_ALLOW_UNSIGNED", "Accept packs and locks without a trusted signature.",
                      "switch", "off", flag="--allow-unsigned", group="signing")
ALLOW_SHARED_CACHE = _row("CUTECC_ALLOW_SHARED_CACHE", "Trust a cache others can write.", "switch",
                          "off", group="signing")
# runtime --------------------------------------------------------------------------------
ARCH = _row("CUTECC_ARCH", "The arch to load for, without (or instead of) a GPU.", "choice",
            "the GPU's", group="runtime")
DRIVER_VERSION = _row("CUTECC_DRIVER_VERSION", "The CUDA driver version to judge PTX by (13.0), "
                      "not libcuda's.", "text", "libcuda's", group="runtime")
SYNC_CHECK = _row("CUTECC_SYNC_CHECK", "Each kernel waits for its stream and reports faults.",
                  "switch", "off", group="runtime")
STRICT = _row("CUTECC_STRICT", "A call no build serves is an error, even where a fallback is "
              "declared.", "switch", "off", group="runtime")
JIT = _row("CUTECC_JIT", "Development: a call no build fits compiles its variant into the cache "
           "(needs the DSL).", "switch", "off", group="runtime")
# homes ----------------------------------------------------------------------------------
PLATFORM_LIBS = _row("CUTECC_PLATFORM_LIBS", "Where the pinned link inputs of other platforms "
                     "(aarch64) are kept.", "path", "`platform-libs-v1` in cutecc's user "
                     "cache directory (`cutecc.store.homes`)", group="homes")
# internal -------------------------------------------------------------------------------
AUDIT = _row("CUTECC_INTERNAL_AUDIT", "off: builds skip the read-set check (to measure its cost, and for "
             "tests that build as before issue 44).", "switch", "on", internal=True)
WORKER_MARK = _row("CUTECC_INTERNAL_WORKER_MARK", "Set by a local build worker: marks what its compiles "
                   "start.", "text", "", internal=True)
DEVICE_KIND = _row("CUTECC_DEVICE_KIND", "The device kind whose tuning records serve where no GPU "
                   "is seen (to lower or export on a CPU host for that device).", "text", "the GPU's",
                   group="runtime")
TVM_FFI_TORCH = _row("CUTECC_TVM_FFI_TORCH", "1: let tvm-ffi import torch and cuda-python (its "
                     "interop) when cutecc imports it.", "text", "unset: hidden from that import",
                     group="runtime")

BY_ENV: dict[str, Setting] = {s.env: s for s in TABLE}

# Variables of other programs that cutecc reads or passes on, named here so that every
# variable the package reads is accounted for (`tests/architecture/test_settings.py`).
FOREIGN = ("CI", "CUDA_VISIBLE_DEVICES", "JAX_CUDA_VISIBLE_DEVICES", "CUTE_DSL_ARCH",
           "CUTE_DSL_DISABLE_FILE_CACHING", "ZIG_GLOBAL_CACHE_DIR", "XDG_RUNTIME_DIR", "PATH",
           "PYTHONPATH", "RAY_ADDRESS", "AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL", "AWS_REGION")


def switch(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Another program's yes/no variable (one of `FOREIGN`: $CI, $AWS_ALLOW_HTTP), read by
    the rule every switch of cutecc's follows."""
    assert name in FOREIGN, name
    return (os.environ if environ is None else environ).get(name, "").strip().lower() not in _OFF


def read_only(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `$CUTECC_READ_ONLY` asks for a cache that is only read."""
    return READ_ONLY.on(environ)


# What a build is told -------------------------------------------------------------------


@dataclass(frozen=True)
class BuildOptions:
    """What a build is told by its caller: the flags given, else the environment
    (`from_environment`). None: not given (the manifest's `[build]`, else the default,
    decides; the cache directory's default is `cutecc.store.view.default_cache_dir`).
    Values are checked and typed here; `origin` names where each came from
    (`--compile-timeout`, `$CUTECC_COMPILE_TIMEOUT`)."""

    cache_dir: Path | None = None
    jobs: int | None = None  # parallel compile workers (None: every core)
    read_only: bool = False
    sign_key: Path | None = None
    executor: str | None = None  # local or ray
    ray_address: str | None = None
    remote: str | None = None  # s3://bucket/prefix
    remote_write: bool = False
    compile_timeout: float | None = None  # seconds; 0: no limit
    compile_memory: int | None = None  # bytes; 0: no limit
    remote_max_blob: int | None = None
    remote_timeout: float | None = None
    remote_jobs: int | None = None
    origin: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def where(self, name: str) -> str:
        """Where `name` was given, as an error names it."""
        return dict(self.origin).get(name, name)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, **flags: object) -> BuildOptions:
        """The options: each of `flags` (the command line's, by field name; None or empty:
        not given) else its environment variable, checked and typed."""
        env = os.environ if environ is None else environ
        by_field = {s.option: s for s in TABLE if s.option}
        unknown = set(flags) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"not build options: {', '.join(sorted(unknown))}")
        raw: dict[str, tuple[object, str]] = {}
        for name, value in flags.items():
            if value is not None and value is not False and str(value).strip():
                raw[name] = (value, f"--{name.replace('_', '-')}")
        for name, s in by_field.items():
            if name not in raw and s.text(env):
                raw[name] = (s.read(env), s.where)
        got: dict[str, object] = {}
        for name, (value, where) in raw.items():
            got[name] = _typed(name, value, where)
        return cls(**got, origin=tuple((n, w) for n, (_, w) in raw.items()))  # type: ignore[arg-type]


NOTHING_GIVEN = BuildOptions()  # a build told nothing: the manifest's `[build]`, else the defaults


def _typed(name: str, value: object, where: str) -> object:
    """A build option's value, checked: the error names `where` it was given."""
    from cutecc.units import parse_size

    text = str(value).strip()
    if name in ("read_only", "remote_write"):
        return value if isinstance(value, bool) else text.lower() not in _OFF
    if name in ("cache_dir", "sign_key"):
        return Path(text) if not isinstance(value, Path) else value
    if name == "jobs":
        return int(value)  # type: ignore[call-overload]
    if name == "compile_timeout":
        if text.lower() in ("0", "off", "none", "no"):
            return 0.0
        try:
            secs = float(text)
        except ValueError:
            secs = -1.0
        if not 0 < secs < float("inf"):
            raise CuteccError(f'"{value}" is not a number of seconds (0 or off: no limit)', where=where)
        return secs
    if name == "compile_memory":
        if text.lower() in ("0", "off", "none", "no"):
            return 0
        mem = value if isinstance(value, int) else parse_size(text, where)
        if 0 < mem < 1 << 26:
            raise CuteccError(f"{value}: under 64M, too little for any compile", where=where)
        return mem
    if name == "remote_max_blob":
        return parse_size(text, where)
    if name in ("remote_timeout", "remote_jobs"):
        try:
            n: float = float(text) if name == "remote_timeout" else int(text)
        except ValueError:
            raise CuteccError(f"{REMOTE_TIMEOUT.where} (seconds) and {REMOTE_JOBS.where} must be "
                              "numbers", where="environment") from None
        if n <= 0:
            raise CuteccError("remote timeout and jobs must be positive", where="environment")
        return n
    return text
