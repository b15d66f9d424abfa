"""The server stays up under one participant's ordinary use: the reproducers of the hang, run
against a real uvicorn server over real sockets, with /healthz polled throughout.

Before database work moved off the event loop, the first reproducer (autosave while pressing
"Next") hung the whole server on PostgreSQL and stalled it with 500s on SQLite. What is measured
is what a hang shows whatever the machine's speed: requests that never finish, 5xx answers, and
/healthz not answered while the load runs. That the event loop never waits on the database is
held deterministically by tests/api/test_event_loop.py, not by timing /healthz here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from study.db import make_engine
from study.models import StaffRole
from study.settings import get_settings
from tests.builders import CONFIRMATIONS, load_study, make_invites, make_staff
from tests.live import live_server
from tests.surveys.test_scoring import ANSWERS
from tests.waiting import WAIT_SECONDS


@pytest.fixture
def server(engine: Engine, example_protocol: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    load_study(engine, example_protocol)
    # The lock timeout bounds the wait, it is not what is measured: with both cores busy a writer
    # can hold SQLite's lock past the 5 s default, and the retryable 503 says nothing of a hang.
    monkeypatch.setenv("AFTERWARD_DB_LOCK_TIMEOUT_MS", str(int(WAIT_SECONDS * 1000)))
    get_settings.cache_clear()
    patient = make_engine(engine.url.render_as_string(hide_password=False))
    with live_server(patient) as url:
        yield url
    patient.dispose()


@dataclass
class Outcomes:
    statuses: list[tuple[str, int, str]] = field(default_factory=list)
    health_during_load: int = 0  # /healthz answers that came while a worker's request was still to finish
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, response: httpx.Response) -> None:
        with self.lock:
            self.statuses.append((what, response.status_code, response.text[:300]))

    def server_errors(self) -> list[tuple[str, int, str]]:
        return [s for s in self.statuses if s[1] >= 500]


def browser(url: str, invite: str, onboard: bool = True) -> tuple[httpx.Client, str]:
    """A participant's browser: the session cookie, consent signed, and (optionally) enrolled."""
    client = httpx.Client(base_url=url, timeout=WAIT_SECONDS)
    joined = client.post("/api/v1/enrollment", json={"invite_code": invite})
    assert joined.status_code == 201, joined.text
    csrf = joined.json()["csrf_token"]
    signed = client.post("/api/v1/me/consent", headers={"X-CSRF-Token": csrf}, json={
        "version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "A. Person"})
    assert signed.status_code == 201, signed.text
    if onboard:
        profile = client.put("/api/v1/me/profile", headers={"X-CSRF-Token": csrf},
                             json={"timezone": "Europe/Berlin", "contact_email": "someone@example.org"})
        assert profile.status_code == 200, profile.text
    return client, csrf


def run_together(url: str, outcomes: Outcomes, workers: list[Callable[[], None]]) -> None:
    """Run the workers at once while /healthz is polled; every wait is bounded."""
    done = threading.Event()
    threads = [threading.Thread(target=work) for work in workers]

    def poll_health() -> None:
        with httpx.Client(base_url=url, timeout=WAIT_SECONDS) as client:
            while not done.is_set():
                response = client.get("/healthz")
                outcomes.add("healthz", response)
                if any(thread.is_alive() for thread in threads):
                    with outcomes.lock:
                        outcomes.health_during_load += 1
                done.wait(0.02)  # a pause between polls, not a wait for anything

    health = threading.Thread(target=poll_health)
    health.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_SECONDS)
    done.set()
    health.join(timeout=WAIT_SECONDS)
    assert not any(t.is_alive() for t in [*threads, health]), "a request never finished: the server hangs"


def test_autosave_while_pressing_next_keeps_the_server_up(server: str, engine: Engine) -> None:
    slug = "wellbeing-pilot"
    client, csrf = browser(server, make_invites(engine, slug)[0])
    survey_id = client.get("/api/v1/me/surveys").json()[0]["assignment_id"]
    outcomes = Outcomes()
    rounds = 40

    def autosave(value: int) -> Callable[[], None]:
        def work() -> None:
            for i in range(rounds):
                outcomes.add("autosave", client.put(f"/api/v1/me/surveys/{survey_id}/answers",
                                                    headers={"X-CSRF-Token": csrf},
                                                    json={"answers": {"A1": (value + i) % 11}}))
        return work

    def press_next() -> None:
        for i in range(rounds):
            outcomes.add("next", client.post(f"/surveys/{survey_id}", data={
                "csrf": csrf, "step": "0", "go": "next", "A1": str(i % 11), "E1": "4"}))

    run_together(server, outcomes, [autosave(1), autosave(5), press_next, press_next])
    client.close()

    assert outcomes.server_errors() == []
    assert {status for what, status, _ in outcomes.statuses if what == "autosave"} == {200}
    assert {status for what, status, _ in outcomes.statuses if what == "next"} == {303}
    assert outcomes.health_during_load >= 3, "/healthz was not answered while the load ran"


def test_staff_reading_participants_during_onboarding_keeps_the_server_up(server: str, engine: Engine) -> None:
    slug = "wellbeing-pilot"
    staff_token = make_staff(engine, slug, StaffRole.RESEARCHER, "r@uni.example")
    browsers = [browser(server, invite, onboard=False) for invite in make_invites(engine, slug, count=6)]
    outcomes = Outcomes()

    def onboard(client: httpx.Client, csrf: str) -> Callable[[], None]:
        def work() -> None:
            outcomes.add("onboarding", client.post("/onboarding", data={
                "csrf": csrf, "timezone": "America/New_York", "contact_email": "p@example.org"}))
        return work

    def read_participants() -> None:
        with httpx.Client(base_url=server, timeout=WAIT_SECONDS,
                          headers={"Authorization": f"Bearer {staff_token}"}) as staff:
            for _ in range(20):
                outcomes.add("participants", staff.get(f"/api/v1/staff/studies/{slug}/participants"))

    run_together(server, outcomes, [read_participants, read_participants,
                                    *(onboard(client, csrf) for client, csrf in browsers)])
    for client, _ in browsers:
        client.close()

    assert outcomes.server_errors() == []
    assert {status for what, status, _ in outcomes.statuses if what == "onboarding"} == {303}
    assert {status for what, status, _ in outcomes.statuses if what == "participants"} == {200}
    assert outcomes.health_during_load >= 1, "/healthz was not answered while the load ran"


def test_escalations_and_profile_updates_at_once_keep_the_server_up(server: str, engine: Engine) -> None:
    """Both append to the audit log, whose appends are serialized (an advisory lock on PostgreSQL)."""
    slug = "wellbeing-pilot"
    browsers = [browser(server, invite) for invite in make_invites(engine, slug, count=8)]
    outcomes = Outcomes()

    def escalate(client: httpx.Client, csrf: str) -> Callable[[], None]:
        def work() -> None:
            roles = client.get("/api/v1/me/chat/roles").json()
            body = {"role": roles["default_role"]} if roles["mode"] == "wellbeing" else {}
            started = client.post("/api/v1/me/conversations", headers={"X-CSRF-Token": csrf}, json=body)
            outcomes.add("start", started)
            for _ in range(3):
                outcomes.add("escalation", client.post(
                    f"/api/v1/me/conversations/{started.json()['id']}/messages", headers={"X-CSRF-Token": csrf},
                    json={"content": "I want to end it all tonight, I have a plan"}))
        return work

    def update_profile(client: httpx.Client, csrf: str) -> Callable[[], None]:
        def work() -> None:
            for zone in ("Europe/Paris", "Asia/Tokyo", "America/Chicago"):
                outcomes.add("profile", client.put("/api/v1/me/profile", headers={"X-CSRF-Token": csrf},
                                                   json={"timezone": zone}))
        return work

    run_together(server, outcomes, [*(escalate(*b) for b in browsers[:4]),
                                    *(update_profile(*b) for b in browsers[4:])])
    for client, _ in browsers:
        client.close()

    assert outcomes.server_errors() == []
    assert {status for what, status, _ in outcomes.statuses if what != "healthz"} <= {200, 201}
    assert sum(what == "escalation" for what, _, _ in outcomes.statuses) == 12
    assert outcomes.health_during_load >= 1, "/healthz was not answered while the load ran"


def test_parallel_submits_of_one_submission_id_all_get_the_stored_answer(server: str, engine: Engine) -> None:
    """A double-click or a client's retry storm: every request of one submission_id, however they
    interleave, gets the same 200 (the stored response), as a sequential resend does."""
    client, csrf = browser(server, make_invites(engine, "wellbeing-pilot")[0])
    survey_id = client.get("/api/v1/me/surveys").json()[0]["assignment_id"]
    body = {"answers": ANSWERS, "submission_id": "parallel-0001"}
    outcomes = Outcomes()
    start = threading.Barrier(20, timeout=WAIT_SECONDS)

    def submit() -> None:
        start.wait()
        outcomes.add("submit", client.post(f"/api/v1/me/surveys/{survey_id}/submit",
                                           headers={"X-CSRF-Token": csrf}, json=body))

    run_together(server, outcomes, [submit] * 20)
    again = client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers={"X-CSRF-Token": csrf}, json=body)
    client.close()

    submits = [(status, text) for what, status, text in outcomes.statuses if what == "submit"]
    assert len(submits) == 20
    assert {status for status, _ in submits} == {200}, submits
    assert {text for _, text in submits} == {again.text[:300]}
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM survey_responses")).scalar_one() == 1


def test_parallel_submits_of_the_survey_page_all_end_on_the_thank_you_page(server: str, engine: Engine) -> None:
    """A double click on the last screen's Submit sends one form (one submission_id) twice or more."""
    client, csrf = browser(server, make_invites(engine, "wellbeing-pilot")[0])
    survey_id = client.get("/api/v1/me/surveys").json()[0]["assignment_id"]
    saved = client.put(f"/api/v1/me/surveys/{survey_id}/answers", headers={"X-CSRF-Token": csrf},
                       json={"answers": ANSWERS})
    assert saved.status_code == 200, saved.text
    last = re.search(r'name="step" value="(\d+)"', client.get(f"/surveys/{survey_id}?step=99").text)
    assert last is not None
    form = {"csrf": csrf, "step": last.group(1), "go": "submit", "submission_id": "double-click-0001"}
    outcomes = Outcomes()
    start = threading.Barrier(10, timeout=WAIT_SECONDS)

    def submit() -> None:
        start.wait()
        outcomes.add("submit", client.post(f"/surveys/{survey_id}", data=form))

    run_together(server, outcomes, [submit] * 10)
    again = client.post(f"/surveys/{survey_id}", data=form)
    client.close()

    assert [(status, text) for what, status, text in outcomes.statuses if what == "submit"] == [(303, "")] * 10
    assert (again.status_code, again.headers["location"]) == (303, "/done")
