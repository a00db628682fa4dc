"""The README's first project on a GPU: its Python session (the block after `<!-- quickstart
-->`) run as a doctest in a fresh process against the cache `cutecc build` made of `cutecc
init`'s project, so every value it shows is what the call returns. The project and its cache
come from `bash tests/gpu/prepare.sh CACHES` (CACHES/quickstart/), which tests/gpu/run.sh
passes as CUTECC_QUICKSTART_CACHE; without it this skips. The same README lines on a CPU:
tests/architecture/test_user_docs.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parents[2] / "README.md"

RUN = r'''
import doctest, sys
text = sys.stdin.read()
test = doctest.DocTestParser().get_doctest(text, {}, "README quickstart", "README.md", 0)
runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
runner.run(test)
sys.exit(1 if runner.failures or not runner.tries else 0)
'''


def test_the_readmes_python_session_prints_what_it_shows() -> None:
    cache = os.environ.get("CUTECC_QUICKSTART_CACHE")
    if not cache or not Path(cache).is_dir():
        pytest.skip("CUTECC_QUICKSTART_CACHE is not set (tests/gpu/prepare.sh CACHES makes quickstart/)")
    m = re.search(r"<!-- quickstart -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert m, "README.md's quickstart block"
    assert m.group(1).count(">>> ") >= 4
    r = subprocess.run([sys.executable, "-c", RUN], input=m.group(1), capture_output=True, text=True,
                       timeout=600, env={**os.environ, "CUTECC_CACHE_DIR": cache})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
