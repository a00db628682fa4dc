"""Build workers die with their build, and Ctrl-C is one line and exit 130.

Seen: killing the main `cutecc build` process leaked its workers: they go on
compiling and publishing, then stay resident (~280 MB each). Workers must die with their
build (a parent-death signal or a watchdog pipe), and Ctrl-C must print one line and
exit 130 with no worker tracebacks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import resident_services, stop_resident_services

from .conftest import CLI, REPO_MANIFEST, child_env, children_of, proc_alive, proc_cmdline, wait_for

pytestmark = pytest.mark.usefixtures("dsl")
SERVICE = "cutecc.build.executors.service_process"  # in a compile service's command line


@pytest.fixture(params=["per-build", "resident"])
def service_kind(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """Workers forked from the build's own compile service (idle 0), or from a resident one
    (cutecc/build/executors/service.py; its $XDG_RUNTIME_DIR, short for the socket's path)."""
    if request.param == "per-build":
        yield None
        return
    run = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    try:
        yield run
    finally:
        stop_resident_services(run)
        shutil.rmtree(run, ignore_errors=True)


def _sigint_as_at_a_terminal() -> None:
    """SIGINT's default action in the build, as a shell at a terminal gives it: a test run
    started in the background of a non-interactive shell inherits SIGINT ignored, and Python
    then never installs its handler, so Ctrl-C would be tested against a build that cannot
    see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_build(cache: Path, kept_in: Path | None) -> tuple[subprocess.Popen, list[int]]:
    """`cutecc build` of the example manifest into a fresh cache, in its own session (with
    `kept_in`, its workers forked by a resident service whose $XDG_RUNTIME_DIR it is);
    returns it and its worker pids once at least one worker has started."""
    extra = {"CUTECC_SERVICE_IDLE": "60", "XDG_RUNTIME_DIR": str(kept_in)} if kept_in else \
        {"CUTECC_SERVICE_IDLE": "0"}
    p = subprocess.Popen([*CLI, "build", str(REPO_MANIFEST), "--cache-dir", str(cache), "--no-lock",
                          "-j", "2"], env=child_env(extra), start_new_session=True,
                         preexec_fn=_sigint_as_at_a_terminal,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def workers() -> list[int]:
        """The build's worker processes: its compile service and the workers it forked (its
        children, not the build's; spawned workers where it could not), or the resident
        service's children."""
        if kept_in:
            return [c for r in resident_services(kept_in) for c in children_of(r)]
        out, todo = [], [p.pid]
        while todo:
            for c in children_of(todo.pop()):
                if "spawn_main" in proc_cmdline(c) or SERVICE in proc_cmdline(c):
                    out.append(c)
                    todo.append(c)
        return out

    assert wait_for(lambda: len(workers()) >= 1 or p.poll() is not None, 60), "no worker started"
    assert p.poll() is None, "the build ended before a worker was seen"
    wait_for(lambda: len(workers()) >= (2 if kept_in else 3), 10)  # the per-build service, and two workers
    return p, workers()


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if proc_alive(pid) and ("spawn_main" in proc_cmdline(pid) or SERVICE in proc_cmdline(pid)):
            os.kill(pid, signal.SIGKILL)


def test_workers_die_when_the_build_is_killed(tmp_path: Path, service_kind: Path | None) -> None:
    """`kill -9` of the main build process; within 3 s none of its compile
    workers is still running, and none publishes afterwards."""
    cache = tmp_path / "cache"
    p, workers = _start_build(cache, service_kind)
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        published_before = len(list(cache.glob("entries/*/*")))
        wait_for(lambda: not any(proc_alive(w) for w in workers), 3.0)
        survivors = [w for w in workers if proc_alive(w)]
        if survivors:  # say what they do (this costs 12 s only when the test fails)
            wait_for(lambda: not any(proc_alive(w) for w in survivors), 12.0)
        published_after = len(list(cache.glob("entries/*/*")))
    finally:
        _kill_leftovers(workers)
    assert not survivors, (
        f"{len(survivors)} of {len(workers)} workers outlived the killed build (pids {survivors}); "
        f"entries published after the kill: {published_after - published_before}")


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path: Path, service_kind: Path | None) -> None:
    """SIGINT to the build's process group (what Ctrl-C does) stops it with exit
    130 and at most one line on stderr, no worker tracebacks, no worker left."""
    p, workers = _start_build(tmp_path / "cache", service_kind)
    try:
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
        wait_for(lambda: not any(proc_alive(w) for w in workers), 3.0)
        survivors = [w for w in workers if proc_alive(w)]
    finally:
        _kill_leftovers(workers)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "Traceback" not in err, f"exit {p.returncode}, {err.count('Traceback')} tracebacks:\n{err[-2500:]}"
    assert p.returncode == 130, f"exit {p.returncode}: {err[-1000:]}"
    assert len(err.strip().splitlines()) <= 1, err
    assert not survivors, survivors
