"""Staff kept blind to arm in outcome views until the analysis plan is frozen, through the staff API:
a study whose protocol says ``blinding: {outcomes_until_plan_frozen: true}`` answers 409 to every
export that carries the arm beside outcomes and pools the aggregate outcome tables over the arms,
while enrollment, follow-up completion and safety stay visible; an admin may unblind one export
with a reason (audited, and only that one); after ``freeze_plan`` every view shows the arms again.
A study without the setting is not blinded, and a later protocol version cannot drop it."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import zipfile
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis.plan import BLINDED, UNBLINDED_READ, freeze_plan
from study import audit, clock
from study.db import session_scope
from study.models import AuditEntry, StaffRole
from tests.analysis.panel_builders import PanelBuilder, perma_answers
from tests.builders import enroll_fully, load_study, make_invites, make_staff, put_in_arm, say, start_chat
from tests.conftest import EXAMPLE

SLUG = "blinded-pilot"
BLINDING = "\nblinding:\n  outcomes_until_plan_frozen: true\n"
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
REGRET_BLOCK = re.compile(r"  - outcome: regret\n(    .*\n)+")
ROW_LEVEL = ("csv", "parquet", "spss", "stata", "trajectories")


def blinded_protocol(slug: str = SLUG) -> str:
    return EXAMPLE.read_text(encoding="utf-8").replace("id: wellbeing-pilot", f"id: {slug}", 1) + BLINDING


def plan_text(slug: str = SLUG) -> str:
    """The example plan for ``slug``, without its regret analysis (these studies have no decisions)."""
    text = EXAMPLE.with_name("wellbeing-pilot.plan.yaml").read_text(encoding="utf-8")
    return REGRET_BLOCK.sub("", text).replace("study: wellbeing-pilot", f"study: {slug}", 1)


@dataclass(frozen=True)
class Blinded:
    slug: str
    headers: dict[StaffRole, dict[str, str]]
    emails: dict[StaffRole, str]


@pytest.fixture
def blinded(engine: Engine, frozen_clock: clock.FrozenClock) -> Blinded:
    """The blinded study: three participants in each arm with their baseline PERMA answered, and an
    admin, a researcher and a viewer."""
    build = PanelBuilder(engine, blinded_protocol())
    frozen_clock.set(T0)
    codes = [build.participant(arm, timezone="UTC") for arm in ("wellbeing", "control") for _ in range(3)]
    frozen_clock.set(T0 + dt.timedelta(minutes=10))
    for i, code in enumerate(codes):
        build.answer(code, purpose="baseline", instrument="perma-profiler",
                     answers=perma_answers(dict.fromkeys("PERMANH", 3 + i), loneliness=5, happiness=3 + i))
    emails = {role: f"{role.value}@uni.example" for role in StaffRole}
    headers = {role: {"Authorization": f"Bearer {make_staff(engine, build.slug, role, email)}"}
               for role, email in emails.items()}
    return Blinded(build.slug, headers, emails)


def export(client: TestClient, who: Blinded, role: StaffRole, export_format: str, **params: Any) -> Any:
    return client.get(f"/api/v1/staff/studies/{who.slug}/exports", headers=who.headers[role],
                      params={"format": export_format, **params})


def files(response: Any) -> dict[str, str]:
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as bundle:
        return {name.rsplit("/", 1)[-1]: bundle.read(name).decode() for name in bundle.namelist()}


def column(text: str, name: str) -> set[str]:
    return {row[name] for row in csv.DictReader(io.StringIO(text))}


def refused(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def entries(engine: Engine, action: str) -> list[AuditEntry]:
    with session_scope(engine, read_only=True) as session:
        return list(session.scalars(sa.select(AuditEntry).where(AuditEntry.action == action)
                                    .order_by(AuditEntry.seq)))


def freeze(engine: Engine, who: Blinded) -> None:
    with session_scope(engine) as session:
        freeze_plan(session, who.slug, plan_text(who.slug), "plan.yaml",
                    audit.Actor("staff", who.emails[StaffRole.RESEARCHER]))


def test_outcome_exports_are_refused_or_pooled_until_the_plan_is_frozen(
    engine: Engine, app_client: TestClient, blinded: Blinded,
) -> None:
    for export_format in ROW_LEVEL:
        message = refused(export(app_client, blinded, StaffRole.RESEARCHER, export_format), 409, BLINDED)
        assert f"afterward plan freeze {SLUG}" in message, message
        assert "admin" in message  # who can unblind
    # A viewer is refused row-level data for being a viewer, as without blinding.
    refused(export(app_client, blinded, StaffRole.VIEWER, "csv"), 403, "participant_data_forbidden")

    for role in (StaffRole.RESEARCHER, StaffRole.VIEWER):
        pooled = files(export(app_client, blinded, role, "aggregates"))
        assert column(pooled["wellbeing.csv"], "arm") == {"all"}
        assert column(pooled["regret.csv"], "starting_role") == {"all"}
        assert "pooled over the arms" in pooled["README.md"]
        assert "Pooled over the arms" in pooled["CODEBOOK.md"]
        # Enrollment and follow-up completion keep their arms.
        assert column(pooled["enrollment.csv"], "arm") == {"wellbeing", "control", "all"}
        assert column(pooled["followups.csv"], "arm") == {"wellbeing", "control", "all"}
    summary = app_client.get(f"/api/v1/staff/studies/{SLUG}/summary", headers=blinded.headers[StaffRole.RESEARCHER])
    assert summary.status_code == 200, summary.text
    assert summary.json()["enrolled_by_arm"] == {"wellbeing": 3, "control": 3}
    assert entries(engine, UNBLINDED_READ) == []

    freeze(engine, blinded)
    tables = files(export(app_client, blinded, StaffRole.RESEARCHER, "csv"))
    assert column(tables["participants.csv"], "arm") == {"wellbeing", "control"}
    assert "wellbeing" in column(tables["panel.csv"], "arm")
    unpooled = files(export(app_client, blinded, StaffRole.VIEWER, "aggregates"))
    assert column(unpooled["wellbeing.csv"], "arm") == {"wellbeing", "control", "all"}
    assert "pooled" not in unpooled["README.md"]
    assert files(export(app_client, blinded, StaffRole.RESEARCHER, "trajectories"))


def test_an_admin_unblinds_one_export_with_a_reason_and_it_is_audited(
    engine: Engine, app_client: TestClient, blinded: Blinded,
) -> None:
    reason = "DSMB safety review, meeting of 2 April"
    refused(export(app_client, blinded, StaffRole.RESEARCHER, "csv", unblind_reason=reason), 403, "unblind_forbidden")
    refused(export(app_client, blinded, StaffRole.VIEWER, "aggregates", unblind_reason=reason), 403,
            "unblind_forbidden")
    refused(export(app_client, blinded, StaffRole.ADMIN, "csv"), 409, BLINDED)
    assert entries(engine, UNBLINDED_READ) == []

    tables = files(export(app_client, blinded, StaffRole.ADMIN, "csv", unblind_reason=reason))
    assert column(tables["participants.csv"], "arm") == {"wellbeing", "control"}
    [unblinded] = entries(engine, UNBLINDED_READ)
    assert (unblinded.actor_type, unblinded.actor) == ("staff", blinded.emails[StaffRole.ADMIN])
    assert unblinded.detail["view"] == "the csv export"
    assert unblinded.detail["reason"] == reason
    exported = entries(engine, "study.export")[-1]
    assert exported.seq > unblinded.seq  # the unblinding is recorded before the read
    assert exported.detail["unblinded"] == reason

    # One read: the next export of the admin is blinded again.
    refused(export(app_client, blinded, StaffRole.ADMIN, "csv"), 409, BLINDED)
    aggregates = files(export(app_client, blinded, StaffRole.ADMIN, "aggregates", unblind_reason=reason))
    assert column(aggregates["wellbeing.csv"], "arm") == {"wellbeing", "control", "all"}
    assert [e.detail["view"] for e in entries(engine, UNBLINDED_READ)] == ["the csv export", "the aggregates export"]
    assert refused(export(app_client, blinded, StaffRole.ADMIN, "csv", unblind_reason="  "), 422,
                   "unblind_reason_missing")


def test_safety_events_and_their_transcripts_are_never_blinded(
    engine: Engine, app_client: TestClient, blinded: Blinded,
) -> None:
    [invite] = make_invites(engine, SLUG)
    who = enroll_fully(app_client, invite)
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(app_client, who, "concierge")
    assert say(app_client, who, conversation, "I want to kill myself")["stance"] == "escalate"
    staff = blinded.headers[StaffRole.RESEARCHER]
    listed = app_client.get(f"/api/v1/staff/studies/{SLUG}/safety-events", headers=staff)
    assert listed.status_code == 200, listed.text
    [event] = listed.json()
    context = app_client.get(f"/api/v1/staff/studies/{SLUG}/safety-events/{event['id']}", headers=staff)
    assert context.status_code == 200, context.text
    transcript = app_client.get(f"/api/v1/staff/studies/{SLUG}/conversations/{conversation}", headers=staff)
    assert transcript.status_code == 200, transcript.text
    assert transcript.json()["arm"] == "wellbeing"  # the clinician sees everything, the arm too
    assert refused(export(app_client, blinded, StaffRole.RESEARCHER, "csv"), 409, BLINDED)


def test_blinding_is_off_by_default_and_no_later_protocol_version_drops_it(
    engine: Engine, app_client: TestClient, blinded: Blinded, example_protocol: str,
) -> None:
    open_slug = load_study(engine, example_protocol)  # the example protocol asks for no blinding
    token = make_staff(engine, open_slug, StaffRole.RESEARCHER, "open@uni.example")
    response = app_client.get(f"/api/v1/staff/studies/{open_slug}/exports", params={"format": "csv"},
                              headers={"Authorization": f"Bearer {token}"})
    assert files(response)["participants.csv"]

    load_study(engine, blinded_protocol().replace(BLINDING, "\n"))  # version 2, without the setting
    with engine.connect() as connection:
        versions = connection.execute(sa.text(
            "SELECT count(*) FROM protocol_versions v JOIN studies s ON s.id = v.study_id WHERE s.slug = :slug"),
            {"slug": SLUG}).scalar_one()
    assert versions == 2
    refused(export(app_client, blinded, StaffRole.RESEARCHER, "csv"), 409, BLINDED)
    freeze(engine, blinded)
    assert files(export(app_client, blinded, StaffRole.RESEARCHER, "csv"))["participants.csv"]


def test_the_export_route_documents_the_refusal(app_client: TestClient) -> None:
    operation = app_client.get("/openapi.json").json()["paths"]["/api/v1/staff/studies/{slug}/exports"]["get"]
    assert "409" in operation["responses"]
    assert "unblind_reason" in {parameter["name"] for parameter in operation["parameters"]}
