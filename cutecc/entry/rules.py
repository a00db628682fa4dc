"""What a cache entry is: formats, its key, its label, and the checks on its metadata.

An entry is a directory `entries/ab/<key>/` holding `meta.json` and the files it
records (the kernel's shared library); its meta.json names the runtime library the
kernel library links against (key, file, SHA-256, size), itself an entry of its own kind
under `runtimes/ab/<key>/`. Everything that reads entries (the store, `verify`,
`pack`/`unpack`, the lock file and the runtime's loader) asks this module what a valid
one looks like, so the rules live in one place; they read the parsed JSON object, which
nothing outside this module (and its typed record, `cutecc.entry.meta`: `EntryMeta`,
`RuntimeMeta`) walks. It imports nothing else of cutecc but `cutecc.names` and
`cutecc.platforms` (base records), so the runtime can use it without pulling in the
build side.
"""

from __future__ import annotations

import array
import gc
import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from cutecc import platforms
from cutecc.names import MAX_NAME_CHARS, call_name_problem, kernel_name_problem
from cutecc.platforms import BUILD_PLATFORM

# The cache directory's layout (its `format` file). 2: runtimes/ and the by-kernel/ index.
STORE_FORMAT = 2
ENTRY_FORMAT = 2  # the layout of meta.json; 2: the `runtime` record
# Bump when the generated wrapper, the calling convention or the link recipe changes in a
# way that makes older artifacts unusable; part of every key and checked at load.
# 2: kernel libraries link against a shared runtime library (they no longer carry the
# CUDA runtime and the DSL's dialect runtime), host code is baseline x86-64, zig links.
ARTIFACT_FORMAT = 2
RUNTIME_ENTRY_FORMAT = 1  # the layout of a runtime library's meta.json (ENTRY_FORMAT's twin)
RUNTIME_ABI = 1  # what a runtime library's cutecc_rt_abi_version() must return (native/cutecc_rt.c)
INDEX_FORMAT = 1  # the layout of an index record (by-kernel/<kernel>/<key>)
MAX_INDEX_BYTES = 4096
META = "meta.json"
USED = "used"  # empty; its mtime is the entry's last use (not an artifact, not hashed)
LIBRARY = "kernel.so"
RESERVED_FILES = frozenset({META, USED})  # in an entry dir, besides the files meta.json lists
KEY_RE = re.compile(r"[0-9a-f]{64}")
# The form of a kernel name (cutecc.names has the whole rule: is_kernel_name).
KERNEL_NAME_RE = re.compile(rf"[A-Za-z][A-Za-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_META_BYTES = 1 << 20  # a meta.json is a few KB; anything larger is not ours
# A recorded file (a kernel or runtime library) is KBs to a few MB; a record of more is not
# ours, and nothing reads, allocates or hashes past it.
MAX_LIBRARY_BYTES = 256 << 20
MAX_JSON_DEPTH = 48  # meta.json and kernels.lock nest about 12 deep (tuples of tensors)
MAX_CONTAINERS_FREE = 1024  # arrays and objects any JSON file may hold, whatever its size
BYTES_PER_CONTAINER = 32  # past those, at most one per this many bytes
# The fields the runtime acts on that must equal their copies in the key inputs.
_KEYED_FIELDS = ("kernel", "args", "arch", "entry", "toolchain")


def parse_json(data: bytes, max_bytes: int = MAX_META_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` of a file cutecc did not necessarily write, else ValueError.

    Bounded in size (checked first), in time (the standard library's scanner does not
    backtrack: its cost is linear in the bytes, and a nesting deeper than the
    interpreter's recursion limit stops it with RecursionError, never a crash) and in
    nesting (`max_depth`, checked on the parsed value without recursion).
    """
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes, over the {max_bytes}-byte limit")
    # Time is linear in the bytes, but building millions of tiny arrays costs ~0.25 s per
    # MiB: cutecc's files hold one array or object per 100 bytes or more, so a file denser
    # than one per 32 (brackets inside strings counted too) is refused before parsing.
    containers = data.count(b"[") + data.count(b"{")
    if containers > MAX_CONTAINERS_FREE + len(data) // BYTES_PER_CONTAINER:
        raise ValueError(f"{containers} arrays and objects in {len(data)} bytes: not a file cutecc "
                         f"writes (at most {MAX_CONTAINERS_FREE} plus one per {BYTES_PER_CONTAINER} bytes)")
    paused = gc.isenabled()  # a JSON value holds no cycle: collections while it is built
    gc.disable()  # (a 4 MB planning cache: ~40 of them) walk what it makes and free nothing
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than the limit of {max_depth}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    finally:
        if paused:
            gc.enable()
    depth = _text_depth_over(data, max_depth)
    if depth is None:
        depth = _depth_over(doc, max_depth)
    if depth:
        raise ValueError(f"nested {depth} deep or more, over the limit of {max_depth}")
    return doc


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")  # as signed bytes: +1 in, -1 out


def _text_depth_over(data: bytes, max_depth: int) -> int | None:
    """`_depth_over` read from the text of a document `json.loads` took, in C-speed passes
    over the bytes rather than a walk of the objects (the 4.4 MB planning cache of the
    published manifest: ~15 ms against ~25-40 ms); None where it cannot tell (not UTF-8).
    In valid JSON a backslash only starts an escape inside a string, so with the escaped
    backslashes, then the escaped quotes, gone, every quote left delimits a string: the
    brackets between pairs of quotes are text, the others open and close the containers,
    and the deepest nesting is the largest running count of those."""
    if json.detect_encoding(data) != "utf-8":
        return None
    marks = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    parts = marks.split(b'"')
    if len(parts) % 2 == 0:
        return None  # an odd number of delimiters: not JSON as read above
    steps = array.array("b", b"".join(parts[::2]).translate(_STEPS))
    return max_depth + 1 if max(itertools.accumulate(steps), default=0) > max_depth else 0


def _depth_over(doc: Any, max_depth: int) -> int:
    """The first nesting depth past `max_depth` found in `doc` (0 when none): a walk with
    an explicit stack, stopping at the first container too deep."""
    stack = [(doc, 1)] if isinstance(doc, (list, dict)) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return depth
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
    return 0


def is_key(text: object) -> TypeGuard[str]:
    """Whether `text` is a cache key: 64 lowercase hex digits, nothing else."""
    return isinstance(text, str) and KEY_RE.fullmatch(text) is not None


def compute_key(inputs: dict[str, Any]) -> str:
    """The SHA-256 of the key inputs' canonical JSON (sorted keys, no spaces, ASCII)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_kernel_name(text: object) -> TypeGuard[str]:
    """Whether `text` can name a kernel: an attribute of the loaded kernel set, a directory
    of the index (`cutecc.names.kernel_name_problem`)."""
    return kernel_name_problem(text) is None


def runtime_soname(runtime_key: str) -> str:
    """A runtime library's file name and DT_SONAME: unique per key (glibc binds a kernel
    library's DT_NEEDED to an already loaded library of that soname)."""
    return f"libcutecc_rt_{runtime_key[:16]}.so"


def label(kernel: object, variant: object, arch: object, platform: str = BUILD_PLATFORM) -> str:
    """`kernel[variant]@arch`, how every command names one artifact; with `/platform`
    after it for host code of another platform than the build's (`cutecc.platforms`)."""
    return f"{kernel}[{variant}]@{arch}{platforms.suffix(platform)}"


def platform_of(meta: Mapping[str, Any]) -> str:
    """The host platform an entry's library is for: its metadata's `platform` (entries
    built before platforms existed have none: they are the build platform's)."""
    p = meta.get("platform", BUILD_PLATFORM)
    return p if isinstance(p, str) else repr(p)


def label_of(meta: Mapping[str, Any]) -> str:
    """The label of an entry from its metadata (damaged fields print as they are)."""
    return label(meta.get("kernel"), meta.get("variant"), meta.get("arch"), platform_of(meta))


@dataclass(frozen=True)
class Recorded:
    """What a meta.json's object says of itself, unchecked: each field as recorded (a
    damaged one as it is, None when absent; a container of the wrong type as empty). For
    the readers that name, size, sort or compare entries whose metadata may fail the
    checks (listings, removals, refusals, the trust check before the checks); whatever is
    acted on is read from the checked record (`cutecc.entry.meta.EntryMeta`) instead."""

    format: object
    kernel: object
    variant: object
    arch: object
    platform: str  # `platform_of`
    toolchain: Mapping[str, Any]
    library: object  # the file name of its library
    backward: str | None
    built_at: object
    files: Mapping[str, Any]  # its file records by name, as recorded
    size: int  # the bytes its file records sum to (a damaged record counts 0)
    label: str  # `label_of`
    runtime: str | None  # the key of its runtime library, when well recorded (`runtime_record`)
    key_inputs: Mapping[str, Any] | None
    call: Mapping[str, Any]  # `call_keywords`

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> Recorded:
        files, backward, inputs = meta.get("files"), meta.get("backward"), meta.get("key_inputs")
        recs, tc = files if isinstance(files, dict) else {}, meta.get("toolchain")
        size = sum(r["size"] for r in recs.values()
                   if isinstance(r, dict) and type(r.get("size")) is int and r["size"] > 0)
        rt = runtime_record(meta)
        return cls(meta.get("format"), meta.get("kernel"), meta.get("variant"), meta.get("arch"),
                   platform_of(meta), tc if isinstance(tc, dict) else {}, meta.get("library"),
                   backward if isinstance(backward, str) else None,
                   meta.get("built_at"), recs, size, label_of(meta), rt["key"] if rt else None,
                   inputs if isinstance(inputs, dict) else None, call_keywords(meta))


def is_file_name(name: object) -> bool:
    """Whether `name` may name a file inside an entry (no path, no dot-file, not reserved)."""
    return (isinstance(name, str) and _FILE_NAME.fullmatch(name) is not None
            and name not in RESERVED_FILES)


def file_record(path: Path) -> dict[str, Any]:
    """`{"sha256": ..., "size": ...}` of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


def library_record(meta: dict[str, Any]) -> tuple[str, str, int] | None:
    """(file name, SHA-256, size) of the entry's library, or None when not recorded."""
    lib, files = meta.get("library"), meta.get("files")
    rec = files.get(lib) if isinstance(files, dict) and isinstance(lib, str) else None
    if not (isinstance(lib, str) and isinstance(rec, dict) and isinstance(rec.get("sha256"), str)
            and type(rec.get("size")) is int):
        return None
    return lib, rec["sha256"], rec["size"]


@dataclass(frozen=True)
class ArtifactRec:
    """What the DSL compiled for an entry, as its build recorded it (meta.json's `artifact`):
    the exported file handed to the linker (`file`: an object, or LLVM IR for another
    platform), its SHA-256 and size, and the SHA-256 of the device code (the cubins) in it
    when it embeds any. A build output like the library's hash: no key input, never read
    by the runtime; `cutecc verify --deep` compiles the entry again and compares."""

    file: str
    sha256: str
    size: int
    device_sha256: str | None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "size": self.size,
                "device_sha256": self.device_sha256}


def artifact_of(meta: Mapping[str, Any]) -> ArtifactRec | None:
    """The entry's artifact digest (`ArtifactRec`), or None when it has none (built before
    cutecc recorded it) or a malformed one."""
    rec = meta.get("artifact")
    if not (isinstance(rec, dict) and set(rec) == {"file", "sha256", "size", "device_sha256"}
            and is_file_name(rec["file"]) and is_key(rec["sha256"]) and type(rec["size"]) is int
            and rec["size"] >= 0 and (rec["device_sha256"] is None or is_key(rec["device_sha256"]))):
        return None
    return ArtifactRec(rec["file"], rec["sha256"], rec["size"], rec["device_sha256"])


def artifact_malformed(meta: Mapping[str, Any]) -> bool:
    """Whether the entry records an artifact digest that is not well formed (`artifact_of`
    reads it as None, like none at all)."""
    return "artifact" in meta and artifact_of(meta) is None


_PTX_ISA = re.compile(r"[1-9]\d?\.\d{1,2}")


def ptx_isa_of(meta: Mapping[str, Any]) -> str | None:
    """The PTX ISA a build recorded for its `compute_` entry ("9.4"), or None when it
    recorded none (machine code, an entry built before cutecc recorded it) or a malformed one."""
    isa = meta.get("ptx_isa")
    return isa if isinstance(isa, str) and _PTX_ISA.fullmatch(isa) else None


def contract_digest(args: Any) -> str:
    """SHA-256 of a contract's canonical JSON (the `args` of meta.json)."""
    blob = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def runtime_record(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The entry's record of its runtime library (`key`, `library`, `sha256`, `size`),
    or None when absent or malformed."""
    rec = meta.get("runtime")
    if not (isinstance(rec, dict) and set(rec) == {"key", "library", "sha256", "size"}
            and is_key(rec["key"]) and rec["library"] == runtime_soname(rec["key"])
            and is_key(rec["sha256"]) and type(rec["size"]) is int
            and 0 <= rec["size"] <= MAX_LIBRARY_BYTES):
        return None
    return rec


def acted_on(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What the runtime acts on besides the key: the library's file record, the exported
    symbol, the backward pairing, the contract's digest and the runtime library's SHA-256
    (None if the library is not recorded). A lock line pins exactly these."""
    rec = library_record(meta)
    if rec is None:
        return None
    backward = meta.get("backward")
    runtime = runtime_record(meta)
    return {"library": rec[0], "sha256": rec[1], "size": rec[2],
            "symbol": meta.get("symbol") if isinstance(meta.get("symbol"), str) else None,
            "backward": backward if isinstance(backward, str) else None,
            "contract": contract_digest(meta.get("args")),
            "runtime": runtime["sha256"] if runtime else None}


def meta_stamp(st: Any) -> list[int]:
    """What changes whenever a meta.json is written or replaced (its size, inode, and
    ctime, which no user can set back): the stamp an index record keeps of it."""
    return [st.st_size, st.st_ino, st.st_ctime_ns]


def _records_problem(meta: dict[str, Any]) -> str | None:
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "no file records"
    for name, rec in files.items():
        if not is_file_name(name):
            return f"bad file name {name!r}"
        if not (isinstance(rec, dict) and type(rec.get("size")) is int
                and 0 <= rec["size"] <= MAX_LIBRARY_BYTES and isinstance(rec.get("sha256"), str)):
            return f"bad record for {name!r} (a size over {MAX_LIBRARY_BYTES} bytes is not a library's)"
    if library_record(meta) is None:
        return f"library {meta.get('library')!r} is not among the recorded files"
    return None


def _key_problem(meta: dict[str, Any], key: str, fmt: int, what: str) -> str | None:
    if meta.get("format") != fmt:
        return f"{what} format {meta.get('format')!r}, this cutecc reads {fmt}"
    if meta.get("key") != key:
        return f"records key {str(meta.get('key'))[:16]}.., its directory is {key[:16]}.."
    inputs = meta.get("key_inputs")
    if not isinstance(inputs, dict):
        return "no key_inputs"
    try:
        digest = compute_key(inputs)
    except (TypeError, ValueError):
        digest = None
    if digest != key:
        return "key_inputs do not hash to the entry's key (damaged metadata)"
    return None


def call_keywords(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The call keywords that reach an entry (`causal=True`), read from its key inputs
    (so they are as trusted as the key itself); {} when it has none."""
    inputs = meta.get("key_inputs")
    call = inputs.get("call", {}) if isinstance(inputs, dict) else {}
    return call if isinstance(call, dict) else {}


def meta_problem(meta: Any, key: str) -> str | None:
    """Why `meta` (an entry's parsed meta.json) cannot be trusted as the entry for `key`.

    The key is the SHA-256 of `key_inputs`, so recomputing it checks those inputs, and the
    fields the runtime acts on (`kernel`, the contract `args`, `arch`, `entry`,
    `toolchain`) must equal their copies there: a damaged contract would otherwise run a
    verified library with the wrong shapes or dtypes. The file records must be well
    formed; whether the files match them is for the reader to check by hashing.
    """
    if not isinstance(meta, dict):
        return "meta.json is not an object"
    why = _key_problem(meta, key, ENTRY_FORMAT, "entry")
    if why:
        return why
    inputs = meta["key_inputs"]
    for keyed in _KEYED_FIELDS:
        if keyed == "kernel" and keyed not in inputs:
            continue  # keyed before the kernel's name was a key input
        if meta.get(keyed) != inputs.get(keyed):
            return f"{keyed} differs from key_inputs.{keyed} (damaged metadata)"
    for name in ("kernel", "variant", "symbol"):
        if not isinstance(meta.get(name), str) or not meta[name]:
            return f"{name} is not a string (damaged metadata)"
    tc = inputs.get("toolchain")
    keyed_platform = tc.get("platform", BUILD_PLATFORM) if isinstance(tc, dict) else None
    if platform_of(meta) != keyed_platform:
        return (f"platform {meta.get('platform')!r} differs from the key's {keyed_platform!r} "
                "(damaged metadata)")
    if not is_kernel_name(meta["kernel"]):
        return f"{kernel_name_problem(meta['kernel'])} (damaged metadata)"
    for name in call_keywords(meta):
        why = call_name_problem(name)
        if why:
            return f"key_inputs.call: {why}; refusing it"
    why = _records_problem(meta)
    if why:
        return why
    runtime = runtime_record(meta)
    toolchain = inputs.get("toolchain")
    if runtime is None:
        return "no runtime library record (damaged metadata)"
    if not isinstance(toolchain, dict) or toolchain.get("runtime") != runtime["key"]:
        return "runtime differs from key_inputs.toolchain.runtime (damaged metadata)"
    return None


def runtime_meta_problem(meta: Any, key: str) -> str | None:
    """Why `meta` (a runtime entry's parsed meta.json) cannot be trusted as the runtime
    library of key `key`: the same key and record checks as an entry's, and the library
    must carry the soname of its key."""
    if not isinstance(meta, dict):
        return "meta.json is not an object"
    why = _key_problem(meta, key, RUNTIME_ENTRY_FORMAT, "runtime")
    if why:
        return why
    if meta.get("library") != runtime_soname(key):
        return f"library {meta.get('library')!r} is not {runtime_soname(key)} (damaged metadata)"
    return _records_problem(meta)


def bad_pin_field(d: dict[str, Any], names: list[str]) -> str | None:
    """The first of `names` whose value in `d` is not what a pinned line (a lock line, a
    tuning line) may hold: `size` an int in [0, MAX_LIBRARY_BYTES], `backward` None or a string, every
    other field a non-empty string of at most 4096 characters. None when all are fine."""
    for name in names:
        v = d[name]
        ok = (type(v) is int and 0 <= v <= MAX_LIBRARY_BYTES if name == "size"
              else v is None or isinstance(v, str) if name == "backward"
              else isinstance(v, str) and 0 < len(v) <= 4096)
        if not ok:
            return name
    return None
