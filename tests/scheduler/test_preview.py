"""The schedule preview (CLI and staff API) against what the planner writes for a real enrollment."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study.clock import FrozenClock
from study.models import StaffRole
from study.settings import get_settings
from tests.builders import enroll_fully, load_study, make_invites, make_staff, put_in_arm, start_chat

UTC = dt.UTC
runner = CliRunner()
# Enrolled on Saturday 2026-03-28 at 09:00 in London (GMT); the clocks go forward (BST) early on
# Sunday the 29th, so every follow-up after it is at 10:00 local = 09:00 UTC, not 10:00 UTC.
ENROLLED = dt.datetime(2026, 3, 28, 9, 0, tzinfo=UTC)
DECIDED = dt.datetime(2026, 3, 28, 20, 30, tzinfo=UTC)  # Saturday evening, still GMT


@pytest.fixture
def late_protocol(example_protocol: str) -> str:
    """The example, with the week-1 survey asked for at 22:30: inside quiet hours (21:00-08:00)."""
    return example_protocol.replace('send_at_local: "10:00"', 'send_at_local: "22:30"', 1)


def preview_url(slug: str, **params: str) -> str:
    return f"/api/v1/staff/studies/{slug}/followups/preview?" + "&".join(f"{k}={v}" for k, v in params.items())


def planned_rows(engine: Engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT followup_key, due_at, closes_at, reminder_offsets, intended_local "
                                          "FROM followups")).mappings().all()
    return {row["followup_key"]: dict(row) for row in rows}


def as_utc(value: Any) -> dt.datetime:
    value = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_preview_across_daylight_saving_is_what_the_planner_schedules(
    engine: Engine, app_client: TestClient, late_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, late_protocol)
    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    response = app_client.get(preview_url(slug, enrolled_at="2026-03-28T09:00", timezone="Europe/London",
                                          decision_at="2026-03-28T20:30"), headers=researcher)
    assert response.status_code == 200, response.text
    preview = response.json()
    assert as_utc(preview["enrolled_at_utc"]) == ENROLLED
    assert preview["decision_followups_not_shown"] == []
    shown = {f["followup"]: f for f in preview["followups"]}
    assert list(shown) == ["regret-day-3", "perma-week-1", "regret-day-14", "perma-week-4"]  # in time order

    # Asked for Saturday 04-04 at 22:30, quiet until 08:00: Sunday 08:00 BST, which is 07:00 UTC.
    week1 = shown["perma-week-1"]
    assert (week1["intended_local"], week1["moved_by_quiet_hours"]) == ("2026-04-04T22:30", True)
    invitation, *reminders = week1["messages"]
    assert invitation["at_local"] == "2026-04-05T08:00:00+01:00"
    assert as_utc(invitation["at_utc"]) == dt.datetime(2026, 4, 5, 7, 0, tzinfo=UTC)
    assert [(m["kind"], m["sequence"], m["at_local"]) for m in reminders] == [
        ("reminder", 1, "2026-04-06T08:00:00+01:00"), ("reminder", 2, "2026-04-07T08:00:00+01:00")]
    week4 = shown["perma-week-4"]
    assert (week4["moved_by_quiet_hours"], week4["messages"][0]["at_local"]) == (False, "2026-04-25T10:00:00+01:00")
    assert as_utc(week4["messages"][0]["at_utc"]).hour == 9  # BST: not the 10:00 UTC of enrollment day
    assert shown["regret-day-3"]["messages"][0]["at_local"] == "2026-03-31T18:00:00+01:00"

    # A real participant enrolling and deciding at those moments gets exactly this schedule.
    frozen_clock.set(ENROLLED)
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite, email=None, timezone="Europe/London")
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(app_client, who, "collaborator")
    frozen_clock.set(DECIDED)
    ended = app_client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                            json={"rating": 5, "made_decision": True, "decision": "Move to Leeds"})
    assert ended.status_code == 200, ended.text
    rows = planned_rows(engine)
    assert set(rows) == set(shown)
    for key, row in rows.items():
        messages = shown[key]["messages"]
        assert as_utc(messages[0]["at_utc"]) == as_utc(row["due_at"]), key
        assert as_utc(shown[key]["closes_at_utc"]) == as_utc(row["closes_at"]), key
        assert shown[key]["intended_local"] == row["intended_local"], key
        offsets = row["reminder_offsets"]
        offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
        assert [as_utc(m["at_utc"]) for m in messages[1:]] == [
            as_utc(row["due_at"]) + dt.timedelta(seconds=s) for s in offsets], key


def test_preview_api_refuses_bad_input_and_other_roles(engine: Engine, app_client: TestClient,
                                                       example_protocol: str) -> None:
    slug = load_study(engine, example_protocol)
    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}

    def refused(headers: dict[str, str], **params: str) -> tuple[int, dict[str, Any]]:
        response = app_client.get(preview_url(slug, **params), headers=headers)
        return response.status_code, response.json()

    status, body = refused(researcher, enrolled_at="2026-03-28T09:00", timezone="Europe/Lundon")
    assert status == 422
    assert body["error"]["fields"][0]["field"] == "timezone"
    assert "not an IANA time zone" in body["error"]["fields"][0]["message"]
    status, body = refused(researcher, enrolled_at="next-tuesday", timezone="Europe/London")
    assert (status, body["error"]["fields"][0]["field"]) == (422, "enrolled_at")
    status, body = refused(researcher, enrolled_at="2026-03-28T09:00", timezone="Europe/London",
                           decision_at="2026-02-30T10:00")
    assert (status, body["error"]["fields"][0]["field"]) == (422, "decision_at")
    status, body = refused(researcher, enrolled_at="1999-12-31T10:00", timezone="UTC")
    assert status == 422
    assert "between 2000 and 2200" in body["error"]["fields"][0]["message"]
    assert refused(researcher, timezone="UTC")[0] == 422  # enrolled_at missing
    assert refused(viewer, enrolled_at="2026-03-28T09:00", timezone="UTC")[0] == 403
    assert refused({}, enrolled_at="2026-03-28T09:00", timezone="UTC")[0] == 401
    missing = app_client.get("/api/v1/staff/studies/no-such-study/followups/preview?enrolled_at=2026-03-28T09:00"
                             "&timezone=UTC", headers=researcher)
    assert missing.status_code in (403, 404)

    # Without a decision time the decision follow-ups are named, not previewed; an offset is honoured.
    response = app_client.get(preview_url(slug, enrolled_at="2026-03-28T09:00%2B01:00", timezone="Europe/London"),
                              headers=researcher)
    assert response.status_code == 200, response.text
    body = response.json()
    assert as_utc(body["enrolled_at_utc"]) == dt.datetime(2026, 3, 28, 8, 0, tzinfo=UTC)
    assert [f["followup"] for f in body["followups"]] == ["perma-week-1", "perma-week-4"]
    assert body["decision_followups_not_shown"] == ["regret-day-3", "regret-day-14"]


@pytest.fixture
def cli_database(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    return engine


def test_cli_preview_prints_local_and_utc_times_with_quiet_hours(cli_database: Engine, late_protocol: str) -> None:
    slug = load_study(cli_database, late_protocol)
    result = runner.invoke(app, ["followups", "preview", slug, "--enrolled-at", "2026-03-28T09:00",
                                 "--timezone", "Europe/London"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (f"{slug}, protocol version 1, a participant in Europe/London "
                        "(quiet hours 21:00-08:00 local)")
    assert "enrolled   Sat 2026-03-28 09:00 GMT (UTC+0000)  = 2026-03-28 09:00 UTC" in lines
    week1 = lines.index("perma-week-1 (perma-profiler, after enrollment)")
    assert lines[week1 + 1:week1 + 6] == [
        "  invitation Sun 2026-04-05 08:00 BST (UTC+0100)  = 2026-04-05 07:00 UTC",
        "  reminder 1 Mon 2026-04-06 08:00 BST (UTC+0100)  = 2026-04-06 07:00 UTC",
        "  reminder 2 Tue 2026-04-07 08:00 BST (UTC+0100)  = 2026-04-07 07:00 UTC",
        "  closes     Wed 2026-04-08 08:00 BST (UTC+0100)  = 2026-04-08 07:00 UTC",
        "  (asked for 2026-04-04 22:30 local, inside quiet hours: moved)"]
    assert "  invitation Sat 2026-04-25 10:00 BST (UTC+0100)  = 2026-04-25 09:00 UTC" in lines
    assert "give --decision-at to preview them" in result.output

    decided = runner.invoke(app, ["followups", "preview", slug, "--enrolled-at", "2026-03-28T09:00",
                                  "--timezone", "Europe/London", "--decision-at", "2026-03-28T20:30"])
    assert decided.exit_code == 0, decided.output
    assert "decision   Sat 2026-03-28 20:30 GMT (UTC+0000)  = 2026-03-28 20:30 UTC" in decided.output
    assert "regret-day-3 (decision-regret, after decision)\n" \
           "  invitation Tue 2026-03-31 18:00 BST (UTC+0100)  = 2026-03-31 17:00 UTC" in decided.output
    assert "--decision-at to preview" not in decided.output

    bad = runner.invoke(app, ["followups", "preview", slug, "--enrolled-at", "soon", "--timezone", "Mars/Base"])
    assert bad.exit_code == 1
    assert "--timezone: 'Mars/Base' is not an IANA time zone" in bad.output
    assert "--enrolled-at:" in bad.output
    unknown = runner.invoke(app, ["followups", "preview", "no-such-study", "--enrolled-at", "2026-03-28T09:00",
                                  "--timezone", "UTC"])
    assert (unknown.exit_code, "no study 'no-such-study'" in unknown.output) == (1, True)
