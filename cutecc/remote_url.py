"""What a remote cache URL is (`s3://bucket/prefix`): checked where it is read (a flag,
`$CUTECC_REMOTE`, the manifest's `[build]` table) without loading the remote cache itself."""

from __future__ import annotations

import re

from cutecc.errors import CuteccError

# S3 bucket naming rules; a prefix of plain path characters, never a `..` step.
_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/([A-Za-z0-9._/-]*))?")


def parse_url(url: str, where: str = "--remote") -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; CuteccError (exit 2) naming `where` otherwise."""
    m = _URL.fullmatch(url.strip())
    if not m or ".." in (m.group(2) or "").split("/"):
        raise CuteccError(f'"{url}" is not a remote cache URL such as s3://bucket/prefix', where=where)
    return m.group(1), (m.group(2) or "").strip("/")
