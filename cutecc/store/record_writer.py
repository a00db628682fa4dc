"""Writing the build records (`cutecc.store.build_records`: generations, manifests,
composites), part of the store's writer (`cutecc.store.writer.Store` is this class); and
the modes the writer gives what it creates.

A record that already holds what a build would write is not written again (a no-op build
writes none): compared byte for byte with what is on disk, read as readers read it
(`current_bytes`), `built_at` aside where only it would change (`record_generations`,
`record_manifest`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.atomic import atomic_write
from cutecc.entry.rules import MAX_META_BYTES, is_kernel_name, parse_json
from cutecc.store.build_records import CompositeRecord, GenerationRecord, ManifestRecord
from cutecc.store.view import StoreView, read_small_json
from cutecc.units import now_iso

DIR_MODE = 0o755  # what the cache's directories get, whatever the umask
FILE_MODE = 0o644  # and its files


class BuildRecordWriter(StoreView):
    """The build records' half of `cutecc.store.writer.Store`."""

    # Build records ---------------------------------------------------------------

    def record_generation(self, kernel: str, arch: str, keys: list[str], manifest: str,
                          fallbacks: dict[str, dict[str, Any]] | None = None) -> None:
        """Record `keys` as the current entries of `kernel` for `arch` (the newest build),
        and the kernel's declared `fallbacks` (`cutecc.contract.fallbacks`; the fields only when set)."""
        self.record_generations(kernel, {arch: keys}, manifest, fallbacks)

    def record_generations(self, kernel: str, per_arch: Mapping[str, list[str]], manifest: str,
                           fallbacks: dict[str, dict[str, Any]] | None = None,
                           roots: tuple[str, ...] = ()) -> None:
        """`record_generation` for each arch of `per_arch`, one build's records of `kernel`.

        Nothing is written when every one of them already says this, but for `built_at`,
        and each is newer than every other record of the kernel: "the newest build" then
        still picks one of these, which name the same manifest and fallbacks (a no-op
        build writes no generation). `built_at` is when a build last changed the record."""
        self.generations_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        now = now_iso()
        recs = {arch: GenerationRecord.of_build(kernel, arch, keys, manifest, now, fallbacks, roots)
                for arch, keys in per_arch.items()}
        if not self._generations_current(kernel, recs):
            for arch, rec in recs.items():
                atomic_write(self.layout.generation(kernel, arch), rec.dumps(), FILE_MODE)

    def _generations_current(self, kernel: str, recs: Mapping[str, GenerationRecord]) -> bool:
        """Whether each of `recs` is on disk as written (`current_bytes`) with an older
        `built_at` alone, every one of those later than every other arch's record of
        `kernel` (strictly: a tie could pick another's)."""
        kept: list[str] = []
        for arch, rec in recs.items():
            path = self.layout.generation(kernel, arch)
            old = current_bytes(path, MAX_META_BYTES)
            doc = _json_or_none(old)
            was = GenerationRecord.from_json(doc)
            if old is None or was is None or dataclasses.replace(rec, built_at=was.built_at).dumps() != old:
                return False
            kept.append(was.built_at)
        try:
            names = [f.name for f in os.scandir(self.generations_dir)]
        except OSError:
            return False
        for name in names:
            arch = name.removeprefix(f"{kernel}@").removesuffix(".json")
            if name.startswith(f"{kernel}@") and name.endswith(".json") and arch not in recs:
                other = GenerationRecord.from_json(read_small_json(self.generations_dir / name))
                if other is not None and other.built_at >= min(kept):
                    return False
        return True

    def record_composite(self, rec: CompositeRecord) -> None:
        """Record a composite kernel (`CompositeRecord`): it has no entry of its own, its
        launches are kernels with theirs. Not written again when it holds these bytes."""
        if not is_kernel_name(rec.name):
            raise ValueError(f"composite name {rec.name!r} is not a kernel name")
        self.composites_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        path, data = self.layout.composite(rec.name), rec.dumps()
        if current_bytes(path, len(data)) != data:
            atomic_write(path, data, FILE_MODE)

    def record_manifest(self, manifest: Path, sha256: str, entries: dict[str, dict[str, list[str]]],
                        *, partial: bool, sources: dict[str, str] | None = None) -> None:
        """Record the keys a build of `manifest` (whose bytes hash to `sha256`) planned, per
        kernel and arch, and the SHA-256 of each project source file they read (`sources`);
        a `partial` build adds to the record of the same bytes. The record it replaces stays
        behind it as an earlier build (`ManifestRecord.after`). Not written when the record
        says this already (`built_at`: when a build last changed it)."""
        self.manifests_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        path = self.layout.manifest_record(manifest)
        data = current_bytes(path, MAX_META_BYTES)
        was = ManifestRecord.from_json(_json_or_none(data))
        if data is None and partial:
            was = self.manifest_entries(manifest, sha256)
        old = was if partial and was is not None and was.sha256 == sha256 else None
        now = now_iso()
        new = ManifestRecord(str(manifest), sha256, old.entries if old else {}, now,
                             old.sources if old else {}).merged(entries, now, sources)
        if was is not None and new.same_plan(was) and was.dumps() == data:
            return
        if old is not None and not old.superseded_by(new):
            new = dataclasses.replace(new, earlier=old.earlier)  # added to, nothing replaced
        else:
            new = new.after(was)
        data = new.dumps()
        while new.earlier and len(data) > MAX_META_BYTES // 2:  # the oldest builds go first:
            new = dataclasses.replace(new, earlier=new.earlier[:-1])  # readers stop at the limit
            data = new.dumps()
        atomic_write(path, data, FILE_MODE)

    def forget_build_records(self, manifest: Path, kernel_archs: list[tuple[str, str]]) -> None:
        """Delete the generation records of `kernel_archs` and the record of `manifest`
        (best-effort): a build that could not write them drops the old ones rather than
        leave them stale."""
        for kernel, arch in kernel_archs:
            with contextlib.suppress(OSError):
                self.layout.generation(kernel, arch).unlink()
        with contextlib.suppress(OSError):
            self.layout.manifest_record(manifest).unlink()



def current_bytes(path: Path, limit: int) -> bytes | None:
    """The bytes of the cache's record `path` when writing it again could only rewrite them:
    a regular file of the cache's mode that readers trust (`trust.read_path`), at most
    `limit` bytes; else None (absent, a link, another mode, untrusted, larger, unreadable)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != FILE_MODE or st.st_size > limit:
            return None
        return trust.read_path(path, limit)
    except (OSError, trust.Untrusted):
        return None


def _json_or_none(data: bytes | None) -> Any:
    try:
        return None if data is None else parse_json(data)
    except ValueError:
        return None
