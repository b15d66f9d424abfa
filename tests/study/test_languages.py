"""Several languages: the interface's catalogs, choosing a language, a protocol's languages with a
consent text per language (versioned, signed in the language shown), and instrument translations
checked before a study loads.

The interface ships in English and Spanish (``study/locale``). The instrument translation used here
(``tests/surveys/data/gad-7.es.yaml``) is a test fixture, not a validated translation."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from babel.messages.pofile import read_po
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.channels import Invitation, SignInLinkMessage, html_body, sign_in_text, subject, text_body
from study import i18n, studies
from study.db import session_scope
from study.errors import Conflict
from study.models import ConsentSignature, Participant
from study.protocol import ProtocolError, parse_protocol
from study.translated import InstrumentCatalog
from surveys import registry
from surveys import service as survey_service
from surveys.models import SurveyAssignment, SurveyResponse
from tests.builders import (
    CONFIRMATIONS,
    SPANISH_CONSENT,
    TEST_ACTOR,
    bilingual,
    enroll_fully,
    load_spanish_gad7,
    load_study,
    make_invites,
    put_in_arm,
    start_chat,
)

ROOT = Path(__file__).resolve().parents[2]
SPANISH_BROWSER = {"Accept-Language": "es-MX,es;q=0.9,en;q=0.5"}


# Choosing a language


def test_accept_language_is_read_by_weight_then_order() -> None:
    assert i18n.preferred("en;q=0.5, es-MX, es;q=0.9, fr;q=0, *;q=0.1") == ["es-mx", "es", "en", "*"]
    assert i18n.preferred("de, ;;;, q=bad, en") == ["de", "en"]  # what cannot be read is skipped
    assert i18n.primary("es-MX,es;q=0.9,en;q=0.5") == ["es", "en"]
    assert i18n.negotiate("fr-CA, es;q=0.8", ["en", "es"]) == "es"
    assert i18n.negotiate("fr, de", ["en", "es"]) is None
    assert i18n.negotiate("*", ["es", "en"]) == "es"
    assert i18n.interface_languages() == ("en", "es")
    assert i18n.name_of("es") == "Español"
    assert i18n.name_of("en") == "English"


def test_moments_and_dates_are_written_in_the_participants_language() -> None:
    moment = dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC)
    assert i18n.moment_text(moment, "Europe/Berlin") == "Thursday 5 March 2026, 18:00 CET (Europe/Berlin)"
    assert i18n.moment_text(moment, "Europe/Madrid", "es") == "jueves, 5 de marzo de 2026, 18:00 CET (Europe/Madrid)"
    assert i18n.date_text(moment, "es") == "5 de marzo de 2026"
    assert i18n.gettext("es", "My study") != "My study"
    assert i18n.gettext("de", "My study") == "My study"  # no catalog: as written


def test_the_catalogs_hold_every_marked_text_and_spanish_translates_each_with_its_placeholders(
        tmp_path: Path) -> None:
    """``make messages`` was run after the last text was marked (the extraction of the code and the
    templates equals the committed template), and the Spanish catalog translates every message,
    keeping each placeholder."""
    extracted = tmp_path / "afterward.pot"
    subprocess.run([str(Path(sys.executable).parent / "pybabel"), "extract", "--mapping-file", "babel.cfg",
                    "--no-location", "--sort-output", "--omit-header", "--no-default-keywords", "--keyword", "_",
                    "--keyword", "gettext:2", "--keyword", "ngettext:2,3", "--keyword", "N_", "--output-file",
                    str(extracted), "api", "chat", "scheduler", "study", "surveys"],
                   cwd=ROOT, check=True, capture_output=True)
    with extracted.open("rb") as fresh, (ROOT / "study/locale/afterward.pot").open("rb") as committed:
        wanted = {m.id for m in read_po(fresh) if m.id}
        assert wanted == {m.id for m in read_po(committed) if m.id}, "run `make messages` and translate"
    with (ROOT / "study/locale/es/LC_MESSAGES/afterward.po").open("rb") as source:
        spanish = {m.id: m for m in read_po(source, locale="es") if m.id}
    assert set(spanish) == wanted
    placeholder = re.compile(r"%\((\w+)\)s")
    for message in spanish.values():
        assert not message.fuzzy, message.id
        ids = [str(i) for i in (message.id if isinstance(message.id, list | tuple) else [message.id])]
        strings = [str(t) for t in (message.string if isinstance(message.string, list | tuple) else [message.string])]
        assert all(strings), f"untranslated: {ids[0]!r}"
        for text in strings:
            assert set(placeholder.findall(text)) == set(placeholder.findall(ids[0])), ids[0]
    assert len(wanted) > 150  # the pages, emails, role cards and the safety check-in


# The protocol's languages


def _catalog(*translated: str) -> InstrumentCatalog:
    names = {"gad-7": frozenset({"total"}), "perma-profiler": frozenset(), "decision-regret": frozenset()}
    return InstrumentCatalog(names, {name: frozenset({"en", *translated}) for name in names})


def test_a_protocol_names_languages_with_a_consent_text_in_each(example_protocol: str) -> None:
    protocol = parse_protocol(bilingual(example_protocol), _catalog("es"))
    assert protocol.languages == ["en", "es"]
    assert protocol.consent.translations["es"].confirmations["adult"] == "Tengo 18 años o más."
    assert parse_protocol(example_protocol).languages == ["en"]  # the default

    def refused(text: str, catalog: InstrumentCatalog | None = None) -> str:
        with pytest.raises(ProtocolError) as caught:
            parse_protocol(text, catalog or _catalog("es"))
        return "\n".join(caught.value.problems)

    assert "'fr' is not a language of the interface (it has: en, es)" in refused(
        bilingual(example_protocol, languages=["en", "fr"]))
    document = yaml.safe_load(bilingual(example_protocol))
    del document["consent"]["translations"]
    assert "no consent text in es" in refused(yaml.safe_dump(document))
    document = yaml.safe_load(bilingual(example_protocol))
    del document["consent"]["translations"]["es"]["confirmations"]["adult"]
    assert "translations.es.confirmations: no text for adult" in refused(yaml.safe_dump(document))
    assert "es is not among the study's other languages (none)" in refused(
        bilingual(example_protocol, languages=["en"]))
    assert "each language once" in refused(bilingual(example_protocol, languages=["en", "es", "en"]))
    document = yaml.safe_load(bilingual(example_protocol))
    del document["study"]["translations"]
    assert "no public_title in es" in refused(yaml.safe_dump(document))
    document = yaml.safe_load(bilingual(example_protocol))
    document["crisis_resources"]["default"] = "Call your local emergency number."
    assert "no text in en, es (a study in several languages" in refused(yaml.safe_dump(document))
    # Every instrument the study asks must be translated into every language, named with what to do.
    problems = refused(bilingual(example_protocol), _catalog())
    assert "instrument gad-7 has no translation in es" in problems
    assert "afterward instruments load FILE" in problems


def test_a_study_in_spanish_loads_only_once_its_instruments_are_translated(engine: Engine,
                                                                          example_protocol: str) -> None:
    with pytest.raises(ProtocolError, match="instrument gad-7 has no translation in es"):
        load_study(engine, bilingual(example_protocol))
    load_spanish_gad7(engine)
    with session_scope(engine) as session:
        assert registry.catalog(session).languages["gad-7"] == {"en", "es"}
    slug = load_study(engine, bilingual(example_protocol))
    with session_scope(engine) as session:
        consent = studies.current_consent(session, studies.get_study(session, slug).id)
        assert consent.languages == ["en", "es"]
        assert consent.text_in("es") == SPANISH_CONSENT["text"]
        assert consent.confirmations_in("es")[1] == {"id": "adult", "text": "Tengo 18 años o más."}
        # A translation is part of the consent version: changing it needs a new version.
        document = yaml.safe_load(bilingual(example_protocol))
        document["consent"]["translations"]["es"]["text"] += "\nUn cambio.\n"
        with pytest.raises(Conflict, match="text, confirmations or translations changed"):
            studies.load_protocol(session, yaml.safe_dump(document, allow_unicode=True), TEST_ACTOR,
                                  instruments=registry.catalog(session))


# A participant in Spanish, through the API


@pytest.fixture
def spanish_study(engine: Engine, example_protocol: str) -> str:
    load_spanish_gad7(engine)
    return load_study(engine, bilingual(example_protocol))


def test_a_spanish_browser_reads_and_signs_the_consent_in_spanish(app_client: TestClient, engine: Engine,
                                                                   spanish_study: str) -> None:
    invite, english = make_invites(engine, spanish_study, count=2)
    joined = app_client.post("/api/v1/enrollment", json={"invite_code": invite}, headers=SPANISH_BROWSER)
    assert joined.status_code == 201
    consent = joined.json()["consent"]
    assert consent["language"] == "es"
    assert consent["languages"] == ["en", "es"]
    assert consent["text_markdown"] == SPANISH_CONSENT["text"]
    assert consent["text_sha256"] == hashlib.sha256(SPANISH_CONSENT["text"].encode()).hexdigest()
    assert consent["confirmations"][0]["text"] == "He leído y entendido esta información."
    headers = {"Authorization": f"Bearer {joined.json()['token']}"}
    signed = app_client.post("/api/v1/me/consent", headers=headers, json={
        "version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "A. P."})
    assert signed.status_code == 201
    assert signed.json()["language"] == "es"
    assert signed.json()["text_markdown"] == SPANISH_CONSENT["text"]
    copy = app_client.get("/api/v1/me/consent/signed?download=true", headers=headers).text
    assert SPANISH_CONSENT["text"] in copy
    assert "Idioma: es" in copy
    assert "- Tengo 18 años o más. (adult)\n" in copy  # each statement ticked, as it was shown
    with session_scope(engine) as session:
        signature = session.scalars(sa.select(ConsentSignature)).one()
        assert signature.language == "es"
        assert signature.signed_text_sha256 == consent["text_sha256"]
    # A browser that asks for no language of the study reads it in the study's first.
    other = app_client.post("/api/v1/enrollment", json={"invite_code": english},
                            headers={"Accept-Language": "fr-FR, de;q=0.8"})
    assert other.json()["consent"]["language"] == "en"


def test_a_participant_changes_language_among_the_studys(app_client: TestClient, engine: Engine,
                                                         spanish_study: str) -> None:
    (invite,) = make_invites(engine, spanish_study)
    token = app_client.post("/api/v1/enrollment", json={"invite_code": invite}).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    assert app_client.get("/api/v1/me", headers=headers).json()["language"] == "en"
    changed = app_client.put("/api/v1/me/language", headers=headers, json={"language": "es"})
    assert changed.status_code == 200
    assert changed.json()["language"] == "es"
    refused = app_client.put("/api/v1/me/language", headers=headers, json={"language": "fr"})
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "language_not_offered"
    assert "it is in: en, es" in refused.json()["error"]["message"]
    # The consent is now shown in Spanish; signing may name the language that was shown.
    assert app_client.get("/api/v1/me/consent", headers=headers).json()["current"]["language"] == "es"
    signed = app_client.post("/api/v1/me/consent", headers=headers, json={
        "version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "A. P.", "language": "en"})
    assert signed.status_code == 201
    assert signed.json()["language"] == "en"
    with session_scope(engine) as session:
        participant = session.scalars(sa.select(Participant)).one()
        assert participant.language == "es"


# Emails


def test_follow_up_and_sign_in_emails_are_written_in_the_participants_language() -> None:
    moment = dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC)
    invitation = Invitation(idempotency_key="k", kind="reminder", participant_code="P1", to_email="a@example.org",
                            study_title="Conversaciones", survey_title="GAD-7", link="https://x/s/1",
                            closes_at_text=i18n.moment_text(moment, "Europe/Madrid", "es"),
                            sign_in_link="https://x/sign-in/link/t", language="es")
    body = text_body(invitation)
    assert "jueves, 5 de marzo de 2026, 18:00 CET" in body
    assert "https://x/s/1" in body
    assert i18n.gettext("es", "A reminder: your survey is still open.") in body
    assert "Hello" not in body
    assert "Hello" not in html_body(invitation)
    assert html_body(invitation).startswith('<!doctype html><html lang="es">')
    assert subject(invitation) == i18n.gettext("es", "Reminder: %(survey)s (%(study)s)", survey="GAD-7",
                                               study="Conversaciones")
    assert subject(invitation) != "Reminder: GAD-7 (Conversaciones)"
    english = Invitation(idempotency_key="k", kind="invitation", participant_code="P1", to_email="a@example.org",
                         study_title="Study", survey_title="GAD-7", link="https://x/s/1", closes_at_text="then")
    assert text_body(english).startswith("Hello,\n\nIt's time for a short follow-up survey")
    sign_in = sign_in_text(SignInLinkMessage("k", "a@example.org", "https://x/l", "mañana", language="es"))
    assert "https://x/l" in sign_in
    assert "mañana" in sign_in
    assert "Someone asked" not in sign_in


def test_what_a_spanish_participant_reads_around_the_study_is_in_spanish(app_client: TestClient, engine: Engine,
                                                                         spanish_study: str) -> None:
    """The crisis resources, the survey list's titles, a survey link opened in a browser that asks for
    English, and the exit check's rating recorded in the language it was asked in."""
    (invite,) = make_invites(engine, spanish_study)
    who = enroll_fully(app_client, invite, timezone="Europe/Madrid")
    assert app_client.put("/api/v1/me/language", headers=who.headers, json={"language": "es"}).status_code == 200
    help_text = app_client.get("/api/v1/me/crisis-resources", headers=who.headers).json()
    assert (help_text["region"], help_text["text"]) == ("ES", bilingual_resources(spanish_study, engine))
    listed = app_client.get("/api/v1/me/surveys", headers=who.headers).json()
    assert [s["title"] for s in listed] == ["GAD-7"]  # the translation's title (the same word)
    with session_scope(engine) as session:
        assignment = session.scalars(sa.select(SurveyAssignment)).one()
        token = survey_service.link_token(assignment)
    app_client.cookies.clear()
    page = app_client.get(f"/s/{token}", headers={"Accept-Language": "en-US"})
    assert '<html lang="es">' in page.text
    assert "Dificultad para relajarte" in page.text
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(app_client, who, "coach")
    ended = app_client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                            json={"rating": 6, "made_decision": False})
    assert ended.status_code == 200, ended.text
    with session_scope(engine) as session:
        rating = session.scalars(sa.select(SurveyResponse).where(
            SurveyResponse.instrument_id == "immediate-rating")).one()
        assert rating.language == "es"  # asked in the exit check's words, in Spanish


def bilingual_resources(slug: str, engine: Engine) -> str:
    with session_scope(engine) as session:
        protocol = studies.current_protocol(session, studies.get_study(session, slug).id)
        return protocol.crisis_resources_in("ES", "es")
