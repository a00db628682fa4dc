"""Whether an entry can run here, read from its metadata: its entry and artifact formats,
the tvm-ffi series it was built against, its arch and host platform, and (a `compute_`
entry) whether this CUDA driver can JIT-compile its PTX. `cutecc.load` sets aside what
fails with the reason, which a call of that kernel reports.
"""

from __future__ import annotations

import contextlib
import importlib.metadata

from cutecc.archs import is_ptx, ptx_driver_problem, runs_on
from cutecc.entry.rules import ARTIFACT_FORMAT, ENTRY_FORMAT, Recorded
from cutecc.errors import CuteccError
from cutecc.platforms import host_platform
from cutecc.store.view import Entry


def tvm_ffi_series() -> str:
    try:
        v = importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        return "absent"
    return ".".join(v.split(".")[:2])


def record_problem(e: Entry) -> str | None:
    """Why the entry's metadata cannot be trusted as its key's (`EntryMeta.parse`), or None
    (its typed record, `e.meta`, is then there to read)."""
    try:
        e.meta  # noqa: B018  (parsed once, kept on the entry)
    except ValueError as err:
        return str(err)
    return None


def ptx_problem(e: Entry, driver: tuple[int, int] | None) -> str | None:
    """Why this process's CUDA driver cannot JIT-compile a `compute_` entry's PTX (its PTX
    ISA is newer than the driver's: `archs.ptx_driver_problem`), or None. The ISA is the
    one its build recorded (`ptx_isa`); an entry built before cutecc recorded it has it read
    from its library's PTX (`.version`), the library checked against its SHA-256 first;
    one whose library cannot be read so is judged unknown, and offered (the driver decides).
    Call after `record_problem` (the typed record is there)."""
    if driver is None or not is_ptx(str(e.recorded.arch)):
        return None
    rec = e.meta
    isa = rec.ptx_isa
    if isa is None:
        from cutecc.cubin import ptx_isa
        from cutecc.runtime.library import verified_bytes

        lib = rec.library
        with contextlib.suppress(CuteccError):  # unreadable, untrusted or altered: unknown
            isa = ptx_isa(verified_bytes(e.path / lib.name, lib.sha256, lib.size, rec.arch))
    return ptx_driver_problem(rec.arch, isa, driver)


def why_unusable(e: Entry, target: str, series: str) -> str | None:
    """Why the entry cannot run here: what it records (`run_problem`, first: an older
    entry says so even where its metadata fails the checks), then metadata that cannot be
    trusted (`record_problem`); None when it can (`e.meta` is then there to read)."""
    return run_problem(e.recorded, target, series) or record_problem(e)


def run_problem(m: Recorded, target: str, series: str) -> str | None:
    """Why an entry's recorded (unchecked) metadata says it cannot run here: its entry or
    artifact format, the tvm-ffi series it was built against, its arch or its host
    platform; None when nothing does."""
    if m.format != ENTRY_FORMAT:
        return f"entry format {m.format!r}, this cutecc reads {ENTRY_FORMAT}"
    tc = m.toolchain
    if tc.get("cutecc_artifact_format") != str(ARTIFACT_FORMAT):
        return (f"artifact format {tc.get('cutecc_artifact_format')!r}, this cutecc runs "
                f"{ARTIFACT_FORMAT}; rebuild it")
    built_tvm = ".".join(str(tc.get("apache-tvm-ffi", "")).split(".")[:2])
    if built_tvm != series:
        return f"built against apache-tvm-ffi {built_tvm}, this runtime has {series}"
    arch = str(m.arch)
    if not runs_on(arch, target):
        return f"built for {arch}, cannot run on {target}"
    built_for, here = m.platform, host_platform()
    if built_for != here:
        return f"built for {built_for} hosts, this host is {here}"
    return None
