from __future__ import annotations

import datetime as dt
import re

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from study.clock import FrozenClock
from study.db import session_scope
from study.models import StaffRole
from surveys import service
from surveys.models import SurveyAssignment
from tests.builders import (
    ParticipantHandle,
    assign_survey,
    counting_statements,
    enroll,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
)
from tests.surveys.test_scoring import ANSWERS

DRS_ANSWERS = {"drs1": 2, "drs2": 4, "drs3": 1, "drs4": 5, "drs5": 2}


def _participant(engine: Engine, client: TestClient, protocol: str) -> ParticipantHandle:
    [invite] = make_invites(engine, load_study(engine, protocol))
    return enroll_fully(client, invite)


def _link(engine: Engine, assignment_id: int) -> str:
    with session_scope(engine) as session:
        return service.link_token(session.get_one(SurveyAssignment, assignment_id))


def test_enrollment_assigns_baseline_perma_and_submit_scores_it(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    who = _participant(engine, app_client, example_protocol)
    pending = app_client.get("/api/v1/me/surveys", headers=who.headers).json()
    assert [(s["instrument"], s["purpose"]) for s in pending] == [("perma-profiler", "baseline")]
    survey_id = pending[0]["assignment_id"]
    survey = app_client.get(f"/api/v1/me/surveys/{survey_id}", headers=who.headers).json()
    assert len(survey["items"]) == 23
    assert survey["items"][0]["block"] == "b1"
    submitted = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                                json={"answers": ANSWERS, "submission_id": "baseline-0001"})
    assert submitted.status_code == 200, submitted.text
    scores = {s["name"]: s for s in submitted.json()["scores"]}
    assert scores["overall_wellbeing"]["value"] == 117 / 16
    assert scores["overall_wellbeing"]["n_items"] == 16
    assert app_client.get("/api/v1/me/surveys", headers=who.headers).json() == []


def test_partial_answers_are_kept_and_resumed_from_another_device(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "to quit my job"})
    saved = app_client.put(f"/api/v1/me/surveys/{survey_id}/answers", headers=who.headers,
                           json={"answers": {"drs1": 2, "drs2": 4}})
    assert saved.status_code == 200
    # Another device: the link from the email, no session.
    link = _link(engine, survey_id)
    resumed = app_client.get(f"/api/v1/survey-links/{link}").json()
    assert resumed["saved_answers"] == {"drs1": 2, "drs2": 4}
    assert '"to quit my job"' in resumed["instructions"]
    app_client.put(f"/api/v1/survey-links/{link}/answers", json={"answers": {"drs2": None, "drs3": 1}})
    assert app_client.get(f"/api/v1/survey-links/{link}").json()["saved_answers"] == {"drs1": 2, "drs3": 1}
    done = app_client.post(f"/api/v1/survey-links/{link}/submit",
                           json={"answers": {"drs2": 4, "drs4": 5, "drs5": 2}, "submission_id": "email-0001"})
    assert done.status_code == 200, done.text
    assert done.json()["scores"] == [{"name": "regret", "value": 15.0, "n_items": 5, "n_expected": 5}]


def test_bad_answers_get_422_naming_the_item(engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "x"})
    url = f"/api/v1/me/surveys/{survey_id}"
    cases = [({"drs1": 7}, "drs1", "must be between 1 and 5"),
             ({"drs1": 2.5}, "drs1", "must be a whole number"),
             ({"mood": 3}, "mood", "is not an item of decision-regret")]
    for answers, item, message in cases:
        response = app_client.put(f"{url}/answers", headers=who.headers, json={"answers": answers})
        assert response.status_code == 422
        assert response.json()["error"]["fields"] == [{"field": item, "message": message}]
    missing = app_client.post(f"{url}/submit", headers=who.headers,
                              json={"answers": {"drs1": 1, "drs2": 5, "drs3": 1, "drs4": 5},
                                    "submission_id": "s-000001"})
    assert missing.status_code == 422
    assert missing.json()["error"]["fields"] == [{"field": "drs5", "message": "is required"}]
    with engine.connect() as connection:  # nothing half-submitted
        assert connection.execute(sa.text("SELECT count(*) FROM survey_scores")).scalar_one() == 0


def test_submit_after_the_window_is_410(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "x"},
                              closes_at=frozen_clock.now() + dt.timedelta(days=3))
    app_client.put(f"/api/v1/me/surveys/{survey_id}/answers", headers=who.headers, json={"answers": {"drs1": 1}})
    frozen_clock.advance(dt.timedelta(days=3, seconds=1))
    response = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                               json={"answers": DRS_ANSWERS, "submission_id": "late-000001"})
    assert response.status_code == 410
    assert response.json()["error"]["message"].startswith("this survey closed on 2026-03-05 09:00 UTC")
    with engine.connect() as connection:  # the partial answer is still there
        assert connection.execute(sa.text("SELECT answers FROM survey_responses")).scalar_one() in (
            {"drs1": 1}, '{"drs1": 1}')


def test_double_submit_stores_one_response(engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "x"})
    body = {"answers": DRS_ANSWERS, "submission_id": "retry-000001"}
    first = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers, json=body)
    second = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers, json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    other = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                            json={**body, "submission_id": "retry-000002"})
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "already_completed"
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM survey_responses")).scalar_one() == 1
        assert connection.execute(sa.text("SELECT count(*) FROM survey_scores")).scalar_one() == 1


def _verb_and_table(statement: str) -> str:
    """``SELECT survey_assignments``: what a statement does, and to which table (a read's first column's)."""
    found = re.match(r"(SELECT) (\w+)\.|(INSERT) INTO (\w+)|(UPDATE) (\w+)|(DELETE) FROM (\w+)", statement)
    assert found is not None, statement
    return " ".join(part for part in found.groups() if part)


def test_a_submit_reads_what_it_needs_once_and_nothing_back(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    """A submit's round trips (issue 29): the participant with the consent check and the protocol in
    force (its answer rules), the survey locked (which is also the ownership check), its response
    read after the lock (a statement of its own: see ``surveys.service._locked``), and the writes.
    Nothing is read back: the scores returned are those computed, a response created in this unit of
    work can have no earlier safety event, and a survey that is not a follow-up's has no follow-up to
    complete."""
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "x"})
    with counting_statements(engine) as statements:
        submitted = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                                    json={"answers": DRS_ANSWERS, "submission_id": "counted-0001"})
    assert submitted.status_code == 200, submitted.text
    # items 2 and 4 reversed: 2, 2, 1, 1, 2, mean 1.6, (1.6 - 1) x 25
    assert submitted.json()["scores"] == [{"name": "regret", "value": 15.0, "n_items": 5, "n_expected": 5}]
    assert submitted.json()["safety"] is None
    sent = sorted(_verb_and_table(s) for s in statements if not s.startswith(("PRAGMA", "BEGIN")))  # SQLite's own
    assert sent == sorted(["SELECT participants", "SELECT survey_assignments", "SELECT survey_responses",
                           "INSERT survey_responses",
                           "UPDATE survey_assignments", "INSERT survey_scores"]), statements


def test_links_refuse_another_participant_a_forgery_and_withdrawal(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    invite_a, invite_b = make_invites(engine, slug, count=2)
    alice, bob = enroll_fully(app_client, invite_a), enroll_fully(app_client, invite_b)
    link = _link(engine, assign_survey(engine, alice.code, "goal-progress"))
    other = app_client.get(f"/api/v1/survey-links/{link}", headers=bob.headers)
    assert other.status_code == 403
    assert other.json()["error"]["code"] == "link_other_participant"
    forged = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
    assert app_client.get(f"/api/v1/survey-links/{forged}").status_code == 404
    assert app_client.get(f"/api/v1/survey-links/{link}", headers=alice.headers).status_code == 200
    app_client.post("/api/v1/me/withdrawal", headers=alice.headers, json={"level": "stop_contact", "confirm": True})
    after = app_client.post(f"/api/v1/survey-links/{link}/submit",
                            json={"answers": {"progress": 5}, "submission_id": "after-000001"})
    assert after.status_code == 403
    assert after.json()["error"]["code"] == "withdrawn"
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT DISTINCT status FROM survey_assignments WHERE participant_id = "
                                          "(SELECT id FROM participants WHERE code = :c)"),
                                  {"c": alice.code}).scalars().all() == ["cancelled"]


def test_no_surveys_without_current_consent(engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    who = enroll(app_client, invite)
    survey_id = assign_survey(engine, who.code, "goal-progress")
    for method, path in (("GET", "/api/v1/me/surveys"), ("GET", f"/api/v1/me/surveys/{survey_id}"),
                         ("POST", f"/api/v1/me/surveys/{survey_id}/submit"),
                         ("GET", f"/api/v1/survey-links/{_link(engine, survey_id)}")):
        response = app_client.request(method, path, headers=who.headers,
                                      json={"answers": {"progress": 3}, "submission_id": "nocon-0001"})
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "consent_required"


def test_staff_read_responses_audited_and_viewer_refused(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite)
    survey_id = assign_survey(engine, who.code, "goal-progress")
    app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                    json={"answers": {"progress": 6}, "submission_id": "goal-000001"})
    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    rows = app_client.get(f"/api/v1/staff/studies/{slug}/responses?instrument=goal-progress", headers=researcher)
    assert rows.status_code == 200
    assert [(r["participant_code"], r["answers"], r["scores"]) for r in rows.json()] == [
        (who.code, {"progress": 6}, {"progress": 6.0})]
    assert app_client.get(f"/api/v1/staff/studies/{slug}/responses", headers=viewer).status_code == 403
    definition = app_client.get("/api/v1/staff/instruments/decision-regret", headers=viewer).json()
    assert [i["id"] for i in definition["items"]] == ["drs1", "drs2", "drs3", "drs4", "drs5"]
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM audit_log WHERE action = 'responses.read'")
                                  ).scalar_one() == 1


def test_scores_can_be_recomputed_from_raw_answers(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    who = _participant(engine, app_client, example_protocol)
    survey_id = assign_survey(engine, who.code, "decision-regret", context={"decision": "x"})
    app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers,
                    json={"answers": DRS_ANSWERS, "submission_id": "recompute-1"})
    with engine.begin() as connection:  # a stored score gone wrong (say, an old scoring bug)
        connection.execute(sa.text("UPDATE survey_scores SET value = 99, n_items = 1"))
    with session_scope(engine) as session:
        response = session.scalars(sa.select(service.SurveyResponse)).one()
        scores = service.recompute_scores(session, response)
        assert [(s.name, s.value, s.n_items, s.instrument_version) for s in scores] == [("regret", 15.0, 5, "2003")]
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value FROM survey_scores")).scalars().all() == [15.0]
