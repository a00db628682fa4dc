"""`cutecc show` says, for a forward paired with a backward, which returned outputs'
cotangents the backward takes and which it does not (non-differentiable or stop-gradient)."""

from __future__ import annotations

from cutecc.commands.show import ShowReport, gradient

X = {"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["m", "n"],
     "layout": "row-major", "align": 16}
OUT = {**X, "name": "out", "role": "output"}
RSTD = {**X, "name": "rstd", "role": "output", "shape": ["m"]}
PAIRING = {"backward": "norm_bwd", "args": ["x", "rstd", "cotangent.out"], "returns": None}


def _meta(pairing: dict | None, rstd: dict = RSTD) -> dict:
    meta = {"kernel": "norm", "backward": "norm_bwd", "args": [X, OUT, rstd], "key_inputs": {}}
    if pairing is not None:
        meta["key_inputs"]["grad"] = pairing
    return meta


def test_each_returned_output_is_taken_nondiff_or_stop_gradient() -> None:
    assert gradient(_meta(PAIRING)) == {"backward": "norm_bwd", "taken": ["out"], "nondiff": ["rstd"],
                                        "stop_gradient": []}
    stopped = gradient(_meta({**PAIRING, "stop_gradient": ["rstd"]}))
    assert stopped is not None and (stopped["nondiff"], stopped["stop_gradient"]) == ([], ["rstd"])
    # the plain pairing (inputs then every cotangent) takes them all; a saved output is no concern
    assert gradient(_meta(None))["taken"] == ["out", "rstd"]  # type: ignore[index]
    assert gradient(_meta(PAIRING, {**RSTD, "saved": True}))["nondiff"] == []  # type: ignore[index]
    assert gradient({**_meta(PAIRING), "backward": None}) is None
    assert gradient({**_meta(PAIRING), "args": "damaged"}) is None


def test_the_text_report_shows_them() -> None:
    meta = _meta(PAIRING)
    info = {"key": "k" * 64, "label": "norm[default]@sm_90a", "path": "/c", "last_used": "never",
            "disk_bytes": 0, "meta": meta, "files": [], "gradient": gradient(meta)}
    lines = ShowReport(info).lines()
    assert "gradient   backward norm_bwd takes the cotangents of: out" in lines
    assert "gradient   non-differentiable (a gradient through it is an error): rstd" in lines
