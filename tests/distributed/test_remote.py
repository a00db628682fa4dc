"""The remote cache against a real S3-compatible server (SeaweedFS on 127.0.0.1):
publish, fetch on a second machine, races, a server that stops or hangs, damaged and
hostile objects, read-only mode, `cutecc fetch --lock` and the stats it all records."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import obstore
import pytest
from helpers import PY, opts, run_cli, write_toy_project

from cutecc.commands.build import Progress, build
from cutecc.commands.fetch import fetch
from cutecc.commands.stats import stats
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import read_lock
from cutecc.settings import BuildOptions
from cutecc.ship.remote import Remote, RemoteConfig, config, parse_url
from cutecc.store import Store

from .conftest import READER, read_only_identities


def _libraries(cache: Path) -> dict[str, bytes]:
    """key -> library bytes of every entry of a cache."""
    return {e.key: (e.path / e.doc["library"]).read_bytes() for e in Store(cache).entries()}


def _cfg(url: str, **kw: object) -> RemoteConfig:
    cfg = config(BuildOptions(remote=url))
    assert cfg is not None
    return RemoteConfig(cfg.url, cfg.bucket, cfg.prefix, **kw)  # type: ignore[arg-type]


def _seed(s3, url: str, cache: Path) -> None:
    """Upload every entry of `cache` to `url` (as a writing build's workers would)."""
    remote, store = Remote(_cfg(url, write=True)), Store(cache)
    for e in store.entries():
        assert remote.push(e, store) is True
    assert remote.down is None


# Configuration ----------------------------------------------------------------------


def test_urls_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_url("s3://my.bucket") == ("my.bucket", "")
    for bad in ("http://x/y", "s3://", "s3://B/x", "s3://b/../x", "bucket/x"):
        with pytest.raises(CuteccError) as e:
            parse_url(bad)
        assert e.value.exit_code == 2 and e.value.where == "--remote"
    monkeypatch.delenv("CUTECC_REMOTE", raising=False)
    monkeypatch.delenv("CUTECC_REMOTE_WRITE", raising=False)
    assert config(BuildOptions.from_environment()) is None
    monkeypatch.setenv("CUTECC_REMOTE", "s3://team-cache/kernels")
    monkeypatch.setenv("CUTECC_REMOTE_MAX_BLOB", "2M")
    cfg = config(BuildOptions.from_environment())
    assert cfg is not None and (cfg.bucket, cfg.prefix, cfg.write, cfg.max_blob) == (
        "team-cache", "kernels", False, 2 << 20)
    monkeypatch.setenv("CUTECC_REMOTE_WRITE", "1")
    assert config(BuildOptions.from_environment()).write  # type: ignore[union-attr]
    assert config(BuildOptions.from_environment(remote="s3://other/p")).url == "s3://other/p"  # type: ignore[union-attr]
    assert config(BuildOptions(), default="s3://manifest/p").url == "s3://manifest/p"  # type: ignore[union-attr]


def test_import_cutecc_and_a_plain_build_import_neither_obstore_nor_ray(toy_cache, tmp_path: Path) -> None:
    copy = toy_cache.copy(tmp_path)
    code = ("import sys, cutecc; from cutecc.commands.build import build; "
            "from cutecc.settings import BuildOptions; "
            f"r = build({str(copy.manifest)!r}, "
            f"BuildOptions.from_environment(cache_dir={str(copy.cache)!r})); "
            "print(r.count('cached'), "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('obstore', 'ray')))")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "[]"]


# Publish, fetch, stats ----------------------------------------------------------------


@pytest.mark.usefixtures("dsl")
def test_a_build_publishes_and_a_second_machine_fetches_everything(s3, prefix: str, tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "proj")
    first = build(manifest, opts(cache_dir=tmp_path / "ci", remote=prefix, remote_write=True), lock=False)
    assert first.ok and first.count("built") == 2, first.warnings()
    assert first.remote is not None and first.remote.uploaded == 2 and first.warnings() == []
    objs = s3.objects(parse_url(prefix)[1])
    keys = sorted(_libraries(tmp_path / "ci"))
    assert [o for o in objs if o.startswith("v1/entries/")] == [f"v1/entries/{k}.json" for k in keys]
    [rt] = list(Store(tmp_path / "ci").runtimes())  # the runtime library, once, before its entries
    assert [o for o in objs if o.startswith("v1/runtimes/")] == [f"v1/runtimes/{rt.key}.json"]
    assert len([o for o in objs if o.startswith("v1/blobs/")]) == 3
    # the entry on the remote is the local meta.json, byte for byte
    key = keys[0]
    raw = bytes(obstore.get(s3.store(parse_url(prefix)[1]), f"v1/entries/{key}.json").bytes())
    assert raw == (Store(tmp_path / "ci").layout.entry(key) / "meta.json").read_bytes()

    # a second machine: fresh local cache, the CLI, read-only remote
    r = run_cli("build", str(manifest), "--cache-dir", str(tmp_path / "dev"), "--remote", prefix,
                "--no-lock", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert (rep["built"], rep["cached"], rep["failed"], rep["fetched"]) == (0, 2, 0, 2)
    assert rep["remote"]["fetched"] == 2 and rep["remote"]["bytes_down"] > 500_000  # the runtime, once
    assert [e.key for e in Store(tmp_path / "dev").runtimes()] == [rt.key]  # fetched, not linked
    assert rep["runtimes_built"] == []
    assert all(e["status"] == "cached" and e["fetched"] for e in rep["entries"])
    assert _libraries(tmp_path / "dev") == _libraries(tmp_path / "ci")
    verify = run_cli("verify", "--cache-dir", str(tmp_path / "dev"))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    s = stats(tmp_path / "dev")
    assert (s["hits"], s["remote_hits"], s["misses"], s["hit_rate"]) == (0, 2, 0, 1.0)
    assert s["remote_bytes_down"] == rep["remote"]["bytes_down"] and s["remote_seconds_saved"] > 0
    assert "remote hits    2 of 2 looked up" in "\n".join(s.lines())
    s = stats(tmp_path / "ci")
    assert (s["misses"], s["remote_misses"], s["remote_uploads"]) == (2, 2, 2)
    assert s["remote_bytes_up"] > 500_000
    # run again: all local hits, nothing asked of the remote
    again = build(manifest, opts(cache_dir=tmp_path / "dev", remote=prefix), lock=False)
    assert again.count("cached") == 2 and again.remote is not None and again.remote.traffic.requests == 0


@pytest.mark.usefixtures("dsl")
def test_read_only_mode_writes_nothing_to_the_remote(s3, prefix: str, tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "proj")
    rep = build(manifest, opts(cache_dir=tmp_path / "c", remote=prefix), lock=False)
    assert rep.ok and rep.count("built") == 2 and rep.remote is not None
    assert rep.remote.absent == 2 and rep.remote.uploaded == 0 and rep.remote.traffic.bytes_up == 0
    assert s3.objects(parse_url(prefix)[1]) == []
    assert "read-only" in "\n".join(rep.lines())


@pytest.mark.usefixtures("dsl")
def test_the_manifests_remote_is_used_read_only_and_a_flag_overrides_it(
        s3, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_REMOTE", raising=False)
    monkeypatch.delenv("CUTECC_REMOTE_WRITE", raising=False)
    manifest = write_toy_project(tmp_path / "proj")
    manifest.write_text(manifest.read_text() + f'\n[build]\nremote = "{prefix}"\n')
    ci = build(manifest, opts(cache_dir=tmp_path / "ci", remote_write=True), lock=False)  # CI writes
    assert ci.remote is not None and ci.remote.url == prefix and ci.remote.uploaded == 2
    dev = run_cli("build", str(manifest), "--cache-dir", str(tmp_path / "dev"), "--no-lock", "--json")
    rep = json.loads(dev.stdout)
    assert dev.returncode == 0 and rep["fetched"] == 2 and rep["remote"]["url"] == prefix, dev.stderr
    assert rep["remote"]["write"] is False  # the manifest never turns writing on
    other = build(manifest, opts(cache_dir=tmp_path / "other", remote=f"{prefix}-elsewhere"), lock=False)
    assert other.remote is not None and other.remote.url == f"{prefix}-elsewhere"
    assert other.count("built") == 2 and other.remote.absent == 2


# Races --------------------------------------------------------------------------------


@pytest.mark.usefixtures("dsl")
def test_two_builders_racing_on_one_key(s3, prefix: str, tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    procs = [subprocess.Popen([PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                               str(tmp_path / f"m{i}"), "--remote", prefix, "--remote-write",
                               "--no-lock", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    reps = [json.loads(o[0]) for o in outs]
    assert all(r["built"] == 1 and r["failed"] == 0 for r in reps)
    assert sum(r["remote"]["uploaded"] for r in reps) >= 1
    assert all(r["remote"]["upload_errors"] == [] for r in reps)  # losing the race is no error
    objs = s3.objects(parse_url(prefix)[1])
    assert len([o for o in objs if o.startswith("v1/entries/")]) == 1
    (key,) = _libraries(tmp_path / "m0")
    raw = bytes(obstore.get(s3.store(parse_url(prefix)[1]), f"v1/entries/{key}.json").bytes())
    assert raw in [(Store(tmp_path / f"m{i}").layout.entry(key) / "meta.json").read_bytes() for i in range(2)]
    third = build(manifest, opts(cache_dir=tmp_path / "m2", remote=prefix), lock=False)
    assert third.count("built") == 0 and third.remote is not None and third.remote.fetched == 1
    assert _libraries(tmp_path / "m2") == _libraries(tmp_path / "m0") == _libraries(tmp_path / "m1")


def test_concurrent_uploads_of_one_entry_create_it_once(s3, prefix: str, toy_cache) -> None:
    store = Store(toy_cache.cache)
    entry = next(iter(store.entries()))
    created: list[bool] = []
    barrier = threading.Barrier(6)

    def push() -> None:
        remote = Remote(_cfg(prefix, write=True))  # a builder each
        barrier.wait(30)
        created.append(remote.push(entry, store))

    threads = [threading.Thread(target=push) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(created) == [False] * 5 + [True]
    objs = s3.objects(parse_url(prefix)[1])
    rt = entry.doc["runtime"]
    assert objs == sorted([f"v1/entries/{entry.key}.json", f"v1/runtimes/{rt['key']}.json",
                           f"v1/blobs/{entry.doc['files']['kernel.so']['sha256']}",
                           f"v1/blobs/{rt['sha256']}"])


# A server that goes away or hangs -----------------------------------------------------


class _StopsServer(Progress):
    """Stops the S3 server when compiling starts (after the lookup, before the uploads)."""

    def __init__(self, server) -> None:
        self.server = server

    def start(self, total: int) -> None:
        self.server.stop()


@pytest.mark.usefixtures("dsl")
def test_the_server_stopped_mid_build_degrades_with_one_warning(
        weed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = weed()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    manifest = write_toy_project(tmp_path / "proj")
    url = f"s3://{server.bucket}/mid"
    t0 = time.monotonic()
    rep = build(manifest, opts(cache_dir=tmp_path / "c", remote=url, remote_write=True),
                progress=_StopsServer(server), lock=False)
    assert time.monotonic() - t0 < 120
    assert rep.ok and rep.exit_code == 0 and rep.count("built") == 2
    assert rep.remote is not None and rep.remote.absent == 2 and rep.remote.uploaded == 0
    warnings = rep.warnings()
    assert len(warnings) == 1 and "not uploaded" in warnings[0] and "remote unavailable" in warnings[0]
    r = run_cli("verify", "--cache-dir", str(tmp_path / "c"))
    assert r.returncode == 0, r.stdout
    # the server still down at the next build: one warning, a local build, exit 0
    r = run_cli("build", str(manifest), "--cache-dir", str(tmp_path / "c2"), "--remote", url,
                "--remote-write", "--no-lock")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "unavailable" in lines[0] and "built locally" in lines[0], r.stderr
    assert "2 built" in r.stdout
    assert stats(tmp_path / "c2")["remote_unavailable"] == 1


def test_a_read_only_credential_warns_in_one_clean_line(weed, tmp_path: Path) -> None:
    """A writing build with a credential that may only read gets
    403 on every upload; it still succeeds, with one warning whose reason is the status
    and the S3 error (`403 Forbidden, AccessDenied: ...`), never a fragment of the XML."""
    server = weed(read_only_identities(tmp_path / "s3.json"))
    env = {**server.env, "AWS_ACCESS_KEY_ID": READER[0], "AWS_SECRET_ACCESS_KEY": READER[1]}
    manifest = write_toy_project(tmp_path / "proj")
    r = run_cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--remote",
                f"s3://{server.bucket}/ro", "--remote-write", "--no-lock", env=env)
    assert r.returncode == 0 and "2 built" in r.stdout, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1, r.stderr
    assert "403" in lines[0] and "AccessDenied" in lines[0], lines[0]
    assert "<" not in lines[0] and "xml" not in lines[0].lower() and len(lines[0]) < 400, lines[0]
    assert server.proc.poll() is None  # the server is up: denied, not down


def test_a_hung_server_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # accepts connections, never answers
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("CUTECC_REMOTE_TIMEOUT", "1")
    keys = ["a" * 64, "b" * 64, "c" * 64]
    t0 = time.monotonic()
    hung = config(BuildOptions.from_environment(remote="s3://hung/p"))
    found = Remote(hung).lookup(keys, Store(tmp_path / "c"))  # type: ignore[arg-type]
    took = time.monotonic() - t0
    sock.close()
    assert found.down and not found.fetched and sorted(found.absent) == sorted(keys)
    assert took < 30, took
    assert not (tmp_path / "c" / "entries").exists() or not list(Store(tmp_path / "c").entries())


# Damaged and hostile objects ------------------------------------------------------------


def _tamper(s3, url: str, path: str, change) -> None:
    store = s3.store(parse_url(url)[1])
    data = bytes(obstore.get(store, path).bytes())
    obstore.put(store, path, change(data))


@pytest.mark.parametrize("damage, why", [
    (lambda b: b[: len(b) // 2], "truncated"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "altered"),
])
def test_a_truncated_or_altered_blob_is_refused(s3, prefix: str, toy_cache, tmp_path: Path,
                                                  damage, why: str) -> None:
    _seed(s3, prefix, toy_cache.cache)
    store = Store(toy_cache.cache)
    entry = next(iter(store.entries()))
    sha = entry.doc["files"]["kernel.so"]["sha256"]
    _tamper(s3, prefix, f"v1/blobs/{sha}", damage)
    store = Store(tmp_path / "c")
    store.ensure()
    found = Remote(_cfg(prefix)).lookup(list(_libraries(toy_cache.cache)), store)
    assert list(found.refused) == [entry.key] and why in found.refused[entry.key]
    assert found.down is None and len(found.fetched) == 1
    assert store.get(entry.key) is None and not list(store.tmp_dir.iterdir())
    # cutecc fetch names it and exits 1; the healthy entry lands
    lock = tmp_path / "kernels.lock"
    lock.write_bytes((toy_cache.manifest.parent / "kernels.lock").read_bytes())
    r = run_cli("fetch", "--lock", str(lock), "--remote", prefix, "--cache-dir", str(tmp_path / "d"),
                "--allow-unsigned")
    assert r.returncode == 1 and "refused scale[threads=" in r.stderr and why in r.stderr, r.stderr
    assert len(list(Store(tmp_path / "d").entries())) == 1


@pytest.mark.usefixtures("dsl")
def test_a_build_refuses_a_damaged_entry_and_builds_it_locally(s3, prefix: str, toy_cache,
                                                                tmp_path: Path) -> None:
    _seed(s3, prefix, toy_cache.cache)
    store = Store(toy_cache.cache)
    entry = next(iter(store.entries()))
    _tamper(s3, prefix, f"v1/entries/{entry.key}.json",
            lambda b: b.replace(b'"threads": ', b'"threads": 1'))
    copy = toy_cache.copy(tmp_path / "p")
    rep = build(copy.manifest, opts(cache_dir=tmp_path / "fresh", remote=prefix), lock=False)
    assert rep.ok and rep.count("built") == 1 and rep.remote is not None and rep.remote.fetched == 1
    (line,) = rep.warnings()
    assert line.startswith(f"warning: remote cache {prefix}: refused 1 entry") and "built locally" in line
    assert "damaged metadata" in line or "key_inputs" in line
    assert _libraries(tmp_path / "fresh") == _libraries(toy_cache.cache)


def test_hostile_objects_are_refused_before_anything_lands(s3, prefix: str, toy_cache,
                                                            tmp_path: Path) -> None:
    entries = list(Store(toy_cache.cache).entries())
    store = s3.store(parse_url(prefix)[1])
    a, b = entries
    # an entry filed under another key
    obstore.put(store, f"v1/entries/{a.key}.json", (b.path / "meta.json").read_bytes())
    # a huge meta.json
    obstore.put(store, f"v1/entries/{b.key}.json", b"{" + b" " * (2 << 20) + b"}")
    local = Store(tmp_path / "c")
    local.ensure()
    found = Remote(_cfg(prefix)).lookup([a.key, b.key], local)
    assert "records key" in found.refused[a.key] and "limit" in found.refused[b.key]
    # a blob larger than the cap is not even downloaded
    _seed(s3, prefix + "-2", toy_cache.cache)
    capped = Remote(_cfg(prefix + "-2", max_blob=1000))
    found = capped.lookup([a.key], local)
    assert "over the 1000-byte limit" in found.refused[a.key]
    assert capped.traffic.bytes_down < 5000
    assert list(local.entries()) == []


# cutecc fetch --lock ------------------------------------------------------------------


def test_fetch_fills_a_cache_with_exactly_the_locked_entries(s3, prefix: str, toy_cache,
                                                               tmp_path: Path) -> None:
    _seed(s3, prefix, toy_cache.cache)
    lock = toy_cache.manifest.parent / "kernels.lock"
    keys = read_lock(lock).distinct_keys()
    rep = fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "prod"), allow_unsigned=True)
    # two ~15 KB kernel libraries and, once, the ~0.8 MB runtime library they link against
    assert rep.ok and len(rep.fetched) == 2 and 500_000 < rep.traffic.bytes_down < 1_200_000
    assert sorted(_libraries(tmp_path / "prod")) == keys
    again = fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "prod"), allow_unsigned=True)
    assert again.ok and len(again.present) == 2 and again.traffic.requests == 0
    one = fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "one"), kernels=("scale",),
                archs=("sm_80",), allow_unsigned=True)
    assert one.ok and one.fetched == [] and one.present == []
    # a lock line the remote's entry does not match is refused
    text = lock.read_text()
    sha = read_lock(lock).entries[0].pin.sha256
    bad = tmp_path / "bad.lock"
    bad.write_text(text.replace(sha, "0" * 64))
    r = run_cli("fetch", "--lock", str(bad), "--remote", prefix, "--cache-dir", str(tmp_path / "x"), "--json",
                "--allow-unsigned")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert len(doc["refused"]) == 1 and "differs from the lock" in doc["refused"][0]["reason"]
    # nothing on the remote: missing, exit 1
    r = run_cli("fetch", "--lock", str(lock), "--remote", prefix + "-empty", "--cache-dir",
                str(tmp_path / "y"), env={"CUTECC_ALLOW_UNSIGNED": "1"})
    assert r.returncode == 1 and "2 locked entries not on" in r.stderr
    # no remote at all: bad input
    r = run_cli("fetch", "--lock", str(lock), "--cache-dir", str(tmp_path / "z"), env={"CUTECC_REMOTE": ""})
    assert r.returncode == 2 and "no remote cache" in r.stderr


def test_without_obstore_a_remote_is_unavailable_not_an_error(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "obstore.store", None)  # as if cutecc[remote] were absent
    found = Remote(_cfg("s3://bkt/p")).lookup(["a" * 64], Store(tmp_path / "c"))
    assert found.down and "pip install 'cutecc[remote]'" in found.down and found.absent == ("a" * 64,)


def test_fetch_checks_the_locks_signature_first(s3, prefix: str, toy_cache, tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason="signing needs cutecc[sign]")
    from cutecc.lock import signing

    _seed(s3, prefix, toy_cache.cache)
    lock = tmp_path / "kernels.lock"
    lock.write_bytes((toy_cache.manifest.parent / "kernels.lock").read_bytes())
    priv, pub = signing.keygen(tmp_path / "ci")
    # no trusted key and no opt-out: refused before any request
    with pytest.raises(CuteccError, match="no trusted key"):
        fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "a"))
    # trusted key, lock not signed: refused
    with pytest.raises(signing.SignatureError, match="not signed"):
        fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "a"), trusted_keys=[pub])
    signing.sign_file(lock, signing.read_private_key(priv), "lock")
    rep = fetch(lock, opts(remote=prefix, cache_dir=tmp_path / "a"), trusted_keys=[pub])
    assert rep.ok and len(rep.fetched) == 2
    # a lock edited after signing (another library for a key) is refused, exit 1
    lock.write_text(lock.read_text().replace(read_lock(lock).entries[0].pin.sha256, "0" * 64))
    r = run_cli("fetch", "--lock", str(lock), "--remote", prefix, "--cache-dir", str(tmp_path / "b"),
                "--trusted-key", str(pub))
    assert r.returncode == 1 and "changed after it was signed" in r.stderr, r.stderr
    assert not (tmp_path / "b" / "entries").exists() or list(Store(tmp_path / "b").entries()) == []
