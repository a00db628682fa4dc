"""`cutecc list`: what a cache holds, read from each entry's metadata, with the manifests
that built each (the cache's build records: one cache serves every project of its user)."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cutecc import platforms
from cutecc.archs import check_device_arch, how_runs, runs_on
from cutecc.commands.report import Report
from cutecc.platforms import BUILD_PLATFORM
from cutecc.store.view import StoreView
from cutecc.units import human_age, human_size


@dataclass(frozen=True)
class Row:
    key: str
    kernel: str
    variant: str
    arch: str
    size: int
    built_at: str
    call: str = ""  # the call keywords that reach this entry, "causal=True"
    winner_for: tuple[str, ...] = ()  # tuning buckets this entry wins (`cutecc tune`)
    platform: str = BUILD_PLATFORM  # the host platform of its host code
    on_gpu: str = ""  # with --gpu: how that GPU runs it (`archs.how_runs`); "*" marks what it gets
    manifests: tuple[str, ...] = ()  # the manifests whose recorded builds planned it (paths, sorted)

    def age_seconds(self, now: dt.datetime) -> float:
        try:
            return (now - dt.datetime.fromisoformat(self.built_at)).total_seconds()
        except ValueError:
            return float("nan")


@dataclass(frozen=True)
class ListReport(Report):
    cache_dir: Path
    rows: tuple[Row, ...]
    runtimes: tuple[tuple[str, str, int], ...] = ()  # (key, library, size) of runtime libraries
    gpu: str | None = None  # --gpu: the device arch the ON column is for

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "entries": [asdict(r) for r in self.rows],
                "runtimes": [{"key": k, "library": lib, "size": n} for k, lib, n in self.runtimes],
                "total": {"entries": len(self.rows), "bytes": sum(r.size for r in self.rows)}}

    def lines(self, verbose: int = 0) -> list[str]:
        now = dt.datetime.now(dt.timezone.utc)
        on = (f"ON {self.gpu}",) if self.gpu else ()
        table = [("KERNEL", "VARIANT", "ARCH", "KEY", "SIZE", "AGE", *on, "MANIFEST", "CALL WITH")] + [
            (r.kernel, r.variant, r.arch + platforms.suffix(r.platform), r.key[: 64 if verbose > 0 else 12],
             human_size(r.size), human_age(r.age_seconds(now)), *((r.on_gpu,) if self.gpu else ()),
             ", ".join(_shown(m) for m in r.manifests) or "-", r.call) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
        out += [f"{r.kernel}[{r.variant}] {r.key[:12]} is the tuned winner for {w}"
                for r in self.rows for w in r.winner_for]
        rt = (f" (+ {len(self.runtimes)} runtime librar{'y' if len(self.runtimes) == 1 else 'ies'}, "
              f"{human_size(sum(n for _, _, n in self.runtimes))})" if self.runtimes else "")
        if self.gpu:
            out.append(f"* what a {self.gpu} GPU loads per variant: exact machine code, then family or "
                       "older minor, then PTX (docs/archs.md)")
        out.append(f"{len(self.rows)} entries, {human_size(sum(r.size for r in self.rows))}{rt} "
                   f"in {self.cache_dir}")
        return out


def call_text(call: Any) -> str:
    """Call keywords as a caller writes them (`causal=True`); "" for none."""
    if not isinstance(call, dict):
        return ""
    return ", ".join(f"{k}={v!r}" for k, v in call.items())[:200]


def _shown(path: str) -> str:
    """A recorded manifest path as printed: relative to the working directory when under it,
    control characters escaped (a record's text is never printed raw)."""
    with_cwd = os.getcwd() + os.sep
    text = path[len(with_cwd):] if path.startswith(with_cwd) else path
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _names(recorded: str, path: Path) -> bool:
    """Whether a recorded manifest path names `path` (a malformed one names nothing)."""
    try:
        return Path(recorded).resolve() == path
    except (OSError, ValueError):
        return False


def built_by(store: StoreView) -> dict[str, set[str]]:
    """Key -> the manifests whose recorded builds (newest and the earlier ones a record
    keeps) planned it; a generation record's manifest for keys no manifest record names."""
    out: dict[str, set[str]] = {}
    for rec in store.manifest_records():
        if rec.manifest:
            for key in rec.named_keys():
                out.setdefault(key, set()).add(rec.manifest)
    for name in store.kernel_names():
        for gen in store.generation_records(name):
            if gen.manifest:
                for key in gen.keys or ():
                    if key not in out:
                        out[key] = {gen.manifest}
    return out


def list_entries(cache_dir: str | Path | None = None, *, kernel: str | None = None,
                 arch: str | None = None, gpu: str | None = None,
                 manifest: str | Path | None = None) -> ListReport:
    """One row per published entry, sorted by kernel, variant and arch (no cache: exit 1),
    each with the manifests that built it; `manifest` keeps those that manifest built.
    With `gpu` (a device arch, `sm_90`), how that GPU runs each, the one it would load per
    kernel, variant and host platform marked `*` (the runtime's rule, `archs.runs_on`)."""
    from cutecc.runtime.tuning import winners_in

    store = StoreView(cache_dir).require()
    wins = winners_in(store.root)
    by = built_by(store)
    only = None if manifest is None else Path(manifest).resolve()
    rows = []
    for e in store.entries():
        m = e.recorded  # damaged entries are listed too (`cutecc verify` names them)
        if (kernel and m.kernel != kernel) or (arch and m.arch != arch):
            continue
        mans = tuple(sorted(by.get(e.key, ())))
        if only is not None and not any(_names(p, only) for p in mans):
            continue
        rows.append(Row(e.key, str(m.kernel), str(m.variant), str(m.arch), e.size,
                        "" if m.built_at is None else str(m.built_at), call_text(dict(m.call)),
                        tuple(wins.get(e.key, ())), m.platform, manifests=mans))
    rows.sort(key=lambda r: (r.kernel, r.variant, r.arch, r.platform, r.key))
    if gpu is not None:
        rows = _on_gpu(rows, check_device_arch(gpu, "--gpu"))
    runtimes = tuple((e.key, str(e.recorded.library), e.size) for e in store.runtimes())
    return ListReport(store.root, tuple(rows), runtimes, gpu)


def _on_gpu(rows: list[Row], gpu: str) -> list[Row]:
    """`rows` with how `gpu` runs each, the best of each kernel, variant and platform
    marked `*` (the newest of equals, as the runtime picks)."""
    best: dict[tuple[str, str, str], tuple[tuple[int, str], str]] = {}
    for r in rows:
        score = (runs_on(r.arch, gpu), r.built_at)
        k = (r.kernel, r.variant, r.platform)
        if score[0] and (k not in best or score > best[k][0]):
            best[k] = (score, r.key)
    return [replace(r, on_gpu=("* " if best.get((r.kernel, r.variant, r.platform), (0, ""))[1] == r.key
                               else "") + how_runs(r.arch, gpu)) for r in rows]
