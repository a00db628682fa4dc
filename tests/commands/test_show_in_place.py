"""`cutecc show` says what an entry's contract allows about copies: donate an `inout` tensor,
call `in_place` where an output may be written in its input's memory."""

from __future__ import annotations

from cutecc.commands.show import ShowReport, in_place_notes

X = {"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n"],
     "layout": "row-major", "align": 16}


def test_notes_for_inout_and_may_alias_outputs() -> None:
    inout = {"kernel": "axpy", "args": [X, {**X, "name": "y", "role": "inout"}]}
    [note] = in_place_notes(inout)
    assert note.startswith("y is inout") and "donate_argnums" in note
    aliased = {"kernel": "mul", "args": [X, {**X, "name": "out", "role": "output", "may_alias": "x"}]}
    [note] = in_place_notes(aliased)
    assert note.startswith("out may be written in x's memory") and "ks.mul.in_place" in note
    plain = {"kernel": "mul", "args": [X, {**X, "name": "out", "role": "output"}]}
    assert in_place_notes(plain) == []
    assert in_place_notes({"args": "damaged"}) == [] and in_place_notes({}) == []
    sized = {"kernel": "crop", "args": [X, {**X, "name": "q", "shape": ["m"], "extents_only": True},
                                        {**X, "name": "dq", "role": "output", "shape": ["m"]}]}
    [note] = in_place_notes(sized)
    assert note.startswith("q is passed for its extents only") and "never receives it" in note


def test_the_text_report_shows_them() -> None:
    meta = {"kernel": "mul", "args": [X, {**X, "name": "out", "role": "output", "may_alias": "x"}]}
    info = {"key": "k" * 64, "label": "mul[default]@sm_90a", "path": "/c", "last_used": "never",
            "disk_bytes": 0, "meta": meta, "files": [], "in_place": in_place_notes(meta)}
    lines = ShowReport(info).lines()
    assert any(line.startswith("in place   out may be written in x's memory") for line in lines)
