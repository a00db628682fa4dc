"""`cutecc keygen`: an ed25519 key pair for signing lock files and packs.

`PREFIX.key` (mode 0600, never overwritten) stays with the builder (CI's secret store);
`PREFIX.pub` goes to every deploy host that should trust what it signs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.errors import WorkError


@dataclass(frozen=True)
class KeygenReport(Report):
    private: Path
    public: Path
    key_id: str

    def to_json(self) -> dict[str, Any]:
        return {"private": str(self.private), "public": str(self.public), "key_id": self.key_id}

    def lines(self, verbose: int = 0) -> list[str]:
        return [f"wrote {self.private} (private: keep it secret; sign with --sign-key)",
                f"wrote {self.public} (public: give it to deploy hosts; --trusted-key)",
                f"key id {self.key_id}"]


def keygen(prefix: str | os.PathLike[str], comment: str = "") -> KeygenReport:
    from cutecc.lock import signing

    if Path(f"{os.fspath(prefix)}.key").exists() or Path(f"{os.fspath(prefix)}.pub").exists():
        raise WorkError("a key of that name exists; nothing written (choose another --out)",
                        where=os.fspath(prefix))
    try:
        private, public = signing.keygen(prefix, comment)
    except OSError as e:
        raise WorkError(f"cannot write the key: {e.strerror}", where=str(e.filename or prefix)) from None
    return KeygenReport(private, public, signing.read_public_key(public).key_id)
