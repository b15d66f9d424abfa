"""Aggregate tables and their disclosure control. A hand-built study of 14 participants goes
through the real services and the dispatcher with a frozen clock; every expected number below is
worked out by hand from what the fixture does. Then the suppression: cells resting on fewer than 5
participants read "< 5", and an attacker who knows every shown cell, every sum and the bounds the
markers give away still cannot work out a single hidden cell: neither by subtraction nor by an
exhaustive search of the tables consistent with what is shown (on the study and on random small
studies; the algorithm alone on random tables: test_disclosure.py)."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import statistics
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import frictionless
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from analysis.aggregates import aggregate_tables, export_aggregates
from analysis.disclosure import SUPPRESSED, THRESHOLD
from analysis.exports import ExportRefused
from api.cli import app as cli
from api.routers.staff import viewer_summary
from scheduler.service import save_profile
from study import audit, clock
from study.db import session_scope
from study.models import AuditEntry, Participant, StaffRole, WithdrawalLevel
from study.settings import get_settings
from tests.analysis.attacker import (
    DERIVED,
    LABELS,
    LOW,
    attack,
    by_subtraction,
    cells_of,
    documented_sums,
    knowledge,
    recoverable,
    viewer_view,
)
from tests.analysis.panel_builders import PanelBuilder, Person, perma_answers, populate
from tests.builders import FRAMING, load_study, make_staff

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment: Monday 10:00 in Berlin (CET)
MINUTE = dt.timedelta(minutes=1)
NOW = dt.datetime(2026, 3, 12, 10, 0, tzinfo=dt.UTC)  # when the data are read
ACTOR = audit.Actor.system("tests")

# Overall well-being is the mean of the 15 P/E/R/M/A items and 'hap': every item at v gives v.
BASELINE = {"W1": 5, "W2": 6, "W3": 7, "W4": 8, "W5": 6, "W6": 5, "W7": 4, "W8": 9,
            "C1": 3, "C2": 4, "C3": 5, "C4": 6}
WEEK_1 = {"W1": 6, "W2": 7, "W3": 7, "W4": 9, "W5": 6, "C1": 4, "C2": 5, "C3": 5}
# Decision Regret Scale: every item answered so that, after reversing items 2 and 4, it is k:
# score (k - 1) * 25.
REGRET_K = {"W1": 1, "W2": 2, "W3": 3, "W4": 2, "W5": 1, "W6": 4, "C1": 5}


def every_item(v: int) -> dict[str, int]:
    return perma_answers(dict.fromkeys("PERMANH", v), loneliness=v, happiness=v)


def regret_answers(k: int) -> dict[str, int]:
    return {"drs1": k, "drs2": 6 - k, "drs3": k, "drs4": 6 - k, "drs5": k}


@dataclass
class Built:
    slug: str
    codes: dict[str, str]  # our names (W1..W8 wellbeing, C1..C6 control) -> participant codes
    emails: list[str]


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Built:
    """W1-W8 in the wellbeing arm, C1-C6 in the control arm, all enrolled at T0 (Berlin).

    W1-W5: a coach conversation: a challenge (W1-W3 override it, W4-W5 reconsider), a planning
    question (agree), "I want to kill myself" (escalate: a risk_to_self safety event), a decision.
    W6: a collaborator conversation with a nudge and a decision. W7: a concierge conversation
    (agree), no decision, then withdraws keeping data. W8: a coach conversation with a crisis, then
    withdraws deleting data (gone from every table but enrollment and the de-identified safety record).
    C1: standard, "Just tell me what to do" (agree), "I want to hurt my boss" (escalate:
    harm_to_others), a decision. C2: agree and a decision. C3-C5: agree, no decision. C6: no
    conversation, withdraws keeping data.
    """
    build = PanelBuilder(engine, example_protocol)
    names = [f"W{i}" for i in range(1, 9)] + [f"C{i}" for i in range(1, 7)]
    codes = {name: build.participant("wellbeing" if name[0] == "W" else "control") for name in names}
    emails = [f"{name.lower()}.private@example.org" for name in names]
    with session_scope(engine) as session:
        for name, email in zip(names, emails, strict=True):
            who = session.scalars(select(Participant).where(Participant.code == codes[name])).one()
            save_profile(session, who, timezone="Europe/Berlin", contact_email=email)

    frozen_clock.set(T0 + 10 * MINUTE)
    for name, v in BASELINE.items():
        build.answer(codes[name], purpose="baseline", instrument="perma-profiler", answers=every_item(v))

    frozen_clock.set(T0 + 20 * MINUTE)
    for name in ("W1", "W2", "W3", "W4", "W5", "W8"):
        code = codes[name]
        conversation = build.start(code, "coach")
        challenge = build.say(code, conversation, FRAMING, "Is quitting tomorrow wise?",
                              proposes="challenge/unsupported_framing")
        assert challenge.stance == "challenge"
        if name in ("W1", "W2", "W3", "W8"):
            assert build.override(code, conversation, challenge.id, "Here is a resignation letter.").stance == "agree"
        else:
            build.reconsider(code, conversation, challenge.id)
        if name != "W8":
            assert build.say(code, conversation, "Help me plan my week", "Start with Monday.").stance == "agree"
        assert build.say(code, conversation, "I want to kill myself", "Please call 988 now.").stance == "escalate"
        build.end(code, conversation, rating=5, decision="Take the evening course")
    conversation = build.start(codes["W6"], "collaborator")
    assert build.say(codes["W6"], conversation, FRAMING, "Could you wait a week?",
                     proposes="nudge/unsupported_framing").stance == "nudge"
    build.end(codes["W6"], conversation, rating=4, decision="Wait a week")
    conversation = build.start(codes["W7"], "concierge")
    assert build.say(codes["W7"], conversation, "Help me plan my week", "Start with Monday.").stance == "agree"
    build.end(codes["W7"], conversation, rating=6)
    for name in ("C1", "C2", "C3", "C4", "C5"):
        conversation = build.start(codes[name], None)
        assert build.say(codes[name], conversation, "Just tell me what to do", "Take the job.").stance == "agree"
        if name == "C1":
            assert build.say(codes[name], conversation, "I want to hurt my boss",
                             "Please step away.").stance == "escalate"
        build.end(codes[name], conversation, rating=3, decision="Take the job" if name in ("C1", "C2") else None)

    frozen_clock.set(T0 + dt.timedelta(hours=1))
    build.withdraw(codes["W7"], WithdrawalLevel.STOP_CONTACT)
    build.withdraw(codes["W8"], WithdrawalLevel.DELETE_DATA)
    build.withdraw(codes["C6"], WithdrawalLevel.STOP_CONTACT)

    # regret-day-3: 3 days after the decision, 18:00 CET = 17:00 UTC on 5 March, open 3 days.
    frozen_clock.set(dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC))
    build.tick()
    frozen_clock.set(dt.datetime(2026, 3, 5, 20, 0, tzinfo=dt.UTC))
    for name, k in REGRET_K.items():  # C2 lets hers expire
        build.answer(codes[name], purpose="followup", instrument="decision-regret", answers=regret_answers(k))

    # perma-week-1: 9 March 10:00 CET = 09:00 UTC, open 3 days.
    frozen_clock.set(dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC))
    build.tick()  # also expires C2's regret-day-3 (closed 8 March 17:00 UTC)
    frozen_clock.set(dt.datetime(2026, 3, 9, 12, 0, tzinfo=dt.UTC))
    for name, v in WEEK_1.items():  # W6, C4 and C5 let theirs expire
        build.answer(codes[name], purpose="followup", instrument="perma-profiler", answers=every_item(v))
    frozen_clock.set(NOW)
    build.tick()
    return Built(build.slug, codes, emails)


# What the fixture did, worked out by hand. Rows are the tables' rows in order; None is an
# undefined mean, SD or rate.

BASE_W = [BASELINE[f"W{i}"] for i in range(1, 8)]  # W8's data were deleted
BASE_C = [BASELINE[f"C{i}"] for i in range(1, 5)]  # C5 never answered, C6 withdrew first
WEEK_W = [WEEK_1[f"W{i}"] for i in range(1, 6)]  # W6 let it expire, W7 had withdrawn
WEEK_C = [WEEK_1[f"C{i}"] for i in range(1, 4)]  # C4 and C5 let it expire
REGRET = {name: (k - 1) * 25 for name, k in REGRET_K.items()}
COACH = [REGRET[f"W{i}"] for i in range(1, 6)]
NOBODY: list[float] = []


def stats(values: Sequence[float]) -> tuple[int, float | None, float | None]:
    return (len(values), statistics.mean(values) if values else None,
            statistics.stdev(values) if len(values) > 1 else None)


def rate(completed: int, due: int) -> float | None:
    return completed / due if due else None


def waves(rows: dict[str, list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    return [(wave, *row) for wave, wave_rows in rows.items() for row in wave_rows]


ZEROS = [("wellbeing", 0, 0, 0, 0, None), ("control", 0, 0, 0, 0, None), ("all", 0, 0, 0, 0, None)]
EXPECTED: dict[str, list[tuple[Any, ...]]] = {
    # arm, enrolled, withdrawn, withdrawn_kept_data, withdrawn_data_deleted, participants
    "enrollment": [("wellbeing", 6, 2, 1, 1, 8), ("control", 5, 1, 1, 0, 6), ("all", 11, 3, 2, 1, 14)],
    # wave, arm, due, completed, expired, pending, completion_rate
    "followups": waves({
        # C5's baseline is still open (a baseline has no window); C6's was cancelled by her withdrawal.
        "baseline": [("wellbeing", 7, 7, 0, 0, 1.0), ("control", 5, 4, 0, 1, 0.8), ("all", 12, 11, 0, 1, 11 / 12)],
        "perma-week-1": [("wellbeing", 6, 5, 1, 0, 5 / 6), ("control", 5, 3, 2, 0, 0.6),
                         ("all", 11, 8, 3, 0, 8 / 11)],
        "perma-week-4": ZEROS,  # due 30 March
        "regret-day-3": [("wellbeing", 6, 6, 0, 0, 1.0), ("control", 2, 1, 1, 0, 0.5), ("all", 8, 7, 1, 0, 7 / 8)],
        "regret-day-14": ZEROS,  # due 16 March
    }),
    # wave, arm, n, mean, sd
    "wellbeing": waves({
        "baseline": [("wellbeing", *stats(BASE_W)), ("control", *stats(BASE_C)), ("all", *stats(BASE_W + BASE_C))],
        "perma-week-1": [("wellbeing", *stats(WEEK_W)), ("control", *stats(WEEK_C)),
                         ("all", *stats(WEEK_W + WEEK_C))],
        "perma-week-4": [(arm, *stats(NOBODY)) for arm in ("wellbeing", "control", "all")],
    }),
    # wave, starting_role, n, mean, sd
    "regret": waves({
        "regret-day-3": [("concierge", *stats(NOBODY)), ("collaborator", *stats([REGRET["W6"]])),
                         ("coach", *stats(COACH)), ("standard", *stats([REGRET["C1"]])),
                         ("all", *stats(list(REGRET.values())))],
        "regret-day-14": [(role, *stats(NOBODY)) for role in ("concierge", "collaborator", "coach", "standard", "all")],
    }),
    # arm, starting_role, participants, conversations, assistant_turns, pushback_turns, pushback_rate,
    # overrides, reconsiders. Coach: W1-W3 4 replies (challenge, the reply after the override,
    # agree, escalate), W4-W5 3 (no reply after a reconsider). Control: C1 2 replies, C2-C5 one each.
    "conversations": [
        ("wellbeing", "concierge", 1, 1, 1, 0, 0.0, 0, 0),
        ("wellbeing", "collaborator", 1, 1, 1, 1, 1.0, 0, 0),
        ("wellbeing", "coach", 5, 5, 3 * 4 + 2 * 3, 5, 5 / 18, 3, 2),
        ("wellbeing", "all", 7, 7, 20, 6, 6 / 20, 3, 2),
        ("control", "standard", 5, 5, 6, 0, 0.0, 0, 0),
        ("control", "all", 5, 5, 6, 0, 0.0, 0, 0),
        ("all", "all", 12, 12, 26, 6, 6 / 26, 3, 2),
    ],
    # month, risk_to_self, harm_to_others, total: W1-W5's crises, C1's threat, and W8's crisis, kept as a
    # de-identified safety record when she deleted her data
    "safety_events": [("2026-03", 6, 1, 0, 7), ("all", 6, 1, 0, 7)],
    # review_status, data_kept, data_deleted, total: nobody reviewed them; W8's is the de-identified one
    "safety_reviews": [("reviewed", 0, 0, 0), ("unreviewed", 6, 1, 7), ("all", 6, 1, 7)],
}
# Safety events: one participant each, W8's de-identified record counted as one too.
EVENT_PARTICIPANTS = {"reviewed": {"data_kept": 0, "data_deleted": 0, "total": 0},
                      "unreviewed": {"data_kept": 6, "data_deleted": 1, "total": 7},
                      "all": {"data_kept": 6, "data_deleted": 1, "total": 7}}
# Participants a cell rests on, where it is not the cell's value itself: the turn counts of the
# conversations table (participants with at least one such turn).
TURN_PARTICIPANTS = {("wellbeing", "coach"): 5, ("wellbeing", "all"): 7, ("control", "standard"): 5,
                     ("control", "all"): 5, ("all", "all"): 12}


def expected_frame(name: str, columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(EXPECTED[name], columns=columns)


def same_number(shown: Any, expected: Any) -> bool:
    if pd.isna(expected):  # an undefined mean, SD or rate (None becomes NaN in the expected frame)
        return shown is None or (isinstance(shown, float) and np.isnan(shown))
    return isinstance(shown, int | float) and shown == pytest.approx(expected, abs=0.005)


def participants_under(name: str, row: pd.Series, column: str) -> int:
    """How many participants the cell rests on (worked out by hand above)."""
    base = DERIVED.get(column, column)
    if name == "safety_reviews":
        return EVENT_PARTICIPANTS[row["review_status"]][base]
    if name == "conversations" and base in ("assistant_turns",):
        return TURN_PARTICIPANTS.get((row["arm"], row["starting_role"]), int(row[base]))
    return int(row[base])


def test_unsuppressed_tables_equal_the_hand_counts(engine: Engine, study: Built) -> None:
    tables = aggregate_tables(engine, study.slug, threshold=0)
    assert list(tables) == list(EXPECTED)
    for name, frame in tables.items():
        expected = expected_frame(name, list(frame.columns))
        assert len(frame) == len(expected), name
        for (_, got), (_, want) in zip(frame.iterrows(), expected.iterrows(), strict=True):
            for column in frame.columns[:LABELS[name]]:
                assert got[column] == want[column], (name, column)
            for column in frame.columns[LABELS[name]:]:
                assert same_number(got[column], want[column]), (name, dict(got), column, want[column])


def test_cells_under_five_participants_read_below_five(engine: Engine, study: Built) -> None:
    tables = aggregate_tables(engine, study.slug)
    hidden = shown = 0
    for name, frame in tables.items():
        expected = expected_frame(name, list(frame.columns))
        for (_, got), (_, want) in zip(frame.iterrows(), expected.iterrows(), strict=True):
            for column in frame.columns[LABELS[name]:]:
                if participants_under(name, want, column) < THRESHOLD:
                    assert got[column] == LOW, (name, dict(got), column)
                elif got[column] == SUPPRESSED:
                    hidden += 1
                else:
                    assert same_number(got[column], want[column]), (name, dict(got), column)
                    shown += 1
    assert hidden > 0
    assert shown > 0
    # Examples, by hand. Enrollment: an arm's enrolled and withdrawn add up to its participants, so
    # with 8 participants and 6 enrolled shown, "< 5" withdrawn would read 2: the enrolled go
    # (suppressed, at least 5: 5 to 8 enrolled, 3 to 0 withdrawn). The two withdrawal levels share
    # what withdrew (0+2, 1+1 or 2+0), so they show "< 5".
    assert tables["enrollment"].to_numpy().tolist() == [
        ["wellbeing", SUPPRESSED, LOW, LOW, LOW, 8], ["control", SUPPRESSED, LOW, LOW, LOW, 6],
        ["all", SUPPRESSED, LOW, LOW, LOW, 14]]
    # The review of safety events: 7, of them 6 of participants with their data kept and W8's
    # de-identified record. 7 - 6 would give the record away: the 6 go.
    assert tables["safety_reviews"].to_numpy().tolist() == [
        ["reviewed", LOW, LOW, LOW], ["unreviewed", SUPPRESSED, LOW, SUPPRESSED], ["all", SUPPRESSED, LOW, 7]]
    # Safety events: 7 in all, 1 of them (C1's) harm to others and none risk from others: two hidden
    # cells (0-4 each) share the 7 - 6 = 1 left by risk_to_self, as 1+0 or 0+1, so neither can be
    # worked out and risk_to_self (6) is shown.
    assert tables["safety_events"].to_numpy().tolist() == [
        ["2026-03", 6, LOW, LOW, 7], ["all", 6, LOW, LOW, 7]]
    # Regret: coach (5) and all (7) are shown. Then concierge + collaborator + standard = 2, and the
    # follow-up table must not tell how the 2 split between the arms: regret-day-3's completed
    # follow-ups of the wellbeing arm (6 = coach + collaborator + concierge) are suppressed.
    regret = tables["regret"].set_index(["wave", "starting_role"])
    assert regret.loc[("regret-day-3", "coach"), "n"] == 5
    assert regret.loc[("regret-day-3", "all"), "n"] == 7
    followups = tables["followups"].set_index(["wave", "arm"])
    assert followups.loc[("regret-day-3", "wellbeing"), "completed"] == SUPPRESSED
    assert followups.loc[("regret-day-3", "all"), "completed"] == 7
    # A rate whose count is hidden is hidden too, however many participants its denominator has.
    assert followups.loc[("perma-week-1", "control"), "due"] == 5
    assert followups.loc[("perma-week-1", "control"), "completion_rate"] == SUPPRESSED



def test_a_study_without_participants_shows_every_cell_below_five(engine: Engine, example_protocol: str,
                                                                   frozen_clock: clock.FrozenClock) -> None:
    tables = aggregate_tables(engine, load_study(engine, example_protocol))
    assert tables["enrollment"]["arm"].tolist() == ["wellbeing", "control", "all"]
    assert tables["safety_events"]["month"].tolist() == ["2026-03", "all"]
    for name, frame in tables.items():
        assert set(frame.iloc[:, LABELS[name]:].to_numpy().ravel()) == {LOW}, name

def test_no_hidden_cell_can_be_worked_out_from_the_shown_ones(engine: Engine, study: Built) -> None:
    tables = aggregate_tables(engine, study.slug)
    truth = cells_of(aggregate_tables(engine, study.slug, threshold=0))
    sums, participant_counts = documented_sums(tables)
    assert all(truth[total] == sum(truth[p] for p in parts) for total, parts in sums)  # the attacker is right
    shown, bounds = knowledge(cells_of(tables), participant_counts)
    assert len(bounds) > 50
    assert len(shown) > 20
    assert by_subtraction(shown, sums) == {}
    assert recoverable(truth, shown, bounds, sums) == []
    # The attack is real: with the "suppressed" cells shown, "< 5" cells are worked out.
    naive = {cell: truth[cell] for cell, v in cells_of(tables).items() if v == SUPPRESSED}
    assert by_subtraction({**shown, **naive}, sums)
    assert recoverable(truth, {**shown, **naive}, {c: b for c, b in bounds.items() if c not in naive}, sums)
    # Means, SDs and rates are hidden whenever a count they rest on is.
    for name, frame in tables.items():
        for record in frame.to_dict("records"):
            for column, base in DERIVED.items():
                inputs = [base, "completed"] if column == "completion_rate" else (
                    [base, "pushback_turns"] if column == "pushback_rate" else [base])
                if column in record and any(record[c] in (LOW, SUPPRESSED) for c in inputs):
                    assert record[column] in (LOW, SUPPRESSED), (name, record, column)


# Random small studies: the tables and the viewer's summary together give nothing away.

PEOPLE = st.builds(
    Person, arm=st.sampled_from(["wellbeing", "control"]), baseline=st.one_of(st.none(), st.integers(0, 10)),
    chats=st.booleans(), crisis=st.booleans(), reviewed=st.booleans(), decides=st.booleans(),
    withdraws=st.one_of(st.none(), st.sampled_from(list(WithdrawalLevel))),
).map(lambda p: replace(p, crisis=p.crisis and p.chats, decides=p.decides and p.chats))
STUDIES = itertools.count()


@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(people=st.lists(PEOPLE, min_size=1, max_size=9))
def test_no_hidden_count_of_a_random_small_study_can_be_worked_out(
    engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock, people: list[Person],
) -> None:
    """Whatever a small study's participants do (enroll in either arm, answer the baseline or not,
    chat, raise a safety event that is reviewed or not, decide, withdraw keeping or deleting their
    data), the attacker finds no hidden count in the viewer's tables and summary."""
    build = PanelBuilder(engine, example_protocol.replace("id: wellbeing-pilot", f"id: random-{next(STUDIES)}", 1))
    populate(build, people, frozen_clock)
    shown, whole = aggregate_tables(engine, build.slug), aggregate_tables(engine, build.slug, threshold=0)
    versions = {"study": build.slug, "protocol_version": 1, "consent_version": "1.2", "channel_alerts_open": 0}
    cells, sums, counts = viewer_view(shown, viewer_summary(versions, shown).model_dump())
    truth, _, _ = viewer_view(whole, viewer_summary(versions, whole).model_dump())
    assert attack(cells, truth, sums, counts) == ({}, [])
    withdrew = sum(person.withdraws is not None for person in people)
    if 0 < withdrew < THRESHOLD:
        assert shown["enrollment"].iloc[-1]["withdrawn"] == LOW


# The export, who may run it, and its audit trail


def no_identities(text_or_bytes: str | bytes, study: Built) -> bool:
    data = text_or_bytes.encode() if isinstance(text_or_bytes, str) else text_or_bytes
    return not any(secret.encode() in data for secret in [*study.codes.values(), *study.emails])


def as_text(frame: pd.DataFrame) -> list[list[str]]:
    return frame.map(lambda v: "" if v is None else str(v)).to_numpy().tolist()


def test_export_writes_the_tables_a_codebook_and_the_rule(engine: Engine, study: Built, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = export_aggregates(engine, study.slug, out, actor=ACTOR)
    tables = aggregate_tables(engine, study.slug)
    assert result.row_counts == {name: len(frame) for name, frame in tables.items()}
    for name, frame in tables.items():
        written = pd.read_csv(out / f"{name}.csv", dtype=str, keep_default_na=False)
        assert list(written.columns) == list(frame.columns)
        assert written.to_numpy().tolist() == as_text(frame), name
    report = frictionless.validate(str(out / "datapackage.json"))
    assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])
    package = json.loads((out / "datapackage.json").read_text())
    assert [r["path"] for r in package["resources"]] == [f"{name}.csv" for name in tables]
    codebook = (out / "CODEBOOK.md").read_text()
    for resource, frame in zip(package["resources"], tables.values(), strict=True):
        assert [f["name"] for f in resource["schema"]["fields"]] == list(frame.columns)
        assert resource["schema"]["missingValues"] == ["", LOW, SUPPRESSED]
        assert all(f"`{column}`" in codebook for column in frame.columns)
    readme = (out / "README.md").read_text()
    assert "Fewer than 5 participants: `< 5`" in readme
    assert f"- packages: numpy {np.__version__}, pandas {pd.__version__}, " in readme
    assert "No working out by subtraction: `suppressed`" in readme
    assert {path.name for path in out.iterdir()} == {*(f"{name}.csv" for name in tables), "datapackage.json",
                                                    "CODEBOOK.md", "README.md"}
    for path in out.iterdir():
        assert no_identities(path.read_bytes(), study), path.name


def test_every_role_may_export_aggregates_and_each_export_is_audited(
    engine: Engine, study: Built, example_protocol: str, tmp_path: Path,
) -> None:
    other = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study", 1))
    staff = {"viewer@uni.example": StaffRole.VIEWER, "researcher@uni.example": StaffRole.RESEARCHER,
             "admin@uni.example": StaffRole.ADMIN}
    results = {}
    for email, role in staff.items():
        make_staff(engine, study.slug, role, email)
        results[email] = export_aggregates(engine, study.slug, tmp_path / role, actor=audit.Actor("staff", email))
    make_staff(engine, other, StaffRole.ADMIN, "outsider@uni.example")
    with pytest.raises(ExportRefused, match="no role in study 'wellbeing-pilot'"):
        export_aggregates(engine, study.slug, tmp_path / "outsider", actor=audit.Actor("staff", "outsider@uni.example"))
    with engine.connect() as connection:
        entries = connection.execute(select(AuditEntry.actor_type, AuditEntry.actor, AuditEntry.detail)
                                     .where(AuditEntry.action == "study.export").order_by(AuditEntry.seq)).all()
    assert [(e.actor_type, e.actor) for e in entries] == [("staff", email) for email in staff]
    for entry in entries:
        assert entry.detail["format"] == "aggregates"
        assert entry.detail["options"] == {"threshold": THRESHOLD}
        assert entry.detail["row_counts"] == results[entry.actor].row_counts


def test_a_viewer_downloads_aggregates_through_the_api_but_no_rows(engine: Engine, app_client: TestClient,
                                                                     study: Built) -> None:
    headers = {"Authorization": f"Bearer {make_staff(engine, study.slug, StaffRole.VIEWER, 'v@uni.example')}"}
    path = f"/api/v1/staff/studies/{study.slug}/exports"
    for row_level in ("csv", "parquet", "spss", "stata", "trajectories"):
        refused = app_client.get(path, params={"format": row_level}, headers=headers)
        assert refused.status_code == 403, row_level
        assert refused.json()["error"]["code"] == "participant_data_forbidden"
        assert "format=aggregates" in refused.json()["error"]["message"]
    assert app_client.get(path, params={"format": "aggregates", "turns": "true"}, headers=headers).status_code == 422
    response = app_client.get(path, params={"format": "aggregates"}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    tables = aggregate_tables(engine, study.slug)
    assert set(bundle.namelist()) == {f"{study.slug}/{name}" for name in (
        *(f"{table}.csv" for table in tables), "datapackage.json", "CODEBOOK.md", "README.md")}
    written = pd.read_csv(io.BytesIO(bundle.read(f"{study.slug}/followups.csv")), dtype=str, keep_default_na=False)
    assert written.to_numpy().tolist() == as_text(tables["followups"])
    assert all(no_identities(bundle.read(name), study) for name in bundle.namelist())
    with engine.connect() as connection:
        entries = connection.execute(text(
            "SELECT actor FROM audit_log WHERE action = 'study.export'")).scalars().all()
    assert entries == ["v@uni.example"]  # the refused requests left no entry


def test_the_cli_exports_aggregates_for_a_viewer_and_refuses_rows(
    engine: Engine, study: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    make_staff(engine, study.slug, StaffRole.VIEWER, "v@uni.example")
    runner = CliRunner()
    done = runner.invoke(cli, ["export", study.slug, "--format", "aggregates", "--out", str(tmp_path / "agg"),
                               "--as", "v@uni.example"])
    assert done.exit_code == 0, done.output
    assert "enrollment: 3 rows" in done.output
    written = pd.read_csv(tmp_path / "agg" / "enrollment.csv", dtype=str, keep_default_na=False)
    assert written.to_numpy().tolist() == as_text(aggregate_tables(engine, study.slug)["enrollment"])
    refused = runner.invoke(cli, ["export", study.slug, "--format", "csv", "--out", str(tmp_path / "rows"),
                                  "--as", "v@uni.example"])
    assert refused.exit_code == 1
    assert "may not export row-level data" in refused.output
    assert "--format aggregates" in refused.output
    assert not (tmp_path / "rows" / "participants.csv").exists()
    options = runner.invoke(cli, ["export", study.slug, "--format", "aggregates", "--out", str(tmp_path / "x"),
                                  "--turns"])
    assert options.exit_code == 1
    assert "do not apply to --format aggregates" in options.output
