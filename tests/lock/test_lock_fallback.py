"""A lock line carries the kernel's fallback only when one is declared: a lock without one
reads and writes byte for byte as before (the committed locks included), one with it round
trips, and a malformed fallback field is refused naming its key path."""

from __future__ import annotations

import hashlib
import json

import pytest
from helpers import REPO

from cutecc.contract.fallbacks import ClosureFile, FallbackRef
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock

SHA = "ab" * 32


@pytest.mark.parametrize("path", ["kernels.lock", "examples/kernels.lock", "kernels.aarch64.lock"])
def test_the_committed_locks_read_and_write_byte_for_byte(path: str) -> None:
    data = (REPO / path).read_bytes()
    lock = Lock.loads(data, path)
    assert lock.dumps() == data
    # only the examples' FA4 forward and quack forwards declare one (examples/*_reference.py)
    assert {le.kernel for le in lock.entries if le.fallbacks} <= {"fa4_fwd", "quack_rmsnorm",
                                                                  "quack_cross_entropy"}


@pytest.mark.parametrize("path", ["examples/kernels.lock", "examples/kernels.aarch64.lock"])
def test_the_committed_locks_pin_each_fallbacks_closure(path: str) -> None:
    lock = Lock.loads((REPO / path).read_bytes(), path)
    refs = [ref for le in lock.entries for _, ref in le.fallbacks]
    assert refs and not any(ref.legacy for ref in refs)
    for ref in refs:
        for f in ref.files:
            assert hashlib.sha256((REPO / "examples" / f.path).read_bytes()).hexdigest() == f.sha256, f


def _with(field: object) -> bytes:
    doc = json.loads((REPO / "kernels.lock").read_bytes())
    doc["entries"][0]["fallback"] = field
    return json.dumps(doc).encode()


def test_a_closure_round_trips_and_a_legacy_line_reads_as_legacy() -> None:
    files = [ClosureFile("pkg", "pkg/__init__.py", SHA), ClosureFile("pkg.ref", "pkg/ref.py", "cd" * 32)]
    ref = FallbackRef.of("pkg.ref:attention", files)
    lock = Lock.loads(_with(ref.to_json()), "l")
    assert dict(lock.entries[0].fallbacks)["fallback"] == ref and not ref.legacy
    assert Lock.loads(lock.dumps(), "l") == lock
    assert FallbackRef.from_json({"ref": "pkg.ref:attention", "sha256": SHA}, "l", "f").legacy


def test_a_fallback_field_round_trips() -> None:
    lock = Lock.loads(_with({"ref": "pkg.ref:attention", "sha256": SHA}), "l")
    assert dict(lock.entries[0].fallbacks) == {"fallback": FallbackRef("pkg.ref:attention", SHA)}
    again = Lock.loads(lock.dumps(), "l")
    assert again == lock
    assert b'"fallback": {"ref": "pkg.ref:attention", "sha256": "' + SHA.encode() in lock.dumps()


@pytest.mark.parametrize(("field", "where"), [
    ("pkg.ref:attention", "entries[0].fallback"),
    ({"ref": "not a ref", "sha256": SHA}, "entries[0].fallback.ref"),
    ({"ref": "pkg.ref:attention", "sha256": "xyz"}, "entries[0].fallback.sha256"),
    ({"ref": "pkg.ref:attention", "sha256": SHA, "extra": 1}, "entries[0].fallback"),
    ({"ref": "pkg.ref:attention", "sha256": SHA, "files": [["pkg.ref", "pkg/ref.py", SHA]]},
     "entries[0].fallback.sha256"),  # not the closure's digest
    ({"ref": "pkg.ref:attention", "sha256": SHA, "files": [["pkg.ref", "../ref.py", SHA]]},
     "entries[0].fallback.files[0]"),  # a path not the module's
    ({"ref": "pkg.ref:attention", "sha256": SHA, "files": [["other", "other.py", SHA]]},
     "entries[0].fallback.files"),  # the module itself unpinned
    ({"ref": "pkg.ref:attention", "sha256": SHA, "files": []}, "entries[0].fallback.files"),
])
def test_a_malformed_fallback_field_is_refused(field: object, where: str) -> None:
    with pytest.raises(CuteccError) as e:
        Lock.loads(_with(field), "l")
    assert e.value.key_path == where
