"""The runtime reads at most what it verifies: it never allocates a size a record claims.

Seen: a meta.json recording 2 GiB over a 3 GiB sparse library peaked
at 2.3 GB of memory in `load` (a file larger than recorded was replaced by a buffer of the
recorded size, to fail the hash), and sizes up to 2^40-1 passed the checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import ARCH, LIB, PY, Cache, run_measured

pytestmark = pytest.mark.usefixtures("dsl")

GIB = 1 << 30
MIB = 1 << 20

LOAD = r'''
import sys, cutecc
from cutecc.errors import CuteccError
ks = cutecc.load(sys.argv[1], arch=sys.argv[2], kernels=["axpy"])
try:
    ks.register_all()
    print("REGISTERED", ks.problems)
except CuteccError as e:
    print("REFUSED", e)
'''


def _plant(cache: Cache, key: str, recorded: int, actual: int) -> None:
    """The entry's library as a sparse file of `actual` bytes, recorded as `recorded`."""
    lib = cache.entry(key) / LIB
    lib.unlink()
    with open(lib, "wb") as f:
        f.truncate(actual)
    meta = cache.meta(key)
    meta["files"][LIB]["size"] = recorded
    cache.write_meta(key, meta)


def _load(cache: Cache) -> tuple[str, int]:
    code, text, rss_kib = run_measured([PY, "-c", LOAD, str(cache.root), ARCH], timeout=300,
                                         cwd=Path("/"))  # (no project: not this checkout's lock)
    assert code == 0, text
    return text, rss_kib * 1024


@pytest.fixture
def baseline(cache: Cache) -> int:
    text, rss = _load(cache)
    assert "REGISTERED" in text or "REFUSED" in text, text
    return rss


def test_a_library_larger_than_recorded_is_refused_without_allocating_its_record(
        cache: Cache, baseline: int) -> None:
    _plant(cache, cache.key("axpy"), recorded=200 * MIB, actual=3 * GIB)
    text, rss = _load(cache)
    assert "larger than its recorded" in text, text
    assert rss < baseline + 64 * MIB, f"peak {rss / MIB:.0f} MiB, healthy load {baseline / MIB:.0f} MiB"


def test_a_record_past_the_library_cap_is_damaged_metadata_and_nothing_is_read(
        cache: Cache, baseline: int) -> None:
    _plant(cache, cache.key("axpy"), recorded=2 * GIB, actual=3 * GIB)
    text, rss = _load(cache)
    assert "bad record for 'kernel.so'" in text, text
    assert rss < baseline + 64 * MIB, f"peak {rss / MIB:.0f} MiB, healthy load {baseline / MIB:.0f} MiB"


def test_lock_and_tuning_pins_past_the_library_cap_are_refused(cache: Cache) -> None:
    from cutecc.errors import CuteccError
    from cutecc.lock.lockfile import read_lock

    doc = json.loads(cache.lock.read_text())
    doc["entries"][0]["size"] = (1 << 40) - 1
    cache.lock.write_text(json.dumps(doc))
    with pytest.raises(CuteccError, match=r"entries\[0\]\.size"):
        read_lock(cache.lock)
