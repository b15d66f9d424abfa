"""Shared set-up for the benches: enrolled participants, a throwaway PostgreSQL schema."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

os.environ.setdefault("AFTERWARD_ENVIRONMENT", "test")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from study import audit, participants, studies  # noqa: E402
from study.db import session_scope  # noqa: E402
from study.models import Participant  # noqa: E402
from surveys import registry  # noqa: E402
from tests.postgres import scratch_schema  # noqa: E402

ACTOR = audit.Actor.system("bench")
PROTOCOL = ROOT / "examples" / "wellbeing-pilot.yaml"


def enrolled(engine: sa.Engine, n: int, *, arm: str | None = None,
             then: Callable[[Session, Participant], int] | None = None,
             protocol: str | None = None) -> list[tuple[str, int]]:
    """n participants through consent and profile (optionally forced into ``arm``) in the study of
    ``protocol`` (its text; the example protocol by default); returns (token, what ``then`` returned
    for each, or 0)."""
    with session_scope(engine) as session:
        study = studies.load_protocol(session, protocol or PROTOCOL.read_text(), ACTOR,
                                      instruments=registry.catalog(session)).study
        codes = participants.create_invites(session, study, ACTOR, count=n)
    out = []
    for code in codes:
        with session_scope(engine) as session:
            enrollment = participants.enroll(session, code)
            who = enrollment.participant
            participants.sign_consent(session, who, version=studies.current_consent(session, study.id).version,
                                      confirmations=["read-and-understood", "adult", "voluntary"],
                                      typed_signature="bench")
            participants.update_profile(session, who, timezone="Europe/Berlin", contact_email=None)
            if arm is not None:
                who.arm = arm
            out.append((enrollment.token, then(session, who) if then else 0))
    return out


def postgres_schema(url: str) -> AbstractContextManager[str]:
    """A URL whose connections use a new, empty schema, dropped afterwards."""
    return scratch_schema(url, "bench")
