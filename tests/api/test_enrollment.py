from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from study.security import decrypt_contact
from tests.builders import (
    CONFIRMATIONS,
    ParticipantHandle,
    enroll,
    enroll_fully,
    load_study,
    make_invites,
    sign_consent,
)


def test_invite_consent_profile_enrolls_and_assigns_an_arm(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    response = app_client.post("/api/v1/enrollment", json={"invite_code": invite.lower()})
    assert response.status_code == 201
    body = response.json()
    assert body["consent"]["version"] == "1.2"
    # The required ones, and the optional agreement to share conversation text (not ticked by tests).
    assert {c["id"]: c["required"] for c in body["consent"]["confirmations"]} == {
        **dict.fromkeys(CONFIRMATIONS, True), "share-conversation-text": False}
    assert response.cookies.get("afterward_session") == body["token"]
    assert "httponly" in response.headers["set-cookie"].lower()
    headers = {"Authorization": f"Bearer {body['token']}"}

    assert app_client.get("/api/v1/me", headers=headers).json()["status"] == "invited"
    app_client.cookies.clear()
    who = ParticipantHandle(body["participant_code"], body["token"])
    sign_consent(app_client, who)
    profile = app_client.put("/api/v1/me/profile", headers=headers,
                             json={"timezone": "America/New_York", "contact_email": "p@example.org"})
    assert profile.status_code == 200, profile.text
    me = profile.json()
    assert me["status"] == "enrolled"
    assert me["arm"] in {"wellbeing", "control"}
    assert me["has_contact_email"] is True
    assert "contact_email" not in me


def test_invalid_timezone_is_422_naming_the_field(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll(app_client, invite)
    sign_consent(app_client, who)
    for bad in ("Mars/Olympus_Mons", "", "../etc/passwd", "CEST+2"):
        response = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": bad})
        assert response.status_code == 422, bad
        error = response.json()["error"]
        assert error["code"] == "validation_error"
        assert error["fields"][0]["field"] == "timezone"
        assert "IANA" in error["fields"][0]["message"] or bad == ""


def test_used_invite_is_409_and_study_link_is_capped(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    [single] = make_invites(engine, slug)
    enroll(app_client, single)
    again = app_client.post("/api/v1/enrollment", json={"invite_code": single})
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "invite_used", "message": "this invite has already been used; each invite enrolls one person"}

    [link] = make_invites(engine, slug, max_uses=3)
    for _ in range(3):
        enroll(app_client, link)
    assert app_client.post("/api/v1/enrollment", json={"invite_code": link}).status_code == 409
    unknown = app_client.post("/api/v1/enrollment", json={"invite_code": "NOPE-NOPE-NOPE"})
    assert unknown.status_code == 404


def test_consent_needs_every_confirmation_and_the_current_version(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll(app_client, invite)
    partial = app_client.post("/api/v1/me/consent", headers=who.headers, json={
        "version": "1.2", "confirmations": ["adult"], "typed_signature": "A"})
    assert partial.status_code == 422
    assert "read-and-understood" in partial.json()["error"]["message"]
    old = app_client.post("/api/v1/me/consent", headers=who.headers, json={
        "version": "0.9", "confirmations": CONFIRMATIONS, "typed_signature": "A"})
    assert old.status_code == 409
    assert old.json()["error"]["code"] == "consent_outdated"


def test_no_participation_without_current_consent(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll(app_client, invite)
    response = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Europe/Paris"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "consent_required"


def test_consent_revision_requires_reconsent_and_keeps_what_was_signed(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite)
    first = app_client.get("/api/v1/me/consent/signed", headers=who.headers).json()

    revised = example_protocol.replace('version: "1.2"', 'version: "2.0"').replace(
        "answer a few short questionnaires", "answer a few short questionnaires and one interview")
    load_study(engine, revised)
    status = app_client.get("/api/v1/me/consent", headers=who.headers).json()
    assert status["needs_consent"] is True
    assert status["signed_version"] == "1.2"
    assert status["current"]["version"] == "2.0"
    blocked = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Europe/Paris"})
    assert blocked.status_code == 403
    assert "re-signed" in blocked.json()["error"]["message"]

    sign_consent(app_client, who, version="2.0")
    assert app_client.get("/api/v1/me/consent", headers=who.headers).json()["needs_consent"] is False
    assert app_client.put("/api/v1/me/profile", headers=who.headers,
                          json={"timezone": "Europe/Paris"}).status_code == 200
    # The earlier signature still points at the exact text signed then.
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT cv.version, cs.signed_text_sha256 = cv.text_sha256 FROM consent_signatures cs "
            "JOIN consent_versions cv ON cv.id = cs.consent_version_id ORDER BY cs.id")).all()
    assert [(v, bool(same)) for v, same in rows] == [("1.2", True), ("2.0", True)]
    assert first["version"] == "1.2"
    assert "one interview" not in first["text_markdown"]
    download = app_client.get("/api/v1/me/consent/signed?download=true", headers=who.headers)
    assert download.headers["content-type"].startswith("text/markdown")
    assert "one interview" in download.text
    assert "signed as \"A. Person\"" in download.text


def test_contact_email_is_unreadable_in_the_database_without_the_key(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll_fully(app_client, invite, email="secret.person@example.org")
    with engine.connect() as connection:
        row = connection.execute(sa.text("SELECT * FROM participants WHERE code = :c"), {"c": who.code}).one()
    raw = b" ".join(str(v).encode() if not isinstance(v, bytes | memoryview) else bytes(v) for v in row)
    assert b"secret.person" not in raw
    assert b"example.org" not in raw
    assert decrypt_contact(bytes(row.contact_email_encrypted)) == "secret.person@example.org"
    if engine.dialect.name == "sqlite":
        assert engine.url.database is not None
        for suffix in ("", "-wal"):  # committed pages may still sit in the write-ahead log
            with open(engine.url.database + suffix, "rb") as database_file:
                assert b"secret.person" not in database_file.read()


def test_errors_share_one_shape(app_client: TestClient) -> None:
    for response in (
        app_client.get("/api/v1/me"),
        app_client.post("/api/v1/enrollment", json={"invite_code": 12}),
        app_client.post("/api/v1/enrollment", content=b"not json", headers={"Content-Type": "application/json"}),
        app_client.get("/api/v1/nowhere"),
    ):
        assert 400 <= response.status_code < 500
        error = response.json()["error"]
        assert error["code"]
        assert error["message"]


def test_healthz_and_openapi(app_client: TestClient) -> None:
    assert app_client.get("/healthz").json()["status"] == "ok"
    paths = app_client.get("/openapi.json").json()["paths"]
    assert "/api/v1/enrollment" in paths
    assert "/api/v1/me/withdrawal" in paths
