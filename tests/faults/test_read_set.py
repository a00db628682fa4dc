"""A compile proves what it read (`cutecc.build.read_set`): every file a build worker opened,
imported or listed is covered by the job's key with the content the key saw, or the entry is
refused naming the file, the module that read it and what to declare. Real compiles of small
kernels through the DSL (CPU only)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, REPO, TOY_KERNEL, resident_services, stop_resident_services, toy_manifest

from cutecc.build import read_installed, read_set
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from cutecc.store import Store, homes

from .conftest import assert_clean_failure, cli

# The toy kernel with its block size read, while the DSL traces it, from a data file beside
# the project: nothing but `[build] inputs` keys that file.
TRACE_READS = TOY_KERNEL.replace(
    "@cute.jit\ndef scale(", '''\
def _width():
    import json
    import pathlib
    with open(pathlib.Path(__file__).parent.parent / "widths.json") as f:
        return json.load(f)["threads"]


@cute.jit
def scale(''', 1).replace("    n = x.shape[0]\n    _scale_kernel",
                          "    n = x.shape[0]\n    threads = _width()\n    _scale_kernel", 1)


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CUTECC_SERVICE_IDLE": "0", **more}


def _project(root: Path, inputs: str = "") -> Path:
    (root / "toy").mkdir(parents=True, exist_ok=True)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "ops.py").write_text(TRACE_READS)
    (root / "widths.json").write_text('{"threads": 64}\n')
    (root / "kernels.toml").write_text(toy_manifest(threads=(32,)) + inputs)
    return root / "kernels.toml"


def _keys(manifest: Path) -> list[str]:
    return [p.key for p in plan(load_manifest(manifest))]


@pytest.mark.usefixtures("dsl")
def test_a_file_the_trace_reads_that_nothing_keys_fails_the_entry_and_declared_it_is_keyed(
        tmp_path: Path) -> None:
    manifest = _project(tmp_path / "proj")
    data = tmp_path / "proj" / "widths.json"
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c1"), "--no-lock", env=_env())
    assert_clean_failure(r, 1, f"the compile read {data} (module toy.ops)", "which its key does not cover",
                         "[build] inputs")
    assert not list(Store(tmp_path / "c1").entries()), "an entry was published"
    # declared, it builds; its content is in the key, so an edit re-keys
    manifest.write_text(manifest.read_text() + '\n[build]\ninputs = ["widths.json"]\n')
    before = _keys(manifest)
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c1"), "--no-lock", "--json", env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    [entry] = Store(tmp_path / "c1").entries()
    assert entry.doc["key_inputs"]["inputs"] == {"widths.json": hashlib.sha256(data.read_bytes()).hexdigest()}
    assert len(entry.doc["read_set"]) == 64
    data.write_text('{"threads": 96}\n')
    after = _keys(manifest)
    assert after != before
    # a project that declares nothing keeps its keys (no "inputs" key input at all)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "kernels.toml").write_text(toy_manifest(threads=(32,)))
    (plain / "toy").mkdir()
    (plain / "toy" / "__init__.py").write_text("")
    (plain / "toy" / "ops.py").write_text(TOY_KERNEL)
    assert "inputs" not in plan(load_manifest(plain / "kernels.toml"))[0].inputs


def test_a_declared_input_must_exist_and_stay_inside_the_project(tmp_path: Path) -> None:
    manifest = _project(tmp_path / "proj", '\n[build]\ninputs = ["nothing*.json"]\n')
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--dry-run", env=_env())
    assert_clean_failure(r, 2, "\"nothing*.json\" matches no file", "build.inputs")
    for bad in ("../x.json", " /etc/passwd", " ~/x.json", " ../x.json"):  # (spaces are stripped)
        manifest.write_text(toy_manifest(threads=(32,)) + f'\n[build]\ninputs = ["{bad}"]\n')
        r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--dry-run", env=_env())
        assert_clean_failure(r, 2, "build.inputs[0]", "inside its directory")


# the exempt list ----------------------------------------------------------------------


def test_the_exempt_list_is_short_and_exempts_nothing_of_a_project_or_installed_code() -> None:
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    assert read_set.exempt(os.path.join(stdlib, "json", "__init__.py")) == "the standard library"
    for pseudo in ("/proc/self/maps", "/sys/devices/x", "/dev/null"):
        assert read_set.exempt(pseudo) == "the kernel's pseudo-files"
    assert read_set.exempt("/etc/ld.so.cache") and read_set.exempt("/usr/share/zoneinfo/UTC")
    assert read_set.exempt("/usr/lib/x86_64-linux-gnu/libstdc++.so.6") == "the system's shared libraries"
    assert read_set.exempt(read_set.__file__) == "cutecc's own package"
    # its folder listed (importlib.metadata's version("cutecc") through an editable install)
    assert read_set.exempt(str(Path(read_set.__file__).parents[1])) == "cutecc's own package"
    beside = Path(read_set.__file__).parents[2]  # cutecc's metadata, which torch's entry points read
    assert read_set.exempt(str(beside / "cutecc.egg-info" / "entry_points.txt")) == "cutecc's own package"
    assert read_set.exempt(str(beside / "cutecc-0.1.0.dist-info" / "METADATA")) == "cutecc's own package"
    assert read_set.exempt(str(beside / "other.egg-info" / "entry_points.txt")) is None
    wraps = str(homes.wrappers())
    for wrap in ("cutecc_wrapper_0123456789abcdef.py",
                 "__pycache__/cutecc_wrapper_0123456789abcdef.cpython-311.pyc"):
        assert read_set.exempt(os.path.join(wraps, wrap), read_set.temp_dirs(None, None)) \
            == "the worker's temporary files"
    for other in ("widths.json", "cutecc_wrapper_x.py", "sub/cutecc_wrapper_0123456789abcdef.py"):
        assert read_set.exempt(os.path.join(wraps, other), read_set.temp_dirs(None, None)) is None, other
    purelib = sysconfig.get_paths()["purelib"]
    for path in (os.path.join(purelib, "numpy", "__init__.py"), os.path.join(purelib, "x", "lib.so"),
                 os.path.join(stdlib, "site-packages", "x.py"), "/etc/passwd",
                 "/usr/lib/python3/dist-packages/a.so",
                 os.path.join(sys.base_prefix, "lib", "python3", "dist-packages", "x", "_y.so"),
                 os.path.join(tempfile.gettempdir(), "widths.json"), "/usr/share/doc/x", "/root/.cache/x"):
        assert read_set.exempt(path, read_set.temp_dirs(None, None)) is None, path


def test_the_store_named_relative_to_the_build_and_the_ptx_dumps_are_the_workers_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--cache-dir DIR` relative to the build's directory (tests/gpu/prepare.sh's) and the
    DSL's PTX dump folders (`tempfile`'s `cutecc-ptx-XXXX`): what the hook records there
    (absolute) is the worker's own, not a read the key must cover."""
    monkeypatch.chdir(tmp_path)
    temps = read_set.temp_dirs(None, "caches/root")
    lock = str(tmp_path / "caches" / "root" / "locks" / "ab.lock")
    assert read_set.exempt(lock, temps) == "the worker's temporary files"
    dump = os.path.join(tempfile.gettempdir(), "cutecc-ptx-k2j4x", "kernel.ptx")
    assert read_set.exempt(dump, temps) == "the worker's temporary files"
    assert read_set.exempt(str(tmp_path / "caches" / "other.json"), temps) is None
    # cutecc's own homes a compile for aarch64 uses (CI saw the link inputs' lock refused)
    for d in (homes.platform_libs(), homes.zig()):
        assert read_set.exempt(str(d / ".5c807217f134272d.lock"), temps) == "the worker's temporary files"


def test_installed_folders_stop_at_their_sys_path_entry() -> None:
    """A venv inside the project (the README's `.venv`, under the python_path root): the
    folders of installed files are those below their `sys.path` entry, never the entry's
    parents (the project root among them), so listing a distribution's folder is covered
    wherever the venv lies, and listing the project's own folders is not (CI once saw
    `nvidia_cutlass_dsl/cu13/lib` refused with the venv in the checkout)."""
    import sysconfig

    read_set.warm()
    purelib = os.path.normpath(sysconfig.get_paths()["purelib"])
    assert os.path.join(purelib, "nvidia_cutlass_dsl", "cu13", "lib") in read_installed.OWNED_DIRS
    for parent in (purelib, os.path.dirname(purelib), str(REPO), "/"):
        assert parent not in read_installed.OWNED_DIRS, parent


def test_the_hook_records_reads_listings_and_who_read_them_but_not_writes(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from cutecc.build import read_installed, read_set
        read_set.install()
        read_set.begin_job()
        (open({str(tmp_path / 'w.txt')!r}, 'w')).close()
        import reader_mod
        os.listdir({str(tmp_path)!r})
        got = read_set.recorded()
        print(json.dumps({{"r": {str(tmp_path / 'data.txt')!r} in got,
                          "w": {str(tmp_path / 'w.txt')!r} in got,
                          "mod": any(p.endswith('reader_mod.py') or 'reader_mod.cpython' in p for p in got),
                          "dir": read_set._DIRS + {str(tmp_path)!r} in got,
                          "who": read_set._who.get({str(tmp_path / 'data.txt')!r})}}))
    """)
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "reader_mod.py").write_text(f"open({str(tmp_path / 'data.txt')!r}).read()\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"r": True, "w": False, "mod": True, "dir": True, "who": "reader_mod"}


# seen 1: an installed package's data file behind a resident service ----------------------

INSTALLED_KERNEL = TOY_KERNEL.replace("import cutlass\n", '''\
import json
import pathlib

import cutlass
''', 1).replace("threads: cutlass.Constexpr = 128", "threads: cutlass.Constexpr = WIDTH", 1) \
    .replace("@cute.kernel", 'WIDTH = json.loads((pathlib.Path(__file__).parent / "widths.json").read_text())'
             '["threads"]\n\n\n@cute.kernel', 1)


def _record_row(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def _install(site: Path) -> Path:
    """A non-editable distribution `widthpkg` in directory `site` (as an installer leaves it)."""
    pkg = site / "widthpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(INSTALLED_KERNEL)
    (pkg / "widths.json").write_text('{"threads": 64}\n')
    info = site / "widthpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widthpkg\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("widthpkg\n")
    (info / "INSTALLER").write_text("pip\n")
    info_files = [f"widthpkg-1.0.dist-info/{n}" for n in ("METADATA", "top_level.txt", "INSTALLER")]
    rows = [_record_row(site, r) for r in ("widthpkg/__init__.py", "widthpkg/ops.py", "widthpkg/widths.json",
                                           *info_files)]
    (info / "RECORD").write_text("\n".join([*rows, "widthpkg-1.0.dist-info/RECORD,,"]) + "\n")
    return pkg / "widths.json"


@pytest.fixture
def run_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    yield d
    stop_resident_services(d)
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _libraries(cache: Path) -> dict[str, str]:
    return {e.key: hashlib.sha256((e.path / e.doc["library"]).read_bytes()).hexdigest()
            for e in Store(cache).entries()}


@pytest.mark.usefixtures("dsl")
def test_a_resident_service_that_read_an_edited_data_file_never_serves_the_new_key(
        tmp_path: Path, run_dir: Path) -> None:
    data = _install(tmp_path / "site")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "kernels.toml").write_text(toy_manifest(threads=(32,)).replace(
        'entry = "toy.ops:scale"', 'entry = "widthpkg.ops:scale"').replace(
        'constants = { threads = "$threads" }\n', "").replace("variants = { threads = [32] }\n", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "site")]),
           "XDG_RUNTIME_DIR": str(run_dir), "CUTECC_SERVICE_IDLE": "120"}

    def build(cache: str, **more: str) -> dict[str, Any]:
        r = subprocess.run([PY, "-m", "cutecc.cli", "build", str(proj / "kernels.toml"), "--cache-dir",
                            str(tmp_path / cache), "--no-lock", "--json"], capture_output=True, text=True,
                           env={**env, **more}, timeout=600, cwd=proj)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return json.loads(r.stdout)

    first = build("c")
    assert first["workers"] == "fork (resident)"
    assert resident_services(run_dir)
    data.write_text('{"threads": 96}\n')  # edited in place, the same size
    second = build("c")
    [(key, lib)] = [(k, v) for k, v in _libraries(tmp_path / "c").items()
                    if k == second["entries"][0]["key"]]
    assert key != first["entries"][0]["key"]  # the file is keyed: its distribution is small
    fresh = build("fresh", CUTECC_WORKERS="spawn")  # a worker that never saw the old file
    assert fresh["entries"][0]["key"] == key
    assert _libraries(tmp_path / "fresh")[key] == lib, "the entry under the new key holds the old width"


def test_an_installed_file_edited_before_its_record_was_touched_is_not_vouched_for_by_its_stat(
        tmp_path: Path) -> None:
    """A file of a distribution the key does not name, edited (same size) and then its RECORD
    touched (a `chmod -R`, a `touch`): its ctime is before the RECORD's, but after the
    INSTALLER's, so the planner's stat rule (`cutecc.toolchain.recordstat`) hashes it, and so
    must the read-set check: the edit is refused, an untouched install is not."""
    import time

    site = tmp_path / "site"
    info = site / "fakedist-1.0.dist-info"
    info.mkdir(parents=True)
    mod = site / "fakemod.py"
    mod.write_text("VALUE = 1\n")
    time.sleep(0.05)
    (info / "INSTALLER").write_text("pip\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(mod.read_bytes()).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fakemod.py,sha256={digest},{mod.stat().st_size}\n"
                                 "fakedist-1.0.dist-info/RECORD,,\n")
    code = textwrap.dedent(f"""
        import sys, types
        sys.path.insert(0, {str(site)!r})
        from cutecc.build import read_installed, read_set
        read_set.warm()
        d = read_installed.Dists(types.SimpleNamespace(key_inputs={{}}), None)
        print(d.problem("fakedist", "fakemod.py", {str(mod)!r}))
    """)

    def problem() -> str:
        time.sleep(2.2)  # the RECORD's stamp settled (`hashcache.SETTLE_NS`)
        r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert problem() == "None"
    mod.write_text("VALUE = 2\n")  # same size
    time.sleep(0.05)
    os.utime(info / "RECORD")
    got = problem()
    assert "differs from its RECORD" in got and str(mod) in got, got


def test_a_file_read_through_proc_is_the_file_itself_not_a_pseudo_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/self/root/... and /proc/self/cwd/... name ordinary files: read so, a project's
    data file is still one the key must cover, never exempt as the kernel's pseudo-files."""
    (tmp_path / "sub").mkdir()
    data = tmp_path / "widths.json"
    data.write_text("{}")
    monkeypatch.chdir(tmp_path / "sub")
    for raw in ("/proc/self/root" + str(data), "/proc/self/cwd/../widths.json"):
        path, target, why = read_set._facts_of(raw)
        assert (path, target, why) == (str(data), str(data), None), raw
    assert read_set._facts_of("/proc/self/maps")[2] == "the kernel's pseudo-files"


# reads that hid from the hook (seen by attacking issue 44's result) -----------------

_DATA = '__file__.rsplit("/toy/", 1)[0] + "/widths.json"'
HIDDEN_READS = {
    # /proc/self/root/<path> names any file; /proc was exempt as the kernel's pseudo-files
    "proc-root": ("proc", f'import json\nreturn json.load(open("/proc/self/root" + {_DATA}))["threads"]',
                  "the compile read {data} (module toy.ops)"),
    # "a+" reads what is there (after a seek); every append mode was taken for a write
    "append-plus": ("a+", f'import json\nf = open({_DATA}, "a+")\nf.seek(0)\nreturn json.load(f)["threads"]',
                    "the compile read {data} (module toy.ops)"),
    # a process the trace starts reads what no audit hook of this one sees
    "subprocess": ("sub", f'import json, subprocess\nreturn json.loads(subprocess.run(["cat", {_DATA}], '
                          'capture_output=True).stdout)["threads"]',
                   "the compile started a process (['cat', '{data}'], module toy.ops)"),
    # os.open(relative, dir_fd=) of an exempt directory: the event carries no dir_fd
    "dir-fd": ("dirfd", 'import json, os\nd = os.open("/dev", os.O_RDONLY)\nfd = os.open("../" + ('
                        + _DATA + ').lstrip("/"), os.O_RDONLY, dir_fd=d)\n'
                        'return json.load(os.fdopen(fd))["threads"]',
               "relative to a directory descriptor (os.open's dir_fd), which cannot be checked"),
    # the generated wrappers' directory is this user's: only the wrappers in it are exempt
    "wrapper-dir": ("wrap", f'import json, os\np = os.path.join({str(homes.wrappers())!r}, '
                            '"planted-{tag}.json")\n'
                            'return json.load(open(p))["threads"]',
                    "planted-{tag}.json (module toy.ops), which its key does not cover"),
}


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("case", sorted(HIDDEN_READS))
def test_a_read_that_hid_from_the_hook_still_fails_the_entry(tmp_path: Path, case: str) -> None:
    _, body, said = HIDDEN_READS[case]
    proj = tmp_path / "proj"
    manifest = _project(proj)
    tag = tmp_path.name
    (proj / "toy" / "ops.py").write_text(TOY_KERNEL.replace(
        "@cute.jit\ndef scale(", "def _width():\n" + textwrap.indent(body.replace("{tag}", tag), "    ")
        + "\n\n\n@cute.jit\ndef scale(", 1).replace(
        "    n = x.shape[0]\n    _scale_kernel",
        "    n = x.shape[0]\n    threads = _width()\n    _scale_kernel", 1))
    planted = homes.wrappers() / f"planted-{tag}.json"
    if case == "wrapper-dir":
        planted.parent.mkdir(mode=0o700, exist_ok=True)
        planted.write_text('{"threads": 64}\n')
    try:
        r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--no-lock", env=_env())
    finally:
        planted.unlink(missing_ok=True)
    assert_clean_failure(r, 1, "not published", said.format(data=proj / "widths.json", tag=tag))
    assert not list(Store(tmp_path / "c").entries()), "an entry was published"


@pytest.mark.usefixtures("dsl")
def test_byte_code_stamped_with_its_source_but_other_code_fails_the_entry(tmp_path: Path) -> None:
    """The import trusts a `.pyc` whose header names the source's mtime and size; the key
    hashes the source. A planted one ran other code under the source's key."""
    import importlib.util
    import marshal
    import struct

    proj = tmp_path / "proj"
    manifest = _project(proj)
    (proj / "toy" / "ops.py").write_text(TOY_KERNEL.replace(
        "    n = x.shape[0]\n    _scale_kernel",
        "    from toy import widths\n    n = x.shape[0]\n    threads = widths.T\n    _scale_kernel", 1))
    src = proj / "toy" / "widths.py"
    src.write_text("T = 64\n")
    st = src.stat()
    pyc = Path(importlib.util.cache_from_source(str(src)))
    pyc.parent.mkdir(exist_ok=True)
    other = compile(f"open({str(tmp_path / 'ran')!r}, 'w').close()\nT = 96\n", str(src), "exec")
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(st.st_mtime), st.st_size)
                    + marshal.dumps(other))
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--no-lock", env=_env())
    assert_clean_failure(r, 1, "not published", f"it ran the byte code {pyc}", "delete it")
    assert not list(Store(tmp_path / "c").entries()), "an entry was published"
    pyc.unlink()  # the import writes its own byte code, which then matches: it builds
    for cache in ("c", "c2"):
        r = cli("build", str(manifest), "--cache-dir", str(tmp_path / cache), "--no-lock", env=_env())
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.usefixtures("dsl")
def test_a_sitecustomize_that_ran_before_the_hook_fails_the_entry(tmp_path: Path) -> None:
    """A `sitecustomize.py` on `$PYTHONPATH` runs in every worker before the hook is installed:
    it read `widths.json`, and the kernel compiled its width under a key naming neither (an
    edit, then a fresh cache, built other bytes under the same key)."""
    proj = tmp_path / "proj"
    manifest = _project(proj)
    (proj / "toy" / "ops.py").write_text(TOY_KERNEL.replace(
        "    n = x.shape[0]\n    _scale_kernel",
        "    import builtins\n    n = x.shape[0]\n    threads = getattr(builtins, 'WIDTH', 64)\n"
        "    _scale_kernel", 1))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import builtins, json\n"
        f"builtins.WIDTH = json.load(open({str(proj / 'widths.json')!r}))['threads']\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(REPO), str(site)]))
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--no-lock", env=env)
    assert_clean_failure(r, 1, "not published", f"the worker ran {site / 'sitecustomize.py'} (sitecustomize, "
                         "run at interpreter start), which its key does not cover")
    assert not list(Store(tmp_path / "c").entries()), "an entry was published"


def test_installed_byte_code_is_vouched_for_by_stat_only_as_the_install_compiled_it(tmp_path: Path) -> None:
    """The check compiles a keyed source again to compare it with the `.pyc` the import ran
    (74 files of FA4's and quack's closures, most of a worker's first check), except where
    the install that wrote the source compiled that byte code (`read_installed.installed_byte_code`):
    both listed in one sealed RECORD (the `.pyc` with no digest, as pip lists what it
    byte-compiles), the source's row naming the key's SHA-256, neither changed since its
    INSTALLER. A `.pyc` planted after the install (stamped with the source's mtime and size,
    holding other code), one the wheel shipped with a digest, one the RECORD does not list
    (Python wrote it at an import), or a source whose row is not what the key hashed, is
    compared by compiling, as before."""
    import importlib.util
    import marshal
    import py_compile
    import struct
    import time

    site = tmp_path / "site"
    text = "VALUE = 1\n"
    sha = hashlib.sha256(text.encode()).hexdigest()
    row = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    cases = {"untouched": "", "planted": "", "shipped": "sha256=" + row, "unlisted": None}
    site.mkdir()
    for name in cases:
        src = site / f"mod_{name}.py"
        src.write_text(text)
        pyc = Path(importlib.util.cache_from_source(str(src)))
        py_compile.compile(str(src), str(pyc), doraise=True)  # the installer byte-compiles...
    time.sleep(0.05)
    for name, pyc_digest in cases.items():
        info = site / f"dist_{name}-1.0.dist-info"
        info.mkdir()
        (info / "INSTALLER").write_text("pip\n")  # ...then writes its INSTALLER and RECORD
        pyc_rel = os.path.relpath(importlib.util.cache_from_source(str(site / f"mod_{name}.py")), site)
        (info / "RECORD").write_text(f"mod_{name}.py,sha256={row},{len(text)}\n"
                                     + (f"{pyc_rel},{pyc_digest},\n" if pyc_digest is not None else "")
                                     + f"{info.name}/RECORD,,\n")
    time.sleep(0.05)
    src = site / "mod_planted.py"  # other code, stamped with the source's mtime and size
    st = src.stat()
    Path(importlib.util.cache_from_source(str(src))).write_bytes(
        importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(st.st_mtime), st.st_size)
        + marshal.dumps(compile("VALUE = 2\n", str(src), "exec")))
    time.sleep(2.2)  # the RECORDs' stamps settled (`hashcache.SETTLE_NS`)
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.path.insert(0, {str(site)!r})
        from cutecc.build import read_installed
        out = {{}}
        for name in {list(cases)!r}:
            src = {str(site)!r} + f"/mod_{{name}}.py"
            pyc = importlib.util.cache_from_source(src)
            out[name] = read_installed.installed_byte_code(pyc, src, {sha!r})
        src = {str(site)!r} + "/mod_untouched.py"
        out["other source"] = read_installed.installed_byte_code(
            importlib.util.cache_from_source(src), src, "0" * 64)
        print(json.dumps(out))
    """)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"untouched": True, "planted": False, "shipped": False,
                                    "unlisted": False, "other source": False}


# what a compile service's preloaded imports did, charged only where a job reaches it ------


def _dist(site: Path, name: str, files: dict[str, str]) -> None:
    """A non-editable distribution `name` holding `files` in directory `site`."""
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    rows = [_record_row(site, r) for r in [*files, f"{name}-1.0.dist-info/METADATA",
                                           f"{name}-1.0.dist-info/INSTALLER"]]
    (info / "RECORD").write_text("\n".join([*rows, f"{name}-1.0.dist-info/RECORD,,"]) + "\n")


def _entry(name: str, entry: str) -> str:
    return toy_manifest(threads=(32,), kernels=(name,)).replace('archs = ["sm_90a"]\n', "").replace(
        'entry = "toy.ops:scale"', f'entry = "{entry}"').replace(
        'constants = { threads = "$threads" }\n', "").replace("variants = { threads = [32] }\n", "")


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("workers", ["fork", "spawn"])
def test_a_process_an_installed_entrys_import_started_fails_only_the_jobs_that_import_it(
        tmp_path: Path, workers: str) -> None:
    """A compile service (or a spawned worker) imports every installed entry module of its
    pool before its first job. One of them starts a process at import (as FlashInfer runs
    `ptxas --version`): the entry whose compile imports it, and one that imports it through
    another distribution, are refused naming the command; an entry whose compile never
    imports it publishes, as it does built alone."""
    site = tmp_path / "site"
    _dist(site, "cleanpkg", {"cleanpkg/__init__.py": "", "cleanpkg/ops.py": TOY_KERNEL})
    starts = 'import subprocess\n\nsubprocess.run(["true"], check=True)\n\nimport cutlass\n'
    _dist(site, "culpritpkg", {"culpritpkg/__init__.py": "",
                               "culpritpkg/ops.py": TOY_KERNEL.replace("import cutlass\n", starts, 1)})
    _dist(site, "mixpkg", {"mixpkg/__init__.py": "", "mixpkg/ops.py": "from culpritpkg.ops import scale\n"})
    proj = tmp_path / "proj"
    proj.mkdir()
    # the clean entry last: its worker (-j 1) refused the others first, for what it preloaded
    (proj / "kernels.toml").write_text('archs = ["sm_90a"]\n' + _entry("culprit", "culpritpkg.ops:scale")
                                       + _entry("mix", "mixpkg.ops:scale")
                                       + _entry("clean", "cleanpkg.ops:scale"))
    env = _env(PYTHONPATH=os.pathsep.join([str(REPO), str(site)]), CUTECC_WORKERS=workers)
    r = cli("build", str(proj / "kernels.toml"), "--cache-dir", str(tmp_path / "c"), "--no-lock", "-j", "1",
            "--json", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    said = {e["kernel"]: e for e in json.loads(r.stdout)["entries"]}
    assert [e["kernel"] for e in json.loads(r.stdout)["entries"]] == ["culprit", "mix", "clean"]
    assert said["clean"]["status"] == "built", said["clean"].get("error")
    for name in ("culprit", "mix"):
        assert said[name]["status"] == "failed", said[name]
        said_why = "the compile started a process (['true'], module culpritpkg.ops)"
        assert said_why in said[name]["error"], said[name]
    [entry] = Store(tmp_path / "c").entries()
    assert entry.doc["kernel"] == "clean"
    # built alone, it has the same key (a worker's later job reads less of the DSL than its
    # first, so the read-set digests of two positions are not compared here)
    alone = proj / "alone.toml"
    alone.write_text('archs = ["sm_90a"]\n' + _entry("clean", "cleanpkg.ops:scale"))
    r = cli("build", str(alone), "--cache-dir", str(tmp_path / "c2"), "--no-lock", "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    [single] = Store(tmp_path / "c2").entries()
    assert single.key == entry.key


def test_what_a_preloaded_import_recorded_is_charged_by_the_modules_being_imported(tmp_path: Path) -> None:
    """In one process: two modules preloaded (`read_set.preloading`), one of which reads a data
    file and starts a process at import; a job keying only the other is charged with neither,
    a job keying the culprit with both (the process first), and what the process read itself
    after the preload counts for every job."""
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "clean_mod.py").write_text("VALUE = 1\n")
    (tmp_path / "culprit_mod.py").write_text(
        f"import subprocess\nopen({str(tmp_path / 'data.txt')!r}).read()\nsubprocess.run(['true'])\n")
    code = textwrap.dedent(f"""
        import json, sys, types
        sys.path.insert(0, {str(tmp_path)!r})
        from cutecc.build import read_set
        from cutecc.plan.key import toolchain
        from cutecc.plan.keyed_sources import KeyedFile, file_sha256
        read_set.install()
        with read_set.preloading():
            import clean_mod, culprit_mod

        def job(name):
            path = {str(tmp_path)!r} + "/" + name + ".py"
            keyed = (KeyedFile(path, name, name + ".py", file_sha256(path)),)
            return types.SimpleNamespace(keyed_files=keyed, key_inputs={{"toolchain": toolchain()}},
                                         python_path=({str(tmp_path)!r},))
        with read_set.paused():  # (the hashes: the planner's reads, not a compile's)
            jobs = {{n: job(n) for n in ("clean_mod", "culprit_mod")}}
        read_set.begin_job()
        out = {{n: read_set.check(j, None, None).error for n, j in jobs.items()}}
        open({str(tmp_path / 'data.txt')!r}).read()  # read again, by no preloaded import
        out["again"] = read_set.check(jobs["clean_mod"], None, None).error
        print(json.dumps(out))
    """)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["clean_mod"] is None, got
    assert "the compile started a process (['true'], module culprit_mod)" in got["culprit_mod"], got
    assert f"the compile read {tmp_path / 'data.txt'}" in (got["again"] or ""), got
