"""Provenance: ed25519 signatures on lock files, made by the builder, checked by the deployer.

A pack or a cache can only vouch for itself: an archive whose entry holds another library
under a legitimate key, with meta.json and its own lock rewritten to match, passes every
hash check. A signature over the lock's exact bytes, made with a key the deployer chose
to trust, ties what runs to what CI built: each lock line pins an entry's key (hence its
key inputs), its library's SHA-256 and everything else the runtime acts on, so one
signature covers a release. The signature lives beside the lock (`kernels.lock.sig`, and
`_cutecc/kernels.lock.sig` in a pack).

Files are small versioned JSON documents: a private key (mode 0600, refused if others can
read it), a public key, and a signature file listing one or more signatures (two during a
key rotation). The signed message is a domain tag, the kind ("lock") and the bytes, so a
signature never verifies for another kind of document. The ed25519 primitives come from
`cryptography` (an optional extra, `cutecc[sign]`), imported only when signing or when
trusted keys are given. See README "Signing" for who signs, who verifies, and what a
stolen key costs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import settings, trust
from cutecc.atomic import atomic_write
from cutecc.entry.rules import parse_json
from cutecc.errors import CuteccError, WorkError

KEY_FORMAT = 1
SIG_FORMAT = 1
DOMAIN = b"cutecc-signature-v1\0"
KINDS = ("lock", "meta")
SIG_SUFFIX = ".sig"
MAX_SIGNED_BYTES = 16 << 20  # a lock (its cap)
MAX_SIG_BYTES = 64 * 1024  # a .sig of a few signatures is < 1 KiB
MAX_KEY_BYTES = 16 * 1024
_PRIVATE = "cutecc-ed25519-private"
_PUBLIC = "cutecc-ed25519-public"


class SignatureError(WorkError):
    """A missing, malformed, untrusted or failing signature (one line, says which; exit 1)."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message, where=where)


# The four primitive calls (cryptography) -----------------------------------------------------


def _crypto() -> None:
    """Say how to install the signing library when it is missing."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise SignatureError("signatures need the `cryptography` package: pip install "
                             "'cutecc[sign]'") from None


def _ed25519_public(seed: bytes) -> bytes:
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _ed25519_sign(seed: bytes, message: bytes) -> bytes:
    _crypto()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(seed).sign(message)


def _ed25519_verify(public: bytes, signature: bytes, message: bytes) -> bool:
    _crypto()
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# Keys -------------------------------------------------------------------------------------


def key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    raw: bytes
    comment: str = ""

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise SignatureError(f"an ed25519 public key is 32 bytes, got {len(self.raw)}")

    @property
    def key_id(self) -> str:
        return key_id(self.raw)

    def dumps(self) -> bytes:
        return _dumps({"format": KEY_FORMAT, "type": _PUBLIC, "key_id": self.key_id,
                       "comment": self.comment, "public": _b64(self.raw)})

    @classmethod
    def loads(cls, data: bytes, where: str = "public key") -> PublicKey:
        doc = _parse(data, where, MAX_KEY_BYTES)
        _expect(doc, _PUBLIC, where)
        key = cls(_unb64(doc.get("public"), 32, where), str(doc.get("comment", "")))
        if doc.get("key_id") != key.key_id:
            raise SignatureError(f"{where}: key_id {doc.get('key_id')!r} does not match its key")
        return key


@dataclass(frozen=True)
class PrivateKey:
    seed: bytes = field(repr=False)
    comment: str = ""

    def __post_init__(self) -> None:
        if len(self.seed) != 32:
            raise SignatureError(f"an ed25519 seed is 32 bytes, got {len(self.seed)}")

    def public(self) -> PublicKey:
        return PublicKey(_ed25519_public(self.seed), self.comment)

    def dumps(self) -> bytes:
        return _dumps({"format": KEY_FORMAT, "type": _PRIVATE, "key_id": self.public().key_id,
                       "comment": self.comment, "seed": _b64(self.seed)})

    @classmethod
    def loads(cls, data: bytes, where: str = "private key") -> PrivateKey:
        doc = _parse(data, where, MAX_KEY_BYTES)
        _expect(doc, _PRIVATE, where)
        key = cls(_unb64(doc.get("seed"), 32, where), str(doc.get("comment", "")))
        if doc.get("key_id") != key.public().key_id:
            raise SignatureError(f"{where}: key_id {doc.get('key_id')!r} does not match its key")
        return key


def generate(comment: str = "") -> PrivateKey:
    return PrivateKey(os.urandom(32), comment)


def keygen(prefix: str | os.PathLike[str], comment: str = "") -> tuple[Path, Path]:
    """`cutecc keygen --out PREFIX`: PREFIX.key (0600, never overwritten) and PREFIX.pub."""
    key = generate(comment)
    priv, pub = Path(f"{os.fspath(prefix)}.key"), Path(f"{os.fspath(prefix)}.pub")
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.dumps())
    atomic_write(pub, key.public().dumps(), 0o644)
    return priv, pub


def read_private_key(path: str | os.PathLike[str]) -> PrivateKey:
    """A private key file, read under the cache's ownership policy (`cutecc.trust`: it and
    every directory above it this user's or root's, not writable by others, no link
    followed) and refused when group or others can read it."""
    def owner_only(st: os.stat_result) -> str | None:
        return (f"a private key must be readable by its owner alone (mode {stat.S_IMODE(st.st_mode):o}); "
                "chmod 600 it") if st.st_mode & 0o077 else None

    return PrivateKey.loads(_read_key(path, owner_only), str(path))


def read_signing_key(path: str | os.PathLike[str]) -> PrivateKey:
    """`read_private_key` for a command given `--sign-key` (or `$CUTECC_SIGNING_KEY`): read
    before any work, so a bad key fails first; unreadable: CuteccError naming the file."""
    try:
        return read_private_key(path)
    except OSError as e:
        raise CuteccError(f"cannot read the signing key: {e.strerror}", where=os.fspath(path)) from None


def read_public_key(path: str | os.PathLike[str]) -> PublicKey:
    """A trusted public key file, under the same ownership policy as the cache: a key that
    someone else could have replaced vouches for nothing."""
    return PublicKey.loads(_read_key(path), str(path))


def _read_key(path: str | os.PathLike[str],
              check: Callable[[os.stat_result], str | None] | None = None) -> bytes:
    try:
        return trust.read_path(path, MAX_KEY_BYTES, check, always=True)
    except trust.Untrusted as e:
        raise SignatureError(f"refusing the key file: {e.why}", where=str(path)) from None
    except OSError as e:
        if e.errno == 27:
            raise SignatureError(f"over the {MAX_KEY_BYTES}-byte limit of a key file",
                                 where=str(path)) from None
        raise


def read_trusted_keys(paths: Iterable[str | os.PathLike[str]]) -> list[PublicKey]:
    return [read_public_key(p) for p in paths]


# Signing and verifying --------------------------------------------------------------------


def message(kind: str, data: bytes) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} (known: {', '.join(KINDS)})")
    return DOMAIN + kind.encode() + b"\0" + data


def sign(data: bytes, key: PrivateKey, kind: str, *, existing: bytes | None = None) -> bytes:
    """The .sig file for `data`; with `existing` (a .sig of the same bytes), add to it."""
    sigs: list[dict[str, Any]] = []
    if existing is not None:
        doc = _sig_doc(existing, kind, "existing signature")
        if doc["sha256"] != hashlib.sha256(data).hexdigest():
            raise SignatureError("the existing signature is of other bytes")
        sigs = [s for s in doc["signatures"] if s.get("key_id") != key.public().key_id]
    sigs.append({"alg": "ed25519", "key_id": key.public().key_id,
                 "sig": _b64(_ed25519_sign(key.seed, message(kind, data)))})
    return _dumps({"format": SIG_FORMAT, "kind": kind, "sha256": hashlib.sha256(data).hexdigest(),
                   "signatures": sorted(sigs, key=lambda s: s["key_id"])})


def verify(data: bytes, sig: bytes | None, trusted: Sequence[PublicKey], kind: str,
           where: str = "the file") -> PublicKey:
    """The trusted key whose signature of `data` verifies; else SignatureError saying why."""
    if not trusted:
        raise SignatureError("no trusted key given")
    if sig is None:
        raise SignatureError(f"{where} is not signed (no {kind} signature); refusing it"
                             + _sign_again(kind, "it"))
    doc = _sig_doc(sig, kind, f"{where}{SIG_SUFFIX}")
    if doc["sha256"] != hashlib.sha256(data).hexdigest():
        raise SignatureError(f"{where} was changed after it was signed (its SHA-256 differs "
                             f"from the signed one); refusing it{_sign_again(kind, 'again')}")
    by_id = {k.key_id: k for k in trusted}
    signers = [s.get("key_id") for s in doc["signatures"]]
    failed, other_alg = [], []
    for s in doc["signatures"]:
        k = by_id.get(s.get("key_id"))
        if k is None:
            continue
        if s.get("alg") != "ed25519":
            other_alg.append(f"key {k.key_id} uses algorithm {str(s.get('alg'))[:20]!r}")
            continue
        raw = _unb64(s.get("sig"), 64, f"{where}{SIG_SUFFIX}")
        if _ed25519_verify(k.raw, raw, message(kind, data)):
            return k
        failed.append(k.key_id)
    if failed:
        raise SignatureError(f"{where}: the signature by key {', '.join(failed)} does not "
                             "verify; refusing it")
    if other_alg:
        raise SignatureError(f"{where}: the signature by {', '.join(other_alg)}, which is not "
                             "accepted (only 'ed25519' is); refusing it")
    raise SignatureError(f"{where} is signed by key(s) {', '.join(map(str, signers)) or 'none'}, "
                         f"none of them trusted (trusted: {', '.join(by_id)}); refusing it")


def sign_file(path: str | os.PathLike[str], key: PrivateKey, kind: str,
              data: bytes | None = None) -> Path:
    """Write PATH.sig for `data` (a build passes the bytes it checked and wrote, so a file
    rewritten meanwhile by another process is never what gets signed), else for the file's
    current bytes, read bounded; added to a valid existing signature of the same bytes.
    A signature that already says exactly this (ed25519 is deterministic: this key signed
    these bytes) is not rewritten."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read(MAX_SIGNED_BYTES + 1)
        if len(data) > MAX_SIGNED_BYTES:
            raise SignatureError(f"over the {MAX_SIGNED_BYTES}-byte limit of a signed file", where=str(path))
    out = Path(f"{os.fspath(path)}{SIG_SUFFIX}")
    try:
        existing: bytes | None = out.read_bytes()
        signed = sign(data, key, kind, existing=existing)  # still of these bytes?
    except (OSError, SignatureError):
        existing, signed = None, sign(data, key, kind)
    if signed != existing:
        atomic_write(out, signed, 0o644)
    return out


def drop_stale_signature(path: str | os.PathLike[str], data: bytes, kind: str) -> Path | None:
    """Remove PATH.sig unless it is a signature of `data` (the file's bytes just recorded,
    with no key to sign them): a signature of other bytes vouches for nothing and must not
    sit beside the file as if it did. The path removed, else None (none there, still of
    these bytes, or not a regular file: a FIFO is never opened). WorkError when it cannot
    be removed."""
    out = Path(f"{os.fspath(path)}{SIG_SUFFIX}")
    try:
        fd = os.open(out, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_SIG_BYTES + 1)
    except OSError:
        raw = b""
    finally:
        os.close(fd)
    try:
        if _sig_doc(raw, kind, str(out))["sha256"] == hashlib.sha256(data).hexdigest():
            return None
    except SignatureError:
        pass  # malformed, or of another kind: it cannot sign these bytes either
    try:
        out.unlink()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise WorkError(f"cannot remove the signature of the file's old bytes: {e.strerror}; remove "
                        "it, or sign the file again", where=str(out)) from None
    return out


def verify_file(path: str | os.PathLike[str], trusted: Sequence[PublicKey], kind: str, *,
                max_bytes: int = 16 << 20) -> bytes:
    """The file's bytes, once its PATH.sig verifies: the caller must use exactly these bytes
    (read once, verified, returned: no check-then-reread gap)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SignatureError(f"{path}: over the {max_bytes}-byte limit")
    try:
        with open(f"{os.fspath(path)}{SIG_SUFFIX}", "rb") as f:
            sig: bytes | None = f.read(MAX_SIG_BYTES + 1)
    except FileNotFoundError:
        sig = None
    verify(data, sig, trusted, kind, str(path))
    return data


def check_lock(data: bytes, sig: bytes | None, where: str, *,
               trusted_keys: Sequence[str | os.PathLike[str]] | None = None,
               allow_unsigned: bool | None = None) -> PublicKey | None:
    """Check a lock's bytes against the deployer's trusted keys (`trusted_keys`; None:
    `$CUTECC_TRUSTED_KEYS`, paths separated by `:`): the key that signed it. Without any
    trusted key the lock is refused, unless the deployer opted out (`allow_unsigned`; None:
    `$CUTECC_ALLOW_UNSIGNED=1`): then None. A load passes both as it read them
    (`cutecc.runtime.runtime_settings`), so neither variable is read here then."""
    if trusted_keys is None:
        trusted_keys = [p for p in (settings.TRUSTED_KEYS.read() or "").split(os.pathsep) if p]
    if allow_unsigned is None:
        allow_unsigned = settings.ALLOW_UNSIGNED.on()
    paths = list(trusted_keys)
    if paths:
        try:
            keys = read_trusted_keys(paths)
        except OSError as e:
            raise SignatureError(f"cannot read a trusted key: {e.strerror}", where=str(e.filename)) from None
        return verify(data, sig, keys, "lock", where)
    if allow_unsigned:
        return None
    raise SignatureError(f"{where}: no trusted key to check its signature with. Pass the builder's "
                         f"public key (--trusted-key, trusted_keys=, {settings.TRUSTED_KEYS.where}), or opt "
                         f"out with --allow-unsigned / allow_unsigned=True / "
                         f"{settings.ALLOW_UNSIGNED.where}=1")


# Helpers ----------------------------------------------------------------------------------


def _sign_again(kind: str, what: str) -> str:
    """How to sign a lock (`what`: "it", "again"): the commands that write one sign it."""
    if kind != "lock":
        return ""
    return (f". Sign {what} with the builder's private key: `cutecc build --sign-key KEY` (or "
            f"{settings.SIGNING_KEY.where}; a pack: `cutecc pack --sign-key KEY`)")


def _dumps(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _parse(data: bytes | None, where: str, limit: int) -> dict[str, Any]:
    if data is None or len(data) > limit:
        raise SignatureError(f"{where}: missing or over {limit} bytes")
    try:
        doc = parse_json(data, limit, 8)
    except ValueError:
        raise SignatureError(f"{where}: not JSON") from None
    if not isinstance(doc, dict):
        raise SignatureError(f"{where}: not a JSON object")
    return doc


def _expect(doc: dict[str, Any], kind: str, where: str) -> None:
    if doc.get("type") != kind:
        raise SignatureError(f"{where}: a {doc.get('type')!r}, expected a {kind!r}")
    if doc.get("format") != KEY_FORMAT:
        raise SignatureError(f"{where}: key format {doc.get('format')!r}, this cutecc reads "
                             f"{KEY_FORMAT}")


def _sig_doc(data: bytes, kind: str, where: str) -> dict[str, Any]:
    doc = _parse(data, where, MAX_SIG_BYTES)
    if doc.get("format") != SIG_FORMAT:
        raise SignatureError(f"{where}: signature format {doc.get('format')!r}, this cutecc "
                             f"reads {SIG_FORMAT}")
    if doc.get("kind") != kind:
        raise SignatureError(f"{where}: a signature of a {doc.get('kind')!r}, not of a {kind!r}")
    sigs = doc.get("signatures")
    if not isinstance(doc.get("sha256"), str) or not isinstance(sigs, list) or not sigs \
            or len(sigs) > MAX_SIGNATURES or not all(_sig_entry_ok(s) for s in sigs):
        raise SignatureError(f"{where}: malformed signature file")
    return doc


MAX_SIGNATURES = 64  # signers of one file (a key rotation needs two)


def _sig_entry_ok(s: Any) -> bool:
    """One signature of a .sig file: string fields of bounded length (a key id, an
    algorithm name, base64); their values are judged by `verify`."""
    return (isinstance(s, dict) and all(isinstance(s.get(f), str) and len(s[f]) <= 256
                                        for f in ("key_id", "sig"))
            and (s.get("alg") is None or isinstance(s["alg"], str) and len(s["alg"]) <= 256))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any, size: int, where: str) -> bytes:
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"{where}: bad base64") from None
    if len(raw) != size:
        raise SignatureError(f"{where}: expected {size} bytes, got {len(raw)}")
    return raw
