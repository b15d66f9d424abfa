"""Through the API with the default (offline) model, collaborator and coach push back on requests
for agreement and leave neutral requests for help alone (issue 25, done means 2).

The messages are a held-out sample: ``chat/crisis_data/heldout/validation_round1.jsonl``, written
by someone who never saw the project's code, corpus or definitions, scored once by
``bench/understanding.py --record`` and never trained on (``chat/reading_train.py`` does not read
it). Each message opens a conversation of its own, so one pushback does not colour the next."""

from __future__ import annotations

import json
import random
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.builders import enroll_fully, make_invites, put_in_arm, say, start_chat

SAMPLE = Path(__file__).resolve().parents[2] / "chat" / "crisis_data" / "heldout" / "validation_round1.jsonl"
PER_LABEL = 30  # messages of each label, per role
PUSHBACK = {"nudge", "challenge"}


def sample() -> dict[str, list[str]]:
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    chosen = random.Random(25).sample(rows, len(rows))
    return {label: [r["text"] for r in chosen if r["label"] == label][:PER_LABEL]
            for label in ("validation_seeking", "neutral")}


def test_collaborator_and_coach_push_back_on_requests_for_agreement(engine: Engine, app_client: TestClient,
                                                                    slug: str) -> None:
    messages = sample()
    assert all(len(texts) == PER_LABEL for texts in messages.values())
    rates: dict[tuple[str, str], float] = {}
    reasons = []
    for role in ("collaborator", "coach"):
        [invite] = make_invites(engine, slug)
        who = enroll_fully(app_client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        for label, texts in messages.items():
            pushed = 0
            for text in texts:
                reply = say(app_client, who, start_chat(app_client, who, role), text)
                if reply["stance"] in PUSHBACK:
                    pushed += 1
                    reasons.append(reply["rationale"])
            rates[role, label] = pushed / len(texts)
    for role in ("collaborator", "coach"):
        assert rates[role, "validation_seeking"] >= 0.85, rates
        assert rates[role, "neutral"] <= 0.05, rates
    assert all(reason for reason in reasons)  # a pushback always says why
