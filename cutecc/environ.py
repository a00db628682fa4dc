"""The environment variables cutecc reads, and how it reads a yes/no one.

One place for the names and for the rule that unset, "", 0, false, no and off mean off,
so the build side, the commands and the runtime agree on every switch.
"""

from __future__ import annotations

import os

CACHE_DIR = "CUTECC_CACHE_DIR"  # the cache directory
READ_ONLY = "CUTECC_READ_ONLY"  # write nothing to the cache
ARCH = "CUTECC_ARCH"  # the arch to load for, without (or instead of) a GPU
DRIVER_VERSION = "CUTECC_DRIVER_VERSION"  # the CUDA driver to judge PTX by (13.0), not libcuda's
ALLOW_SHARED_CACHE = "CUTECC_ALLOW_SHARED_CACHE"  # trust a cache others can write
SYNC_CHECK = "CUTECC_SYNC_CHECK"  # each kernel waits for its stream and reports faults
TVM_FFI_TORCH = "CUTECC_TVM_FFI_TORCH"  # let tvm-ffi import torch and cuda-python (its interop)
SIGNING_KEY = "CUTECC_SIGNING_KEY"  # the private key `build` and `pack` sign locks with
TRUSTED_KEYS = "CUTECC_TRUSTED_KEYS"  # public keys (paths, `:`-separated) a lock must verify with
ALLOW_UNSIGNED = "CUTECC_ALLOW_UNSIGNED"  # accept packs and locks without a trusted signature
STRICT = "CUTECC_STRICT"  # a call no build serves is an error, even where a fallback is declared
JIT = "CUTECC_JIT"  # development: a call no build fits compiles its variant into the cache (needs the DSL)
EXECUTOR = "CUTECC_EXECUTOR"  # where misses compile: local (default) or ray
RAY_ADDRESS = "CUTECC_RAY_ADDRESS"  # the Ray cluster to submit to (else a private local one)
COMPILE_TIMEOUT = "CUTECC_COMPILE_TIMEOUT"  # seconds one compile may run (0 or off: no limit)
COMPILE_MEMORY = "CUTECC_COMPILE_MEMORY"  # the data memory one compile may use (size; off: none)
REMOTE = "CUTECC_REMOTE"  # the shared remote cache, s3://bucket/prefix
REMOTE_WRITE = "CUTECC_REMOTE_WRITE"  # builds upload what they compile to the remote
REMOTE_MAX_BLOB = "CUTECC_REMOTE_MAX_BLOB"  # the largest blob accepted from the remote (size)
REMOTE_TIMEOUT = "CUTECC_REMOTE_TIMEOUT"  # seconds one remote request may take
REMOTE_JOBS = "CUTECC_REMOTE_JOBS"  # parallel remote requests
WORKERS = "CUTECC_WORKERS"  # how local build workers start: fork (from the compile service) or spawn
PLAN_MEMORY = "CUTECC_PLAN_MEMORY"  # where planning facts are remembered for every cache (off: nowhere)
SERVICE_IDLE = "CUTECC_SERVICE_IDLE"  # seconds a resident compile service waits for the next build (0: none)
AUDIT = "CUTECC_AUDIT"  # off: builds skip the read-set check (to measure its cost; builds as before issue 44)
WORKER_MARK = "CUTECC_WORKER_MARK"  # set by a local build worker: marks what its compiles start
_OFF = ("", "0", "false", "no", "off")


def flag(name: str) -> bool:
    """Whether the switch `name` is on: set to anything but "", 0, false, no or off."""
    return os.environ.get(name, "").strip().lower() not in _OFF


def read_only() -> bool:
    """Whether `$CUTECC_READ_ONLY` asks for a cache that is only read."""
    return flag(READ_ONLY)
