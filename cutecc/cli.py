"""The `cutecc` command line: each command parses its arguments and calls one library function."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import click

from cutecc.errors import CuteccError

_cache_opt = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Cache directory (default: $CUTECC_CACHE_DIR, else the user cache dir).")


class _Group(click.Group):
    """Renders CuteccError as one line on stderr with its exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CuteccError as e:
            click.echo(f"error: {e.render()}", err=True)
            ctx.exit(e.exit_code)


@click.group(cls=_Group)
@click.version_option(package_name="cutecc")
def main() -> None:
    """Build CuTe DSL kernels ahead of time into a cache, and inspect that cache."""


@main.command()
@click.argument("manifest", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--arch", "archs", multiple=True, help="Target arch(s), e.g. sm_90a; overrides the manifest.")
@_cache_opt
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile workers (default: all cores).")
@click.option("--kernel", "kernels", multiple=True, help="Build only these kernels.")
@click.option("--dry-run", is_flag=True, help="Show what would be built; compile nothing.")
@click.option("--read-only", is_flag=True,
              help="Write nothing to the cache; any miss is an error (also $CUTECC_READ_ONLY=1).")
@click.option("--lock/--no-lock", "lock", default=True, show_default=True,
              help="After a fully successful build, write kernels.lock beside the manifest.")
@click.option("--lock-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the lock here instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def build(manifest: Path | None, archs: tuple[str, ...], cache_dir: Path | None,
          jobs: int | None, kernels: tuple[str, ...], dry_run: bool, read_only: bool,
          lock: bool, lock_file: Path | None, as_json: bool) -> None:
    """Compile every kernel, variant and arch of MANIFEST (default: ./kernels.toml)."""
    from cutecc.build import build as run_build
    from cutecc.manifest import find_manifest

    path = manifest or find_manifest()
    bar = _Progress(enabled=not as_json and sys.stderr.isatty())
    report = run_build(path, archs=archs, cache_dir=cache_dir, jobs=jobs, kernels=kernels,
                       dry_run=dry_run, on_done=bar.update, read_only=read_only, lock=lock,
                       lock_file=lock_file)
    bar.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        for o in report.outcomes:
            if o.status == "failed":
                click.echo(f"FAILED {o.planned.label}: {o.error}", err=True)
            elif o.status == "planned":
                click.echo(f"would build {o.planned.label} {o.planned.key[:12]}")
        click.echo(f"{report.count('built')} built, {report.count('cached')} cached, "
                   f"{report.count('failed')} failed"
                   + (f", {report.count('planned')} to build" if dry_run else "")
                   + f" in {report.seconds:.2f}s ({report.cache_dir})")
        if report.lock_changed:
            click.echo(f"wrote {report.lock_file}")
    if not report.ok:
        sys.exit(1)


class _Progress:
    """A one-line progress count on a terminal; silent otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.done = 0

    def update(self, o: Any) -> None:
        if self.enabled:
            self.done += 1
            click.echo(f"\r[{self.done}] {o.status:7} {o.planned.label}\033[K", err=True, nl=False)

    def close(self) -> None:
        if self.enabled and self.done:
            click.echo("\r\033[K", err=True, nl=False)


@main.command("list")
@_cache_opt
@click.option("--kernel", default=None, help="Only entries of this kernel.")
@click.option("--arch", default=None, help="Only entries built for this arch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(cache_dir: Path | None, kernel: str | None, arch: str | None, as_json: bool) -> None:
    """List the cache's entries: kernel, variant, arch, key, size, age."""
    from cutecc.listing import human_age, human_size, list_entries, to_json
    from cutecc.store import Store

    rows = list_entries(cache_dir, kernel=kernel, arch=arch)
    root = Store(cache_dir).root
    if as_json:
        click.echo(json.dumps(to_json(rows, root), indent=1))
        return
    now = dt.datetime.now(dt.timezone.utc)
    table = [("KERNEL", "VARIANT", "ARCH", "KEY", "SIZE", "AGE")] + [
        (r.kernel, r.variant, r.arch, r.key[:12], human_size(r.size), human_age(r.age_seconds(now)))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    click.echo(f"{len(rows)} entries, {human_size(sum(r.size for r in rows))} in {root}")


# Cache lifecycle -----------------------------------------------------------------


@main.command()
@click.argument("key")
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(key: str, cache_dir: Path | None, as_json: bool) -> None:
    """Show one entry (by KEY or a unique key prefix): metadata and files."""
    from cutecc.commands.show import show as run_show
    from cutecc.listing import human_size

    info = run_show(key, cache_dir)
    if as_json:
        click.echo(json.dumps(info, indent=1, sort_keys=True))
        return
    click.echo(f"key        {info['key']}\nentry      {info['label']}\npath       {info['path']}\n"
               f"last used  {info['last_used']}\non disk    {human_size(info['disk_bytes'])}\nfiles")
    for f in info["files"]:
        click.echo(f"  {f['name']}  {f['size']} B  sha256 {f['sha256']}")
    click.echo("metadata")
    for k, v in sorted(info["meta"].items()):
        if k == "key_inputs" and isinstance(v, dict):
            for ik, iv in sorted(v.items()):
                click.echo(f"  key_inputs.{ik}: {json.dumps(iv, sort_keys=True)}")
        elif k != "files":
            click.echo(f"  {k}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}")


@main.command()
@click.option("--fix", is_flag=True,
              help="Move bad entries to quarantine/ (rebuilt by the next build); delete orphans.")
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify(fix: bool, cache_dir: Path | None, as_json: bool) -> None:
    """Re-hash every entry against its metadata; find orphans. Exit 1 if anything is wrong."""
    from cutecc.commands.verify import verify as run_verify

    report = run_verify(cache_dir, fix=fix)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        for p in report.problems:
            click.echo(f"{p.kind:9}  {p.path}: {p.detail}" + (f" -> {p.action}" if p.action else ""))
        click.echo(f"{report.entries} entries, {report.healthy} healthy, "
                   f"{len(report.problems)} problem(s){' (fixed)' if fix and report.ok else ''} "
                   f"in {report.cache_dir}")
    if not report.ok:
        sys.exit(1)


@main.command()
@click.option("--max-size", default=None, help="Evict least recently used entries down to this "
              "size (500M, 2G, 1024K, bytes).")
@click.option("--older-than", default=None, help="Remove entries unused for this long (30d, 12h, 90m).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gc(max_size: str | None, older_than: str | None, dry_run: bool, cache_dir: Path | None,
       as_json: bool) -> None:
    """Evict entries by least recent use; sweep leftovers of killed builds."""
    from cutecc.commands.gc import gc as run_gc
    from cutecc.listing import human_size

    report = run_gc(cache_dir, max_size=max_size, older_than=older_than, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    verb = "would remove" if dry_run else "removed"
    for r in report.removed:
        click.echo(f"{verb} {r['label']} {r['key'][:12]} ({human_size(r['bytes'])})")
    for k in report.busy:
        click.echo(f"skipped {k[:12]}: locked by another process", err=True)
    click.echo(f"{verb} {len(report.removed)} entries "
               f"({human_size(sum(r['bytes'] for r in report.removed))}), kept {report.kept} "
               f"({human_size(report.kept_bytes)}), swept {report.swept_tmp} tmp leftover(s) "
               f"in {report.cache_dir}")


@main.command()
@click.argument("keys", nargs=-1)
@click.option("--kernel", default=None, help="Remove every entry of this kernel.")
@click.option("--arch", default=None, help="Remove every entry built for this arch.")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@_cache_opt
def rm(keys: tuple[str, ...], kernel: str | None, arch: str | None, dry_run: bool,
       cache_dir: Path | None) -> None:
    """Remove entries by KEY or key prefix, --kernel or --arch."""
    from cutecc.commands.rm import rm as run_rm
    from cutecc.listing import human_size

    report = run_rm(cache_dir, keys=keys, kernel=kernel, arch=arch, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in report.removed:
        click.echo(f"{verb} {r['label']} {r['key'][:12]} ({human_size(r['bytes'])})")
    for k in report.busy:
        click.echo(f"error: {k[:12]}: locked by another process (a build?); not removed", err=True)
    if not report.ok:
        sys.exit(1)


@main.command()
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def stats(cache_dir: Path | None, as_json: bool) -> None:
    """Entries, bytes, and the hits/misses/failures builds recorded."""
    from cutecc.commands.stats import stats as run_stats
    from cutecc.listing import human_size

    s = run_stats(cache_dir)
    if as_json:
        click.echo(json.dumps(s, indent=1))
        return
    rate = "-" if s["hit_rate"] is None else f"{100 * s['hit_rate']:.1f}%"
    click.echo(f"cache          {s['cache_dir']}\nentries        {s['entries']} "
               f"({human_size(s['bytes'])}), {s['quarantined']} quarantined\n"
               f"hits           {s['hits']} ({rate})\nmisses         {s['misses']}\n"
               f"failures       {s['failures']}\ncompile saved  {s['seconds_saved']:.1f} s"
               + (f"\nsince          {s['since']}" if s.get("since") else ""))


@main.command()
@click.argument("kernel")
@click.argument("manifest", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--variant", default=None, help="Only this variant (its id, e.g. threads=64).")
@click.option("--arch", default=None, help="Explain for this arch instead of the manifest's.")
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def explain(kernel: str, manifest: Path | None, variant: str | None, arch: str | None,
            cache_dir: Path | None, as_json: bool) -> None:
    """Say whether each variant of KERNEL is cached, and for a miss which key inputs changed."""
    from cutecc.commands.explain import explain as run_explain

    found = run_explain(kernel, manifest, variant=variant, arch=arch, cache_dir=cache_dir)
    if as_json:
        click.echo(json.dumps([x.to_json() for x in found], indent=1))
        return
    for x in found:
        head = f"{x.kernel}[{x.variant}]@{x.arch} {x.key[:12]}"
        if x.cached:
            click.echo(f"{head}: cached")
        elif x.closest is None:
            click.echo(f"{head}: miss; no cached entry of this kernel to compare with")
        else:
            click.echo(f"{head}: miss; closest cached {x.closest_label} {x.closest[:12]} differs in "
                       f"{', '.join(d.input for d in x.differences)}")
            for d in x.differences:
                old, new = _short(d.cached), _short(d.planned)
                click.echo(f"    {d.input}: {old} -> {new}" if old and new else f"    {d.input}")


def _short(value: Any, limit: int = 80) -> str | None:
    """A value as compact JSON (a 64-hex digest cut to 12), or None if too long to show."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= limit else None


# Shipping --------------------------------------------------------------------------


@main.command()
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Pack the entries this manifest plans (they must be built).")
@click.option("--lock", "lock", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Pack the entries this kernels.lock names.")
@click.option("--name", required=True, help="Distribution name; its import package is NAME "
              "normalised (my-kernels -> my_kernels).")
@click.option("--version", "version", required=True, help="Distribution version, e.g. 1.0.0.")
@click.option("--arch", "archs", multiple=True, help="Only these archs (one wheel per GPU family).")
@click.option("--kernel", "kernels", multiple=True, help="Only these kernels (and their backward).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Directory to write into.")
@_cache_opt
@click.option("--format", "fmt", type=click.Choice(["wheel", "tar"]), default="wheel",
              show_default=True, help="A pip-installable wheel, or a .tar.gz for `cutecc unpack`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pack(manifest: Path | None, lock: Path | None, name: str, version: str, archs: tuple[str, ...],
         kernels: tuple[str, ...], out: Path, cache_dir: Path | None, fmt: str, as_json: bool) -> None:
    """Write built entries into a reproducible wheel (or tarball) for deploy hosts."""
    from cutecc.listing import human_size
    from cutecc.pack import pack as run_pack

    r = run_pack(name=name, version=version, manifest=manifest, lock=lock, archs=archs,
                 kernels=kernels, out=out, cache_dir=cache_dir, fmt=fmt)
    if as_json:
        click.echo(json.dumps(r.to_json(), indent=1))
        return
    for arch, s in r.sizes.items():
        click.echo(f"{arch:10} {s['entries']:4} entries  {human_size(s['bytes'])}")
    click.echo(f"{'total':10} {len(r.lock.distinct_keys()):4} entries  {human_size(r.total_bytes)}")
    click.echo(f"wrote {r.path} ({human_size(r.file_bytes)})")


@main.command()
@click.argument("archive", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@_cache_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def unpack(archive: Path, cache_dir: Path | None, as_json: bool) -> None:
    """Import a pack's entries (wheel or tarball) into a cache, each verified first."""
    from cutecc.pack import unpack as run_unpack

    r = run_unpack(archive, cache_dir)
    if as_json:
        click.echo(json.dumps(r.to_json(), indent=1))
    else:
        for e, why in r.refused:
            click.echo(f"error: refused {e}: {why}", err=True)
        click.echo(f"{len(r.imported)} imported, {len(r.present)} already present, "
                   f"{len(r.refused)} refused ({r.cache_dir})")
    if not r.ok:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
