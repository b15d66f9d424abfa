"""Small builders for test data: studies, staff and participants driven through the real API."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, select
from sqlalchemy.engine import Engine

from study import audit, participants, staff, studies
from study.db import session_scope
from study.models import Participant, StaffRole
from surveys import registry
from surveys import service as survey_service

TEST_ACTOR = audit.Actor.system("tests")
CONFIRMATIONS = ["read-and-understood", "adult", "voluntary"]
# An unsupported framing: the monitors and the offline model push back on it.
FRAMING = "Nobody at work ever listens to me, so I'm quitting tomorrow without another job lined up"


@contextmanager
def counting_statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` runs meanwhile, as sent (a round trip each; the pool's ping and the
    commit are not statements)."""
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


def load_study(engine: Engine, protocol_yaml: str) -> str:
    with session_scope(engine) as session:
        return studies.load_protocol(session, protocol_yaml, TEST_ACTOR,
                                     instruments=registry.catalog(session)).study.slug


def make_invites(engine: Engine, slug: str, count: int = 1, max_uses: int = 1) -> list[str]:
    with session_scope(engine) as session:
        return participants.create_invites(session, studies.get_study(session, slug), TEST_ACTOR,
                                           count=count, max_uses=max_uses)


def make_staff(engine: Engine, slug: str, role: StaffRole, email: str) -> str:
    """A staff account with ``role`` in the study; returns an API token."""
    with session_scope(engine) as session:
        account = staff.create_staff(session, email=email, name=email.split("@")[0],
                                     password="correct horse battery", actor=TEST_ACTOR)
        staff.grant(session, account, studies.get_study(session, slug), role, TEST_ACTOR)
        return staff.issue_token(session, account, "test", TEST_ACTOR)


@dataclass
class ParticipantHandle:
    code: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def enroll(client: TestClient, invite: str) -> ParticipantHandle:
    response = client.post("/api/v1/enrollment", json={"invite_code": invite})
    assert response.status_code == 201, response.text
    client.cookies.clear()  # tests authenticate with the bearer token unless they test cookies
    body = response.json()
    return ParticipantHandle(body["participant_code"], body["token"])


def sign_consent(client: TestClient, who: ParticipantHandle, version: str = "1.2") -> None:
    response = client.post("/api/v1/me/consent", headers=who.headers, json={
        "version": version, "confirmations": CONFIRMATIONS, "typed_signature": "A. Person"})
    assert response.status_code == 201, response.text


def enroll_fully(client: TestClient, invite: str, email: str | None = "someone@example.org",
                 timezone: str = "Europe/Berlin") -> ParticipantHandle:
    who = enroll(client, invite)
    sign_consent(client, who)
    response = client.put("/api/v1/me/profile", headers=who.headers,
                          json={"timezone": timezone, "contact_email": email})
    assert response.status_code == 200, response.text
    return who


def assign_survey(engine: Engine, participant_code: str, instrument: str, *, purpose: str = "followup",
                  closes_at: dt.datetime | None = None, context: dict[str, str] | None = None) -> int:
    """What the follow-up planner does: give a participant a survey to answer."""
    with session_scope(engine) as session:
        participant = session.scalars(select(Participant).where(Participant.code == participant_code)).one()
        return survey_service.assign(session, participant, instrument, purpose=purpose,
                                     closes_at=closes_at, context=context).id


def put_in_arm(engine: Engine, participant_code: str, arm: str) -> None:
    """Override the randomization for a test that needs a particular arm."""
    with session_scope(engine) as session:
        session.scalars(select(Participant).where(Participant.code == participant_code)).one().arm = arm


def start_chat(client: TestClient, who: ParticipantHandle, role: str | None = "collaborator") -> int:
    response = client.post("/api/v1/me/conversations", headers=who.headers, json={"role": role})
    assert response.status_code == 201, response.text
    conversation_id: int = response.json()["id"]
    return conversation_id


def say(client: TestClient, who: ParticipantHandle, conversation_id: int, text: str) -> dict[str, Any]:
    """Send a message and return the assistant's reply turn."""
    response = client.post(f"/api/v1/me/conversations/{conversation_id}/messages", headers=who.headers,
                           json={"content": text})
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()["reply"]
    return reply


def evaluate_grid(engine: Engine, folder: Path, name: str, body: str) -> int:
    """An evaluation grid named ``name`` (``body``: the rest of its YAML) written in ``folder``,
    planned, run to the end and judged: its run id."""
    from evals.grid import load_grid
    from evals.runner import create_run, execute_run, plan

    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}", encoding="utf-8")
    run_id = create_run(engine, plan(load_grid(path), folder))
    outcome = execute_run(engine, run_id, progress=False)
    assert outcome.finished, outcome.errors
    return run_id


PUSHBACK = ("nudge", "challenge")


def stances_of_first_messages(client: TestClient, engine: Engine, slug: str, rows: list[dict[str, Any]],
                              roles: tuple[str, ...]) -> dict[tuple[str, str], dict[str, int]]:
    """Each of ``rows`` (``text``, ``label``) as a new participant's first message in the
    well-being arm, in each of ``roles``: the count of each reply stance per (role, label), so that
    no earlier turn (a concern already raised, a reassurance request repeated) changes what it meets
    (``bench/pushback.py`` and ``tests/api/test_pushback_held_out.py``)."""
    stances: dict[tuple[str, str], dict[str, int]] = {}
    invites = iter(make_invites(engine, slug, count=len(rows) * len(roles)))
    for role in roles:
        for row in rows:
            who = enroll_fully(client, next(invites))
            put_in_arm(engine, who.code, "wellbeing")
            stance = say(client, who, start_chat(client, who, role), row["text"])["stance"]
            counts = stances.setdefault((role, row["label"]), {})
            counts[stance] = counts.get(stance, 0) + 1
    return stances


def pushback_share(counts: dict[str, int]) -> float:
    """The share of replies that pushed back (a nudge or a challenge) among ``counts`` of stances."""
    return sum(counts.get(s, 0) for s in PUSHBACK) / sum(counts.values())


# The participant pages, through their forms


def csrf_of(html: str) -> str:
    """The CSRF token of a page's form."""
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, html
    return match.group(1)


def join(client: TestClient, invite: str) -> str:
    """Redeem the invite through the home page's form; returns the consent page HTML."""
    landing = client.get("/")
    pre = re.search(r'name="pre" value="([^"]+)"', landing.text)
    assert pre
    joined = client.post("/join", data={"pre": pre.group(1), "invite_code": invite}, follow_redirects=False)
    assert joined.headers["location"] == "/consent"
    return client.get("/consent").text


GAD7_SPANISH = Path(__file__).parent / "surveys" / "data" / "gad-7.es.yaml"  # a test fixture, not a validated one
SPANISH_CONSENT: dict[str, Any] = {
    "text": ("# Participar en el piloto de Afterward\n\n**Qué te pedimos.** Conversarás con un asistente de IA "
             "sobre cosas que te importan y, durante las próximas cuatro semanas, responderás algunos "
             "cuestionarios breves sobre cómo te va.\n\n**Tus opciones.** Participar es voluntario. Puedes "
             "retirarte en cualquier momento desde la página «Mi estudio», sin dar explicaciones.\n"),
    "confirmations": {"read-and-understood": "He leído y entendido esta información.",
                      "adult": "Tengo 18 años o más.",
                      "voluntary": "Participo voluntariamente y sé que puedo retirarme en cualquier momento.",
                      "share-conversation-text": "Acepto que el texto de mis conversaciones, sin direcciones de "
                                                 "correo ni teléfonos, se comparta con otros investigadores."},
}


SPANISH_STUDY = {"public_title": "Conversaciones con un asistente de IA: un estudio de cuatro semanas",
                 "public_description": "Conversa con un asistente de IA sobre lo que te importa y cuéntanos cómo "
                                       "te va durante las próximas cuatro semanas."}


SPANISH_HELP = ("Si estás en peligro o piensas en hacerte daño, llama ahora al número de emergencias de tu zona. "
                "En https://findahelpline.com encontrarás una línea de ayuda gratuita y confidencial de tu país.")


def bilingual(example_protocol: str, **changes: Any) -> str:
    """The example study offered in English and Spanish: the consent in both, the GAD-7 (translated by
    ``GAD7_SPANISH``) at baseline and one week on, instead of instruments nobody translated."""
    import yaml

    document = yaml.safe_load(example_protocol)
    document["languages"] = ["en", "es"]
    document["consent"]["translations"] = {"es": SPANISH_CONSENT}
    document["study"]["translations"] = {"es": SPANISH_STUDY}
    document["crisis_resources"]["default"] = {"en": document["crisis_resources"]["default"], "es": SPANISH_HELP}
    document["crisis_resources"]["ES"] = ("Si estás en peligro, llama al **112**. Línea 024 de atención a la conducta "
                                          "suicida: **024** (gratuita, confidencial, 24 horas).")
    document["baseline"] = ["gad-7"]
    document["followups"] = [{"id": "gad-week-1", "instrument": "gad-7", "anchor": "enrollment", "offset": "P7D",
                              "window": "P3D", "reminders": ["P1D"], "send_at_local": "10:00"}]
    document.update(changes)
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)


def load_spanish_gad7(engine: Engine) -> None:
    with session_scope(engine) as session:
        registry.load_custom(session, GAD7_SPANISH.read_text(encoding="utf-8"), TEST_ACTOR)
