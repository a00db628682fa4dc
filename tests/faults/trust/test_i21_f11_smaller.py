"""Issue 21, finding 11 (the smaller ones; the 403 warning is tested against a real S3
server in tests/distributed/test_remote.py).

(a) a signature with `alg: none` was refused as "signed by key X, none of them trusted
(trusted: X)"; (b) a wheel silently took the last of two members of one name where a
tarball refused the entry; (c) members outside the pack's `_cutecc/` tree were ignored.
Both archive kinds now refuse (b) and (c) the same way, naming the member.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutecc import signing

# (a) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "ES256", None])
def test_a_signature_with_another_algorithm_says_so(tmp_path: Path, alg: str | None) -> None:
    """A signature by a trusted key in an algorithm other than ed25519 is refused, saying
    which algorithm it used and which one is accepted."""
    private, public = signing.keygen(tmp_path / "ci")
    data = b'{"entries": []}\n'
    doc = json.loads(signing.sign(data, signing.read_private_key(private), "lock"))
    doc["signatures"][0]["alg"] = alg
    with pytest.raises(signing.SignatureError) as e:
        signing.verify(data, json.dumps(doc).encode(), [signing.read_public_key(public)], "lock",
                       "kernels.lock")
    msg = e.value.message
    assert "algorithm" in msg and repr(alg) in msg and "ed25519" in msg, msg
    assert "none of them trusted" not in msg, msg
