"""Which studies' rows a dispatcher touches: every live study, or one simulated study.

A simulated study (``study.studies.load_simulated``) lives in the same database as the live ones,
on a clock of its own: a simulation moves time through weeks of the past in minutes. So the live
dispatcher (``afterward scheduler``) touches none of its rows (no on-call notice of a simulated
safety event, no check-in deadline, no re-planning, opening, expiry, invitation or reminder), and
a simulation's own dispatcher touches only its study's rows, none of the live studies'.

The condition is part of the WHERE clause of each statement that selects or claims rows, so it
adds no statement and no lock: for the live dispatcher, "the row's study is not a simulated one"
(an uncorrelated subquery over the small ``studies`` table, evaluated once per statement); for a
simulation's, "the row's study is this one".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, select

from study.models import Study


@dataclass(frozen=True)
class Scope:
    """``simulated_study`` None: every live study (the live dispatcher); an id: that simulated
    study alone (a simulation's dispatcher)."""

    simulated_study: int | None = None

    def covers(self, study_id: Any) -> ColumnElement[bool]:
        """The condition that a row whose study is ``study_id`` (a column, or a correlated scalar
        subquery) is this dispatcher's to touch."""
        if self.simulated_study is None:
            return study_id.not_in(select(Study.id).where(Study.simulated))
        return study_id == self.simulated_study


LIVE = Scope()
