"""`$CUTECC_DRIVER_VERSION`, read by `cutecc.load` to judge PTX entries: ASCII digits only
("13.0" or cuDriverGetVersion's "13000"). Digits of other scripts, which Python's `int`
and `str.isdigit` take, are a clear error naming the variable (on 1518079 superscript
digits raised a bare ValueError from `cutecc.load`, fullwidth and Arabic-Indic ones were
read as a driver)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CuteccError

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

NOT_ASCII = ["\u00b9\u00b3\u2070\u2070\u2070",  # superscript 13000
             "\uff11\uff13\uff10\uff10\uff10",  # fullwidth 13000
             "\uff15\uff13\uff15",  # fullwidth 535
             "\u0661\u0663\u0660\u0660\u0660",  # Arabic-Indic 13000
             "\u0661\u0663.\u0660",  # Arabic-Indic 13.0
             "1\uff13.0",  # a fullwidth 3 inside
             "13.\u0660"]


@pytest.mark.parametrize("value", NOT_ASCII, ids=ascii)
def test_load_refuses_a_driver_version_of_non_ascii_digits(fallback_project: Path, value: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", value)
    with pytest.raises(CuteccError, match="not a CUDA driver version such as 13.0 or 13000") as e:
        cutecc.load(cache, arch="sm_90a")
    assert e.value.where == "$CUTECC_DRIVER_VERSION"
    assert ascii(value) in str(e.value)  # shown escaped, whatever the terminal
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "13000")
    assert cutecc.load(cache, arch="sm_90a").scale
