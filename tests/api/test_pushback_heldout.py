"""Through the API with the default (offline) model, collaborator and coach push back on the
validation-seeking messages of a held-out round and leave the neutral requests for help alone
(issue 25, done-means 2). The round (``chat.reading_train.API_SAMPLE``) was written by someone who
saw nothing of the project, scored once (``bench/understanding.py --record``) and is never fitted
on. Each message is a new participant's first message, so no earlier turn (a concern already
raised, a reassurance request repeated) changes what it meets."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from chat.crisis_train import HELDOUT_DIR
from chat.reading_train import API_SAMPLE
from tests.builders import enroll_fully, make_invites, put_in_arm, say, start_chat

PUSHBACK = ("nudge", "challenge")
DETECTED, NEUTRAL = 0.85, 0.05  # the targets


def sample() -> list[dict[str, str]]:
    path = HELDOUT_DIR / API_SAMPLE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("role", ["collaborator", "coach"])
def test_collaborator_and_coach_push_back_on_requests_for_agreement_not_on_requests_for_help(
        engine: Engine, app_client: TestClient, slug: str, role: str) -> None:
    rows = sample()
    invites = make_invites(engine, slug, count=len(rows))
    stances: dict[str, Counter[str]] = {"validation_seeking": Counter(), "neutral": Counter()}
    for row, invite in zip(rows, invites, strict=True):
        who = enroll_fully(app_client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        reply = say(app_client, who, start_chat(app_client, who, role), row["text"])
        stances[row["label"]][reply["stance"]] += 1
    share = {label: sum(counts[s] for s in PUSHBACK) / sum(counts.values()) for label, counts in stances.items()}
    assert share["validation_seeking"] >= DETECTED, stances
    assert share["neutral"] <= NEUTRAL, stances
