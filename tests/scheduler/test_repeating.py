"""Repeating follow-ups: a daily diary at 20:00 for 14 days, with two reminders and quiet hours,
run through the real services for 16 simulated days across the autumn DST changes of Europe
(25 October 2026) and the United States (1 November 2026), for a participant in each zone and one
who withdraws on day 5. Every occurrence is opened once at 20:00 on the participant's wall clock
(and so at a different UTC hour after their change), its reminders at 21:00 and at the end of the
quiet hours, none after an answer or after withdrawal; the panel has one row per occurrence; the
Follow-ups page shows adherence (answered / sent) per occurrence and per participant."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
import streamlit as st
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis import operations
from analysis.panel import panel
from dashboard import data
from scheduler.dispatcher import Dispatcher
from scheduler.planner import preview
from study.clock import FrozenClock
from study.models import StaffRole
from study.protocol import ProtocolError, parse_protocol
from study.settings import Settings, get_settings
from tests.builders import ParticipantHandle, enroll_fully, load_study, make_invites, make_staff
from tests.dashboard.conftest import sign_in, visit
from tests.mail import smtp_server

DIARY = """followups:
  - id: diary
    instrument: goal-progress
    anchor: enrollment
    offset: P1D
    window: PT20H
    reminders: [PT1H, PT3H]
    send_at_local: "20:00"
    repeat: {every: P1D, count: 14}

quiet_hours:
  start: "22:00"
  end: "07:00"
"""
T0 = dt.datetime(2026, 10, 20, 12, 0, tzinfo=dt.UTC)
ZONES = {"berlin": "Europe/Berlin", "new_york": "America/New_York", "leaver": "Europe/Berlin"}


def diary_protocol(example_protocol: str) -> str:
    start, end = example_protocol.index("followups:"), example_protocol.index("channels:")
    head, tail = example_protocol[:start], example_protocol[end:]
    return head + DIARY + "\n" + re.sub(r"quiet_hours:\n  start: .*\n  end: .*\n", "", tail)


def test_repeat_is_checked_when_the_protocol_loads(example_protocol: str) -> None:
    diary = diary_protocol(example_protocol)
    assert parse_protocol(diary).followups[0].repeat is not None
    for wrong, problem in (("{every: P1D, days: [mon], count: 3}", "either every"),
                           ("{every: P1D}", "either count"),
                           ("{every: PT12H, count: 3}", "whole number of days"),
                           ("{every: P1D, count: 0}", "greater than or equal to 1")):
        with pytest.raises(ProtocolError, match=problem) as refused:
            parse_protocol(diary.replace("{every: P1D, count: 14}", wrong))
        assert re.search(r"followups\[0\]\.repeat.* \(line \d+\)", refused.value.problems[0]), refused.value.problems
    with pytest.raises(ProtocolError, match="each occurrence must close before the next opens"):
        parse_protocol(diary.replace("window: PT20H", "window: P2D"))
    # Calendar months and days of the week.
    monthly = parse_protocol(diary.replace("window: PT20H", "window: P3D").replace(
        "{every: P1D, count: 14}", "{every: P2M, count: 4}")).followups[0]
    assert monthly.repeat is not None
    assert monthly.repeat.dates(dt.date(2026, 8, 31)) == [dt.date(2026, 8, 31), dt.date(2026, 10, 31),
                                                          dt.date(2026, 12, 31), dt.date(2027, 2, 28)]
    weekly = parse_protocol(diary.replace("{every: P1D, count: 14}", "{days: [mon, thu], until: P14D}")).followups[0]
    assert weekly.repeat is not None
    assert [d.strftime("%a %d") for d in weekly.repeat.dates(dt.date(2026, 10, 21))] == [
        "Thu 22", "Mon 26", "Thu 29", "Mon 02"]


def test_the_preview_lists_each_occurrence_at_20_00_local(example_protocol: str) -> None:
    previews = preview(parse_protocol(diary_protocol(example_protocol)), "America/New_York", T0)
    assert [p.occurrence for p in previews] == list(range(14))
    local = [p.messages[0].due_at.astimezone(ZoneInfo("America/New_York")) for p in previews]
    assert {moment.strftime("%H:%M") for moment in local} == {"20:00"}
    assert [moment.day for moment in local] == [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 1, 2, 3]
    assert {p.messages[0].due_at.hour for p in previews[:11]} == {0}  # EDT, UTC-4
    assert {p.messages[0].due_at.hour for p in previews[12:]} == {1}  # EST from 1 November, UTC-5


def rows(engine: Engine, query: str, **params: object) -> list[dict[str, object]]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(sa.text(query), params).mappings()]


def answer_open_diaries(client: TestClient, who: ParticipantHandle) -> int:
    answered = 0
    for survey in client.get("/api/v1/me/surveys", headers=who.headers).json():
        if survey["instrument"] == "goal-progress":
            assignment = survey["assignment_id"]
            submitted = client.post(f"/api/v1/me/surveys/{assignment}/submit", headers=who.headers,
                                    json={"answers": {"progress": 6}, "submission_id": f"diary-answer-{assignment}"})
            assert submitted.status_code == 200, submitted.text
            answered += 1
    return answered


def test_a_14_day_diary_across_two_dst_changes_in_two_zones(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slug = load_study(engine, diary_protocol(example_protocol))
    frozen_clock.set(T0)
    people = {name: enroll_fully(app_client, invite, email=f"{name}@example.org", timezone=ZONES[name])
              for name, invite in zip(ZONES, make_invites(engine, slug, len(ZONES)), strict=True)}
    withdrawn_at = T0 + dt.timedelta(days=5)
    with smtp_server() as (inbox, port):
        dispatcher = Dispatcher(engine, Settings(smtp_port=port), name="diary")
        moment = T0
        while moment <= T0 + dt.timedelta(days=16):
            frozen_clock.set(moment)
            report = dispatcher.tick()
            assert not report.errors, report.errors
            local = moment.astimezone(ZoneInfo(ZONES["berlin"]))
            if local.hour == 20 and local.day % 2 == 1:  # Berlin answers on odd dates, as soon as the survey opens
                answer_open_diaries(app_client, people["berlin"])
            if moment == withdrawn_at:
                left = app_client.post("/api/v1/me/withdrawal", headers=people["leaver"].headers,
                                       json={"level": "stop_contact", "confirm": True})
                assert left.status_code == 200, left.text
            moment += dt.timedelta(hours=1)  # every send time of this protocol is on the hour
        mail = {name: inbox.to(f"{name}@example.org") for name in ZONES}

    diaries = rows(engine, "SELECT p.code, f.occurrence, f.status, f.sent_at, f.intended_local, f.closes_at "
                           "FROM followups f JOIN participants p ON p.id = f.participant_id "
                           "WHERE f.followup_key = 'diary' ORDER BY p.code, f.occurrence")
    for name in ("berlin", "new_york"):
        zone = ZoneInfo(ZONES[name])
        mine = [row for row in diaries if row["code"] == people[name].code]
        assert [row["occurrence"] for row in mine] == list(range(14))  # each occurrence planned once
        opened = [dt.datetime.fromisoformat(str(row["sent_at"])).replace(tzinfo=dt.UTC).astimezone(zone)
                  for row in mine]
        assert {moment.strftime("%H:%M") for moment in opened} == {"20:00"}, opened  # the wall clock, across DST
        assert [(b.date() - a.date()).days for a, b in zip(opened, opened[1:], strict=False)] == [1] * 13
        assert len({moment.utcoffset() for moment in opened}) == 2  # each zone changed its offset meanwhile
    berlin = [row for row in diaries if row["code"] == people["berlin"].code]
    answered = sum(row["status"] == "completed" for row in berlin)
    assert 6 <= answered <= 8
    assert all(row["status"] == "expired" for row in diaries if row["code"] == people["new_york"].code)

    # Email: one invitation per occurrence; reminders at 21:00 and 07:00 (after the quiet hours)
    # only for occurrences not answered by then; nothing to the leaver after withdrawing.
    sent = rows(engine, "SELECT p.code, d.kind, d.sent_at FROM deliveries d JOIN participants p "
                        "ON p.id = d.participant_id WHERE d.channel = 'email' AND d.status = 'sent'")

    def local_hours(name: str) -> list[str]:
        zone = ZoneInfo(ZONES[name])
        return [dt.datetime.fromisoformat(str(row["sent_at"])).replace(tzinfo=dt.UTC).astimezone(zone)
                .strftime("%H:%M") for row in sent if row["code"] == people[name].code]

    assert len(mail["new_york"]) == len(local_hours("new_york")) == 14 * 3
    assert sorted(local_hours("new_york")) == ["07:00"] * 14 + ["20:00"] * 14 + ["21:00"] * 14
    assert len(mail["berlin"]) == len(local_hours("berlin")) == 14 + 2 * (14 - answered)
    assert local_hours("berlin").count("20:00") == 14
    leaver_sent = [dt.datetime.fromisoformat(str(row["sent_at"])).replace(tzinfo=dt.UTC)
                   for row in sent if row["code"] == people["leaver"].code]
    assert leaver_sent
    assert len(mail["leaver"]) == len(leaver_sent)
    assert max(leaver_sent) < withdrawn_at
    leaver = [row for row in diaries if row["code"] == people["leaver"].code]
    assert {row["status"] for row in leaver if row["sent_at"] is None} == {"cancelled"}

    # The panel: one row per occurrence, with its index and intended time.
    waves = panel(engine, slug)
    diary_rows = waves[waves["wave"] == "diary"]
    for name in ("berlin", "new_york"):
        theirs = diary_rows[diary_rows["participant_code"] == people[name].code]
        assert list(theirs["occurrence"]) == list(range(14))
        assert set(theirs["intended_local"].str[-5:]) == {"20:00"}
    assert (diary_rows[diary_rows["participant_code"] == people["berlin"].code]["response_status"]
            == "completed").sum() == answered

    # Adherence, per occurrence and per participant, read by the dashboard's queries and page.
    with engine.connect() as connection:
        study_id = connection.execute(sa.text("SELECT id FROM studies WHERE slug = :s"), {"s": slug}).scalar_one()
        by_participant = operations.adherence_by_participant(connection, study_id).set_index("participant_code")
        by_occurrence = operations.adherence_by_occurrence(connection, study_id)
    assert list(by_participant.loc[people["berlin"].code, ["sent", "answered"]]) == [14, answered]
    assert by_participant.loc[people["berlin"].code, "adherence"] == round(answered / 14, 3)
    assert by_participant.loc[people["new_york"].code, "adherence"] == 0
    assert list(by_occurrence["occurrence"]) == list(range(14))
    assert by_occurrence["answered"].sum() == answered

    make_staff(engine, slug, StaffRole.RESEARCHER, "researcher@uni.example")
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    page = visit(sign_in("researcher@uni.example"), "followups")
    assert "Adherence to repeating follow-ups" in [header.value for header in page.subheader]
    shown = {frame.value.shape[0] for frame in page.dataframe}
    assert 14 in shown  # the table per occurrence
