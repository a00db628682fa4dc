"""A build whose Ray cluster dies still prints one whole JSON report.

Seen: when the raylet died mid-build, `build --json` printed Ray's coloured
"Raylet is terminated" text on stdout and exited 1 with no report at all. The report must
stay whole: stdout is exactly one JSON document, entries built before the failure stay
built, each entry the cluster failed is cutecc's own one-line error, and Ray's chatter
goes to stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY

from .conftest import descendants, write_hang_project
from .trust.conftest import proc_cmdline, wait_for

pytestmark = [pytest.mark.usefixtures("dsl")]


def test_a_raylet_killed_mid_build_leaves_one_whole_json_report(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    manifest = write_hang_project(tmp_path / "p")
    cache, marker = tmp_path / "c", tmp_path / "hang-started"
    p = subprocess.Popen([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir", str(cache),
                          "--executor", "ray", "-j", "2", "--no-lock", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "HANG_MARKER": str(marker)}, start_new_session=True)
    try:
        # the hanging compile runs and both others are published: then the raylet dies
        assert wait_for(lambda: marker.exists() and len(list(cache.glob("entries/*/*"))) == 2
                        or p.poll() is not None, 240, 0.2), "the build never got going"
        assert p.poll() is None, p.communicate()
        raylets = [c for c in descendants(p.pid) if proc_cmdline(c).split(" ")[0].endswith("/raylet")]
        assert raylets, [proc_cmdline(c)[:80] for c in descendants(p.pid)]
        t0 = time.monotonic()
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert "Traceback" not in out + err, err[-3000:]
    try:
        rep = json.loads(out)
    except ValueError:
        pytest.fail(f"stdout is not one JSON report (exit {p.returncode}):\n{out[:1500]}")
    assert p.returncode == 1 and time.monotonic() - t0 < 120
    by = {e["kernel"] + e["variant"]: e for e in rep["entries"]}
    assert by["scalethreads=64"]["status"] == by["scalethreads=128"]["status"] == "built", rep
    failed = by["hangdefault"]
    assert failed["status"] == "failed" and "Ray" in failed["error"] and "\n" not in failed["error"], failed
    assert (rep["built"], rep["failed"]) == (2, 1)
