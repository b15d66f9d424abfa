"""A dispatcher's scope (``scheduler.scope``): the live dispatcher touches no row of a simulated
study, and a simulation's dispatcher none of a live study's, whatever is due in the other.

Two studies from the same protocol, one live and one simulated, each with the same things due at
once: follow-ups to open, an opened one whose invitation waits to be emailed, a window that
closed, a check-in past its deadline, an escalation to page the on-call contact; or a new protocol
version to re-plan for. One dispatcher's poll does all of it in its own study (what shows the poll
reached as far as the other's rows) and leaves every row of the other as it was.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.channels import EmailChannel, InAppChannel
from scheduler.dispatcher import Dispatcher, TickReport
from scheduler.models import FollowUp
from study import participants, studies
from study.clock import FrozenClock
from study.db import session_scope
from study.settings import Settings
from surveys import registry
from tests.builders import TEST_ACTOR, enroll_fully, load_study, put_in_arm, say, start_chat
from tests.mail import Inbox, smtp_server

ONCALL = "oncall@example.org"  # the example protocol's safety contact, in both studies
SIMULATED = "pilot-simulated"
CRISIS = "I want to kill myself"
DISTRESS = "I feel hopeless about all of this lately."  # met by a check-in


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def simulated_study(engine: Engine, protocol: str) -> str:
    with session_scope(engine) as session:
        return studies.load_simulated(session, protocol, TEST_ACTOR, SIMULATED,
                                      instruments=registry.catalog(session)).study.slug


def study_id(engine: Engine, slug: str) -> int:
    with session_scope(engine, read_only=True) as session:
        return studies.get_study(session, slug).id


def everything_due(engine: Engine, client: TestClient, clock: FrozenClock, slug: str, email: str,
                   *, simulation: int | None) -> None:
    """Two participants of ``slug`` (the first with an email address) with everything a poll does
    due now: both week-1 follow-ups opened (the first one's invitation waits to be emailed, the
    second one's window has closed), both week-4 ones due, an escalation and a check-in."""
    with session_scope(engine) as session:
        invites = participants.create_invites(session, studies.get_study(session, slug), TEST_ACTOR, count=2,
                                              simulation=simulation)
    first = enroll_fully(client, invites[0], email=email)
    second = enroll_fully(client, invites[1], email=None)
    put_in_arm(engine, first.code, "wellbeing")
    put_in_arm(engine, second.code, "wellbeing")
    assert say(client, first, start_chat(client, first, "coach"), CRISIS)["stance"] == "escalate"
    assert say(client, second, start_chat(client, second, "coach"), DISTRESS)["stance"] == "check_in"
    with engine.begin() as connection:  # every follow-up of the study falls due now, its window open
        connection.execute(sa.text(
            "UPDATE followups SET due_at = :due, closes_at = :closes WHERE study_id = (SELECT id FROM studies "
            "WHERE slug = :slug)"), {"due": clock.now() - dt.timedelta(minutes=5),
                                     "closes": clock.now() + dt.timedelta(days=2), "slug": slug})
    # Both week-1 follow-ups opened by a dispatcher of the study's own (with the email channel).
    opener = Dispatcher(engine, Settings(), name="opener", channels={"in_app": InAppChannel(),
                                                                      "email": EmailChannel(Settings())},
                        simulated_study=study_id(engine, slug) if simulation is not None else None)
    for who in (first, second):
        opener.open_due(TickReport(), only=followup_of(engine, who.code, "perma-week-1"))
    closed = followup_of(engine, second.code, "perma-week-1")
    with engine.begin() as connection:  # the second one's window closed since
        connection.execute(sa.text("UPDATE followups SET closes_at = :at WHERE id = :id"),
                           {"at": clock.now(), "id": closed})


def followup_of(engine: Engine, code: str, key: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT f.id FROM followups f JOIN participants p ON p.id = f.participant_id "
            "WHERE p.code = :code AND f.followup_key = :key"), {"code": code, "key": key}).scalar_one())


def load_protocol_text(engine: Engine, slug: str) -> str:
    with session_scope(engine, read_only=True) as session:
        return studies.current_version(session, studies.get_study(session, slug).id).source_yaml


def rows(engine: Engine, slug: str) -> dict[str, list[Any]]:
    """Every scheduler-facing row of the study, as the dispatcher could change it."""
    study = "(SELECT id FROM studies WHERE slug = :slug)"
    people = f"(SELECT id FROM participants WHERE study_id = {study})"
    queries = {
        "followups": "SELECT id, status, due_at, closes_at, sent_at, protocol_version, assignment_id, end_reason "
                     f"FROM followups WHERE study_id = {study} ORDER BY id",
        "deliveries": "SELECT id, kind, channel, status, attempts, claimed_by, sent_at, last_error FROM deliveries "
                      f"WHERE participant_id IN {people} ORDER BY id",
        "assignments": f"SELECT id, status FROM survey_assignments WHERE participant_id IN {people} ORDER BY id",
        "safety_events": "SELECT id, level, page_since, answer_due_at, unanswered_at FROM safety_events "
                         f"WHERE study_id = {study} ORDER BY id",
        "notices": f"SELECT id, status FROM safety_notifications WHERE study_id = {study} ORDER BY id",
    }
    with engine.connect() as connection:
        return {name: [tuple(row) for row in connection.execute(sa.text(query), {"slug": slug})]
                for name, query in queries.items()}


def changes(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> dict[str, int]:
    """How many rows of each table differ (changed, added or gone)."""
    return {name: len(set(before[name]) ^ set(after[name])) for name in before}


def test_the_live_dispatcher_and_a_simulations_dispatcher_each_touch_only_their_own_studies(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    live = load_study(engine, example_protocol)
    simulated = simulated_study(engine, example_protocol)
    everything_due(engine, app_client, frozen_clock, live, "live@example.org", simulation=None)
    everything_due(engine, app_client, frozen_clock, simulated, "simulated@example.org", simulation=1)
    frozen_clock.advance(dt.timedelta(minutes=31))  # past both check-ins' deadline (PT30M)
    live_before, simulated_before = rows(engine, live), rows(engine, simulated)

    # The live dispatcher, as `afterward scheduler` runs it: on-call email, participant email, in-app.
    report = Dispatcher(engine, Settings(smtp_port=port), name="live").tick()
    assert not report.errors
    live_after = rows(engine, live)
    # It did everything due in the live study in this one poll ...
    assert (report.unanswered, report.opened, report.expired, report.sent) == (1, 2, 1, 2)
    assert report.notified == 2  # the escalation and the unanswered check-in, to the on-call contact
    assert all(changes(live_before, live_after).values())
    # ... and nothing in the simulated one: not a row changed, no email about it or to its participants.
    assert rows(engine, simulated) == simulated_before
    assert sorted(str(m["To"]) for m in messages.messages) == ["live@example.org", "live@example.org", ONCALL,
                                                               ONCALL]
    for notice in messages.to(ONCALL):
        body = notice.get_body(("plain",))
        assert body is not None
        assert f"study={live}&" in body.get_content()

    # The simulation's dispatcher: its own study alone, in-app only, telling nobody. (The opener
    # above left the simulated study an email to send; a simulation's dispatcher has no email
    # channel, so a simulated study never has one: it is taken away.)
    with engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM deliveries WHERE channel = 'email' AND participant_id IN "
                                   "(SELECT id FROM participants WHERE study_id = :study)"),
                           {"study": study_id(engine, simulated)})
    simulated_before = rows(engine, simulated)
    own = Dispatcher(engine, Settings(smtp_port=port), name="simulation", channels={"in_app": InAppChannel()},
                     simulated_study=study_id(engine, simulated))
    report = own.tick()
    assert not report.errors
    assert (report.unanswered, report.opened, report.expired, report.notified, report.sent) == (1, 2, 1, 0, 0)
    assert all(changes(simulated_before, rows(engine, simulated))[table] for table in
               ("followups", "deliveries", "assignments", "safety_events"))
    assert rows(engine, simulated)["notices"] == []  # nobody is paged about a simulated study
    assert rows(engine, live) == live_after
    assert len(messages.messages) == 4


def test_each_dispatcher_re_plans_only_its_own_studies_for_a_new_protocol_version(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    live = load_study(engine, example_protocol)
    simulated = simulated_study(engine, example_protocol)
    for slug, simulation in ((live, None), (simulated, 1)):
        with session_scope(engine) as session:
            [invite] = participants.create_invites(session, studies.get_study(session, slug), TEST_ACTOR,
                                                   simulation=simulation)
        enroll_fully(app_client, invite)
        protocol = load_protocol_text(engine, slug).replace("offset: P28D", "offset: P21D", 1)
        with session_scope(engine) as session:
            known = registry.catalog(session)
            if simulation is None:
                studies.load_protocol(session, protocol, TEST_ACTOR, instruments=known)
            else:
                studies.load_simulated(session, protocol, TEST_ACTOR, slug, instruments=known)

    def versions(slug: str) -> dict[str, tuple[int, dt.datetime]]:
        with session_scope(engine, read_only=True) as session:
            return {key: (version, due) for key, version, due in session.execute(
                sa.select(FollowUp.followup_key, FollowUp.protocol_version, FollowUp.due_at)
                .where(FollowUp.study_id == studies.get_study(session, slug).id))}

    simulated_before = versions(simulated)
    assert {version for version, _ in simulated_before.values()} == {1}
    assert not Dispatcher(engine, Settings(), name="live", channels={"in_app": InAppChannel()}).tick().errors
    replanned = versions(live)
    assert {version for version, _ in replanned.values()} == {2}
    assert versions(simulated) == simulated_before
    own = Dispatcher(engine, Settings(), name="simulation", channels={"in_app": InAppChannel()},
                     simulated_study=study_id(engine, simulated))
    assert not own.tick().errors
    assert {version for version, _ in versions(simulated).values()} == {2}
    assert versions(simulated)["perma-week-4"][1] < simulated_before["perma-week-4"][1]  # P21D now, not P28D
    assert versions(live) == replanned


def test_the_live_dispatcher_refuses_to_send_a_simulated_follow_up_now(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    simulated = simulated_study(engine, example_protocol)
    with session_scope(engine) as session:
        [invite] = participants.create_invites(session, studies.get_study(session, simulated), TEST_ACTOR,
                                               simulation=1)
    enroll_fully(app_client, invite)
    before = rows(engine, simulated)
    with engine.connect() as connection:
        followup = connection.execute(sa.text("SELECT min(id) FROM followups")).scalar_one()
    with pytest.raises(LookupError, match="simulated study's: no live dispatcher sends it"):
        Dispatcher(engine, Settings(), name="cli").send_now(followup)  # `afterward followups send`
    assert rows(engine, simulated) == before
