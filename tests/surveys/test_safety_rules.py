"""Safety rules on survey answers, and the PHQ-9 and GAD-7 they are most often written for.

The screeners score as published (Kroenke et al. 2001; Spitzer et al. 2006: the sum of the items,
0-3 each; the severity bands' cut points checked at their edges by hand). A protocol's
``safety.answer_rules`` are checked when it loads (the instrument must be asked; the item or score
must exist, with the nearest name suggested). A positive PHQ-9 item 9, through the participant API
and the participant pages, raises one escalation however often it is saved, shows the participant
the crisis resources at once, and reaches the on-call contact's mailbox (a real SMTP server) within
one dispatcher poll, without the answers; an answer of 0 raises nothing."""

from __future__ import annotations

from email.message import EmailMessage
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study import studies
from study.clock import FrozenClock
from study.db import session_scope
from study.models import StaffRole
from study.protocol import ProtocolError
from study.settings import Settings
from surveys import registry
from tests.builders import TEST_ACTOR, csrf_of, enroll_fully, join, load_study, make_invites, make_staff
from tests.mail import smtp_server

PHQ9, GAD7 = registry.builtin()["phq-9"], registry.builtin()["gad-7"]
ONCALL = "oncall@example.org"  # the example protocol's safety contact
RULES = """  answer_rules:
    - {id: phq9-item9, instrument: phq-9, item: phq9_9, at_least: 1, level: escalation}
    - {id: phq9-severe, instrument: phq-9, score: total, at_least: 20, level: check_in}
"""


def screening(example_protocol: str, rules: str = RULES) -> str:
    """The example study with the PHQ-9 at baseline and ``rules`` under safety."""
    text = example_protocol.replace("baseline: [perma-profiler]", "baseline: [perma-profiler, phq-9]", 1)
    return text.replace("    on_unanswered: [page, follow_up]\n", "    on_unanswered: [page, follow_up]\n" + rules, 1)


def phq9(*values: int) -> dict[str, int]:
    return {f"phq9_{i}": value for i, value in enumerate(values, start=1)}


PHQ9_BANDS = [(0, 4, "minimal"), (5, 9, "mild"), (10, 14, "moderate"), (15, 19, "moderately severe"),
              (20, 27, "severe")]


def band(total: float, bands: list[tuple[int, int, str]]) -> str:
    return next(label for low, high, label in bands if low <= total <= high)


@pytest.mark.parametrize(("answers", "total", "severity"), [
    (phq9(0, 0, 0, 0, 0, 0, 0, 0, 0), 0, "minimal"),
    (phq9(1, 1, 1, 1, 0, 0, 0, 0, 0), 4, "minimal"),  # the band edges, summed by hand
    (phq9(1, 1, 1, 1, 1, 0, 0, 0, 0), 5, "mild"),
    (phq9(2, 2, 2, 2, 1, 0, 0, 0, 0), 9, "mild"),
    (phq9(2, 2, 2, 2, 2, 0, 0, 0, 0), 10, "moderate"),
    (phq9(3, 3, 3, 3, 2, 1, 0, 0, 0), 15, "moderately severe"),
    (phq9(3, 3, 3, 3, 3, 2, 1, 1, 1), 20, "severe"),
    (phq9(3, 3, 3, 3, 3, 3, 3, 3, 3), 27, "severe"),
])
def test_the_phq9_total_is_the_sum_of_its_nine_items(answers: dict[str, int], total: int, severity: str) -> None:
    assert PHQ9.score({**answers, "phq9_difficulty": "very"})["total"] == (total, 9, 9)
    assert band(total, PHQ9_BANDS) == severity


@pytest.mark.parametrize(("values", "total"), [((0,) * 7, 0), ((1, 1, 1, 1, 0, 0, 0), 4), ((1, 1, 1, 1, 1, 0, 0), 5),
                                               ((2, 2, 2, 2, 2, 0, 0), 10), ((3, 3, 3, 3, 2, 1, 0), 15),
                                               ((3,) * 7, 21)])
def test_the_gad7_total_is_the_sum_of_its_seven_items(values: tuple[int, ...], total: int) -> None:
    assert GAD7.score({f"gad7_{i}": v for i, v in enumerate(values, start=1)})["total"] == (total, 7, 7)


def test_the_screeners_carry_the_published_wording_and_response_options() -> None:
    assert PHQ9.instructions == ("Over the last 2 weeks, how often have you been bothered by any of the following "
                                 "problems?")
    assert PHQ9.item("phq9_9").text == "Thoughts that you would be better off dead or of hurting yourself in some way"
    assert GAD7.item("gad7_2").text == "Not being able to stop or control worrying"
    for instrument in (PHQ9, GAD7):
        scored = [item for item in instrument.items if item.type == "likert"]
        assert {tuple(item.labels.values()) for item in scored} == {
            ("Not at all", "Several days", "More than half the days", "Nearly every day")}
        assert (min(item.min or 0 for item in scored), max(item.max or 0 for item in scored)) == (0, 3)
    assert [len([i for i in x.items if i.type == "likert"]) for x in (PHQ9, GAD7)] == [9, 7]


@pytest.mark.parametrize(("rules", "problem"), [
    ("  answer_rules:\n    - {id: gad, instrument: gad-7, item: gad7_1, at_least: 2}\n",
     "rule gad is on gad-7, which the study does not ask"),
    ("  answer_rules:\n    - {id: nine, instrument: phq-9, item: phq9_99, at_least: 1}\n",
     "'phq9_99' is not an item of phq-9; did you mean 'phq9_9'?"),
    ("  answer_rules:\n    - {id: both, instrument: phq-9, item: phq9_9, score: total, at_least: 1}\n",
     "give either item or score"),
    ("  answer_rules:\n    - {id: sum, instrument: phq-9, score: totl, at_least: 20}\n",
     "'totl' is not a score of phq-9; did you mean 'total'?"),
])
def test_a_rule_the_study_cannot_apply_is_refused_with_its_line(engine: Engine, example_protocol: str, rules: str,
                                                                  problem: str) -> None:
    with session_scope(engine) as session, pytest.raises(ProtocolError) as refused:
        studies.load_protocol(session, screening(example_protocol, rules), TEST_ACTOR,
                              instruments=registry.catalog(session))
    [message] = refused.value.problems
    assert message.startswith("safety"), message
    assert "(line " in message
    assert problem in message


def events(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(sa.text(
            "SELECT category, source, level, page_since IS NOT NULL AS pages, cue FROM safety_events "
            "ORDER BY id")).mappings()]


def phq9_assignment(client: TestClient, headers: dict[str, str]) -> int:
    pending = client.get("/api/v1/me/surveys", headers=headers).json()
    return next(s["assignment_id"] for s in pending if s["instrument"] == "phq-9")


def body_of(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


def test_a_positive_item_9_escalates_shows_resources_and_reaches_the_on_call_contact(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, screening(example_protocol))
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite, email="participant@example.org", timezone="Europe/London")
    assignment = phq9_assignment(app_client, who.headers)

    saved = app_client.put(f"/api/v1/me/surveys/{assignment}/answers", headers=who.headers,
                           json={"answers": {"phq9_9": 2}})
    assert saved.status_code == 200, saved.text
    notice = saved.json()["safety"]
    assert notice["region"] == "GB"
    assert "Samaritans on 116 123" in notice["resources"]
    assert "A member of the study team will see these answers" in notice["message"]
    [event] = events(engine)
    assert event == {"category": "risk_to_self", "source": "survey", "level": "escalation", "pages": True,
                     "cue": event["cue"]}
    assert event["cue"].endswith("rule phq9-item9: phq9_9 = 2")

    app_client.put(f"/api/v1/me/surveys/{assignment}/answers", headers=who.headers, json={"answers": {"phq9_9": 3}})
    submitted = app_client.post(f"/api/v1/me/surveys/{assignment}/submit", headers=who.headers, json={
        "answers": phq9(1, 1, 1, 1, 1, 1, 1, 1, 3), "submission_id": "first-submit"})
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["safety"]["resources"] == notice["resources"]
    assert len(events(engine)) == 1  # one event per rule and response, however often it is saved

    with smtp_server() as (inbox, port):
        report = Dispatcher(engine, Settings(smtp_port=port), name="test").tick()
        assert not report.errors
        [message] = inbox.to(ONCALL)  # within that one poll
    text = body_of(message)
    assert text.startswith("A participant's answers to a questionnaire met one of the study's safety rules.")
    assert "Level: escalation" in text
    assert "Category: risk to self" in text
    for trace in (who.code, "phq9_9", "participant@example.org"):
        assert trace not in message.as_string()

    # The clinician reads which rule the answers met (no conversation to show), and reviews it.
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'clinician@uni.example')}"}
    with engine.connect() as connection:
        event_id = connection.execute(sa.text("SELECT id FROM safety_events")).scalar_one()
    read = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events/{event_id}", headers=staff)
    assert read.status_code == 200, read.text
    assert (read.json()["conversation_id"], read.json()["turns"], read.json()["transcript_path"]) == (None, [], "")
    assert read.json()["event"]["cue"].endswith("rule phq9-item9: phq9_9 = 2")


def test_a_severe_total_raises_a_check_in_and_answers_of_0_raise_nothing(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, screening(example_protocol))
    first, second = make_invites(engine, slug, 2)
    calm = enroll_fully(app_client, first)
    answered = app_client.post(f"/api/v1/me/surveys/{phq9_assignment(app_client, calm.headers)}/submit",
                               headers=calm.headers, json={"answers": phq9(3, 3, 3, 3, 3, 3, 3, 2, 0),
                                                           "submission_id": "calm-submit"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["safety"] is not None  # 23: the severe total's rule
    [event] = events(engine)
    assert (event["level"], event["pages"]) == ("check_in", False)  # this protocol pages escalations only
    assert event["cue"].endswith("rule phq9-severe: total = 23")

    quiet = enroll_fully(app_client, second)
    answered = app_client.post(f"/api/v1/me/surveys/{phq9_assignment(app_client, quiet.headers)}/submit",
                               headers=quiet.headers, json={"answers": phq9(1, 0, 1, 0, 2, 0, 1, 0, 0),
                                                            "submission_id": "quiet-submit"})
    assert answered.json()["safety"] is None
    assert len(events(engine)) == 1


def test_the_survey_page_shows_the_resources_once_item_9_is_answered(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, screening(example_protocol))
    [invite] = make_invites(engine, slug)
    consent_page = join(app_client, invite)
    signed = app_client.post("/consent", data={"csrf": csrf_of(consent_page), "version": "1.2",
                                               "typed_signature": "AP",
                                               "confirmations": ["read-and-understood", "adult", "voluntary"]})
    assert signed.status_code == 200, signed.text
    onboarding = app_client.get("/onboarding")
    app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Berlin",
                                         "contact_email": ""})
    with engine.connect() as connection:
        assignment = connection.execute(sa.text(
            "SELECT id FROM survey_assignments WHERE instrument_id = 'phq-9'")).scalar_one()
    form = app_client.get(f"/surveys/{assignment}")
    assert "Help, right now" not in form.text
    finished = app_client.post(f"/surveys/{assignment}", data={
        "csrf": csrf_of(form.text), "step": "0", "submission_id": "page-submit-1", "go": "submit",
        **{name: str(value) for name, value in phq9(0, 1, 0, 1, 0, 1, 0, 1, 1).items()}})
    assert finished.status_code == 200, finished.text
    assert "Your answers were saved." in finished.text
    assert 'aria-label="Help, right now"' in finished.text
    assert "TelefonSeelsorge" in finished.text  # the protocol's resources for Germany
    assert "Help, right now" in app_client.get(f"/surveys/{assignment}").text  # and when it is opened again
