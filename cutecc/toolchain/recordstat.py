"""Installed files told unchanged by their stat against their distribution's RECORD, so a
first planning need not read and hash them (torch alone: 1.14 GB, 1.8 s of CPU; the stat of
a whole 1.5 GB venv: 0.09 s), with the key exactly what hashing gives (the RECORD's
SHA-256 for the file's, only where that is what the file holds).

An installer (pip, uv) writes every file of a wheel, then its INSTALLER, then the RECORD
naming each file's SHA-256 and size, last (seen here: pip's INSTALLER 2-43 ms before its
RECORD, after byte-compiling; uv's in the same tick). A file's ctime is set by the kernel to
the current time on every change of its contents or of its inode (write, truncate, chmod,
chown, link, rename, utime) and cannot be set by a user, unlike the mtime (`touch -r`,
`cp -p`, `tar` put it back). So a file whose ctime is before its install's INSTALLER was
last changed before the install ended; if the RECORD is the one that install wrote, the file
holds what its row says. `by_stat` trusts a row for a file only where all of this holds;
everything else is hashed as before (`DistIndex._compute`):

- the RECORD's stamp is settled and held while it was read (`dists._Record.stable`);
- the RECORD was last changed by a write of its own text: its ctime is at most SEAL_NS
  after its mtime (pip and uv write it and rename it into place: 0-4 ms seen). A RECORD
  copied or unpacked with its times (`cp -p`, `cp -a`, `rsync -a`, `tar`, container image
  layers: the mtime is put back, the ctime is the copy's), whose times were set
  (`touch -r`, `touch -d`), or whose inode changed later (chmod, chown, link, rename: a
  `chmod -R` after an edit) says nothing about when its text was written: the whole
  distribution is hashed. A copy that keeps times, made after an edit, is never trusted,
  in whatever order it writes the files and the RECORD;
- the dist-info holds an INSTALLER whose ctime is at most INSTALL_SPAN_NS before the
  RECORD's (and not after it): the RECORD's rows are those the install that wrote the
  INSTALLER wrote. A RECORD rewritten later, even with rows naming other digests for
  untouched files of the same size, is not trusted (else its rows would key content that
  is not there, as another install's key);
- per file: a regular file, not a symbolic link, at the path its row names (a row spelled
  otherwise is hashed), no directory between site-packages and it a link, on the RECORD's
  device (a tree linked or mounted into place keeps its own old ctimes), its size the
  row's, the row's digest a well-formed SHA-256, and its ctime strictly before the
  INSTALLER's (one tick of the file system's clock cannot order two changes: equal is
  hashed).

Moving ctimes forward without an edit only costs speed: uv installing the same wheel into
a second venv by hardlink moves the first venv's ctimes (the link count changed), and
unpacking an archive that writes the dist-info first makes every file newer than it; both
are hashed, as is everything when `HashCache.trust_records` is off (`cutecc verify --deep`).

Touching or rewriting the RECORD after an edit does not hide it: a file is compared with
the INSTALLER, which the install wrote after every file (and a RECORD rewritten later fails
the previous rule). What remains unseen, and why it is accepted: an edit followed by
rewriting both the INSTALLER and then the RECORD in place (a deliberate re-sealing, as
rewriting a row's digest would be); a tree copied *without* its times (`cp -r`, no `-p`)
after a same-size edit, when the copy writes the package before the dist-info (every time
is then the copy's: nothing on disk tells it from an install); a whole directory renamed
into place from another tree (its files keep their inodes and times).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping, Sequence
from stat import S_ISLNK, S_ISREG

SEAL_NS = 100_000_000  # the RECORD's ctime at most this after its mtime: written, not copied
INSTALL_SPAN_NS = 5_000_000_000  # its INSTALLER's ctime at most this before the RECORD's
# A row's digest as an installer writes a SHA-256 (`sha256=`, unpadded URL-safe base64 of 32
# bytes: the last of 43 characters carries 2 zero bits), so that it is what hashing the file
# would write; any other is hashed.
_SHA256_ROW = re.compile(r"sha256=[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]")


def by_stat(record_stamp: Sequence[int] | None, installer_stamp: Sequence[int] | None, stable: bool,
            rows: Mapping[str, tuple[str, str]], stats: Sequence[tuple[str, str, os.stat_result | None]],
            linked: set[str], prefix: str) -> set[str]:
    """The paths in RECORD of the files of `stats` (`(path in RECORD, path on disk, its
    stat)`) that the RECORD (`record_stamp`, `stable`: see `dists._Record`; its
    `rows`: `{path: (digest, size)}`) vouches for by their stat alone (the module's rule);
    `installer_stamp`: the dist-info's INSTALLER's (`hashcache.stamp`); `linked`: the
    paths that are symbolic links; `prefix`: the directory the paths are under."""
    if not stable or record_stamp is None or installer_stamp is None:
        return set()
    _size, r_mtime, r_ctime, _ino, r_dev = record_stamp
    i_ctime = installer_stamp[2]
    if not 0 <= r_ctime - r_mtime <= SEAL_NS or not 0 <= r_ctime - i_ctime <= INSTALL_SPAN_NS:
        return set()
    out: set[str] = set()
    dirs: dict[str, bool] = {}  # directory under prefix -> whether it and those above are real
    for rel, p, st in stats:
        if (st is None or rel in linked or p != prefix + rel or not S_ISREG(st.st_mode)
                or st.st_dev != r_dev or st.st_ctime_ns >= i_ctime):
            continue
        digest, size = rows[rel]
        if size != str(st.st_size) or not _SHA256_ROW.fullmatch(digest) or not _real_dirs(prefix, rel, dirs):
            continue
        out.add(rel)
    return out


def _real_dirs(prefix: str, rel: str, known: dict[str, bool]) -> bool:
    """Whether every directory between `prefix` and `rel` is a directory, not a link."""
    d = rel.rpartition("/")[0]
    if not d:
        return True
    if d not in known:
        try:
            real = not S_ISLNK(os.lstat(prefix + d).st_mode)
        except OSError:
            real = False
        known[d] = real and _real_dirs(prefix, d, known)
    return known[d]


def record_hex(digest: str) -> str:
    """A trusted row's digest (`_SHA256_ROW`) as the hex SHA-256 hashing gives."""
    return base64.urlsafe_b64decode(digest[7:] + "=").hex()
