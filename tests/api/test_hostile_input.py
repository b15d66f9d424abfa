"""Hostile and unlucky input gets a 4xx with a message a person can act on, never a 500; the
same validators guard the API and the pages. Each test is one finding of the reliability issue."""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine

from study.models import StaffRole
from study.settings import Settings
from tests.api.test_pages import csrf_of, join, sign
from tests.builders import (
    ParticipantHandle,
    assign_survey,
    enroll,
    enroll_fully,
    make_invites,
    make_staff,
    put_in_arm,
    sign_consent,
    start_chat,
)
from tests.live import live_server
from tests.waiting import WAIT_SECONDS

SLUG = "wellbeing-pilot"


@pytest.fixture
def who(engine: Engine, app_client: TestClient, slug: str) -> ParticipantHandle:
    return enroll_fully(app_client, make_invites(engine, slug)[0])


@pytest.fixture
def staff_headers(engine: Engine, slug: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.ADMIN, 'admin@uni.example')}"}


def refused(response: Any, status: int, *words: str) -> None:
    """The response (from TestClient or httpx) is ``status`` with a message naming ``words``."""
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"] if "json" in response.headers["content-type"] else response.text
    for word in words:
        assert word in message, message


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(sql)).scalar_one())


def in_control_arm(app_client: TestClient, engine: Engine) -> None:
    """The page's participant in the control arm: a standard assistant, no role to choose."""
    code = re.search(r"<strong>(P[0-9A-Z]+)</strong>", app_client.get("/me").text)
    assert code
    put_in_arm(engine, code.group(1), "control")


def onboarding_page(app_client: TestClient, engine: Engine, slug: str) -> str:
    [invite] = make_invites(engine, slug)
    sign(app_client, join(app_client, invite))
    return csrf_of(app_client.get("/onboarding").text)


# Email addresses: one validator for the API and the onboarding page.


@pytest.mark.parametrize("email", ["me@x.org\r\nBcc: v@y.net", "a@x.org, v1@y.net", "a@x.org;b@y.net",
                                   "Someone <a@x.org>", "no-at-sign.example.org"])
def test_the_onboarding_page_refuses_an_injected_or_listed_email(engine: Engine, app_client: TestClient,
                                                                 slug: str, email: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    response = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris",
                                                    "contact_email": email}, follow_redirects=False)
    assert response.status_code == 422, response.text
    assert "email" in response.text.lower()
    assert count(engine, "SELECT count(*) FROM participants WHERE contact_email_encrypted IS NOT NULL") == 0
    assert count(engine, "SELECT count(*) FROM participants WHERE status = 'enrolled'") == 0


@pytest.mark.parametrize("email", ["me@x.org\r\nBcc: v@y.net", "a@x.org, v1@y.net"])
def test_the_api_refuses_the_same_emails(engine: Engine, app_client: TestClient, slug: str, email: str) -> None:
    who = enroll(app_client, make_invites(engine, slug)[0])
    sign_consent(app_client, who)
    refused(app_client.put("/api/v1/me/profile", headers=who.headers,
                           json={"timezone": "Europe/Paris", "contact_email": email}), 422, "email")


def test_a_valid_email_from_the_page_is_stored_normalized(engine: Engine, app_client: TestClient,
                                                          slug: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    response = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris",
                                                    "contact_email": " someone@Example.ORG "}, follow_redirects=False)
    assert response.status_code == 303


# NUL characters: PostgreSQL cannot store them; every text input refuses them.


def test_nul_in_every_text_input_is_refused(engine: Engine, app_client: TestClient, slug: str,
                                            who: ParticipantHandle, staff_headers: dict[str, str]) -> None:
    put_in_arm(engine, who.code, "control")
    conversation = start_chat(app_client, who, role=None)
    base = f"/api/v1/me/conversations/{conversation}"
    refused(app_client.post(f"{base}/messages", headers=who.headers, json={"content": "hi\x00there"}), 422, "NUL")
    refused(app_client.post(f"{base}/end", headers=who.headers,
                            json={"made_decision": True, "decision": "quit\x00"}), 422, "NUL")
    refused(app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff_headers,
                            json={"label": "flyer\x00"}), 422, "NUL")
    refused(app_client.post("/api/v1/staff/login", json={"email": "a\x00@x.org", "password": "pw"}), 422, "NUL")
    newcomer = enroll(app_client, make_invites(engine, slug)[0])
    refused(app_client.post("/api/v1/me/consent", headers=newcomer.headers, json={
        "version": "1.2", "confirmations": ["adult"], "typed_signature": "A\x00B"}), 422, "NUL")
    refused(app_client.get(f"/api/v1/staff/studies/{slug}/responses?instrument=perma%00", headers=staff_headers),
            400, "NUL")
    refused(app_client.get("/api/v1/staff/studies/wellbeing%00pilot/participants", headers=staff_headers),
            400, "NUL")
    assert count(engine, "SELECT count(*) FROM turns") == 0


def test_nul_in_page_forms_is_refused(engine: Engine, app_client: TestClient, slug: str) -> None:
    [invite] = make_invites(engine, slug)
    html = join(app_client, invite)
    response = app_client.post("/consent", data={"csrf": csrf_of(html), "version": "1.2", "typed_signature": "A\x00",
                                                 "confirmations": ["read-and-understood", "adult", "voluntary"]})
    refused(response, 422, "NUL")


# Ids beyond what the database stores.


@pytest.mark.parametrize("big", [2**31, 2**63, 10**30])
def test_ids_out_of_range_are_refused_in_every_kind_of_path(app_client: TestClient, who: ParticipantHandle,
                                                            staff_headers: dict[str, str], big: int) -> None:
    api = [("GET", f"/api/v1/me/conversations/{big}"), ("POST", f"/api/v1/me/conversations/{big}/retry"),
           ("POST", f"/api/v1/me/conversations/1/turns/{big}/reconsider"),
           ("GET", f"/api/v1/me/surveys/{big}"), ("PUT", f"/api/v1/me/surveys/{big}/answers")]
    for method, path in api:
        body: dict[str, Any] | None = {"answers": {}} if method == "PUT" else None
        refused(app_client.request(method, path, headers=who.headers, json=body), 422)
    refused(app_client.post(f"/api/v1/staff/studies/{SLUG}/safety-events/{big}/review", headers=staff_headers,
                            json={"note": "checked"}), 422)
    for path in (f"/surveys/{big}", f"/chat/{big}", f"/chat/{big}/end"):  # pages: a page that says so
        assert app_client.get(path, follow_redirects=False).status_code == 404


# Numbers: NaN and infinity are not answers.


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_answers_are_refused(engine: Engine, app_client: TestClient, who: ParticipantHandle,
                                        literal: str) -> None:
    survey = app_client.get("/api/v1/me/surveys", headers=who.headers).json()[0]["assignment_id"]
    body = f'{{"answers": {{"A1": {literal}}}}}'.encode()
    for method, path in (("PUT", "answers"), ("POST", "submit")):
        payload = body if method == "PUT" else body[:-1] + b', "submission_id": "abcdefgh"}'
        refused(app_client.request(method, f"/api/v1/me/surveys/{survey}/{path}", content=payload,
                                   headers={**who.headers, "Content-Type": "application/json"}), 422, "finite")
    assert count(engine, "SELECT count(*) FROM survey_responses") == 0


def test_non_numeric_answers_on_the_page_are_named(engine: Engine, app_client: TestClient, slug: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    moved = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris",
                                                 "contact_email": "p@example.org"}, follow_redirects=False)
    survey = moved.headers["location"]
    for raw in ("nan", "inf", "lots"):
        response = app_client.post(survey, data={"csrf": csrf, "step": "0", "go": "next", "A1": raw})
        assert response.status_code == 422, response.text
        assert "A1" in response.text or "number" in response.text


# Page forms with tampered fields.


def test_page_forms_with_a_tampered_step_or_rating_get_a_clear_answer(engine: Engine, app_client: TestClient,
                                                                     slug: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    survey = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris",
                                                  "contact_email": "p@example.org"},
                             follow_redirects=False).headers["location"]
    for step in ("abc", "-1", "99999", "1e9", "٣"):
        response = app_client.post(survey, data={"csrf": csrf, "step": step, "go": "next"})
        assert response.status_code == 422, (step, response.text)
        assert "out of date" in response.text
    assert app_client.get(f"{survey}?step=abc").status_code == 200  # a bad link shows the first page
    in_control_arm(app_client, engine)
    conversation = app_client.post("/chat", data={"csrf": csrf},
                                   follow_redirects=False).headers["location"]
    for rating in ("great", "7.5", "0", "8"):
        response = app_client.post(f"{conversation}/end", data={"csrf": csrf, "rating": rating})
        assert response.status_code == 422, (rating, response.text)
        assert "rating" in response.text


def test_page_routes_apply_the_apis_length_checks(engine: Engine, app_client: TestClient, slug: str) -> None:
    [invite] = make_invites(engine, slug)
    html = join(app_client, invite)
    long_signature = app_client.post("/consent", data={
        "csrf": csrf_of(html), "version": "1.2", "typed_signature": "A" * 5000,
        "confirmations": ["read-and-understood", "adult", "voluntary"]})
    assert long_signature.status_code == 422
    assert "Typed signature" in long_signature.text
    sign(app_client, html)
    csrf = csrf_of(app_client.get("/onboarding").text)
    app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris"})
    in_control_arm(app_client, engine)
    conversation = app_client.post("/chat", data={"csrf": csrf},
                                   follow_redirects=False).headers["location"]
    too_long = app_client.post(f"{conversation}/send", data={"csrf": csrf, "content": "x" * 50_000})
    assert too_long.status_code == 422
    decision = app_client.post(f"{conversation}/end", data={"csrf": csrf, "made_decision": "yes",
                                                            "decision": "d" * 5000})
    assert decision.status_code == 422
    assert "decision" in decision.text
    role = app_client.post("/chat", data={"csrf": csrf, "role": "r" * 500})
    assert role.status_code == 422
    assert count(engine, "SELECT count(*) FROM turns") == 0


# Invite expiry: a moment with a time zone, in range, in the future.


@pytest.mark.parametrize(("expires_at", "words"), [
    ("2030-01-01T00:00:00", "time zone"), ("9999-12-31T23:59:59Z", "between"), (0, "between"),
    ("2001-01-01T00:00:00Z", "in the past"), ("not a date", "datetime")])
def test_invite_expiry_must_be_an_aware_future_time(app_client: TestClient, slug: str,
                                                    staff_headers: dict[str, str], expires_at: object,
                                                    words: str) -> None:
    refused(app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff_headers,
                            json={"expires_at": expires_at}), 422, words)


# Body size: refused before it is read and parsed.


def test_an_oversized_body_is_refused_before_parsing(app_client: TestClient, who: ParticipantHandle) -> None:
    big = b'{"content": "' + b"x" * (20 * 1024 * 1024) + b'"}'
    refused(app_client.post("/api/v1/me/conversations/1/messages", content=big,
                            headers={**who.headers, "Content-Type": "application/json"}), 413, "larger than")

    def chunks() -> Iterator[bytes]:
        for _ in range(30):
            yield b"x" * 100_000
    streamed = app_client.post("/api/v1/me/conversations/1/messages", content=chunks(),
                               headers={**who.headers, "Content-Type": "application/json"})
    refused(streamed, 413, "larger than")


# Races: one stored row, never a duplicate-key 500.


def test_parallel_submits_and_first_autosaves_store_one_row(engine: Engine, slug: str) -> None:
    with live_server(engine) as url:
        clients = []
        for invite in make_invites(engine, slug, count=2):
            client = httpx.Client(base_url=url, timeout=WAIT_SECONDS)
            token = client.post("/api/v1/enrollment", json={"invite_code": invite}).json()["token"]
            client.cookies.clear()
            client.headers["Authorization"] = f"Bearer {token}"
            client.post("/api/v1/me/consent", json={"version": "1.2", "typed_signature": "A",
                                                    "confirmations": ["read-and-understood", "adult", "voluntary"]})
            client.put("/api/v1/me/profile", json={"timezone": "Europe/Paris"})
            clients.append(client)
        saver, submitter = clients
        saved_survey = saver.get("/api/v1/me/surveys").json()[0]["assignment_id"]
        submitted_survey = submitter.get("/api/v1/me/surveys").json()[0]["assignment_id"]
        statuses: list[int] = []

        def at_once(work: Callable[[int], httpx.Response], n: int = 8) -> None:
            barrier = threading.Barrier(n)

            def run(i: int) -> None:
                barrier.wait()
                statuses.append(work(i).status_code)
            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=WAIT_SECONDS)

        at_once(lambda i: saver.put(f"/api/v1/me/surveys/{saved_survey}/answers", json={"answers": {"A1": i}}))
        at_once(lambda i: submitter.post(f"/api/v1/me/surveys/{submitted_survey}/submit",
                                         json={"answers": {"A1": 5}, "submission_id": "same-submission"}))
        for client in clients:
            client.close()
    assert len(statuses) == 16
    assert set(statuses) <= {200, 409}, statuses
    assert statuses.count(200) >= 9  # every autosave, and the submit (repeats answer with the stored one)
    assert count(engine, f"SELECT count(*) FROM survey_responses WHERE assignment_id = {saved_survey}") == 1
    assert count(engine, f"SELECT count(*) FROM survey_responses WHERE assignment_id = {submitted_survey}") == 1
    assert count(engine, "SELECT count(DISTINCT response_id) FROM survey_scores") == 1


# Survey links after submission: "done", not the answers.


def test_a_survey_link_shows_done_without_the_answers_after_submission(engine: Engine, app_client: TestClient,
                                                                       who: ParticipantHandle) -> None:
    from study.db import session_scope
    from surveys.models import SurveyAssignment
    from surveys.service import link_token

    survey = app_client.get("/api/v1/me/surveys", headers=who.headers).json()[0]["assignment_id"]
    with session_scope(engine) as session:
        assignment = session.get(SurveyAssignment, survey)
        assert assignment is not None
        link = link_token(assignment)
    answered = app_client.post(f"/api/v1/survey-links/{link}/submit",
                               json={"answers": {"A1": 7, "P1": 3}, "submission_id": "secret-answers"})
    assert answered.status_code == 200, answered.text
    app_client.cookies.clear()
    after = app_client.get(f"/api/v1/survey-links/{link}")
    assert after.status_code == 200
    assert (after.json()["status"], after.json()["saved_answers"]) == ("completed", {})
    page = app_client.get(f"/s/{link}")
    assert "already completed" in page.text
    assert re.search(r'value="7"[^>]*checked|checked[^>]*value="7"', page.text) is None


# Headers on every response, errors included; security schemes in the OpenAPI document.


def test_every_response_is_not_stored_and_carries_the_security_headers(engine: Engine) -> None:
    from api.app import create_app

    app: FastAPI = create_app(engine)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("an unexpected failure")

    with TestClient(app, raise_server_exceptions=False) as client:
        for path, status in (("/", 200), ("/api/v1/me", 401), ("/healthz", 200), ("/nowhere", 404),
                             ("/boom", 500)):
            response = client.get(path)
            assert response.status_code == status
            assert response.headers["Cache-Control"] == "no-store", path
            assert response.headers["X-Content-Type-Options"] == "nosniff", path
            assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"], path
        assert "something went wrong" in client.get("/boom").json()["error"]["message"]


def test_the_openapi_document_declares_how_each_operation_authenticates(app_client: TestClient) -> None:
    document = app_client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert {"ParticipantToken", "ParticipantCookie", "StaffToken"} <= set(schemes)
    operations = document["paths"]
    assert {"ParticipantToken": []} in operations["/api/v1/me/conversations"]["get"]["security"]
    assert {"StaffToken": []} in operations["/api/v1/staff/studies/{slug}/participants"]["get"]["security"]
    assert "security" not in operations["/api/v1/enrollment"]["post"]


# Production refuses the offline model unless a demo says so.


def test_production_refuses_the_offline_model_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AFTERWARD_ENVIRONMENT": "production", "AFTERWARD_SECRET_KEY": "s" * 40,
                       "AFTERWARD_CONTACT_ENCRYPTION_KEYS": "k", "AFTERWARD_AUDIT_KEY": "a" * 40}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="offline model"):
        Settings()
    monkeypatch.setenv("AFTERWARD_LLM_MODEL", "openai/gpt-4o-mini")
    assert Settings().llm_model == "openai/gpt-4o-mini"
    monkeypatch.setenv("AFTERWARD_LLM_MODEL", "offline/afterward")
    monkeypatch.setenv("AFTERWARD_ALLOW_OFFLINE_MODEL", "true")
    assert Settings().allow_offline_model


# What the new-user probe found after the fix.


def test_healthz_never_waits_for_a_writer(engine: Engine, app_client: TestClient) -> None:
    with engine.connect() as holder:
        holder.execute(text("UPDATE studies SET title = title"))  # holds the write lock (SQLite) / a row
        response = app_client.get("/healthz")
        holder.rollback()
    assert response.status_code == 200


def test_pages_answer_a_browser_with_a_page(engine: Engine, app_client: TestClient, slug: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    for path in ("/surveys/9223372036854775808", "/chat/2147483648", "/chat/99999999999999999999/end"):
        response = app_client.get(path)
        assert (response.status_code, response.headers["content-type"].split(";")[0]) == (404, "text/html"), path
        assert "no such page" in response.text
    nul = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "UTC", "contact_email": "a@b.org\x00"})
    assert (nul.status_code, nul.headers["content-type"].split(";")[0]) == (422, "text/html")
    assert "NUL" in nul.text
    assert app_client.get("/api/v1/me/surveys/9223372036854775808").headers["content-type"] == "application/json"


def test_page_forms_refuse_what_the_api_refuses(engine: Engine, app_client: TestClient, slug: str) -> None:
    csrf = onboarding_page(app_client, engine, slug)
    app_client.post("/onboarding", data={"csrf": csrf, "timezone": "UTC"})
    in_control_arm(app_client, engine)
    conversation = app_client.post("/chat", data={"csrf": csrf}, follow_redirects=False).headers["location"]
    maybe = app_client.post(f"{conversation}/end", data={"csrf": csrf, "made_decision": "maybe"})
    assert maybe.status_code == 422
    obliterate = app_client.post("/me/withdraw", data={"csrf": csrf, "level": "obliterate", "confirm": "yes"})
    assert obliterate.status_code == 422
    assert count(engine, "SELECT count(*) FROM participants WHERE status = 'withdrawn'") == 0


def test_malformed_json_is_named_as_such(app_client: TestClient, who: ParticipantHandle) -> None:
    response = app_client.put("/api/v1/me/profile", content=b'{"timezone": "UTC"\x00}',
                              headers={**who.headers, "Content-Type": "application/json"})
    refused(response, 422, "not valid JSON")


# Text: one validator (study.validation.text) for every string sent: lone surrogates, NUL and
# control characters refused with the field named; line breaks, bidi controls and NFC normalized.

BROKEN = [("\ud83d x", "broken character"), ("a\x1bb", "control character"), ("a\x85b", "control character"),
          ("a\x00b", "NUL")]


def _shapes(schema: dict[str, Any], components: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The alternatives a JSON schema allows, references resolved."""
    if "$ref" in schema:
        yield from _shapes(components[schema["$ref"].rsplit("/", 1)[1]], components)
    elif "anyOf" in schema:
        for alternative in schema["anyOf"]:
            yield from _shapes(alternative, components)
    else:
        yield schema


def _under(name: str, shape: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda value: {name: shape(value)}


def string_slots(schema: dict[str, Any], components: dict[str, Any]) -> Iterator[tuple[str, Callable[[str], Any]]]:
    """Every place a request body takes a string, as (the field a refusal must name, a body with
    the given string there); a key of the body or of an object field is a place too."""
    yield "body", lambda value: {value: "x"}
    for body in _shapes(schema, components):
        for name, field in body.get("properties", {}).items():
            for shape in _shapes(field, components):
                kinds = {s.get("type") for s in _shapes(shape.get("items", {}), components)}
                if shape.get("type") == "string":
                    yield name, _under(name, lambda value: value)
                elif shape.get("type") == "array" and "string" in kinds:
                    yield f"{name}.0", _under(name, lambda value: [value])
                elif shape.get("type") == "object":
                    yield f"{name}.A1", _under(name, lambda value: {"A1": value})
                    yield name, _under(name, lambda value: {value: 1})


def test_every_string_of_every_request_body_is_refused_when_broken(
        engine: Engine, app_client: TestClient, slug: str, who: ParticipantHandle,
        staff_headers: dict[str, str]) -> None:
    """Walks the OpenAPI document, so a new field or endpoint cannot escape the validator. A broken
    key refused as ``body`` shows the body went through ``RequestBody``'s walk, which also
    normalizes every string in it (shown below on a few)."""
    document = app_client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    walked: set[str] = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            headers = staff_headers if path.startswith("/api/v1/staff/") else who.headers
            url = path.replace("{slug}", slug).replace("{token}", "not-a-link")
            url = re.sub(r"\{[a-z_]+\}", "1", url)
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            for field, body_with in string_slots(schema, components):
                for value, words in BROKEN:
                    response = app_client.request(method, url, content=json.dumps(body_with(value)).encode(),
                                                  headers={**headers, "Content-Type": "application/json"})
                    where = f"{method.upper()} {path} {field} {value!r}"
                    assert response.status_code == 422, (where, response.text)
                    named = [f["message"] for f in response.json()["error"]["fields"] if f["field"] == field]
                    assert named, (where, response.text)
                    assert words in named[0], (where, response.text)
                walked.add(f"{method.upper()} {path} {field}")
    assert {"POST /api/v1/me/conversations/{conversation_id}/messages content",
            "PUT /api/v1/me/surveys/{assignment_id}/answers answers", "POST /api/v1/staff/login password",
            "POST /api/v1/me/surveys/{assignment_id}/submit answers.A1", "POST /api/v1/me/consent confirmations.0",
            "POST /api/v1/staff/studies/{slug}/safety-events/{event_id}/review note"} <= walked


def _address(path: str, slug: str, parameter: dict[str, Any], hostile: str) -> str:
    """``path`` with real-looking values, ``hostile`` put inside the value of ``parameter``."""
    values = {"slug": slug, "token": "not-a-link"}
    value = values.get(parameter["name"], "abcd")
    value = value[:4] + hostile + value[4:]
    query = ""
    if parameter["in"] == "path":
        values[parameter["name"]] = value
    else:
        query = f"?{parameter['name']}={value}"
    return re.sub(r"\{([a-z_]+)\}", lambda m: values.get(m.group(1), "1"), path) + query


def test_strings_in_the_address_are_refused_or_cleaned_never_echoed(
        app_client: TestClient, slug: str, who: ParticipantHandle, staff_headers: dict[str, str]) -> None:
    """Every string path and query parameter of the OpenAPI document, with a C0 or C1 control or a
    bidi override in it: a 4xx or an answer, never a 500, and the character never comes back."""
    document = app_client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    walked = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            headers = staff_headers if path.startswith("/api/v1/staff/") else who.headers
            for parameter in operation.get("parameters", []):
                if parameter["in"] not in ("path", "query") or "string" not in {
                        shape.get("type") for shape in _shapes(parameter["schema"], components)}:
                    continue
                for hostile in ("%1B", "%C2%85", "%E2%80%AE"):
                    url = _address(path, slug, parameter, hostile)
                    response = app_client.request(method, url, headers=headers)
                    assert response.status_code < 500, (method, url, response.text)
                    if response.headers["content-type"].startswith(("application/json", "text/")):
                        assert not re.search("[\x1b\x85\u202e]", response.text), (method, url, response.text)
                walked += 1
    assert walked > 20
    refused(app_client.get(f"/api/v1/staff/studies/{slug}/responses?instrument=perma%1B", headers=staff_headers),
            422, "instrument", "control character")
    cleaned = app_client.get("/api/v1/staff/studies/well%E2%80%AEbeing-pilot/summary", headers=staff_headers)
    assert (cleaned.status_code, cleaned.json()["study"]) == (200, slug)


def test_text_is_stored_and_shown_normalized(engine: Engine, app_client: TestClient, slug: str,
                                             staff_headers: dict[str, str]) -> None:
    """Line breaks as \\n, bidi embeddings/overrides/isolates removed, the marks kept, NFC; in a
    participant's message, survey answer, signature and a staff member's review and invite label."""
    newcomer = enroll(app_client, make_invites(engine, slug)[0])
    signed = app_client.post("/api/v1/me/consent", headers=newcomer.headers, json={
        "version": "1.2", "confirmations": ["read-and-understood", "adult", "voluntary"],
        "typed_signature": "A. \u202eNosrep\u202c"})
    assert signed.json()["typed_signature"] == "A. Nosrep", signed.text
    app_client.put("/api/v1/me/profile", headers=newcomer.headers, json={"timezone": "Europe/Paris"})
    put_in_arm(engine, newcomer.code, "wellbeing")
    conversation = start_chat(app_client, newcomer, "concierge")
    sent = "I want to kill myself\r\nre\u0301ally \u2067\u05e9\u05dc\u05d5\u05dd\u2069 \u200f!"
    message = app_client.post(f"/api/v1/me/conversations/{conversation}/messages", headers=newcomer.headers,
                              json={"content": sent}).json()["message"]
    assert message["content"] == "I want to kill myself\nr\u00e9ally \u05e9\u05dc\u05d5\u05dd \u200f!"
    survey = assign_survey(engine, newcomer.code, "goal-progress")
    saved = app_client.put(f"/api/v1/me/surveys/{survey}/answers", headers=newcomer.headers,
                           json={"answers": {"note": "one\rtwo\u202dthree"}})
    assert saved.json()["saved_answers"] == {"note": "one\ntwothree"}, saved.text
    [event] = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events", headers=staff_headers).json()
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{event['id']}/review",
                               headers=staff_headers, json={"note": "called\u202e back\r\nper protocol"})
    assert reviewed.json()["review_note"] == "called back\nper protocol", reviewed.text
    app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff_headers,
                    json={"label": "\u2066flyer\u2069 caf\u0065\u0301"})
    labels = {i["label"] for i in app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff_headers).json()}
    assert "flyer caf\u00e9" in labels


def test_one_line_fields_refuse_line_breaks_and_passwords_are_not_rewritten(
        engine: Engine, app_client: TestClient, slug: str, staff_headers: dict[str, str]) -> None:
    from study import staff
    from study.db import session_scope

    newcomer = enroll(app_client, make_invites(engine, slug)[0])
    refused(app_client.post("/api/v1/me/consent", headers=newcomer.headers, json={
        "version": "1.2", "confirmations": ["adult"], "typed_signature": "A.\nPerson"}), 422,
        "typed_signature", "one line")
    refused(app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff_headers,
                            json={"label": "a\tb"}), 422, "label", "one line")
    sign_consent(app_client, newcomer)  # a trailing line break is trimmed as before
    with session_scope(engine) as session:
        staff.create_staff(session, email="rtl@uni.example", name="rtl", password="\u202ecorrect horse e\u0301",
                           actor=audit_actor())
    as_typed = app_client.post("/api/v1/staff/login", json={"email": "rtl@uni.example",
                                                            "password": "\u202ecorrect horse e\u0301"})
    assert as_typed.status_code == 200, as_typed.text
    normalized = app_client.post("/api/v1/staff/login", json={"email": "rtl@uni.example",
                                                              "password": "correct horse \u00e9"})
    assert normalized.status_code == 403, normalized.text


def audit_actor() -> Any:
    from study.audit import Actor

    return Actor("cli", "test")


def test_page_forms_go_through_the_same_text_validator(engine: Engine, app_client: TestClient, slug: str) -> None:
    [invite] = make_invites(engine, slug)
    html = join(app_client, invite)
    app_client.post("/consent", data={"csrf": csrf_of(html), "version": "1.2", "typed_signature": "A.\u202e B",
                                      "confirmations": ["read-and-understood", "adult", "voluntary"]})
    assert app_client.get("/api/v1/me/consent/signed").json()["typed_signature"] == "A. B"
    csrf = csrf_of(app_client.get("/onboarding").text)
    survey = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Paris",
                                                  "contact_email": "p@example.org"},
                             follow_redirects=False).headers["location"]
    refused(app_client.post(survey, data={"csrf": csrf, "step": "0", "go": "next", "A1": "7\x1b"}), 422,
            "A1", "control character")
    in_control_arm(app_client, engine)
    code = re.search(r"<strong>(P[0-9A-Z]+)</strong>", app_client.get("/me").text)
    assert code
    note_survey = assign_survey(engine, code.group(1), "goal-progress")
    moved = app_client.post(f"/surveys/{note_survey}", data={"csrf": csrf, "step": "0", "go": "next", "progress": "4",
                                                             "note": "first\r\nsecond \u202eline"},
                            follow_redirects=False)
    assert moved.status_code == 303, moved.text
    saved = app_client.get(f"/api/v1/me/surveys/{note_survey}").json()["saved_answers"]
    assert saved == {"progress": 4, "note": "first\nsecond line"}
    conversation = app_client.post("/chat", data={"csrf": csrf}, follow_redirects=False).headers["location"]
    refused(app_client.post(f"{conversation}/send", data={"csrf": csrf, "content": "hi\x9bthere"}), 422,
            "content", "control character")
    assert count(engine, "SELECT count(*) FROM turns") == 0
    # A form cannot carry a lone surrogate: its percent-encoded bytes arrive as U+FFFD, stored as sent.
    broken = app_client.post(f"{conversation}/send", content=f"csrf={csrf}&content=hi%ED%A0%BD".encode(),
                             headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert broken.status_code == 303, broken.text
    assert count(engine, "SELECT count(*) FROM turns WHERE speaker = 'participant'") == 1


def _exchange(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
              headers: dict[str, str]) -> tuple[int, str]:
    connection.request(method, path, body=body, headers={**headers, "Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode()


def test_broken_text_over_a_live_keep_alive_connection_is_refused_and_the_connection_kept(
        engine: Engine, slug: str) -> None:
    [invite] = make_invites(engine, slug)
    with live_server(engine) as url:
        connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        connection.auto_open = 0  # a closed connection must fail the test, not be reopened quietly
        connection.connect()
        socket = connection.sock
        status, enrolled = _exchange(connection, "POST", "/api/v1/enrollment",
                                     json.dumps({"invite_code": invite}).encode(), {})
        assert status == 201, enrolled
        me = {"Authorization": f"Bearer {json.loads(enrolled)['token']}"}
        for method, path, body in (
                ("POST", "/api/v1/me/consent", {"version": "1.2", "typed_signature": "A",
                                                "confirmations": ["read-and-understood", "adult", "voluntary"]}),
                ("PUT", "/api/v1/me/profile", {"timezone": "Europe/Paris"})):
            status, text = _exchange(connection, method, path, json.dumps(body).encode(), me)
            assert status < 300, text
        put_in_arm(engine, json.loads(enrolled)["participant_code"], "control")
        status, started = _exchange(connection, "POST", "/api/v1/me/conversations", b"{}", me)
        conversation = json.loads(started)["id"]
        status, surveys = _exchange(connection, "GET", "/api/v1/me/surveys", None, me)
        survey = json.loads(surveys)[0]["assignment_id"]
        messages = f"/api/v1/me/conversations/{conversation}/messages"
        broken = [(messages, "POST", b'{"content": "\\ud83d x"}'),
                  (f"{messages}?stream=true", "POST", b'{"content": "\\ud83d x"}'),
                  (messages, "POST", b'{"content": "\xed\xa0\xbd x"}'),  # the surrogate's bytes, not its escape
                  (f"/api/v1/me/surveys/{survey}/answers", "PUT", b'{"answers": {"\\ud83d": 1}}'),
                  (f"/api/v1/me/surveys/{survey}/submit", "POST",
                   b'{"answers": {"\\ud83d": 1}, "submission_id": "abcdefgh"}')]
        for path, method, payload in broken:
            status, text = _exchange(connection, method, path, payload, me)
            assert status == 422, (path, text)
            assert "broken character" in json.loads(text)["error"]["message"], text
        status, streamed = _exchange(connection, "POST", f"{messages}?stream=true", b'{"content": "hello"}', me)
        assert status == 200, streamed
        assert "event: reply" in streamed, streamed
        status, plain = _exchange(connection, "POST", messages, b'{"content": "hello again"}', me)
        assert status == 200, plain
        status, saved = _exchange(connection, "PUT", f"/api/v1/me/surveys/{survey}/answers",
                                  b'{"answers": {"A1": 5}}', me)
        assert status == 200, saved
        assert connection.sock is socket  # one connection for all of it: never reset
        connection.close()
    assert count(engine, "SELECT count(*) FROM turns WHERE speaker = 'participant'") == 2
