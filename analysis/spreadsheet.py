"""Text cells of every CSV the platform writes, made safe to open in a spreadsheet (CSV or formula
injection: a participant's message ``=HYPERLINK(...)`` would otherwise run in the spreadsheet of
whoever opens the file). A text cell a spreadsheet could read as a formula gets an apostrophe in
front, as OWASP advises; numbers are never touched, so ``-3`` in a number column stays a number.

    >>> neutralize("=1+1"), neutralize(" @SUM(A1)"), neutralize("fine")
    ("'=1+1", "' @SUM(A1)", 'fine')
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

# A formula starts with =, +, - or @, also after leading white space; a tab, carriage return or NUL
# first starts one in some spreadsheets. A text that already starts with an apostrophe gets one
# more, so that undoing is always "remove the first apostrophe".
FORMULA_START = re.compile(r"[\t\r\0']|\s*[=+\-@]")
MARK = "'"

RULE = ("a text cell that starts with `=`, `+`, `-` or `@` (also after leading spaces or line breaks), "
        "with a tab, a carriage return or a NUL, or with an apostrophe has one apostrophe (`'`) put in front")
UNDO = "remove the first character of every text cell that starts with an apostrophe"
CSV_TEXT_NOTE = (
    f"Text cells of the CSV files are safe to open in a spreadsheet (no formula runs): {RULE} (OWASP's advice "
    "on CSV injection). Number, date and true/false columns are never changed (a negative number stays a "
    f"number). To get the text exactly as written, {UNDO} (pandas: "
    "`frame[column].str.replace(\"^'\", \"\", regex=True)`; R: `sub(\"^'\", \"\", x)`). Parquet, SPSS and "
    "Stata files keep the text as written.")


def neutralize(text: str) -> str:
    """``text`` with an apostrophe in front where a spreadsheet could read it as a formula."""
    return MARK + text if FORMULA_START.match(text) else text


def _cell(value: Any) -> Any:
    return neutralize(value) if isinstance(value, str) else value


def neutralized(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell neutralized (in text and mixed columns; numbers, dates and
    booleans as they are), ready for ``to_csv`` or a CSV writer."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object or isinstance(out[column].dtype, pd.StringDtype):
            out[column] = out[column].map(_cell, na_action="ignore")
    return out


def csv_text(frame: pd.DataFrame) -> str:
    """``frame`` as CSV text, its text cells neutralized: what the aggregate export and the
    dashboard's table downloads write."""
    return neutralized(frame).to_csv(index=False)
