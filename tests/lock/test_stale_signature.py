"""A signed kernels.lock rebuilt without `--sign-key`: the build removes the signature of
the old bytes and says so (on 1518079 the old `kernels.lock.sig` stayed beside the changed
lock, silently), and `cutecc.load(lock=, trusted_keys=)` then says how to sign it again."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import fallback_manifest, opts

import cutecc
from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.lock.signing import SIG_SUFFIX, SignatureError, keygen

pytest.importorskip("cryptography")
pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


def test_a_build_without_the_key_removes_the_stale_signature(fallback_project: Path, tmp_path: Path) -> None:
    private, public = keygen(tmp_path / "ci")
    cache = tmp_path / "cache"
    lock = fallback_project.parent / "kernels.lock"
    sig = Path(f"{lock}{SIG_SUFFIX}")
    assert build(fallback_project, opts(cache_dir=cache, sign_key=private)).ok and sig.is_file()
    assert cutecc.load(cache, arch="sm_90a", lock=lock, trusted_keys=[public]).scale
    # unchanged: the signature stays (it still signs these bytes)
    r = build(fallback_project, opts(cache_dir=cache))
    assert r.ok and not r.lock_changed and sig.is_file() and not r.warnings()
    # changed, no key: the old signature goes, and the build says so
    fallback_project.write_text(fallback_manifest(ds=[64, 32]))
    out = CliRunner().invoke(main, ["build", str(fallback_project), "--cache-dir", str(cache)],
                             catch_exceptions=False, prog_name="cutecc")
    assert out.exit_code == 0, out.output
    assert not sig.exists()
    said = [line for line in out.stderr.splitlines() if SIG_SUFFIX in line]
    assert said and "removed" in said[0] and "--sign-key" in said[0], out.stderr
    with pytest.raises(SignatureError, match="is not signed") as e:
        cutecc.load(cache, arch="sm_90a", lock=lock, trusted_keys=[public])
    assert "cutecc build --sign-key" in e.value.message
    # signed again as said: served
    assert build(fallback_project, opts(cache_dir=cache, sign_key=private)).ok and sig.is_file()
    assert cutecc.load(cache, arch="sm_90a", lock=lock, trusted_keys=[public]).scale
