from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Mapped, mapped_column

from study import participants
from study.db import Base, session_scope
from study.models import ParticipantResearchData, WithdrawalLevel
from tests.builders import enroll_fully, load_study, make_invites


class _Diary(ParticipantResearchData, Base):
    """A stand-in research-data table: withdrawal must find it through the mixin alone."""

    __tablename__ = "test_diary"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id"))
    entry: Mapped[str] = mapped_column(String(100))


# Other test modules' databases have no such table: it counts as research data only while this
# module's tests run (importing the module at collection must not register it for everyone).
ParticipantResearchData.registered.discard(_Diary)


@pytest.fixture(scope="module", autouse=True)
def _diary_is_research_data() -> Iterator[None]:
    ParticipantResearchData.registered.add(_Diary)
    yield
    ParticipantResearchData.registered.discard(_Diary)


def _with_diary(engine: Engine, code: str) -> None:
    _Diary.__table__.create(engine, checkfirst=True)  # type: ignore[attr-defined]
    with engine.begin() as connection:
        pid = connection.execute(sa.text("SELECT id FROM participants WHERE code = :c"), {"c": code}).scalar_one()
        connection.execute(sa.insert(_Diary), [{"participant_id": pid, "entry": "day 1"},
                                               {"participant_id": pid, "entry": "day 2"}])


def _audit_actions(engine: Engine, code: str) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(
            "SELECT action FROM audit_log WHERE participant_code = :c ORDER BY seq"), {"c": code}).scalars())


def test_stop_contact_keeps_data_and_blocks_everything(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll_fully(app_client, invite)
    _with_diary(engine, who.code)
    response = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                               json={"level": "stop_contact", "confirm": True})
    assert response.status_code == 200
    assert "not contact you again" in response.json()["message"]
    me = app_client.get("/api/v1/me", headers=who.headers).json()
    assert (me["status"], me["withdrawal_level"], me["has_contact_email"]) == ("withdrawn", "stop_contact", False)
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM test_diary")).scalar_one() == 2
    blocked = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Europe/Paris"})
    assert blocked.status_code == 403
    assert blocked.json()["error"]["code"] == "withdrawn"
    assert _audit_actions(engine, who.code)[-1] == "participant.withdrawn"


def test_delete_data_removes_research_data_and_keeps_the_audit_trail(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite, other_invite] = make_invites(engine, load_study(engine, example_protocol), count=2)
    who = enroll_fully(app_client, invite)
    other = enroll_fully(app_client, other_invite)
    _with_diary(engine, who.code)
    _with_diary(engine, other.code)
    response = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                               json={"level": "delete_data", "confirm": True})
    assert response.status_code == 200, response.text
    deleted = response.json()["deleted_rows"]
    assert deleted["test_diary"] == 2
    assert deleted["survey_assignments"] == 1  # the baseline PERMA assigned at enrollment
    with engine.connect() as connection:
        remaining = connection.execute(sa.text(
            "SELECT p.code FROM test_diary d JOIN participants p ON p.id = d.participant_id")).scalars().all()
        row = connection.execute(sa.text(
            "SELECT timezone, contact_email_encrypted, data_deleted_at FROM participants WHERE code = :c"),
            {"c": who.code}).one()
    assert set(remaining) == {other.code}
    assert row.timezone is None
    assert row.contact_email_encrypted is None
    assert row.data_deleted_at is not None
    actions = _audit_actions(engine, who.code)
    assert actions[0] == "participant.invited"
    assert actions[-1] == "participant.withdrawn"
    assert "consent.signed" in actions
    again = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                            json={"level": "stop_contact", "confirm": True})
    assert again.status_code == 200
    assert again.json()["level"] == "delete_data"


def test_withdrawal_must_be_confirmed(engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll_fully(app_client, invite)
    response = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                               json={"level": "delete_data", "confirm": False})
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0]["field"] == "confirm"
    assert app_client.get("/api/v1/me", headers=who.headers).json()["status"] == "enrolled"


def test_protocol_can_forbid_deletion_but_not_stopping(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol.replace("allow_data_deletion: true", "allow_data_deletion: false"))
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite)
    refused = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                              json={"level": "delete_data", "confirm": True})
    assert refused.status_code == 409
    assert "stop all contact" in refused.json()["error"]["message"]
    assert app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                           json={"level": "stop_contact", "confirm": True}).status_code == 200


def test_withdrawal_hooks_run_in_the_same_transaction(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll_fully(app_client, invite)
    seen: list[tuple[str, WithdrawalLevel]] = []
    participants.withdrawal_hooks.append(lambda _s, p, level: seen.append((p.code, level)))
    try:
        with session_scope(engine) as session:
            participant = session.scalars(sa.select(participants.Participant)
                                          .where(participants.Participant.code == who.code)).one()
            participants.withdraw(session, participant, WithdrawalLevel.STOP_CONTACT,
                                  participants.audit.Actor.system("tests"))
    finally:
        participants.withdrawal_hooks.pop()
    assert seen == [(who.code, WithdrawalLevel.STOP_CONTACT)]
