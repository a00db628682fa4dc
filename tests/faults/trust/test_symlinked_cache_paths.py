"""The ownership check holds through symlinks: every directory on the way to a library is
checked, and the library is opened through the path that was checked.

Seen: the runtime checked the *resolved* path while it opens the library through the unresolved
one, and never looks at the directory holding a symlink on the way. A cache (or its
entries/) reached through a symlink that others can replace passes; flipping that symlink
between the check and the open got root to dlopen another user's library.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import STORE_FORMAT
from cutecc.store.index_record import IndexRecord

from .conftest import ARCH, LIB, META, Cache, as_user, chown_tree, compute_key, marker_runs, out, py, record

pytestmark = pytest.mark.usefixtures("dsl")

PROBE = r'''
import json, sys
import cutecc
from cutecc.errors import CuteccError
try:
    ks = cutecc.load(sys.argv[1], arch=sys.argv[2])
    names = ks.register_all()
    print(json.dumps({"state": "registered", "n": len(names)}))
except CuteccError as e:
    print(json.dumps({"state": "refused", "message": str(e)}))
'''


def probe(root: Path) -> dict:
    r = py(PROBE, root, ARCH)
    assert r.returncode == 0 and "Traceback" not in r.stderr, out(r)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_cache_symlinked_from_a_world_writable_directory_is_refused(cache: Cache,
                                                                      tmp_path: Path) -> None:
    """The cache path is `W/cache`, a symlink in a directory anyone can write
    (mode 0777, not sticky): anyone can point it elsewhere, so nothing is loaded through it."""
    w = tmp_path / "shared"
    w.mkdir()
    os.chmod(w, 0o777)
    (w / "cache").symlink_to(cache.root, target_is_directory=True)
    got = probe(w / "cache")
    assert got["state"] == "refused", f"loaded {got.get('n')} libraries through {w}/cache"


def test_an_entries_dir_symlinked_from_a_world_writable_cache_root_is_refused(cache: Cache,
                                                                             tmp_path: Path) -> None:
    """The cache root is writable by anyone and its entries/ is a symlink to a
    safe place: the check looks only at the resolved path, which is safe, and passes."""
    safe = tmp_path / "safe"
    safe.mkdir()
    shutil.move(str(cache.root / "entries"), safe / "entries")
    (cache.root / "entries").symlink_to(safe / "entries", target_is_directory=True)
    os.chmod(cache.root, 0o777)
    got = probe(cache.root)
    assert got["state"] == "refused", f"loaded {got.get('n')} libraries through a replaceable entries/"


RACE = r'''
import json, os, sys, time
import cutecc
from cutecc.errors import CuteccError
root, arch, n, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
outcome = {"tries": 0, "registered": 0, "refused": 0, "load_retries": 0}
for i in range(n):
    if os.path.exists(os.environ["CUTECC_TEST_MARKER"]):
        break  # his library ran: no need to go on
    outcome["tries"] += 1
    name = f"evil{i % kinds}"  # a refused kernel is not registered, so it can be tried again
    deadline = time.monotonic() + 20
    while True:  # load while the link points at the attacker's cache (that is when he flips)
        try:
            ks = cutecc.load(root, arch=arch, kernels=[name])
            break
        except (CuteccError, OSError):  # the link flipped mid-scan (today: an OSError)
            outcome["load_retries"] += 1
            if time.monotonic() > deadline:
                raise
    try:
        ks.register_all()
        outcome["registered"] += 1
    except (CuteccError, OSError) as e:
        outcome["refused"] += 1
        why = str(e).split(": ")[-1][:60] if "owned by" not in str(e) else "owned by"
        outcome.setdefault("why", {}).setdefault(why, 0)
        outcome["why"][why] += 1
print(json.dumps(outcome))
'''

FLIPPER = r'''
import os, sys
link, a, b, stop = sys.argv[1:5]
tmp = f"{link}.{os.getpid()}"
i = 0
while not os.path.exists(stop):
    for _ in range(200):
        os.symlink(a if i % 2 else b, tmp)
        os.replace(tmp, link)
        i += 1
'''


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory a second user can reach (pytest's tmp_path is 0700), on a tmpfs when
    there is one (/dev/shm): a link flips there in about 9 us, against 180 us on this disk."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    d = Path(tempfile.mkdtemp(prefix="trust-", dir=base))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.needs_root
def test_flipping_the_cache_symlink_never_gets_root_to_run_the_other_users_library(
        cache: Cache, other_user, evil_so: bytes, shared_tmp: Path) -> None:
    """The race: root loads `W/cache` (W world-writable); the other user flips
    that link between his own cache (self-consistent entries of his ELF) and root's. The
    check must be made on what is opened: 0 of 1,000 registrations may run his library
    (today about 1 in 60 does, more on an idle host: the check resolves to root's cache,
    the open follows his; the loop stops at the first, so today's run takes 1-5 s)."""
    n, kinds = 1000, 10
    theirs = shared_tmp / "theirs"
    template = cache.meta(cache.key("axpy"))
    for i in range(kinds):
        meta = copy.deepcopy(template)
        meta["key_inputs"]["kernel"] = meta["kernel"] = f"evil{i}"
        key = compute_key(meta["key_inputs"])
        meta.update(key=key, files={LIB: record(evil_so)})
        d = theirs / "entries" / key[:2] / key
        d.mkdir(parents=True)
        (d / LIB).write_bytes(evil_so)
        (d / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
        (theirs / "by-kernel" / meta["kernel"]).mkdir(parents=True)  # indexed, as published
        rec = IndexRecord.of_meta(key, EntryMeta.parse(meta, key))
        (theirs / "by-kernel" / meta["kernel"] / key).write_bytes(rec.dumps())
    (theirs / "format").write_text(f"{STORE_FORMAT}\n")
    chown_tree(theirs, other_user.pw_uid, other_user.pw_gid)
    w = shared_tmp / "w"
    w.mkdir()
    os.chmod(w, 0o777)
    link = w / "cache"
    link.symlink_to(theirs, target_is_directory=True)
    stop = shared_tmp / "stop"
    flipper = subprocess.Popen([*as_user(other_user), "/usr/bin/python3", "-c", FLIPPER,
                                str(link), str(theirs), str(cache.root), str(stop)])
    marker = shared_tmp / "ran"
    try:
        time.sleep(0.2)
        assert flipper.poll() is None, "the flipper did not start"
        r = py(RACE, link, ARCH, str(n), str(kinds), env={"CUTECC_TEST_MARKER": str(marker)}, timeout=600)
    finally:
        stop.write_text("")
        flipper.wait(timeout=30)
    assert r.returncode == 0, out(r)
    outcome = json.loads(r.stdout.strip().splitlines()[-1])
    assert marker_runs(marker) == 0, (
        f"root ran the other user's library (tries: {outcome})")
