"""The command line's conventions: errors, discovery, output formats, help,
verbosity, color, completion, `init`, `env` and `schema`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import PY, REPO, Toy, opts, run_cli, write_toy_project

import cutecc
from cutecc.cli import main
from cutecc.commands.build import Outcome, Progress, build
from cutecc.commands.init import init
from cutecc.entry.rules import is_key
from cutecc.errors import CuteccError
from cutecc.locks import held
from cutecc.manifest import find_manifest, load_manifest
from cutecc.plan.build_plan import Planned, plan
from cutecc.store import Store

LIFECYCLE = [["list"], ["show", "abcd"], ["verify"], ["gc", "--max-size", "1G"], ["rm", "abcd"],
             ["stats"], ["explain", "scale"]]


def invoke(*args: str, **kw) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False, prog_name="cutecc", **kw)


@pytest.mark.parametrize("args", LIFECYCLE, ids=lambda a: a[0])
def test_every_lifecycle_command_on_a_path_without_a_cache_exits_1_with_one_line(
        args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toy_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path / "proj")
    r = invoke(*args, "--cache-dir", str(tmp_path / "none"))
    assert r.exit_code == 1, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: {tmp_path / 'none'}: no cutecc cache here")
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("args, where", [
    (["build", "--nope"], "cutecc build: No such option"),
    (["frobnicate"], "cutecc: No such command"),
    (["gc", "--max-size"], "Option '--max-size' requires an argument"),
    (["build", "--arch", "hopper"], '--arch: "hopper" is not a GPU architecture'),
    (["build", "--arch", "sm_90a;rm"], '--arch: "sm_90a;rm" is not a GPU architecture'),
])
def test_every_input_error_is_one_line_with_exit_2(args: list[str], where: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(write_toy_project(tmp_path / "proj").parent)
    r = invoke(*args)
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and where in r.stderr, r.stderr


def test_help_is_dash_h_and_lists_commands_in_workflow_order() -> None:
    r = invoke("-h")
    assert r.exit_code == 0
    listed = re.findall(r"^  (\w+)\s{2,}", r.stdout.split("Commands:")[1], re.M)
    assert listed[:4] == ["init", "build", "list", "show"] and listed.index("pack") < listed.index("unpack")
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    assert invoke("build", "-h").stdout.startswith("Usage: ")


def test_version_is_read_from_the_package_metadata() -> None:
    import importlib.metadata

    assert cutecc.__version__ == importlib.metadata.version("cutecc")
    assert invoke("--version").stdout.strip().endswith(cutecc.__version__)


def test_the_manifest_is_found_by_walking_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = write_toy_project(tmp_path / "proj")
    deep = tmp_path / "proj" / "toy" / "sub"
    deep.mkdir()
    assert find_manifest(deep) == manifest
    monkeypatch.chdir(deep)
    r = invoke("build", "--dry-run", "--cache-dir", str(tmp_path / "c"))
    assert r.exit_code == 0 and "would build scale[threads=64]@sm_90a" in r.stdout
    monkeypatch.chdir(tmp_path)
    r = invoke("build", "--dry-run", "--cache-dir", str(tmp_path / "c"))
    assert r.exit_code == 2 and "no kernels.toml" in r.stderr and "cutecc init" in r.stderr


def test_every_command_names_the_manifest_with_dash_m(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = write_toy_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)  # nothing to find here
    Store(tmp_path / "c").ensure()
    r = invoke("build", "-m", str(manifest), "--dry-run", "--cache-dir", str(tmp_path / "c"))
    assert r.exit_code == 0 and "would build" in r.stdout
    r = invoke("explain", "scale", "-m", str(manifest), "--cache-dir", str(tmp_path / "c"))
    assert r.exit_code == 0 and "miss" in r.stdout
    r = invoke("pack", "-m", str(manifest), "--name", "x", "--version", "1.0",
               "--cache-dir", str(tmp_path / "c"))
    assert r.exit_code == 1 and "not in the cache" in r.stderr  # found the manifest, nothing built
    r = invoke("build", str(manifest), "-m", str(tmp_path / "other.toml"), "--dry-run")
    assert r.exit_code == 2 and "give the manifest once" in r.stderr
    r = invoke("build", str(manifest), "-m", str(manifest), "--dry-run")  # both, even alike: once
    assert r.exit_code == 2 and "error: MANIFEST: give the manifest once" in r.stderr


def test_every_command_that_reads_a_manifest_takes_it_both_ways(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is named alike everywhere: the argument MANIFEST or -m/--manifest (issue 46:
    `cutecc verify -m` and `cutecc misses kernels.toml` failed)."""
    import click

    from cutecc.cli import main

    ctx = click.Context(main, **main.context_settings)
    readers = {}
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        assert cmd is not None
        params = {p.name: p for p in cmd.params}
        if "manifest" in params or "manifest_opt" in params:
            readers[name] = params
    assert set(readers) == {"build", "tune", "list", "explain", "verify", "misses", "pack"}
    for name, params in readers.items():
        assert isinstance(params["manifest"], click.Argument), name
        assert params["manifest_opt"].opts == ["-m", "--manifest"], name
    manifest = write_toy_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)  # nothing to find here
    cache = str(tmp_path / "c")
    Store(tmp_path / "c").ensure()
    for spelled in ([str(manifest)], ["-m", str(manifest)], ["--manifest", str(manifest)]):
        r = invoke("build", *spelled, "--dry-run", "--cache-dir", cache)
        assert r.exit_code == 0 and "would build" in r.stdout, (spelled, r.stderr)
        r = invoke("misses", *spelled, "--toml", "--cache-dir", cache)
        assert r.exit_code == 0, (spelled, r.stderr)
        r = invoke("list", *spelled, "--cache-dir", cache)
        assert r.exit_code == 0, (spelled, r.stderr)
        r = invoke("verify", *spelled, "--cache-dir", cache)  # read, then refused: it is --deep's
        assert r.exit_code == 2 and "give --deep too" in r.stderr, (spelled, r.stderr)
        r = invoke("tune", *spelled, "--dry-run", "--cache-dir", cache)  # read: it tunes nothing
        assert r.exit_code == 2 and f"{manifest}: no kernel declares a tuning space" in r.stderr, r.stderr


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


def test_every_json_report_has_a_format_and_iso_times(built: Toy) -> None:
    manifest, cache = built.manifest, built.cache
    c = ["--cache-dir", str(cache)]
    key = next(iter(Store(cache).entries())).key
    reports = {
        "build": invoke("build", "-m", str(manifest), *c, "--json"),
        "list": invoke("list", *c, "--json"),
        "show": invoke("show", key[:10], *c, "--json"),
        "explain": invoke("explain", "scale", "-m", str(manifest), *c, "--json"),
        "verify": invoke("verify", *c, "--json"),
        "stats": invoke("stats", *c, "--json"),
        "gc": invoke("gc", "--max-size", "1G", "--dry-run", *c, "--json"),
        "rm": invoke("rm", key[:10], "--dry-run", *c, "--json"),
        "env": invoke("env", *c, "--json"),
    }
    for name, r in reports.items():
        assert r.exit_code == 0, (name, r.output)
        doc = json.loads(r.stdout)
        assert doc["format"] == 1, name
    assert ISO.fullmatch(json.loads(reports["show"].stdout)["last_used"])
    assert all(ISO.fullmatch(e["built_at"]) for e in json.loads(reports["list"].stdout)["entries"])
    rm_doc = json.loads(reports["rm"].stdout)
    assert rm_doc["dry_run"] and [r["key"] for r in rm_doc["removed"]] == [key]
    gc_doc = json.loads(invoke("gc", "--max-size", "0", "--dry-run", *c, "--json").stdout)
    assert gc_doc["removed"] and all(ISO.fullmatch(r["last_used"]) for r in gc_doc["removed"])


def test_quiet_and_verbose(built: Toy) -> None:
    manifest, cache = built.manifest, built.cache
    args = ["build", "-m", str(manifest), "--cache-dir", str(cache)]
    def lines(*flags: str) -> list[str]:  # without the timing, which differs per run
        return [re.sub(r" in \d+\.\d+s ", " in Ts ", x) for x in invoke(*flags, *args).stdout.splitlines()]

    plain = lines()
    assert plain == [line for line in plain if "cached" in line and "built," in line]
    assert len([x for x in lines("-v") if x.startswith("cached  scale[")]) == 2
    assert lines("-q") == plain


def test_color_always_and_never(tmp_path: Path) -> None:
    args = ["list", "--cache-dir", str(tmp_path / "none")]
    assert "\x1b[" in invoke("--color", "always", *args).stderr
    assert "\x1b[" not in invoke("--color", "never", *args).stderr
    assert "\x1b[" not in invoke(*args).stderr  # auto: not a terminal


@pytest.mark.usefixtures("dsl")  # compiles the toy kernel
def test_progress_is_one_plain_line_per_entry_off_a_terminal(tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "proj")
    r = run_cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("[")]
    assert sorted(x.split()[0] for x in lines) == ["[1/2]", "[2/2]"]
    assert all(re.fullmatch(r"\[\d/2\] built   scale\[threads=\d+\]@sm_90a \(\d+\.\ds\)", x) for x in lines)
    q = run_cli("-q", "build", str(manifest), "--cache-dir", str(tmp_path / "c2"))
    assert q.returncode == 0 and q.stderr == ""


@pytest.mark.usefixtures("dsl")  # compiles the toy kernel
def test_a_build_says_when_it_waits_for_another_process(tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    store = Store(tmp_path / "c")
    store.ensure()
    [p] = plan(load_manifest(manifest))
    seen: list[str] = []
    release = threading.Event()

    class Recorder(Progress):
        def waiting(self, planned: Planned) -> None:
            seen.append(planned.label)
            release.set()

        def done(self, outcome: Outcome) -> None:
            seen.append(outcome.status)

    out: list[object] = []
    with held(store.locks_dir / f"{p.key}.lock"):
        t = threading.Thread(target=lambda: out.append(build(manifest, opts(cache_dir=store.root),
                                                             progress=Recorder())))
        t.start()
        assert release.wait(60)
    t.join(300)
    assert seen == ["scale[threads=64]@sm_90a", "built"] and out[0].ok


def test_env_names_versions_cache_and_extras(tmp_path: Path) -> None:
    r = invoke("env", "--cache-dir", str(tmp_path), "--json")
    doc = json.loads(r.stdout)
    assert doc["packages"]["cutecc"] == cutecc.__version__ and doc["cache_dir"] == str(tmp_path)
    assert doc["extras"]["test"] is True and doc["cache"] == "no cache yet"
    try:  # cutecc.torch's framework: the extra is installed exactly when torch is
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    assert doc["packages"].get("torch") == torch_version
    assert doc["extras"]["torch"] is (torch_version is not None)
    text = invoke("env", "--cache-dir", str(tmp_path)).stdout
    assert "apache-tvm-ffi" in text and "python" in text


def test_init_writes_a_starter_that_plans_and_never_overwrites(tmp_path: Path) -> None:
    report = init(tmp_path / "new", name="double")
    manifest = tmp_path / "new" / "kernels.toml"
    assert manifest in report.written and manifest.read_text().startswith("# kernels.toml")
    [p] = plan(load_manifest(manifest))
    assert p.label == "double[threads=128]@sm_90a" and is_key(p.key)
    before = manifest.read_text()
    with pytest.raises(CuteccError, match="already exists") as err:
        init(tmp_path / "new")
    assert err.value.exit_code == 1 and manifest.read_text() == before
    with pytest.raises(CuteccError, match="not a kernel name"):
        init(tmp_path / "other", name="_bad")


@pytest.mark.usefixtures("dsl")  # compiles the starter kernel
def test_the_starter_kernel_builds(tmp_path: Path) -> None:
    init(tmp_path)
    r = run_cli("build", "--cache-dir", str(tmp_path / "c"), cwd=tmp_path)
    assert r.returncode == 0 and "1 built" in r.stdout, r.stderr


def _complete(words: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    parts = words.split(" ")
    r = subprocess.run([str(Path(PY).parent / "cutecc")], capture_output=True, text=True, cwd=cwd,
                       timeout=120, env={**os.environ, "_CUTECC_COMPLETE": "bash_complete", **(env or {}),
                            "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)})
    return [line.split(",", 1)[1] for line in r.stdout.splitlines() if "," in line]


def test_shell_completion_of_kernels_keys_and_archs(built: Toy) -> None:
    manifest, cache = built.manifest, built.cache
    proj = manifest.parent
    assert _complete("cutecc build --kernel s", proj) == ["scale"]
    assert _complete("cutecc build --arch sm_90", proj) == ["sm_90", "sm_90a"]
    keys = sorted(e.key for e in Store(cache).entries())
    got = _complete("cutecc show ", proj, {"CUTECC_CACHE_DIR": str(cache)})
    assert sorted(got) == keys


def test_the_committed_schema_is_what_cutecc_schema_prints() -> None:
    r = invoke("schema")
    assert r.exit_code == 0 and r.stdout == (REPO / "kernels.schema.json").read_text()


@pytest.mark.parametrize("manifest", [REPO / "kernels.toml",
                                      REPO / "tests" / "gpu" / "faulty_kernels" / "kernels.toml",
                                      REPO / "tests" / "gpu" / "train_kernels" / "kernels.toml",
                                      REPO / "examples" / "kernels.toml"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_schema_accepts_the_projects_manifests(manifest: Path) -> None:
    import tomllib

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "kernels.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(tomllib.loads(manifest.read_text()), schema)


def test_the_schema_refuses_what_the_manifest_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "kernels.schema.json").read_text())
    bad = [{"kernel": {"k": {"entry": "m:f", "args": [], "colour": 1}}},
           {"archs": ["sm_90a\n"], "kernel": {"k": {"entry": "m:f", "args": []}}},
           {"kernel": {"k": {"entry": "m:f", "args": [{"name": "x", "dtype": "f8", "shape": [4]}]}}},
           # Names the runtime exposes are capped and never its own
           {"kernel": {"k" * 65: {"entry": "m:f", "args": []}}},
           {"kernel": {"k": {"entry": "m:f", "args": [{"kind": "scalar", "name": "self",
                                                         "dtype": "float32"}]}}}]
    for doc in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)


def test_every_command_takes_the_groups_options_after_its_name_too() -> None:
    """`cutecc build -q` is `cutecc -q build` (pip, pytest, ruff and uv take options after
    the subcommand): -q, -v and --color on every command."""
    from click.testing import CliRunner

    from cutecc.cli import main

    for name in main.list_commands(None):  # type: ignore[arg-type]
        r = CliRunner().invoke(main, [name, "-q", "-v", "--color", "never", "-h"])
        assert r.exit_code == 0 and "--quiet" in r.output, (name, r.output)


def test_quiet_after_the_command_is_as_quiet_as_before_it(toy_project, tmp_path) -> None:
    from click.testing import CliRunner

    from cutecc.cli import main

    args = ["build", str(toy_project), "--dry-run", "--cache-dir", str(tmp_path / "c")]
    before = CliRunner().invoke(main, ["-q", *args])
    after = CliRunner().invoke(main, [*args, "-q"])
    plain = CliRunner().invoke(main, ["-v", *args])
    assert before.exit_code == after.exit_code == plain.exit_code == 0, after.output
    assert after.output.splitlines()[:-1] == before.output.splitlines()[:-1]
    assert len(plain.output.splitlines()) >= len(after.output.splitlines())
