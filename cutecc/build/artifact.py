"""The digest of what the DSL traced and compiled for one entry, and how two of them differ.

A build records it in the entry's meta.json (`artifact`, read as `cutecc.entry.rules.ArtifactRec`)
beside the library's hash: the SHA-256 of the file the compile exported and handed to the
linker (the object, whose embedded cubin is the device code; LLVM IR for another host
platform), and of the device code alone. That file is a function of the key's inputs
alone (the same bytes in every process and directory, `cutecc.build.compiler`), and unlike the
library it carries nothing the link adds (the key label, the build id), so a second
compile of the same key that gives another digest means the key missed an input the
trace read, a source changed during the compile, or the compile is not deterministic.
`cutecc verify --deep` compiles each entry again and compares (`difference`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cutecc import cubin
from cutecc.entry.rules import MAX_LIBRARY_BYTES, ArtifactRec


def digest(path: Path) -> ArtifactRec:
    """The digest of the exported file at `path` (bounded like a library: an export past
    `MAX_LIBRARY_BYTES` is no kernel's)."""
    with open(path, "rb") as f:
        data = f.read(MAX_LIBRARY_BYTES + 1)
    if len(data) > MAX_LIBRARY_BYTES:
        raise ValueError(f"{path}: the exported file is over {MAX_LIBRARY_BYTES} bytes")
    images = cubin.cubins(data)
    device = None
    if images:  # each image's hash, in order: the device code, whatever surrounds it
        h = hashlib.sha256()
        for image in images:
            h.update(hashlib.sha256(image).digest())
        device = h.hexdigest()
    return ArtifactRec(path.name, hashlib.sha256(data).hexdigest(), len(data), device)


def difference(recorded: ArtifactRec, again: ArtifactRec) -> str | None:
    """What differs between an entry's recorded digest and a second compile's (None: the
    same), in one line: which file, its hashes and sizes, and whether the device code
    (the cubins) or only the host code differs."""
    if recorded == again:
        return None
    if recorded.file != again.file:
        return f"the compile exported {again.file}, the entry records {recorded.file}"
    what = f"{recorded.file} sha256 {again.sha256[:16]}.. ({again.size} bytes), recorded " \
           f"{recorded.sha256[:16]}.. ({recorded.size} bytes)"
    if recorded.device_sha256 is None or again.device_sha256 is None:
        where = "" if recorded.device_sha256 == again.device_sha256 else "; device code found in one only"
    elif recorded.device_sha256 != again.device_sha256:
        where = "; its device code (cubin) differs"
    else:
        where = "; its device code is the same, its host code differs"
    return what + where
