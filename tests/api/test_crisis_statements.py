"""Through the API, in every role of the well-being arm and in the control arm: an explicit crisis
statement escalates, with resources and a safety event for the study team, whatever unrelated text
comes before or after it (issue 23)."""

from __future__ import annotations

import itertools

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.builders import enroll_fully, make_invites, put_in_arm, say, start_chat
from tests.chat.crisis_statements import STATEMENTS, cases

SEATS = (("wellbeing", "concierge"), ("wellbeing", "collaborator"), ("wellbeing", "coach"), ("control", None))


def test_explicit_statements_escalate_in_every_role_and_arm(engine: Engine, app_client: TestClient,
                                                            slug: str) -> None:
    people = {}
    for arm, role in SEATS:
        [invite] = make_invites(engine, slug)
        who = enroll_fully(app_client, invite)
        put_in_arm(engine, who.code, arm)
        people[arm, role] = who
    # Every case once, the seats taking turns, so each role and arm meets every statement and filler.
    conversations: dict[tuple[tuple[str, str | None], str], int] = {}
    sent: dict[tuple[str, str | None], int] = dict.fromkeys(SEATS, 0)
    wrong = []
    for seat, (statement, filler, position, text) in zip(itertools.cycle(SEATS), cases(), strict=False):
        who = people[seat]
        key = (seat, statement)
        if key not in conversations:
            conversations[key] = start_chat(app_client, who, seat[1])
        reply = say(app_client, who, conversations[key], text)
        sent[seat] += 1
        if (reply["stance"], reply["concern"]) != ("escalate", STATEMENTS[statement]) or not reply["crisis_resources"]:
            wrong.append((seat, statement, filler, position, reply["stance"], reply["concern"]))
    assert wrong == []
    assert min(sent.values()) >= len(list(cases())) // len(SEATS)
    with engine.connect() as connection:
        events: dict[str, int] = dict(connection.execute(sa.text(
            "SELECT p.code, count(*) FROM safety_events e JOIN participants p ON p.id = e.participant_id "
            "GROUP BY p.code")).tuples().all())
    assert {seat: events.get(who.code, 0) for seat, who in people.items()} == sent  # each reaches the study team
