"""The HTML pieces of the analysis report (``analysis.report``) and of the pages built like it
(``analysis.plan_report``, ``evals.report``): a table column, a formatted cell whose full value is
in ``data-value`` (intervals also ``data-low`` and ``data-high``), a table, a list of notes. Every
shown string is escaped."""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

Kind = Literal["number", "p", "count", "text", "interval", "flag", "days"]


@dataclass(frozen=True)
class _Col:
    """A table column: ``field`` of the frame (an interval: the estimate, with ``low`` and ``high``)."""

    header: str
    field: str
    kind: Kind = "number"
    low: str = ""
    high: str = ""


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _format(value: Any, kind: Kind) -> str:
    if _missing(value):
        return "–"
    if isinstance(value, bool | np.bool_) or kind == "flag":
        return "yes" if value else "no"
    if isinstance(value, dt.datetime | pd.Timestamp):
        return value.isoformat(timespec="seconds")
    if isinstance(value, int | np.integer) or kind == "count":
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        number = float(value)
        if math.isinf(number):
            return "not reached" if kind == "days" else ("∞" if number > 0 else "-∞")
        if kind == "p":
            return "< 0.001" if number < 0.001 else f"{number:.3f}"
        return f"{number:,.0f}" if abs(number) >= 10_000 else f"{number:.3f}"
    return str(value)


def _data_value(value: Any) -> str:
    """The full value for ``data-value``: repr of a float (it reads back exactly), str otherwise."""
    if _missing(value):
        return "nan"
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, int | np.integer | bool | np.bool_):
        return str(int(value))
    return str(value)


def _cell(row: Mapping[str, Any], col: _Col) -> str:
    value = row.get(col.field)
    attrs = f' data-field="{html.escape(col.field)}"'
    if col.kind == "text":
        return f"<td{attrs}>{html.escape(_format(value, 'text'))}</td>"
    attrs += f' data-value="{html.escape(_data_value(value))}"'
    text = _format(value, col.kind)
    if col.kind == "interval":
        low, high = row.get(col.low), row.get(col.high)
        attrs += f' data-low="{html.escape(_data_value(low))}" data-high="{html.escape(_data_value(high))}"'
        if not _missing(value):
            text += f" ({_format(low, 'number')} to {_format(high, 'number')})"
    return f'<td class="num"{attrs}>{html.escape(text)}</td>'


def _table(frame: pd.DataFrame, cols: Sequence[_Col], table_id: str, caption: str = "") -> str:
    """An HTML table of ``frame``'s rows, one column per ``cols``; empty frames say so."""
    if frame is None or frame.empty:
        return f'<p class="empty" id="{html.escape(table_id)}">No rows.</p>'
    head = "".join(f'<th scope="col" data-field="{html.escape(c.field)}">{html.escape(c.header)}</th>' for c in cols)
    records: list[dict[str, Any]] = [{str(k): v for k, v in row.items()} for row in frame.to_dict(orient="records")]
    body = "".join("<tr>" + "".join(_cell(row, c) for c in cols) + "</tr>" for row in records)
    title = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<div class="scroll"><table id="{html.escape(table_id)}">{title}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li>{html.escape(note)}</li>" for note in notes) + "</ul>"
