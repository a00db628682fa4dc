"""What every `cutecc` command shares: the one-line error, verbosity and color, help in
workflow order, shell completion of kernels, keys and archs, the common options, and how
a report is printed (text or `--json`). The commands themselves are `cutecc.cli`'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cutecc import settings
from cutecc.errors import CuteccError, ManifestErrors
from cutecc.settings import Setting

# Workflow order, for `cutecc -h`.
_ORDER = ("init", "build", "list", "show", "explain", "verify", "gc", "rm", "stats", "misses", "tune",
          "pack", "unpack", "keygen", "fetch", "env", "schema")


_color: bool | None = None  # --color: None follows the terminal


def _error(message: str) -> None:
    """One error line on stderr, `error:` in red where color is on."""
    click.echo(f"{click.style('error:', fg='red', bold=True)} {message}", err=True, color=_color)


def _more_verbose(by: int) -> Any:
    """A callback adding a command's own -q/-v count to the group's (`_verbosity`)."""
    def callback(ctx: click.Context, param: click.Parameter, value: int) -> None:
        if value:
            root = ctx.find_root()
            root.obj = {**(root.obj or {}), "verbose": int((root.obj or {}).get("verbose", 0)) + by * value}
    return callback


def _set_color(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    global _color
    if value is not None:
        _color = None if value == "auto" else value == "always"
        ctx.color = ctx.find_root().color = _color


class _Command(click.Command):
    """A subcommand that also takes the group's options after its name (`cutecc build -q`),
    as pip, pytest and ruff do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params += [
            click.Option(["-q", "--quiet"], count=True, expose_value=False, callback=_more_verbose(-1),
                         help="Print less (also before the command)."),
            click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_more_verbose(1),
                         help="Print more (also before the command)."),
            click.Option(["--color"], type=click.Choice(["auto", "always", "never"]), default=None,
                         expose_value=False, callback=_set_color,
                         help="Color in terminal output (also before the command)."),
        ]


class _Group(click.Group):
    """Lists commands in workflow order, and renders every error as one line."""

    command_class = _Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ManifestErrors as e:  # every error of the manifest, one line each
            for line in e.lines():
                _error(line)
            ctx.exit(e.exit_code)
        except CuteccError as e:
            _error(e.render())
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:  # the build stopped its workers; one line, no traceback
            _error("interrupted")
            ctx.exit(130)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except (click.Abort, KeyboardInterrupt):
            _error("interrupted")
            sys.exit(130)
        except click.UsageError as e:  # one style for every input error
            if type(e).__name__ == "NoArgsIsHelpError":  # plain `cutecc`: the help, as asked
                click.echo(e.ctx.get_help() if e.ctx else e.format_message())
                sys.exit(0)
            where = e.ctx.command_path if e.ctx else "cutecc"
            _error(f"{where}: {e.format_message()} (see `{where} -h`)")
            sys.exit(e.exit_code)
        except click.ClickException as e:
            _error(e.format_message())
            sys.exit(e.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


def _verbosity(ctx: click.Context) -> int:
    return int((ctx.find_root().obj or {}).get("verbose", 0))


def _emit(report: Any, as_json: bool) -> None:
    """Print a command's report (warnings to stderr first) and exit with its code."""
    ctx = click.get_current_context()
    for line in report.warnings():
        if line.startswith("error: "):
            _error(line[len("error: "):])
        else:
            click.echo(line, err=True, color=_color)
    if as_json:
        click.echo(json.dumps(report.json(), indent=1, sort_keys=False, default=str))
    else:
        for line in report.lines(_verbosity(ctx)):
            click.echo(line)
    ctx.exit(report.exit_code)


# Completion -------------------------------------------------------------------------


def _complete_kernels(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    try:
        from cutecc.manifest import find_manifest, load_manifest

        path = ctx.params.get("manifest") or ctx.params.get("manifest_opt") or find_manifest()
        names = [k.name for k in load_manifest(path).kernels]
    except Exception:
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _complete_keys(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    from cutecc.store.view import StoreView

    try:
        store = StoreView(ctx.params.get("cache_dir"))
        return [CompletionItem(e.key, help=e.recorded.label) for e in store.entries()
                if e.key.startswith(incomplete.lower())][:200]
    except Exception:
        return []


def _complete_archs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    from cutecc.archs import KNOWN

    return [CompletionItem(a) for a in KNOWN if a.startswith(incomplete)]


# Shared options -----------------------------------------------------------------------


def setting_option(row: Setting, *decls: str, help: str, **kw: Any) -> Any:
    """The click option of a setting of `cutecc.settings.TABLE`: its flag from the row, and
    its help saying what else sets it (the variable, the `[build]` key) and the default."""
    assert row.flag is not None, row.env
    also = [f"${row.env}"] + ([f"[build] {row.key}"] if row.key else [])
    text = (f"{help.rstrip('.')} (also {', '.join(also)}"
            + (f"; default: {row.default}" if row.default else "") + ").")
    return click.option(row.flag, *decls, help=text, **kw)


_cache_opt = setting_option(settings.CACHE_DIR, type=click.Path(file_okay=False, path_type=Path),
                            default=None, help="Cache directory.")
_json_opt = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
_remote_opt = setting_option(
    settings.REMOTE, default=None, metavar="s3://BUCKET/PREFIX",
    help="A shared remote cache; endpoint and credentials from the AWS_* variables.")

_MANIFEST_HELP = ("The manifest, also as the argument MANIFEST (default: kernels.toml or "
                  "pyproject.toml [tool.cutecc], found by walking up from the working directory).")


def _manifest_args(f: Any) -> Any:
    """The manifest, named the same way by every command that reads one: the argument
    MANIFEST or `-m/--manifest` (not both; `_manifest` resolves them)."""
    f = click.option("-m", "--manifest", "manifest_opt", type=click.Path(dir_okay=False, path_type=Path),
                     default=None, help=_MANIFEST_HELP)(f)
    return click.argument("manifest", required=False, type=click.Path(dir_okay=False, path_type=Path))(f)


_sign_opt = setting_option(
    settings.SIGNING_KEY, type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Sign the lock with this private key (cutecc keygen).")
_trust_opts = [
    setting_option(settings.TRUSTED_KEYS, "trusted_keys", multiple=True,
                   type=click.Path(dir_okay=False, path_type=Path),
                   help="A public key the lock must be signed by (repeatable)."),
    setting_option(settings.ALLOW_UNSIGNED, is_flag=True, help="Accept a lock no trusted key signed."),
]


def _given_manifest(positional: Path | None, option: Path | None) -> Path | None:
    """The manifest named by MANIFEST or `-m/--manifest`, None when neither; both is an error."""
    if positional is not None and option is not None:
        raise CuteccError(f"give the manifest once, as MANIFEST or as -m/--manifest (given both: "
                          f"{positional} and -m {option})", where="MANIFEST")
    return positional if positional is not None else option


def _manifest(positional: Path | None, option: Path | None) -> Path:
    """The manifest named (`_given_manifest`), else the one found from the working directory."""
    from cutecc.manifest import find_manifest

    return _given_manifest(positional, option) or find_manifest()
