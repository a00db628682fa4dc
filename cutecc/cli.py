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
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def build(manifest: Path | None, archs: tuple[str, ...], cache_dir: Path | None,
          jobs: int | None, kernels: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Compile every kernel, variant and arch of MANIFEST (default: ./kernels.toml)."""
    from cutecc.build import build as run_build
    from cutecc.manifest import find_manifest

    path = manifest or find_manifest()
    bar = _Progress(enabled=not as_json and sys.stderr.isatty())
    report = run_build(path, archs=archs, cache_dir=cache_dir, jobs=jobs, kernels=kernels,
                       dry_run=dry_run, on_done=bar.update)
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


if __name__ == "__main__":  # pragma: no cover
    main()
