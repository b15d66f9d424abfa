"""A study's aggregate tables with disclosure control: what every staff role, viewers included,
may see and export. Enrollment by arm and status, follow-up completion per wave and arm, PERMA
overall well-being per wave and arm, decision regret per wave and starting role, conversations
and pushback per arm and role, safety events per month and category, and safety events by review
status. Every number a viewer is shown comes from these tables as suppressed together: the
dashboard's viewer pages, the aggregate export and the staff API's study summary for viewers
(``api.routers.staff.viewer_summary`` picks its cells), so no surface can be subtracted from another.

The numbers come from grouped SQL: ``analysis.panel.survey_cells`` (surveys by the panel's own
status rule, with their headline scores), ``analysis.features.conversation_cells`` (conversations
summed per participant, arm and starting role), enrollment and safety events, so they mean what
the same numbers mean in the panel and the exports, and no row per survey or turn leaves the
database. Then the suppression rule (``SUPPRESSION_RULE``; the algorithm is ``analysis.disclosure``)
is applied: a cell resting on fewer than 5 participants shows ``"< 5"``, and further cells show
``"suppressed"`` wherever a hidden cell could otherwise be worked out from the cells shown.

    >>> from analysis.aggregates import aggregate_tables, export_aggregates
    >>> tables = aggregate_tables(engine, "wellbeing-pilot")
    >>> tables["followups"]
    >>> export_aggregates(engine, "wellbeing-pilot", Path("out"), actor=Actor.system("cli"))
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Final, get_args

import pandas as pd
from sqlalchemy import case, func, literal, select, union_all
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from analysis.codebook import Column, TableSpec, write_codebook_markdown, write_datapackage
from analysis.disclosure import BELOW, SHOWN, SUPPRESSED, THRESHOLD, CellKey, Count, Disclosure, below
from analysis.exports import open_study, record_export
from analysis.features import conversation_cells
from analysis.panel import PERMA, REGRET, survey_cells
from analysis.plan import blinding, outcome_view
from analysis.reading import Source, concurrently, connect, read_frame, resolve_study_id
from analysis.software import packages_line
from analysis.spreadsheet import CSV_TEXT_NOTE, csv_text
from chat.monitors import CrisisCategory
from chat.roles import roles_for_arm
from study import audit
from study.clock import now
from study.db import READ_ONLY
from study.models import Participant, ProtocolVersion, Study
from study.safety import SafetyEvent

ALL = "all"
AGGREGATES: Final = "aggregates"  # the export format's name (CLI and API)


SUPPRESSION_RULE = f"""\
Every value is an aggregate; no participant code, contact detail or free text appears.

1. **Fewer than {THRESHOLD} participants: `{below()}`.** A count is shown only when at least
   {THRESHOLD} participants contribute to it (a count of zero rests on none, so it shows `{below()}` too).
   A mean, SD or rate is shown only when the participants it rests on (its n, or its
   denominator) number at least {THRESHOLD}. `{below()}` always means "fewer than {THRESHOLD}
   participants"; for counts of other things (turns, follow-ups, events) the count itself may
   be larger.
2. **No working out by subtraction: `{SUPPRESSED}`.** The counts are tied together: the parts of
   a row add up to its total, the arms (or roles, or months) add up to the `{ALL}` row, and some
   counts appear in two tables (completed PERMA follow-ups are the n of the well-being table;
   completed regret follow-ups of an arm are the n of its roles in the regret table; all safety
   events are the total of both safety tables; a withdrawal count is the sum of its two levels).
   The staff API's study summary for viewers and the dashboard show cells of these tables, nothing
   else, so they add nothing to work with. A viewer who knows every shown value, every such sum,
   that a `{below()}` count of participants lies between 0 and {THRESHOLD - 1} and that a `{SUPPRESSED}`
   count is at least {THRESHOLD} could pin a hidden count down: a margin with one hidden cell gives it
   away by subtraction, and a total of 8 over two `{below()}` cells means both are 4. So while some
   hidden count can be pinned down this way, one more count is hidden: the smallest shown count of
   a sum it belongs to (the sum with the fewest hidden cells first; its parts before its total). In
   particular no row or column ever has exactly one hidden cell, and totals are hidden when they
   would reveal what they add up. The check is exact: a hidden count counts as protected only when another table,
   consistent with everything shown and those bounds, gives it a different value.
3. **Means, SDs and rates follow their counts.** One whose n, numerator or denominator is
   hidden is `{SUPPRESSED}` as well.

What the rule does not model: inequalities between tables (e.g. that a wave's follow-ups cannot
exceed the participants enrolled), and means pinned by the ends of their scale (a mean of 10.00
on a 0-10 scale tells that every answer was 10).
"""


# The tables: rows of labels, count cells (in the Disclosure) and derived cells (means, SDs, rates).


@dataclass(frozen=True)
class Derived:
    """A mean, SD or rate: shown only when every count in ``inputs`` is shown; ``inputs[0]`` is
    what it rests on (its n or its denominator)."""

    value: float | None
    inputs: tuple[CellKey, ...]
    digits: int


@dataclass
class _Table:
    spec: TableSpec
    labels: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    derived: dict[CellKey, Derived] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def row(self, **labels: Any) -> int:
        self.rows.append(labels)
        return len(self.rows) - 1

    def key(self, row: int, column: str) -> CellKey:
        return (self.name, row, column)


def _tally(frame: pd.DataFrame, mask: Any = None, amount: str | None = None,
           counts_participants: bool = False) -> Count:
    """Rows of ``frame`` (where ``mask``), or the sum of column ``amount`` over them, and the
    participants contributing (those with at least one row, or a positive amount)."""
    rows = frame if mask is None else frame[mask]
    if amount is None:
        return Count(len(rows), int(rows["participant_id"].nunique()), counts_participants)
    values = pd.to_numeric(rows[amount]).fillna(0)
    return Count(int(values.sum()), int(rows.loc[values > 0, "participant_id"].nunique()), counts_participants)


def _mean_sd(n: int, total: float, squares: float) -> tuple[float | None, float | None]:
    """Mean and sample SD (n - 1) from n, the sum and the sum of squares (scores are bounded, so
    the difference of sums loses nothing at the digits shown)."""
    if n == 0:
        return None, None
    mean = total / n
    sd = math.sqrt(max(squares - n * mean * mean, 0.0) / (n - 1)) if n > 1 else None
    return mean, sd


def _survey_cell(cells: pd.DataFrame, kind: str, wave: str, arm: str, **labels: str) -> tuple[Count, float, float]:
    """One group of ``analysis.panel.survey_cells`` (``arm`` ``all``: summed over the arms, each
    participant being in one): its surveys and participants as a Count, the score's sum and sum of
    squares."""
    rows = cells[(cells["kind"] == kind) & (cells["wave"] == wave) & ((cells["arm"] == arm) | (arm == ALL))]
    for column, value in labels.items():
        rows = rows[rows[column] == value]
    return (Count(int(rows["surveys"].sum()), int(rows["participants"].sum()), False),
            float(rows["score_sum"].sum()), float(rows["score_sumsq"].sum()))


@dataclass(frozen=True)
class _Protocol:
    arms: dict[str, str]  # name -> mode
    roles: dict[str, list[str]]  # arm -> roles it offers (``standard`` for the default mode)
    instruments: dict[str, str]  # follow-up key -> instrument, in protocol order
    anchors: dict[str, str]  # follow-up key -> enrollment or decision


def _protocol(connection: Connection, study_id: int) -> _Protocol:
    """Arms, roles and follow-ups of every protocol version, the newest version's first."""
    documents = connection.scalars(select(ProtocolVersion.protocol).where(ProtocolVersion.study_id == study_id)
                                   .order_by(ProtocolVersion.version.desc())).all()
    arms: dict[str, str] = {}
    roles: dict[str, list[str]] = {}
    instruments: dict[str, str] = {}
    anchors: dict[str, str] = {}
    for document in documents:
        for arm in document.get("arms", []):
            if arm["name"] not in arms:
                arms[arm["name"]] = arm["mode"]
                roles[arm["name"]] = list(roles_for_arm(arm["mode"], list(arm.get("roles") or [])))
        for followup in document.get("followups", []):
            instruments.setdefault(followup["id"], followup["instrument"])
            anchors.setdefault(followup["id"], followup["anchor"])
    return _Protocol(arms, roles, instruments, anchors)


def _in_order(known: Sequence[str], found: Iterable[Any]) -> list[str]:
    """``known`` values, then any others found in the data (sorted)."""
    extra = sorted({v for v in found if isinstance(v, str) and v} - set(known))
    return [*known, *extra]


ROLE_ORDER = ("concierge", "collaborator", "coach", "standard")


class _Builder:
    """Reads the study once (its surveys, its conversation cells, two SQL aggregates) and builds each
    table's rows, registering its counts and sums with one ``Disclosure``."""

    def __init__(self, connection: Connection, study_id: int, threshold: int) -> None:
        self.connection, self.study_id = connection, study_id
        self.protocol = _protocol(connection, study_id)
        self.disclosure = Disclosure(threshold)
        self.surveys, self.conversations = concurrently(connection, lambda c: survey_cells(c, study_id),
                                                        lambda c: conversation_cells(c, study_id))
        self.arms = _in_order(list(self.protocol.arms), connection.scalars(
            select(Participant.arm).where(Participant.study_id == study_id).distinct()))
        self.arm_roles = {arm: self.protocol.roles.get(arm, []) for arm in self.arms}
        roles = [r for r in ROLE_ORDER if any(r in offered for offered in self.arm_roles.values())]
        self.roles = _in_order(roles, self.conversations["starting_role"])

    def count(self, table: _Table, row: int, column: str, count: Count) -> CellKey:
        key = table.key(row, column)
        self.disclosure.add_count(key, count)
        return key

    def margin(self, table: _Table, total: int, parts: list[int], columns: Sequence[str]) -> None:
        """For each of ``columns``: row ``total`` is the sum of rows ``parts``."""
        for column in columns if parts else ():
            self.disclosure.add_sum(table.key(total, column), [table.key(p, column) for p in parts])

    def link(self, total: CellKey, parts: list[CellKey]) -> None:
        """A count of one table that is the sum of counts of another: declared when it holds in the
        data (then a viewer may know it)."""
        counts = self.disclosure.counts
        if counts[total].value == sum(counts[p].value for p in parts):
            self.disclosure.add_sum(total, parts)

    def waves(self) -> list[str]:
        return _in_order(["baseline", *self.protocol.instruments], self.surveys["wave"])

    # Tables

    def enrollment(self) -> _Table:
        table = _Table(TableSpec("enrollment", "Participants assigned to each arm, by status now (participants "
                                 "not yet assigned to an arm are not counted).", [
            Column("arm", "string", "Study arm, or 'all'.", enum=self._arm_enum()),
            Column("enrolled", "integer", "Enrolled and taking part.", unit="participants"),
            Column("withdrawn", "integer", "Withdrew (the sum of the next two).", unit="participants"),
            Column("withdrawn_kept_data", "integer", "Withdrew; the data collected so far are kept.",
                   unit="participants"),
            Column("withdrawn_data_deleted", "integer", "Withdrew and had their research data deleted.",
                   unit="participants"),
            Column("participants", "integer", "All participants assigned to the arm (enrolled + withdrawn).",
                   unit="participants"),
        ]), ["arm"])
        status = case((Participant.data_deleted_at.is_not(None), "withdrawn_data_deleted"),
                      (Participant.status == "withdrawn", "withdrawn_kept_data"), else_="enrolled")
        frame = read_frame(self.connection, select(Participant.arm, status.label("column"), func.count().label("n"))
                           .where(Participant.study_id == self.study_id, Participant.arm.is_not(None))
                           .group_by(Participant.arm, status))
        columns = ["enrolled", "withdrawn_kept_data", "withdrawn_data_deleted"]
        cells = {(arm, column): int(n) for arm, column, n in frame.itertuples(index=False)}
        rows = {arm: table.row(arm=arm) for arm in [*self.arms, ALL]}
        for arm, row in rows.items():
            values = {c: sum(n for (a, col), n in cells.items() if col == c and arm in (a, ALL)) for c in columns}
            values = {"enrolled": values["enrolled"], "withdrawn": values["withdrawn_kept_data"]
                      + values["withdrawn_data_deleted"], **values, "participants": sum(values.values())}
            for column, value in values.items():
                self.count(table, row, column, Count(value, value, True))
            self.disclosure.add_sum(table.key(row, "participants"), [table.key(row, c) for c in columns])
            self.disclosure.add_sum(table.key(row, "withdrawn"), [table.key(row, c) for c in columns[1:]])
        self.margin(table, rows[ALL], [rows[a] for a in self.arms], [*columns, "withdrawn", "participants"])
        return table

    def followups(self) -> _Table:
        table = _Table(TableSpec("followups", "Survey completion per wave and arm: the baseline PERMA-Profiler and "
                                 "every follow-up of the protocol (a wave asking about decisions has one follow-up "
                                 "per decision).", [
            Column("wave", "string", "'baseline' or the protocol's follow-up id.", enum=self._wave_enum()),
            Column("arm", "string", "Study arm, or 'all'.", enum=self._arm_enum()),
            Column("due", "integer", "Surveys whose time has come: completed + expired + pending (not counted: not "
                   "yet due, cancelled by a withdrawal or otherwise).", unit="surveys"),
            Column("completed", "integer", "Submitted.", unit="surveys"),
            Column("expired", "integer", "Window closed unanswered.", unit="surveys"),
            Column("pending", "integer", "Due and not answered yet (open, or due and not yet sent).", unit="surveys"),
            Column("completion_rate", "number", "completed / due.", unit="proportion"),
        ]), ["wave", "arm"])
        parts = ["completed", "expired", "pending"]
        cells = self.surveys
        for wave in self.waves():
            one_each = wave == "baseline" or self.protocol.anchors.get(wave) == "enrollment"
            rows = {arm: table.row(wave=wave, arm=arm) for arm in [*self.arms, ALL]}
            for arm, row in rows.items():
                for column in parts:
                    found = (_survey_cell(cells, "pending", wave, arm) if column == "pending"
                             else _survey_cell(cells, "status", wave, arm, response_status=column))[0]
                    self.count(table, row, column, replace(found, counts_participants=one_each))
                due = self.count(table, row, "due", replace(_survey_cell(cells, "due", wave, arm)[0],
                                                            counts_participants=one_each))
                self.disclosure.add_sum(due, [table.key(row, c) for c in parts])
                completed, due_value = (self.disclosure.counts[k].value for k in (table.key(row, "completed"), due))
                table.derived[table.key(row, "completion_rate")] = Derived(
                    completed / due_value if due_value else None, (due, table.key(row, "completed")), 3)
            self.margin(table, rows[ALL], [rows[a] for a in self.arms], ["due", *parts])
        return table

    def wellbeing(self, followups: _Table) -> _Table:
        table = _Table(TableSpec("wellbeing", "PERMA-Profiler overall well-being (mean of the 15 PERMA items and "
                                 "happiness, 0-10) per wave and arm, over the submitted surveys with a score.", [
            Column("wave", "string", "'baseline' or a PERMA follow-up id.", enum=self._wave_enum()),
            Column("arm", "string", "Study arm, or 'all'.", enum=self._arm_enum()),
            Column("n", "integer", "Submitted surveys with an overall well-being score (one per participant).",
                   unit="participants"),
            Column("mean", "number", "Mean overall well-being.", unit="points (0-10)"),
            Column("sd", "number", "Sample standard deviation (n - 1).", unit="points (0-10)"),
        ]), ["wave", "arm"])
        for wave in [w for w in self.waves() if w == "baseline" or self.protocol.instruments.get(w) == PERMA]:
            rows = {arm: table.row(wave=wave, arm=arm) for arm in [*self.arms, ALL]}
            for arm, row in rows.items():
                found, total, squares = _survey_cell(self.surveys, "scored", wave, arm)
                n = self.count(table, row, "n", replace(found, counts_participants=True))
                mean, sd = _mean_sd(found.value, total, squares)
                table.derived[table.key(row, "mean")] = Derived(mean, (n,), 2)
                table.derived[table.key(row, "sd")] = Derived(sd, (n,), 2)
                self.link(self._followup_cell(followups, wave, arm), [n])
            self.margin(table, rows[ALL], [rows[a] for a in self.arms], ["n"])
        return table

    def regret(self, followups: _Table) -> _Table:
        table = _Table(TableSpec("regret", "Decision Regret Scale (0-100, 100 = high regret) per regret wave and "
                                 "the starting role of the conversation the decision was made in.", [
            Column("wave", "string", "The protocol's regret follow-up id.", enum=self._wave_enum()),
            Column("starting_role", "string", "Role the decision's conversation started in, or 'all'.",
                   enum=self._role_enum()),
            Column("n", "integer", "Submitted regret surveys with a score (one per decision).", unit="responses"),
            Column("mean", "number", "Mean regret score.", unit="points (0-100)"),
            Column("sd", "number", "Sample standard deviation (n - 1).", unit="points (0-100)"),
        ]), ["wave", "starting_role"])
        offered = [role for roles in self.arm_roles.values() for role in roles]
        for wave in [w for w in self.waves() if self.protocol.instruments.get(w) == REGRET]:
            rows = {role: table.row(wave=wave, starting_role=role) for role in [*self.roles, ALL]}
            for role, row in rows.items():
                found, total, squares = (_survey_cell(self.surveys, "scored", wave, ALL) if role == ALL else
                                         _survey_cell(self.surveys, "scored_role", wave, ALL, starting_role=role))
                n = self.count(table, row, "n", found)
                mean, sd = _mean_sd(found.value, total, squares)
                table.derived[table.key(row, "mean")] = Derived(mean, (n,), 2)
                table.derived[table.key(row, "sd")] = Derived(sd, (n,), 2)
            self.margin(table, rows[ALL], [rows[r] for r in self.roles], ["n"])
            self.link(self._followup_cell(followups, wave, ALL), [table.key(rows[ALL], "n")])
            if len(offered) == len(set(offered)):  # no role in two arms: an arm's regret n is its roles'
                for arm, roles in self.arm_roles.items():
                    self.link(self._followup_cell(followups, wave, arm), [table.key(rows[r], "n") for r in roles])
        return table

    def conversation_table(self) -> _Table:
        table = _Table(TableSpec("conversations", "Conversations per arm and starting role: how often the assistant "
                                 "pushed back, and how participants answered.", [
            Column("arm", "string", "Study arm, or 'all'.", enum=self._arm_enum()),
            Column("starting_role", "string", "Role the conversation started in, or 'all'.", enum=self._role_enum()),
            Column("participants", "integer", "Participants with a conversation.", unit="participants"),
            Column("conversations", "integer", "Conversations.", unit="conversations"),
            Column("assistant_turns", "integer", "Replies of the assistant.", unit="turns"),
            Column("pushback_turns", "integer", "Replies whose stance was nudge or challenge.", unit="turns"),
            Column("pushback_rate", "number", "pushback_turns / assistant_turns (the conversations' pushback_rate, "
                   "pooled).", unit="proportion"),
            Column("overrides", "integer", "Pushbacks the participant overrode ('go ahead anyway').",
                   unit="responses"),
            Column("reconsiders", "integer", "Pushbacks the participant answered with 'let me reconsider'.",
                   unit="responses"),
        ]), ["arm", "starting_role"])
        frame = self.conversations
        additive = ["conversations", "assistant_turns", "pushback_turns", "overrides", "reconsiders"]
        arm_rows: list[int] = []
        for arm in self.arms:
            in_arm = frame[frame["arm"] == arm]
            roles = _in_order(self.arm_roles[arm], in_arm["starting_role"])
            rows = [table.row(arm=arm, starting_role=role) for role in roles]
            for role, row in zip(roles, rows, strict=True):
                self._conversation_cells(table, row, in_arm[in_arm["starting_role"] == role])
            arm_rows.append(table.row(arm=arm, starting_role=ALL))
            self._conversation_cells(table, arm_rows[-1], in_arm)
            # A participant may start conversations in several roles, but has one arm.
            self.margin(table, arm_rows[-1], rows, [*additive, "participants"] if len(rows) == 1 else additive)
        everyone = table.row(arm=ALL, starting_role=ALL)
        self._conversation_cells(table, everyone, frame[frame["arm"].isin(self.arms)])
        self.margin(table, everyone, arm_rows, [*additive, "participants"])
        return table

    def _conversation_cells(self, table: _Table, row: int, cell: pd.DataFrame) -> None:
        participants = int(cell["participant_id"].nunique())
        self.count(table, row, "participants", Count(participants, participants, True))
        self.count(table, row, "conversations", _tally(cell, amount="conversations"))
        keys = [self.count(table, row, amount, _tally(cell, amount=amount))
                for amount in ("assistant_turns", "pushback_turns", "overrides", "reconsiders")]
        turns, pushbacks = (self.disclosure.counts[key].value for key in keys[:2])
        table.derived[table.key(row, "pushback_rate")] = Derived(pushbacks / turns if turns else None,
                                                                 (keys[0], keys[1]), 3)

    def _events(self, **keys: Any) -> dict[tuple[str, ...], Count]:
        """The study's safety events counted in SQL per value of every subset of ``keys`` (a key
        left out reads 'all'), keyed by the values in the order of ``keys``. De-identified records
        (the participant withdrew and deleted data) count too; they are taken as one participant
        between them, the fewest they can be, so the disclosure rule errs towards suppressing."""
        who = func.coalesce(SafetyEvent.participant_id, -1)
        queries = []
        for kept in itertools.product((True, False), repeat=len(keys)):
            labels = [(key if keep else literal(ALL)).label(name) for (name, key), keep in zip(keys.items(), kept,
                                                                                               strict=True)]
            queries.append(select(*labels, func.count().label("events"), func.count(who.distinct()).label("who"))
                           .where(SafetyEvent.study_id == self.study_id)
                           .group_by(*(key for key, keep in zip(keys.values(), kept, strict=True) if keep)))
        frame = read_frame(self.connection, union_all(*queries))
        return {tuple(row[:-2]): Count(int(row[-2]), int(row[-1]), False) for row in frame.itertuples(index=False)}

    def _event_grid(self, table: _Table, cells: dict[tuple[str, ...], Count], rows: dict[str, int],
                    parts: list[str]) -> None:
        """A table of safety-event counts (``_events``, by row label and column): each row's parts
        and their total, the 'all' row the sum of the others."""
        none = Count(0, 0, False)
        for label, row in rows.items():
            for column in parts:
                self.count(table, row, column, cells.get((label, column), none))
            self.count(table, row, "total", cells.get((label, ALL), none))
            self.disclosure.add_sum(table.key(row, "total"), [table.key(row, c) for c in parts])
        self.margin(table, rows[ALL], [row for label, row in rows.items() if label != ALL], [*parts, "total"])

    def safety_events(self) -> _Table:
        month = (func.to_char(func.timezone("UTC", SafetyEvent.created_at), "YYYY-MM")
                 if self.connection.dialect.name == "postgresql"
                 else func.substr(SafetyEvent.created_at, 1, 7))  # SQLite: UTC text
        cells = self._events(month=month, category=SafetyEvent.category)
        categories = _in_order(list(get_args(CrisisCategory)), [c for _, c in cells if c != ALL])
        table = _Table(TableSpec("safety_events", "Safety events (every risk finding recorded for staff review, at "
                                 "any level: check-ins, escalations and check-ins left unanswered) per month (UTC) "
                                 "and category, from the month the study was created to the current one.", [
            Column("month", "string", "Calendar month, YYYY-MM (UTC), or 'all'."),
            *(Column(c, "integer", f"Safety events of category '{c}'.", unit="events") for c in categories),
            Column("total", "integer", "Safety events of any category.", unit="events"),
        ]), ["month"])
        created = self.connection.scalar(select(Study.created_at).where(Study.id == self.study_id))
        first, last = sorted([f"{created:%Y-%m}", f"{now():%Y-%m}"])
        months = _in_order([str(m) for m in pd.period_range(first, last, freq="M")], [m for m, _ in cells if m != ALL])
        self._event_grid(table, cells, {label: table.row(month=label) for label in [*months, ALL]}, categories)
        return table

    def safety_reviews(self, events: _Table) -> _Table:
        table = _Table(TableSpec("safety_reviews", "Safety events by whether staff have reviewed them, and whether "
                                 "the participant has since deleted their research data (the record is then "
                                 "de-identified).", [
            Column("review_status", "string", "'reviewed', 'unreviewed' or 'all'.",
                   enum={"reviewed": "reviewed by staff", "unreviewed": "not reviewed yet", ALL: "all events"}),
            Column("data_kept", "integer", "Events of participants whose research data are kept.", unit="events"),
            Column("data_deleted", "integer", "De-identified records: the participant withdrew and deleted their "
                   "research data.", unit="events"),
            Column("total", "integer", "All safety events (the sum of the two).", unit="events"),
        ]), ["review_status"])
        cells = self._events(
            review_status=case((SafetyEvent.reviewed_at.is_(None), "unreviewed"), else_="reviewed"),
            data=case((SafetyEvent.participant_data_deleted.is_(True), "data_deleted"), else_="data_kept"))
        rows = {status: table.row(review_status=status) for status in ("reviewed", "unreviewed", ALL)}
        self._event_grid(table, cells, rows, ["data_kept", "data_deleted"])
        every = next(i for i, labels in enumerate(events.rows) if labels["month"] == ALL)
        self.link(events.key(every, "total"), [table.key(rows[ALL], "total")])  # the same events
        return table

    # Helpers

    def _followup_cell(self, followups: _Table, wave: str, arm: str) -> CellKey:
        row = next(i for i, r in enumerate(followups.rows) if r["wave"] == wave and r["arm"] == arm)
        return followups.key(row, "completed")

    def _arm_enum(self) -> dict[str, str]:
        return {**{arm: f"{arm} ({self.protocol.arms.get(arm, 'unknown')} mode)" for arm in self.arms},
                ALL: "all arms"}

    def _role_enum(self) -> dict[str, str]:
        return {**{role: role for role in self.roles}, ALL: "all roles"}

    def _wave_enum(self) -> dict[str, str]:
        return {wave: wave for wave in self.waves()}


# Rendering, the library entry point and the export


def _render(table: _Table, disclosure: Disclosure, status: dict[CellKey, str]) -> pd.DataFrame:
    """The table as shown: numbers where shown, else the marker (``"< 5"`` or ``"suppressed"``)."""
    threshold, marker = disclosure.threshold, below(disclosure.threshold)
    records = []
    for i, labels in enumerate(table.rows):
        record: dict[str, Any] = dict(labels)
        for column in table.spec.columns[len(table.labels):]:
            key = table.key(i, column.name)
            if key in disclosure.counts:
                shown = status[key]
                record[column.name] = (disclosure.counts[key].value if shown == SHOWN
                                       else marker if shown == BELOW else SUPPRESSED)
                continue
            derived = table.derived[key]
            if disclosure.counts[derived.inputs[0]].contributors < threshold:
                record[column.name] = marker
            elif any(status[k] != SHOWN for k in derived.inputs):
                record[column.name] = SUPPRESSED
            else:
                record[column.name] = None if derived.value is None else round(derived.value, derived.digits)
        records.append(record)
    return pd.DataFrame(records, columns=[c.name for c in table.spec.columns], dtype=object)


@dataclass
class _Aggregates:
    frames: dict[str, pd.DataFrame]
    specs: list[TableSpec]
    hidden: dict[str, int]  # table -> hidden cells (counts and derived)


# The outcome tables and the column that splits them by arm (roles split by arm too: each arm offers its own).
OUTCOME_SPLITS = {"wellbeing": "arm", "regret": "starting_role"}
POOLED_NOTE = (" Pooled over the arms: the study is blinded until its analysis plan is frozen (analysis.plan), so "
               "only the 'all' rows are given.")


def _aggregate(connection: Connection, study_id: int, threshold: int, pooled: bool | None = None) -> _Aggregates:
    build = _Builder(connection, study_id, threshold)
    followups = build.followups()
    tables = [build.enrollment(), followups, build.wellbeing(followups), build.regret(followups),
              build.conversation_table(), build.safety_events()]
    tables.append(build.safety_reviews(tables[-1]))
    status = build.disclosure.protect()
    frames = {table.name: _render(table, build.disclosure, status) for table in tables}
    if blinding(connection, study_id).blinded if pooled is None else pooled:
        # Only rows are dropped, after the suppression rule: what is left shows nothing it did not before.
        for table in tables:
            if table.name in OUTCOME_SPLITS:
                frame = frames[table.name]
                frames[table.name] = frame[frame[OUTCOME_SPLITS[table.name]] == ALL].reset_index(drop=True)
                table.spec = replace(table.spec, description=table.spec.description + POOLED_NOTE)
    markers = (below(threshold), SUPPRESSED)
    hidden = {name: int(frame.isin(markers).to_numpy().sum()) for name, frame in frames.items()}
    return _Aggregates(frames, [table.spec for table in tables], hidden)


def aggregate_tables(source: Source, study: int | str, *, threshold: int = THRESHOLD,
                     pooled: bool | None = None) -> dict[str, pd.DataFrame]:
    """The study's aggregate tables (``enrollment``, ``followups``, ``wellbeing``, ``regret``,
    ``conversations``, ``safety_events``) with the suppression rule applied: each cell is a
    number, ``"< 5"`` or ``"suppressed"``. ``threshold=0`` gives the tables unsuppressed (for
    staff with participant-level access; never show that to a viewer). While the study is blinded
    (``analysis.plan.blinding``) the outcome tables (``OUTCOME_SPLITS``) keep their ``all`` rows
    only; ``pooled`` overrides that decision (False only for a read ``analysis.plan.outcome_access``
    unblinded)."""
    with connect(source) as connection:
        return _aggregate(connection, resolve_study_id(connection, study), threshold, pooled).frames


@dataclass
class AggregateExport:
    out_dir: Path
    exported_at: dt.datetime
    row_counts: dict[str, int]
    files: list[Path]
    tables: list[TableSpec]
    pooled: bool = False  # the outcome tables pooled over the arms: the study is blinded


def export_aggregates(engine: Engine, study_slug: str, out_dir: Path, *, actor: audit.Actor,
                      audit_in: Session | None = None, unblind: str | None = None) -> AggregateExport:
    """Write the suppressed aggregate tables as CSV files with ``datapackage.json``,
    ``CODEBOOK.md`` and a README stating the suppression rule, and audit the export (action
    ``study.export``, format ``aggregates``). Open to every staff role of the study. While the
    study is blinded its outcome tables are pooled over the arms, unless an admin gives the reason to
    ``unblind`` (``analysis.plan.outcome_access``, audited). ``audit_in``: record the audit entry in
    this session instead of a transaction of its own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    exported_at = now()
    with engine.execution_options(**{READ_ONLY: True}).connect() as connection:
        found = open_study(connection, study_slug, actor, row_level=False)
        blind = outcome_view(engine, found.id, actor, "the aggregates export", unblind=unblind, refuse=False)
        built = _aggregate(connection, found.id, THRESHOLD, pooled=blind.blinded)
    files = []
    for name, frame in built.frames.items():
        (out_dir / f"{name}.csv").write_text(csv_text(frame), encoding="utf-8")
        files.append(out_dir / f"{name}.csv")
    counts = {name: len(frame) for name, frame in built.frames.items()}
    title = f"{found.title} ({study_slug}): aggregate tables"
    package = out_dir / "datapackage.json"
    write_datapackage(package, re.sub(r"[^a-z0-9._-]", "-", f"{study_slug.lower()}-aggregates"), title,
                      built.specs, "csv", counts, f"Aggregate tables of study {study_slug} at "
                      f"{exported_at.isoformat()}; cells resting on fewer than {THRESHOLD} participants hidden.")
    document = json.loads(package.read_text(encoding="utf-8"))
    for resource in document["resources"]:  # the markers of hidden cells read as missing values
        resource["schema"]["missingValues"] = ["", below(), SUPPRESSED]
    package.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    codebook = out_dir / "CODEBOOK.md"
    write_codebook_markdown(codebook, title, built.specs, counts)
    with codebook.open("a", encoding="utf-8") as handle:
        handle.write(f"\n## Hidden cells\n\n`{below()}` and `{SUPPRESSED}` mark hidden values (missing values in "
                     f"`datapackage.json`).\n\n{SUPPRESSION_RULE}")
    _write_readme(out_dir / "README.md", title, exported_at, counts, built.hidden, pooled=blind.blinded)
    files += [package, codebook, out_dir / "README.md"]

    record_export(engine, actor, found.id, audit_in, format=AGGREGATES, options={"threshold": THRESHOLD},
                  row_counts=counts, tables=list(counts), hidden_cells=built.hidden,
                  **({"pooled_over_arms": True} if blind.blinded else {}),
                  **({"unblinded": blind.reason} if blind.unblinded_by else {}))
    return AggregateExport(out_dir, exported_at, counts, files, built.specs, pooled=blind.blinded)


def _write_readme(path: Path, title: str, exported_at: dt.datetime, counts: dict[str, int],
                  hidden: dict[str, int], *, pooled: bool = False) -> None:
    try:
        version = metadata.version("afterward")
    except metadata.PackageNotFoundError:
        version = "unknown"
    lines = [f"# {title}", "",
             f"- exported at: {exported_at.isoformat()}",
             f"- software: afterward {version}",
             f"- packages: {packages_line()}",
             f"- format: {AGGREGATES} (CSV, one file per table)",
             f"- threshold: {THRESHOLD} participants",
             *([f"- blinded: {', '.join(OUTCOME_SPLITS)} are pooled over the arms (their 'all' rows only) until "
                "the study's analysis plan is frozen"] if pooled else []), "",
             "## Tables", "", "| table | rows | hidden cells |", "|---|---|---|",
             *(f"| {name} | {n} | {hidden[name]} |" for name, n in counts.items()), "",
             "Every column is described in `CODEBOOK.md` and `datapackage.json` (Frictionless Data Package). "
             "Rows labelled `all` are the totals of the rows above them.", "",
             "## Suppression rule", "", SUPPRESSION_RULE, "## Text cells in spreadsheets", "", CSV_TEXT_NOTE, ""]
    path.write_text("\n".join(lines), encoding="utf-8")
