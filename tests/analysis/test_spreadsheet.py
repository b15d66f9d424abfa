"""Text cells made safe for spreadsheets: every formula start gets an apostrophe, nothing else
changes, numbers stay numbers, and undoing as documented gives the text back."""

from __future__ import annotations

import csv
import io

import pandas as pd
import pytest

from analysis.spreadsheet import csv_text, neutralize, neutralized

FORMULAS = ["=1+1", "+1", "-1+cmd", "@SUM(A1)", "\t=1", "\r=1", "\0x", "  =1", "\n\t@x", "\u00a0=1", "'=1", "'plain"]
PLAIN = ["fine", "< 5", "suppressed", "a=b", "2026-03-02", "", " spaced", "\nline"]


@pytest.mark.parametrize("text", FORMULAS)
def test_a_formula_start_gets_an_apostrophe_and_undoing_gives_it_back(text: str) -> None:
    assert neutralize(text) == "'" + text
    assert neutralize(text)[1:] == text  # the README's undo: drop the first apostrophe


@pytest.mark.parametrize("text", PLAIN)
def test_other_text_is_left_as_it_is(text: str) -> None:
    assert neutralize(text) == text


def test_only_text_cells_change_in_a_frame_and_its_csv() -> None:
    frame = pd.DataFrame({"label": ["=A1", "all"], "count": [-3, 7], "mixed": [-2, "< 5"], "mean": [-0.5, None],
                          "text": pd.array(["-1", pd.NA], dtype="string")})
    safe = neutralized(frame)
    assert safe["label"].tolist() == ["'=A1", "all"]
    assert safe["count"].tolist() == [-3, 7]  # a number column is not touched
    assert safe["mixed"].tolist() == [-2, "< 5"]  # a number in a mixed column stays a number
    assert safe["text"].tolist() == ["'-1", pd.NA]  # "-1" typed as text is text
    assert frame["label"].tolist() == ["=A1", "all"]  # a copy
    rows = list(csv.reader(io.StringIO(csv_text(frame))))
    assert rows == [["label", "count", "mixed", "mean", "text"], ["'=A1", "-3", "-2", "-0.5", "'-1"],
                    ["all", "7", "< 5", "", ""]]
