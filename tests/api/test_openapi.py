"""The OpenAPI document states what the API does: every refusal an operation can give, with the
body it really has, the methods of each address, and the rules its request schemas enforce."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError
from sqlalchemy.engine import Engine

from api.errors import ErrorRead
from chat.schemas import ExitCheck, MessageCreate
from study.protocol import TIME_ZONES
from study.schemas import EnrollmentCreate, InviteCreate, InviteRevoke, ProfileUpdate, SignInLinkCreate
from study.validation import EARLIEST
from surveys.schemas import AnswersUpdate
from tests.builders import enroll_fully, load_study, make_invites

METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture
def document(app_client: TestClient) -> dict[str, Any]:
    return app_client.get("/openapi.json").json()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, operation) for path, item in document["paths"].items()
            for method, operation in item.items() if method in METHODS]


def test_every_refusal_is_documented_with_the_error_body(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        responses = operation["responses"]
        assert {"400", "413", "503"} <= set(responses), (method, path)
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorRead"}, (method, path, status)
                assert response["description"], (method, path, status)
        needs_sign_in = operation.get("security") and {} not in operation["security"]
        assert ("401" in responses) == bool(needs_sign_in or path.startswith("/api/v1/survey-links")), (method, path)
        if "{" in path:
            assert "404" in responses or path.startswith("/api/v1/staff/studies/{slug}"), (method, path)
        if path.startswith("/api/v1/staff/studies/{slug}"):
            assert "no role in this study" in responses["403"]["description"], (method, path)
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_survey_links_need_no_sign_in_but_check_one_that_is_sent(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        if path.startswith("/api/v1/survey-links/"):
            assert operation["security"][-1] == {}, (method, path)
            assert "another participant" in operation["responses"]["403"]["description"]
        elif path.startswith("/api/v1/me"):
            assert {} not in operation["security"], (method, path)
    only_reads = document["paths"]["/api/v1/me"]["get"]["responses"]
    assert "403" not in only_reads  # the CSRF check is for changes only


def test_error_bodies_are_exactly_the_documented_model(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    who = enroll_fully(app_client, make_invites(engine, load_study(engine, example_protocol))[0])
    answers = [
        app_client.get("/api/v1/me/surveys/1%00"),  # the edge
        app_client.post("/api/v1/enrollment", content=b"\xc3(", headers={"Content-Type": "application/json"}),
        app_client.get("/api/v1/me"),  # 401
        app_client.get("/api/v1/me/conversations/999", headers=who.headers),  # 404
        app_client.delete("/api/v1/me", headers=who.headers),  # 405
        app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Mars/Olympus"}),  # 422 fields
        app_client.post("/api/v1/enrollment", json={"invite_code": "ABCD-EFGH-JKMN"}),  # 404 domain
    ]
    assert [a.status_code for a in answers] == [400, 400, 401, 404, 405, 422, 404]
    assert "UTF-8" in answers[1].json()["error"]["message"]
    for answer in answers:
        body = answer.json()
        assert ErrorRead.model_validate(body).model_dump(exclude_none=True) == body, answer.text


def test_405_names_every_method_the_address_has(app_client: TestClient, document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        address = re.sub(r"\{[^}]+\}", "1", path)
        answer = app_client.options(address)
        assert answer.status_code == 405, path
        assert set(answer.headers["Allow"].split(", ")) == {m.upper() for m in item if m in METHODS}, path


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def accepted(model: type[BaseModel], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def states(model: type[BaseModel], body: dict[str, Any]) -> bool:
    validator = jsonschema.Draft202012Validator
    return validator(schema_of(model), format_checker=validator.FORMAT_CHECKER).is_valid(body)


# Rules a service checks that hold whatever the study's data, so the schema states them too.
SERVICE_RULES: dict[type[BaseModel], Callable[[dict[str, Any]], bool]] = {
    MessageCreate: lambda body: bool(body["content"].strip()),  # chat.service.accept_message
    ExitCheck: lambda body: bool(body.get("made_decision")) == bool((body.get("decision") or "").strip()),
}


@pytest.mark.parametrize(("model", "bodies"), [
    (EnrollmentCreate, [{"invite_code": code} for code in ("ABCD", " ABCD ", "\fAB C", "ABC", "  ABC  ", "A" * 64,
                                                         f" {'A' * 64} ", "A" * 65, "AB\x00D")]),
    (MessageCreate, [{"content": text} for text in ("hello", "  hi ", "", "   ", "\n\t", "a\x00b", " \x00 ")]),
    (ExitCheck, [{}, {"rating": 5}, {"made_decision": True, "decision": "took it"}, {"made_decision": True},
                 {"made_decision": True, "decision": "  "}, {"decision": "took it"}, {"decision": "  "},
                 {"made_decision": False, "decision": None}, {"made_decision": 0}]),
    (InviteRevoke, [{"code": "ABCD-EFGH"}, {"invite_id": 3}, {}, {"code": "ABCD", "invite_id": 3},
                    {"code": None, "invite_id": 3}]),
    (AnswersUpdate, [{"answers": {"A1": 3, "E1": 2.5, "T": "text", "M": ["a", "b"], "X": None}},
                     {"answers": {"A\x00": 1}}, {"answers": {"A1": "x\x00"}}]),
    (SignInLinkCreate, [{"email": "someone@example.org"}, {"email": "someone@host.test"},
                        {"email": "someone@x.LOCALHOST"}, {"email": "not an address"}]),
])
def test_the_schema_states_the_rules_the_model_enforces(model: type[BaseModel], bodies: list[dict[str, Any]]) -> None:
    """What the document calls valid is accepted, and what it calls invalid is refused (the rules
    that hold whatever the study's data: ExitCheck's decision rule is the service's, stated here)."""
    for body in bodies:
        enforced = accepted(model, body) and SERVICE_RULES.get(model, lambda _: True)(body)
        if model is AnswersUpdate and enforced:
            continue  # the instrument checks the answers' values further (invalid_answers)
        assert states(model, body) == enforced, body


def test_time_zones_and_moments_are_stated_as_the_validators_take_them() -> None:
    timezone = schema_of(ProfileUpdate)["properties"]["timezone"]
    assert timezone["enum"] == TIME_ZONES
    assert all(accepted(ProfileUpdate, {"timezone": zone}) for zone in TIME_ZONES[::25])
    pattern = schema_of(InviteCreate)["properties"]["expires_at"]["anyOf"][0]["pattern"]
    for moment, ok in ((f"{EARLIEST:%Y}-01-01T00:00:00Z", True), ("2199-12-31T12:00:00+02:00", True),
                       ("1999-12-31T12:00:00Z", False), ("2200-06-01T00:00:00Z", False),
                       ("2026-03-01T09:00:00", False)):
        assert bool(re.search(pattern, moment)) == ok, moment
        assert accepted(InviteCreate, {"expires_at": moment}) == ok, moment
