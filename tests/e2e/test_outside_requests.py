"""Nothing a participant page serves loads from outside this machine: every GET page of the
participant site (read off the app's routes, so a new page is covered when it is added) opened in
Chromium, anonymous and as an enrolled participant with a conversation, a survey and a survey link.
Every request is recorded by ``tests/e2e/conftest.py`` (``nothing_from_outside``, for every browser
test; the staff dashboard's pages by ``test_dashboard.py``, the report's sections by
``test_report_sections.py``)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.routing import APIRoute
from playwright.sync_api import Browser, expect
from sqlalchemy.engine import Engine

from api import chat_pages, pages
from study.db import session_scope
from surveys import service as survey_service
from surveys.models import SurveyAssignment
from tests.builders import assign_survey
from tests.e2e.conftest import OUTSIDE
from tests.e2e.test_participant_journey import new_page
from tests.e2e.test_reply_survives import coach_chat


def page_paths() -> set[str]:
    return {route.path for router in (pages.router, chat_pages.router) for route in router.routes
            if isinstance(route, APIRoute) and "GET" in (route.methods or ())}


def test_every_participant_page_loads_nothing_from_outside(browser: Browser, live_server: str, engine: Engine,
                                                           example_protocol: str) -> None:
    anonymous = new_page(browser, bypass_csp=True)  # what the pages ask for, not what the policy lets through
    for path in sorted(path for path in page_paths() if "{" not in path):
        anonymous.goto(live_server + path)
    page = coach_chat(browser, live_server, engine, example_protocol)
    page.get_by_label("Your message").fill("hi, can you help me plan my week?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".msg.assistant .bubble")).to_have_count(1)
    conversation = page.url.split("#")[0].rstrip("/").rsplit("/", 1)[1]
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    assignment = assign_survey(engine, code, "decision-regret", context={"decision": "to move to Lisbon."})
    with session_scope(engine) as session:
        token = survey_service.link_token(session.get_one(SurveyAssignment, assignment))
    filled = {"{conversation_id}": conversation, "{assignment_id}": str(assignment),
              "/s/{token}": f"/s/{token}", "{token}": "an-expired-link"}  # a sign-in link's refusal page
    visited = []
    for path in sorted(page_paths()):
        for name, value in filled.items():
            path = path.replace(name, value)
        page.goto("about:blank")  # each page a new document: a goto within one document answers no response
        response = page.goto(live_server + path)
        assert response is not None, path
        assert response.status < 500, path
        visited.append(path)
    assert not [path for path in visited if "{" in path], visited
    assert len(visited) >= 12
    assert OUTSIDE == []
