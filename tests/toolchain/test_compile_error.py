"""Where a compile error is told (`cutecc.build.compile_error`), without the DSL: the
innermost frame of the project's code (under the working directory) before an installed
package's, the frames below it counted by package, the causes followed from the deepest, and
text from the files escaped. tests/commands/test_compile_errors.py shows it through the DSL."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cutecc.build.compile_error import kernel_frame, traceback_text

KERNEL = '''\
import click


def launch(value):
    return check(value)


def check(value):
    return click.Choice(["a"]).convert(value, None, None)  # HOSTILE


def wrapped(value):
    try:
        check(value)
    except click.BadParameter as e:
        raise RuntimeError("the DSL's own wrapping") from e
'''.replace("HOSTILE", "\x1b[2J")


def _module(root: Path) -> ModuleType:
    (root / "proj").mkdir()
    path = root / "proj" / "kern.py"
    path.write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("kern_for_frames", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raised(fn, *args) -> BaseException:
    with pytest.raises(Exception) as e:
        fn(*args)
    return e.value


def test_the_projects_innermost_line_is_told_and_the_packages_below_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _module(tmp_path)
    monkeypatch.chdir(tmp_path)
    line = next(i for i, s in enumerate(KERNEL.splitlines(), 1) if "convert(" in s)
    frame = kernel_frame(_raised(mod.launch, "b"))
    assert frame is not None and frame.place == f"proj/kern.py:{line}", frame
    assert frame.source.startswith("return click.Choice") and "\\x1b[2J" in frame.source
    assert "\x1b" not in frame.source
    assert frame.below and frame.below[0][0] == "click" and frame.summary().startswith("(+")
    # a wrapped error still points at the line that raised first
    frame = kernel_frame(_raised(mod.wrapped, "b"))
    assert frame is not None and frame.place == f"proj/kern.py:{line}"
    text = traceback_text(_raised(mod.wrapped, "b"))
    assert "the DSL's own wrapping" in text and "BadParameter" in text and "\x1b" not in text


def test_outside_the_project_the_innermost_package_frame_is_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _module(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the kernel's file is no project file here
    frame = kernel_frame(_raised(mod.launch, "b"))
    assert frame is not None and "click" in frame.file and frame.file.endswith(".py"), frame
    assert frame.file == str(Path(sys.modules["click"].__file__ or "").parent / Path(frame.file).name)
