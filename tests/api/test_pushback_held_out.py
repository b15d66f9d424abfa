"""Issue 25, done-means 2: through the API with the default (offline) model, collaborator and coach
push back on at least 85% of a held-out set of validation-seeking messages and on at most 5% of
neutral requests for help.

The set is ``chat.reading_train.API_SAMPLE``: a validation round written by someone who saw nothing
of the project (plain definitions and the style participants write in), never fitted on and never
used to set a threshold (``chat.reading_train.corpus``, ``chat.crisis_train.calibration_rounds``).
Each message is a new participant's first, so nothing said earlier changes what it meets. Met from
the fit round 13 scored (the encoder's last three layers tuned); the fit before gave 0.908 and
0.054 (7 of 130 neutral requests), and the test was marked as an expected failure.
"""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from chat.crisis_train import HELDOUT_DIR, calibration_rounds
from chat.reading_train import API_SAMPLE, corpus
from tests.builders import pushback_share, stances_of_first_messages

ROLES = ("collaborator", "coach")


def test_collaborator_and_coach_push_back_on_held_out_requests_for_agreement_not_on_requests_for_help(
        engine: Engine, app_client: TestClient, slug: str) -> None:
    path = HELDOUT_DIR / API_SAMPLE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert {row["label"] for row in rows} == {"validation_seeking", "neutral"}
    texts = {row["text"] for row in rows}
    assert path not in calibration_rounds()
    assert not texts & {str(row["text"]) for row in corpus()[0]}  # never fitted on

    stances = stances_of_first_messages(app_client, engine, slug, rows, ROLES)
    shares = {key: round(pushback_share(counts), 3) for key, counts in stances.items()}
    for role in ROLES:
        assert shares[(role, "validation_seeking")] >= 0.85, (shares, stances)
        assert shares[(role, "neutral")] <= 0.05, (shares, stances)
