"""The `cutecc` command line: each command parses its arguments, calls one function in
`cutecc.commands`, and prints the report it returns (as text, or as JSON with `--json`).

Conventions: `-h` everywhere; `-q`/`-v` and `--color` before the command; every error
is one line `error: <where>: <what>` on stderr, exit 2 for bad input and 1 for failures
at work; the manifest is found by walking up from the working directory, or named with
the argument MANIFEST or `-m/--manifest` (not both) by every command that reads one.
"""

from __future__ import annotations

import gc as collector  # (`gc` is a command here)
from pathlib import Path

import click

from cutecc import settings
from cutecc.cli import options as cli_options
from cutecc.cli.options import (
    _cache_opt,
    _complete_archs,
    _complete_kernels,
    _complete_keys,
    _emit,
    _given_manifest,
    _Group,
    _json_opt,
    _manifest,
    _manifest_args,
    _remote_opt,
    _sign_opt,
    _trust_opts,
    _verbosity,
    setting_option,
)
from cutecc.errors import CuteccError
from cutecc.settings import BuildOptions


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cutecc", message="%(prog)s %(version)s")
@click.option("-q", "--quiet", count=True, help="Print less (no progress).")
@click.option("-v", "--verbose", count=True, help="Print more (every entry).")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Color in terminal output.")
@click.pass_context
def main(ctx: click.Context, quiet: int, verbose: int, color: str) -> None:
    """Build CuTe DSL kernels ahead of time into a cache, inspect it, and ship it.

    Shell completion: eval "$(_CUTECC_COMPLETE=bash_source cutecc)" (zsh_source, fish_source).
    """
    ctx.obj = {"verbose": verbose - quiet}
    cli_options._color = None if color == "auto" else color == "always"
    ctx.color = cli_options._color


@main.command(short_help="Write a starter kernels.toml and kernel.")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path),
                default=Path("."))
@click.option("--name", default="scale", show_default=True, help="The starter kernel's name.")
@_json_opt
def init(directory: Path, name: str, as_json: bool) -> None:
    """Write a commented kernels.toml and a starter CuTe DSL kernel into DIRECTORY."""
    from cutecc.commands.init import init as run

    _emit(run(directory, name=name), as_json)


@main.command(short_help="Compile every kernel, variant and arch into the cache.")
@_manifest_args
@click.option("--arch", "archs", multiple=True, shell_complete=_complete_archs,
              help="Target arch(s), e.g. sm_90a; overrides the manifest.")
@click.option("--platform", "platforms", multiple=True, type=click.Choice(["x86_64", "aarch64"]),
              help="Host platform(s) of the libraries; overrides the manifest's `platforms`.")
@_cache_opt
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile workers (default: all cores).")
@click.option("--kernel", "kernels", multiple=True, shell_complete=_complete_kernels,
              help="Build only these kernels and what calling them needs: each one's "
                   "backward kernel (a composite backward's launches too) and a composite's "
                   "launches.")
@click.option("--dry-run", is_flag=True, help="Show what would be built; compile nothing.")
@setting_option(settings.READ_ONLY, is_flag=True,
                help="Write nothing to the cache; any miss is an error.")
@click.option("--lock/--no-lock", "lock", default=True, show_default=True,
              help="After a fully successful build, write kernels.lock beside the manifest.")
@click.option("--lock-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the lock here instead.")
@_sign_opt
@setting_option(settings.EXECUTOR, type=click.Choice(["local", "ray"]), default=None,
                help="Compile misses in local processes or as Ray tasks.")
@setting_option(settings.RAY_ADDRESS, default=None,
                help="The Ray cluster to submit to.")
@_remote_opt
@setting_option(settings.REMOTE_WRITE, is_flag=True, default=None,
                help="Upload what this build compiles to the remote.")
@setting_option(settings.COMPILE_TIMEOUT, default=None, metavar="SECONDS",
                help="Stop a compile running longer (0 or off: no limit).")
@setting_option(settings.COMPILE_MEMORY, default=None, metavar="SIZE",
                help="Data memory one compile may use, e.g. 16G (0 or off: no limit).")
@click.option("--timings", is_flag=True,
              help="Say where the build spent its time: per stage, and per compiled entry.")
@_json_opt
def build(manifest: Path | None, manifest_opt: Path | None, archs: tuple[str, ...],
          platforms: tuple[str, ...], cache_dir: Path | None, jobs: int | None,
          kernels: tuple[str, ...], dry_run: bool,
          read_only: bool, lock: bool, lock_file: Path | None, sign_key: Path | None,
          executor: str | None, ray_address: str | None, remote: str | None, remote_write: bool | None,
          compile_timeout: str | None, compile_memory: str | None, timings: bool, as_json: bool) -> None:
    """Compile every kernel, variant and arch of the manifest that is not in the cache."""
    # What the process holds once the build path is imported (~26,000 tracked objects) lives
    # as long as it: the cyclic collector would walk it in every older-generation pass and
    # once more at exit (~50 ms of a 0.55 s no-op, load 3-4), so the imports run with it
    # paused and then leave all of it out of its care (`gc.freeze`, as the compile service
    # does; in a process running many commands, click's test runner, what was alive then
    # is never collected as cyclic garbage).
    paused = collector.isenabled()
    collector.disable()
    try:
        from cutecc.cli.progress import BuildProgress
        from cutecc.commands.build import build as run

        collector.freeze()
    finally:
        if paused:
            collector.enable()
    path = _manifest(manifest, manifest_opt)
    options = BuildOptions.from_environment(  # the flags, else the environment: the one read of it
        cache_dir=cache_dir, jobs=jobs, read_only=read_only, sign_key=sign_key, executor=executor,
        ray_address=ray_address, remote=remote, remote_write=remote_write,
        compile_timeout=compile_timeout, compile_memory=compile_memory)
    progress = BuildProgress(quiet=as_json or _verbosity(click.get_current_context()) < 0)
    try:
        report = run(path, options, archs=archs, platforms=platforms, kernels=kernels, dry_run=dry_run,
                     progress=progress, lock=lock, lock_file=lock_file, timings=timings)
    finally:
        progress.close()
    _emit(report, as_json)


@main.command(short_help="Compile, measure and record a tuning space's winners.")
@_manifest_args
@click.option("--kernel", "kernels", multiple=True, shell_complete=_complete_kernels,
              help="Tune only these kernels.")
@click.option("--bucket", "buckets", multiple=True, help="Measure only these buckets, e.g. n=65536.")
@click.option("--arch", "archs", multiple=True, shell_complete=_complete_archs,
              help="Target arch(s); overrides the manifest.")
@_cache_opt
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel compile workers.")
@click.option("--dry-run", is_flag=True, help="Print the candidate plan; compile and measure nothing.")
@click.option("--compile-only", is_flag=True, help="Compile every candidate (no GPU needed).")
@click.option("--measure", is_flag=True, help="Measure from the cache alone on this GPU (no DSL needed).")
@click.option("--record", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Record a results file measured elsewhere into the lock and the cache.")
@click.option("--check", is_flag=True, help="Measure again; report winners that drifted.")
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write what was measured here (JSON).")
@click.option("--lock/--no-lock", "lock", default=True, show_default=True,
              help="Record winners into kernels.lock.")
@click.option("--lock-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The lock to record into (default: beside the manifest).")
@click.option("--repeats", type=click.IntRange(min=3), default=30, show_default=True,
              help="Timed rounds per bucket (at least; more until the medians settle).")
@click.option("--max-rounds", type=click.IntRange(min=3), default=None,
              help="Timed rounds per bucket at most [default: 4 x --repeats].")
@click.option("--replace-tuning", is_flag=True,
              help="Drop the lock's tuning lines measured under another policy (else refused).")
@click.option("--threshold", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="--check: relative drift reported.")
@_sign_opt
@_json_opt
def tune(manifest: Path | None, manifest_opt: Path | None, kernels: tuple[str, ...],
         buckets: tuple[str, ...], archs: tuple[str, ...], cache_dir: Path | None, jobs: int | None,
         dry_run: bool, compile_only: bool, measure: bool, record: Path | None, check: bool,
         results: Path | None, lock: bool, lock_file: Path | None, repeats: int, max_rounds: int | None,
         replace_tuning: bool, threshold: float, sign_key: Path | None, as_json: bool) -> None:
    """Tune kernels with a [kernel.NAME.tune] space: compile every candidate (CPU), time them
    against the default on a GPU, record the winner per bucket in kernels.lock and the cache."""
    from cutecc.commands.tune import tune as run

    path = _manifest(manifest, manifest_opt)
    options = BuildOptions.from_environment(cache_dir=cache_dir, jobs=jobs, sign_key=sign_key)
    _emit(run(path, options, kernels=kernels, buckets=buckets, archs=archs, dry_run=dry_run,
              compile_only=compile_only, measure=measure, record=record, check=check, results=results,
              lock=lock, lock_file=lock_file, repeats=repeats, threshold=threshold,
              max_rounds=max_rounds, replace_tuning=replace_tuning), as_json)


@main.command("list", short_help="List the cache's entries.")
@_cache_opt
@click.option("--kernel", default=None, shell_complete=_complete_kernels, help="Only this kernel.")
@click.option("--arch", default=None, shell_complete=_complete_archs, help="Only this arch.")
@click.option("--gpu", default=None, metavar="ARCH",
              help="Say how a GPU of this arch (sm_90) runs each entry, and mark what it loads.")
@_manifest_args
@_json_opt
def list_cmd(cache_dir: Path | None, kernel: str | None, arch: str | None, gpu: str | None,
             manifest: Path | None, manifest_opt: Path | None, as_json: bool) -> None:
    """List the cache's entries: kernel, variant, arch, key, size, age, the manifests that built it.
    With MANIFEST (or -m), only the entries that manifest's recorded builds planned."""
    from cutecc.commands.list import list_entries

    _emit(list_entries(cache_dir, kernel=kernel, arch=arch, gpu=gpu,
                       manifest=_given_manifest(manifest, manifest_opt)), as_json)


@main.command(short_help="Show one entry's metadata and files.")
@click.argument("key", shell_complete=_complete_keys)
@_cache_opt
@click.option("--gpu", default=None, metavar="ARCH",
              help="Say whether and how a GPU of this arch (sm_90) runs it.")
@_json_opt
def show(key: str, cache_dir: Path | None, gpu: str | None, as_json: bool) -> None:
    """Show one entry (by KEY or a unique key prefix): metadata and files."""
    from cutecc.commands.show import show as run

    _emit(run(key, cache_dir, gpu), as_json)


@main.command(short_help="Say why a kernel's entries are (not) cached.")
@click.argument("kernel", shell_complete=_complete_kernels)
@_manifest_args
@click.option("--variant", default=None, help="Only this variant (its id, e.g. threads=64).")
@click.option("--arch", default=None, shell_complete=_complete_archs,
              help="Explain for this arch instead of the manifest's.")
@_cache_opt
@_json_opt
def explain(kernel: str, manifest: Path | None, manifest_opt: Path | None, variant: str | None,
            arch: str | None, cache_dir: Path | None, as_json: bool) -> None:
    """Say whether each variant of KERNEL is cached, and for a miss which key inputs changed."""
    from cutecc.commands.explain import explain as run

    _emit(run(kernel, _manifest(manifest, manifest_opt), variant=variant, arch=arch,
              cache_dir=cache_dir), as_json)


@main.command(short_help="Re-hash every entry; find damage and orphans.")
@_manifest_args
@click.option("--fix", is_flag=True,
              help="Move bad entries to quarantine/ (rebuilt by the next build); delete orphans.")
@click.option("--lock", "lock_file", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also name the distributions this kernels.lock was made with that differ here.")
@click.option("--deep", is_flag=True, help="Also compile again every entry MANIFEST plans that the "
              "cache holds (needs the DSL) and report any whose artifact differs from its record.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="With --deep: parallel compile workers (default: all cores).")
@_cache_opt
@_json_opt
def verify(manifest: Path | None, manifest_opt: Path | None, fix: bool, lock_file: Path | None,
           deep: bool, jobs: int | None, cache_dir: Path | None, as_json: bool) -> None:
    """Re-hash every entry against its metadata; find orphans. Exit 1 if anything is wrong.

    With --deep, also compile again what MANIFEST (default: the one found from here) plans
    and the cache holds, in a throwaway directory, and compare each entry's artifact digest."""
    from cutecc.commands.verify import verify as run

    given = _given_manifest(manifest, manifest_opt)
    if given is not None and not deep:
        raise CuteccError("MANIFEST is what --deep compiles again: give --deep too", where="MANIFEST")
    if jobs is not None and not deep:
        raise CuteccError("--jobs is for --deep", where="--jobs")
    if not deep:
        _emit(run(cache_dir, fix=fix, lock=lock_file), as_json)
        return
    from cutecc.cli.progress import BuildProgress

    progress = BuildProgress(quiet=as_json or _verbosity(click.get_current_context()) < 0)
    try:
        report = run(cache_dir, fix=fix, lock=lock_file, deep=_manifest(manifest, manifest_opt), jobs=jobs,
                     progress=progress, options=BuildOptions.from_environment())
    finally:
        progress.close()
    _emit(report, as_json)


@main.command(short_help="Evict least recently used entries.")
@click.option("--max-size", default=None, help="Evict least recently used entries down to this "
              "size (500M, 2G, 1024K, bytes).")
@click.option("--older-than", default=None, help="Remove entries unused for this long (30d, 12h, 90m).")
@click.option("--unreachable", is_flag=True, help="Remove entries that no recorded build, tuning "
              "or --keep-lock file names.")
@click.option("--keep-lock", "keep_locks", multiple=True, type=click.Path(path_type=Path),
              help="With --unreachable: also keep every entry this kernels.lock names (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@_cache_opt
@_json_opt
def gc(max_size: str | None, older_than: str | None, unreachable: bool, keep_locks: tuple[Path, ...],
       dry_run: bool, cache_dir: Path | None, as_json: bool) -> None:
    """Evict entries by least recent use, age or reachability; sweep leftovers of killed builds."""
    from cutecc.commands.gc import gc as run

    _emit(run(cache_dir, max_size=max_size, older_than=older_than, unreachable=unreachable,
              keep_locks=keep_locks, dry_run=dry_run), as_json)


@main.command(short_help="Remove entries by key, kernel or arch.")
@click.argument("keys", nargs=-1, shell_complete=_complete_keys)
@click.option("--kernel", default=None, shell_complete=_complete_kernels,
              help="Remove every entry of this kernel.")
@click.option("--arch", default=None, shell_complete=_complete_archs,
              help="Remove every entry built for this arch.")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@_cache_opt
@_json_opt
def rm(keys: tuple[str, ...], kernel: str | None, arch: str | None, dry_run: bool,
       cache_dir: Path | None, as_json: bool) -> None:
    """Remove entries by KEY or key prefix, --kernel or --arch."""
    from cutecc.commands.rm import rm as run

    _emit(run(cache_dir, keys=keys, kernel=kernel, arch=arch, dry_run=dry_run), as_json)


@main.command(short_help="Entries, bytes, and build hits and misses.")
@_cache_opt
@_json_opt
def stats(cache_dir: Path | None, as_json: bool) -> None:
    """Entries, bytes, and the hits/misses/failures builds recorded."""
    from cutecc.commands.stats import stats as run

    _emit(run(cache_dir), as_json)


@main.command(short_help="Calls kernels' fallbacks served, and the variants to cover them.")
@_manifest_args
@_cache_opt
@click.option("--toml", "as_toml", is_flag=True,
              help="Print the manifest's [kernel.NAME] variants (or archs) that would cover them.")
@_json_opt
def misses(manifest: Path | None, manifest_opt: Path | None, cache_dir: Path | None, as_toml: bool,
           as_json: bool) -> None:
    """The calls no build served, each served by its kernel's declared fallback, counted
    per kernel, call signature and arch (the cache's misses.json)."""
    from cutecc.commands.misses import misses as run

    _emit(run(cache_dir, toml=as_toml, manifest=_given_manifest(manifest, manifest_opt)), as_json)


@main.command(short_help="Write built entries into a wheel or tarball.")
@_manifest_args
@click.option("--lock", "lock", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Pack the entries this kernels.lock names.")
@click.option("--name", required=True, help="Distribution name; its import package is NAME "
              "normalised (my-kernels -> my_kernels).")
@click.option("--version", "version", required=True, help="Distribution version, e.g. 1.0.0.")
@click.option("--arch", "archs", multiple=True, shell_complete=_complete_archs,
              help="Only these archs (one wheel per GPU family).")
@click.option("--platform", "platform", type=click.Choice(["x86_64", "aarch64"]), default=None,
              help="The host platform to pack (one per wheel; needed when the lock has several).")
@click.option("--kernel", "kernels", multiple=True, shell_complete=_complete_kernels,
              help="Only these kernels (and their backward).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Directory to write into.")
@_cache_opt
@click.option("--format", "fmt", type=click.Choice(["wheel", "tar"]), default="wheel",
              show_default=True, help="A pip-installable wheel, or a .tar.gz for `cutecc unpack`.")
@click.option("--runtime-wheel/--no-runtime-wheel", "with_runtime", default=True, show_default=True,
              help="Also write cutecc's own wheel beside a wheel (the runtime the pack requires).")
@click.option("--wheelhouse", is_flag=True,
              help="Also write the wheels of the runtime's dependencies (from pip's index) into "
              "--out, for `pip install --no-index --find-links OUT NAME` on a host with no index.")
@click.option("--with-jax", is_flag=True, help="With --wheelhouse: JAX's wheels too (jax, jaxlib, "
              "numpy, ...); by default the deploy host brings its own.")
@click.option("--python-version", "python_version", default=None, metavar="X.Y",
              help="With --wheelhouse: the deploy host's Python (default: this one's).")
@_sign_opt
@_json_opt
def pack(manifest: Path | None, manifest_opt: Path | None, lock: Path | None, name: str, version: str,
         archs: tuple[str, ...], platform: str | None, kernels: tuple[str, ...], out: Path,
         cache_dir: Path | None, fmt: str, with_runtime: bool, wheelhouse: bool, with_jax: bool,
         python_version: str | None, sign_key: Path | None, as_json: bool) -> None:
    """Write built entries (those --manifest plans, or --lock names) into a reproducible
    wheel (or tarball) for deploy hosts, with each declared fallback's pinned code (what
    serves a call no entry fits there)."""
    from cutecc.commands.pack import pack as run

    _emit(run(name=name, version=version, manifest=_given_manifest(manifest, manifest_opt), lock=lock,
              archs=archs, kernels=kernels, out=out, cache_dir=cache_dir, fmt=fmt,
              sign_key=BuildOptions.from_environment(sign_key=sign_key).sign_key,
              platform=platform, with_runtime=with_runtime, wheelhouse=wheelhouse,
              with_jax=with_jax, python_version=python_version), as_json)


@main.command(short_help="Import a pack's entries into a cache.")
@click.argument("archive", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@_cache_opt
@click.option("--max-members", type=click.IntRange(min=1), default=None,
              help="Refuse an archive of more members (default 50,000).")
@click.option("--max-member-size", default=None, help="Refuse a member larger than this (default 64M).")
@click.option("--max-total-size", default=None, help="Refuse members declaring more in all (default 4G).")
@_trust_opts[0]
@_trust_opts[1]
@_json_opt
def unpack(archive: Path, cache_dir: Path | None, max_members: int | None, max_member_size: str | None,
           max_total_size: str | None, trusted_keys: tuple[Path, ...], allow_unsigned: bool,
           as_json: bool) -> None:
    """Import a pack's entries (wheel or tarball) into a cache, each verified first."""
    import dataclasses

    from cutecc.commands.unpack import unpack as run
    from cutecc.ship.archive import Limits
    from cutecc.units import parse_size

    limits = Limits()
    if max_members is not None:
        limits = dataclasses.replace(limits, members=max_members)
    if max_member_size is not None:
        limits = dataclasses.replace(limits, member_bytes=parse_size(max_member_size, "--max-member-size"))
    if max_total_size is not None:
        limits = dataclasses.replace(limits, total_bytes=parse_size(max_total_size, "--max-total-size"))
    _emit(run(archive, cache_dir, limits=limits, trusted_keys=list(trusted_keys) or None,
              allow_unsigned=allow_unsigned or None, read_only=settings.read_only()), as_json)


@main.command(short_help="Make a key pair for signing locks and packs.")
@click.option("--out", "prefix", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write PREFIX.key (private, 0600) and PREFIX.pub (public).")
@click.option("--comment", default="", help="A note stored with the key (who, what for).")
@_json_opt
def keygen(prefix: Path, comment: str, as_json: bool) -> None:
    """Make an ed25519 key pair: sign with PREFIX.key (build/pack --sign-key), trust
    PREFIX.pub on deploy hosts (unpack --trusted-key, load(trusted_keys=...))."""
    from cutecc.commands.keygen import keygen as run

    _emit(run(prefix, comment), as_json)


@main.command(short_help="Fill a cache with a lock's entries from the remote cache.")
@click.option("--lock", "lock", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The kernels.lock whose entries to fetch.")
@_remote_opt
@click.option("--arch", "archs", multiple=True, shell_complete=_complete_archs,
              help="Only these archs.")
@click.option("--kernel", "kernels", multiple=True, shell_complete=_complete_kernels,
              help="Only these kernels.")
@_cache_opt
@_trust_opts[0]
@_trust_opts[1]
@_json_opt
def fetch(lock: Path, remote: str | None, archs: tuple[str, ...], kernels: tuple[str, ...],
          cache_dir: Path | None, trusted_keys: tuple[Path, ...], allow_unsigned: bool,
          as_json: bool) -> None:
    """Fill a local cache with exactly the entries --lock names, from the remote cache, once
    the lock's signature verifies; each entry is checked against its key, its SHA-256s and
    its lock line. Exit 1 if any is missing or refused."""
    from cutecc.commands.fetch import fetch as run

    _emit(run(lock, BuildOptions.from_environment(cache_dir=cache_dir, remote=remote), archs=archs,
              kernels=kernels,
              trusted_keys=list(trusted_keys) or None, allow_unsigned=allow_unsigned or None), as_json)


@main.command(short_help="Versions, cache and GPU, for bug reports.")
@_cache_opt
@_json_opt
def env(cache_dir: Path | None, as_json: bool) -> None:
    """Print toolchain versions, the cache directory, this device's arch and the extras
    installed: what a bug report needs."""
    from cutecc.commands.env import env as run

    _emit(run(cache_dir), as_json)


@main.command(short_help="Print the JSON Schema of kernels.toml.")
def schema() -> None:
    """Print the JSON Schema of kernels.toml (for editors through taplo or SchemaStore)."""
    from cutecc.manifest.schema import schema_json

    click.echo(schema_json(), nl=False)

