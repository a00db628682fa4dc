"""Installed code in the key, through the planning cache a build keeps in its store: a warm
cache re-reads no installed source, yet every change of installed code the compile reaches
still changes the key (an edit, a same-size edit with its mtime put back, a reinstall of
another version), and a distribution that merely adds a sub-package to another's top-level
package (nvidia-cutlass-operators into the DSL's `cutlass`) changes no key until a kernel
imports it.

Pure Python: fake distributions in a temporary site directory, no DSL import, no compile.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import importlib
import io
import os
import shutil
from pathlib import Path

import pytest
from helpers import REPO, opts

import cutecc.plan.key
import cutecc.plan.sourcefacts
import cutecc.toolchain.dists
import cutecc.toolchain.hashcache
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import Planned, plan

LIB = {
    "fakelib/__init__.py": "from . import core\n",
    "fakelib/core.py": "import fakelib.util\n\n\ndef kern(x, out, stream):\n    return fakelib.util.K\n",
    "fakelib/util.py": "K = 1\n",
}
OPS = {  # a sibling: a sub-package of the DSL's `cutlass`, as nvidia-cutlass-operators ships
    "cutlass/operators/__init__.py": "",
    "cutlass/operators/gemm.py": "import fakenx\n\n\ndef gemm(x, out, stream):\n    return 1\n",
}
NX = {"fakenx/__init__.py": "GRAPH = 1\n"}

KERNEL = '''
[kernel.{name}]
entry = "{entry}"
args = [{{ name = "x", dtype = "float32", shape = ["n"] }},
        {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }}, {{ kind = "stream" }}]
'''


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, name: str, version: str, files: dict[str, str], *,
            requires: tuple[str, ...] = (), top: str | None = None) -> Path:
    """Install a fake distribution into `site` as pip would: its files, METADATA and a
    RECORD naming every file's SHA-256 and size. Returns its dist-info directory."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    rows = []
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
        rows.append(f"{rel},{_record_digest(text.encode())},{len(text.encode())}\n")
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(meta)
    if top:
        (info / "top_level.txt").write_text(top + "\n")
    (info / "RECORD").write_text("".join(rows) + f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    forget()
    return info


def forget() -> None:
    """Drop what this process remembers of the installed distributions (an install or an
    edit happened): the metadata finders' and cutecc's own lookups."""
    importlib.invalidate_caches()
    for f in vars(cutecc.toolchain.dists).values():
        if callable(getattr(f, "cache_clear", None)):
            f.cache_clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty site directory ahead of everything on sys.path; installed stamps count as
    settled at once (they are younger than the settling time the real cache waits for)."""
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)
    forget()
    yield d
    forget()


def project(tmp_path: Path, body: str) -> Path:
    """A manifest of `body`'s kernels over a project package `kp` (python_path = its root)."""
    root = tmp_path / "proj"
    (root / "kp").mkdir(parents=True, exist_ok=True)
    (root / "kp/__init__.py").write_text("")
    (root / "kp/uses_lib.py").write_text("import fakelib.core\n\n\ndef kern(x, out, stream):\n    pass\n")
    (root / "kp/uses_cutlass.py").write_text(
        "import cutlass\nimport cutlass.cute as cute\n\n\ndef kern(x, out, stream):\n    pass\n")
    (root / "kp/uses_ops.py").write_text(
        "from cutlass.operators import gemm\n\n\ndef kern(x, out, stream):\n    pass\n")
    m = root / "kernels.toml"
    m.write_text('format = 1\narchs = ["sm_90a"]\n' + body)
    return m


def parsed_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files planning parses with `ast` from now on (their names, in order)."""
    parsed: list[str] = []
    real = cutecc.plan.sourcefacts.ast.parse

    def spy(src, filename="<unknown>", *a, **k):
        parsed.append(str(filename))
        return real(src, filename, *a, **k)

    monkeypatch.setattr(cutecc.plan.sourcefacts.ast, "parse", spy)
    return parsed


def planned(manifest: Path, cache: Path | None) -> dict[str, Planned]:
    forget()
    return {p.kernel.name: p for p in plan(load_manifest(manifest), hash_cache=cache)}


BOTH = (KERNEL.format(name="imports_lib", entry="kp.uses_lib:kern")
        + KERNEL.format(name="in_lib", entry="fakelib.core:kern"))


def test_a_warm_cache_reads_and_parses_no_installed_source(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-op build's planning: installed files are told unchanged by their stat alone
    (seen: ~1,400 installed files re-parsed and re-hashed on every no-op build)."""
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    cold = planned(m, cache)
    touched: list[str] = []
    real_open, real_parse = builtins.open, cutecc.plan.sourcefacts.ast.parse

    def spy_open(f, *a, **k):
        touched.append(str(f))
        return real_open(f, *a, **k)

    def spy_parse(src, filename="<unknown>", *a, **k):
        touched.append(str(filename))
        return real_parse(src, filename, *a, **k)

    with monkeypatch.context() as mp:
        mp.setattr(builtins, "open", spy_open)
        mp.setattr(io, "open", spy_open)
        mp.setattr(cutecc.plan.sourcefacts.ast, "parse", spy_parse)
        warm = planned(m, cache)
    assert {n: p.key for n, p in warm.items()} == {n: p.key for n, p in cold.items()}
    assert [f for f in touched if f.startswith(str(site / "fakelib") + os.sep)] == []


def test_installed_sources_are_scanned_and_the_project_s_parsed_whole(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first planning builds no syntax tree of an installed source (its imports are read
    from its text), so a syntax error inside an installed function is the build's import's to
    report; the project's own sources are parsed whole, their syntax errors reported with the
    file and line."""
    broken = dict(LIB, **{"fakelib/util.py": "K = 1\n\n\ndef later(:\n    pass\n"})
    install(site, "fakelib", "1.0", broken)
    m = project(tmp_path, BOTH)
    parsed = parsed_files(monkeypatch)
    keys = planned(m, None)
    assert set(keys) == {"imports_lib", "in_lib"}
    assert [f for f in parsed if f.startswith(str(site) + os.sep)] == []
    assert str((tmp_path / "proj/kp/uses_lib.py").resolve()) in {str(Path(f).resolve()) for f in parsed}
    broken_own = "import fakelib.core\n\n\ndef kern(x, out, stream:\n    pass\n"
    (tmp_path / "proj/kp/uses_lib.py").write_text(broken_own)
    with pytest.raises(CuteccError, match=r"syntax error: .* \(line 4\)") as info:
        planned(m, None)
    assert info.value.where is not None and info.value.where.endswith("uses_lib.py")


@pytest.mark.parametrize("large", [False, True], ids=["by-content", "by-record"])
@pytest.mark.parametrize("kernel", ["imports_lib", "in_lib"])
def test_a_same_size_edit_with_its_mtime_put_back_rekeys(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch, large: bool, kernel: str) -> None:
    """Size, mtime and inode are all the same after such an edit; the ctime is not."""
    if large:  # the RECORD path (torch, triton): digest of RECORD + files that differ from it
        monkeypatch.setattr(cutecc.toolchain.dists, "FULL_HASH_LIMIT", 0)
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    before = planned(m, cache)[kernel].key
    assert planned(m, cache)[kernel].key == before  # the cache is warm now
    f = site / "fakelib/util.py"
    st = f.stat()
    f.write_text("K = 2\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = f.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    after = planned(m, cache)[kernel]
    assert after.key != before
    assert planned(m, None)[kernel].key == after.key  # what planning without a cache says


def test_reinstalling_another_version_rekeys(tmp_path: Path, site: Path) -> None:
    info = install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    before = {n: p.key for n, p in planned(m, cache).items()}
    shutil.rmtree(info)
    shutil.rmtree(site / "fakelib")
    install(site, "fakelib", "1.1", {**LIB, "fakelib/util.py": "K = 3\n"})
    after = planned(m, cache)
    assert all(after[n].key != before[n] for n in before)
    assert after["imports_lib"].inputs["distributions"]["fakelib"].startswith("1.1 ")


def test_a_distribution_adding_a_sub_package_to_the_dsls_leaves_keys_unchanged(
        tmp_path: Path, site: Path) -> None:
    """nvidia-cutlass-operators installs `cutlass/operators/` (the DSL's `cutlass` appends
    it to its `__path__`) and requires networkx: kernels that do not import it keep their
    keys, and neither it nor what it requires shows in their inputs."""
    m = project(tmp_path, KERNEL.format(name="uses_cutlass", entry="kp.uses_cutlass:kern")
                + KERNEL.format(name="in_dsl_only", entry="kp.uses_lib:kern"))
    install(site, "fakelib", "1.0", LIB)
    before = {n: p.key for n, p in planned(m, None).items()}
    root = {p.label: p.key for p in plan(load_manifest(REPO / "kernels.toml"))}
    install(site, "fake-cutlass-operators", "0.1", OPS, requires=("fakenx",), top="cutlass")
    install(site, "fakenx", "3.0", NX)
    after = planned(m, None)
    assert {n: p.key for n, p in after.items()} == before
    assert {p.label: p.key for p in plan(load_manifest(REPO / "kernels.toml"))} == root
    assert not {"fake-cutlass-operators", "fakenx"} & set(after["uses_cutlass"].inputs["distributions"])


def test_a_sub_package_a_kernel_imports_is_keyed_and_its_edits_rekey(tmp_path: Path, site: Path) -> None:
    m = project(tmp_path, KERNEL.format(name="uses_ops", entry="kp.uses_ops:kern")
                + KERNEL.format(name="uses_cutlass", entry="kp.uses_cutlass:kern"))
    install(site, "fake-cutlass-operators", "0.1", OPS, requires=("fakenx",), top="cutlass")
    install(site, "fakenx", "3.0", NX)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    before = planned(m, cache)
    dists = before["uses_ops"].inputs["distributions"]
    assert dists["fake-cutlass-operators"].startswith("0.1 ") and dists["fakenx"].startswith("3.0 ")
    gemm = site / "cutlass/operators/gemm.py"
    gemm.write_text(gemm.read_text() + "# edited\n")
    after = planned(m, cache)
    assert after["uses_ops"].key != before["uses_ops"].key
    assert after["uses_cutlass"].key == before["uses_cutlass"].key


def test_the_first_build_into_a_new_cache_keeps_what_planning_learned(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build into a cache directory that does not exist yet plans before creating it; what
    planning learned is written once the store is there, so the next (no-op) build is the
    fast one, not the one after it."""
    import cutecc.build.builder
    import cutecc.build.executors.local
    import cutecc.commands.build as b

    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    monkeypatch.setattr(cutecc.build.executors.local, "compile_all", lambda *a, **k: None)  # planning only
    monkeypatch.setattr(cutecc.build.builder, "_ensure_runtimes", lambda *a, **k: [])
    cache = tmp_path / "new-cache"
    forget()
    b.build(m, opts(cache_dir=cache), lock=False)
    assert (cache / "planfacts.json").is_file()
    facts = (cache / "planfacts.json").read_text()
    assert str(site / "fakelib" / "core.py") in facts and "fakelib-1.0.dist-info" in facts


def test_remembered_facts_of_another_parser_are_parsed_again(tmp_path: Path, monkeypatch) -> None:
    """Facts are what cutecc's own parsing made of a file: a planning cache written by
    another version of that code (its `parser` digest differs) is never served."""
    import json

    from cutecc.toolchain import hashcache
    from cutecc.toolchain.hashcache import FACTS, HashCache
    from cutecc.toolchain.planfacts import SourceFacts

    monkeypatch.setattr(hashcache, "SETTLE_NS", 0)  # remember a stamp made just now
    src = tmp_path / "m.py"
    src.write_text("import os\n")
    calls: list[int] = []

    def parse(data: bytes) -> SourceFacts:
        calls.append(1)
        return SourceFacts([[0, "os", None]], [])

    first = HashCache(tmp_path / "filehashes.json")
    first.source(str(src), SourceFacts, parse)
    first.save()
    HashCache(tmp_path / "filehashes.json").source(str(src), SourceFacts, parse)
    assert len(calls) == 1  # remembered
    doc = json.loads((tmp_path / FACTS).read_text())
    doc["parser"] = "0" * 16
    (tmp_path / FACTS).write_text(json.dumps(doc))
    HashCache(tmp_path / "filehashes.json").source(str(src), SourceFacts, parse)
    assert len(calls) == 2  # another parser's facts: parsed again


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The modules whose import closure planning walks from here on (not served remembered)."""
    walked: list[str] = []
    real = cutecc.plan.key.SourceIndex._walk

    def spy(self, module: str):
        walked.append(module)
        return real(self, module)

    monkeypatch.setattr(cutecc.plan.key.SourceIndex, "_walk", spy)
    return walked


def test_a_warm_cache_walks_no_import_closure(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The closure of a published library's entry is thousands of module lookups (FlashInfer's
    RMSNorm: 956 files): a warm cache serves it, and a file written beside the manifest (the
    lock, in the directory every top-level lookup searches) does not stop it."""
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    cold = {n: p.key for n, p in planned(m, cache).items()}
    walked = _walks(monkeypatch)
    assert {n: p.key for n, p in planned(m, cache).items()} == cold
    (m.parent / "kernels.lock").write_text("written after the build\n")
    assert {n: p.key for n, p in planned(m, cache).items()} == cold
    assert walked == []


def test_the_closures_of_one_planning_stamp_each_path_once(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closures walked by one index share most of their lookups (the published manifest's 13:
    75,000 stamps of 16,000 paths): remembering them stats each path once, and a warm cache
    serves them all."""
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    stamped: list[str] = []
    real = cutecc.toolchain.hashcache.path_stamp

    def spy(p: str) -> list[int] | None:
        stamped.append(p)
        return real(p)

    with monkeypatch.context() as mp:
        mp.setattr(cutecc.toolchain.hashcache, "path_stamp", spy)
        cold = {n: p.key for n, p in planned(m, cache).items()}
    assert stamped and len(stamped) == len(set(stamped))
    walked = _walks(monkeypatch)
    assert {n: p.key for n, p in planned(m, cache).items()} == cold and walked == []
    assert {n: p.key for n, p in planned(m, None).items()} == cold


@pytest.mark.parametrize("where", ["installed", "project"])
def test_a_module_appearing_where_an_import_looked_rekeys(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """`from pkg import name` finds no module `pkg.name` (an attribute) until a file of that
    name appears: then the closure has one more file and the key changes, though no file the
    remembered closure holds changed (an installed one outside RECORD changes no digest of
    its distribution either)."""
    lib = {**LIB, "fakelib/core.py": "from fakelib import extra\n\n\ndef kern(x, out, stream):\n    pass\n"}
    install(site, "fakelib", "1.0", lib)
    m = project(tmp_path, BOTH)
    (m.parent / "kp/uses_lib.py").write_text(
        "from kp import helper\n\n\ndef kern(x, out, stream):\n    pass\n")
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    kernel, new = (("in_lib", site / "fakelib/extra.py") if where == "installed"
                   else ("imports_lib", m.parent / "kp/helper.py"))
    before = planned(m, cache)[kernel].key
    walked = _walks(monkeypatch)
    assert planned(m, cache)[kernel].key == before and walked == []  # served remembered
    new.write_text("X = 1\n")
    after = planned(m, cache)[kernel]
    assert after.key != before and walked != []
    assert str(new.relative_to(site if where == "installed" else m.parent)) in after.sources
    assert planned(m, None)[kernel].key == after.key  # what planning without a cache says


def test_a_damaged_remembered_closure_is_walked_afresh(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planning cache is read from disk: a closure record of the wrong shape (a member
    that is no absolute path, a directory without its lookups) is not served, and planning
    gives the keys it gives without a cache."""
    import json

    from cutecc.toolchain.hashcache import FACTS

    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    keys = {n: p.key for n, p in planned(m, cache).items()}
    facts = cache.parent / FACTS
    doc = json.loads(facts.read_text())
    assert doc["closure_bodies"]
    for body in doc["closure_bodies"].values():
        if body[0]:  # (the shadows scan's record has no member: nothing shadowed)
            body[0][0][0] = 5  # a file descriptor's number where a path belongs
        body[1][0][2] = "not a list"
    facts.write_text(json.dumps(doc))
    walked = _walks(monkeypatch)
    assert {n: p.key for n, p in planned(m, cache).items()} == keys
    assert sorted(walked) == sorted({"fakelib.core", "kp.uses_lib"})


@pytest.mark.parametrize("inside", [".venv/lib/python3.11/site-packages",  # the README's venv
                                    "vendor",  # `pip install --target vendor`
                                    "env/conda/lib/python3.11/site-packages"])
def test_the_same_distribution_keys_the_same_wherever_it_is_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str) -> None:
    """A distribution is keyed by what it is (name, version, its files), not by where it
    lies: installed inside the project's directory (a venv at its root, a --target
    directory, a conda environment) or outside it (another prefix, a --user install), an
    entry in it and a kernel importing it get the same keys."""
    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)
    m = project(tmp_path, BOTH)
    keys = {}
    for where in (tmp_path / "elsewhere/lib/python3.11/site-packages", tmp_path / "user-site",
                  m.parent / inside):
        where.mkdir(parents=True)
        install(where, "fakelib", "1.0", LIB)
        with monkeypatch.context() as mp:
            mp.syspath_prepend(str(where))
            keys[str(where)] = {n: p.key for n, p in planned(m, None).items()}
        forget()
    first, *rest = keys.values()
    assert all(k == first for k in rest), keys


@pytest.mark.parametrize("mode", ["dry_run", "read_only"])
def test_a_dry_run_or_read_only_build_plans_with_what_was_remembered_and_writes_nothing(
        tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """`--dry-run` and `--read-only` plan from the planning caches a build left (no closure
    walked again: seen 18 s for the published manifest's dry run), and leave them as they were."""
    import cutecc.build.builder
    import cutecc.build.executors.local
    import cutecc.commands.build as b

    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    monkeypatch.setattr(cutecc.build.executors.local, "compile_all", lambda *a, **k: None)  # planning only
    monkeypatch.setattr(cutecc.build.builder, "_ensure_runtimes", lambda *a, **k: [])
    cache = tmp_path / "cache"
    forget()
    b.build(m, opts(cache_dir=cache), lock=False)
    facts = (cache / "planfacts.json").read_bytes()
    walked = _walks(monkeypatch)
    forget()
    if mode == "dry_run":
        rep = b.build(m, opts(cache_dir=cache), lock=False, dry_run=True)
        assert rep.count("planned") == 2
    else:
        with pytest.raises(CuteccError, match="read-only mode"):  # its misses (nothing compiled)
            b.build(m, opts(cache_dir=cache, read_only=True), lock=False)
    assert walked == []
    assert (cache / "planfacts.json").read_bytes() == facts
    forget()
    b.build(m, opts(cache_dir=tmp_path / "fresh"), lock=False, dry_run=True)  # a new cache: nothing written
    assert not (tmp_path / "fresh").exists()


def test_files_hashed_on_several_threads_give_what_hashing_one_by_one_gives(tmp_path: Path,
                                                                           monkeypatch) -> None:
    """`HashCache.prefetch` (a first planning's installed files, on every core): the same
    SHA-256 per file as `sha256` alone, and a file changed after it was prefetched is hashed
    again, never answered from the prefetch."""
    monkeypatch.setattr(cutecc.toolchain.hashcache, "HASH_THREADS", 4)
    files = []
    for i in range(80):
        f = tmp_path / f"f{i}.bin"
        f.write_bytes(os.urandom(1000 + 997 * i))
        files.append(str(f))
    alone = cutecc.toolchain.hashcache.HashCache(None)
    want = {f: alone.sha256(f) for f in files}
    assert want == {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files}
    threaded = cutecc.toolchain.hashcache.HashCache(None)
    threaded.prefetch([(f, os.stat(f)) for f in files])
    assert len(threaded._hashed) == len(files)  # all of them hashed ahead
    Path(files[3]).write_bytes(b"changed after the prefetch, before it was asked for")
    want[files[3]] = hashlib.sha256(Path(files[3]).read_bytes()).hexdigest()
    assert {f: threaded.sha256(f) for f in files} == want
