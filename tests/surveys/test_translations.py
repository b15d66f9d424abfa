"""Instrument translations from the study team: checked complete when loaded (each missing item,
label, option or anchor named), shown to participants who read the study in that language with the
instrument's own values and scoring, and recorded with each response and in the export."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis.exports import export_study
from study.db import session_scope
from surveys import registry
from surveys.definitions import InstrumentError
from surveys.translations import parse_translation
from tests.builders import (
    GAD7_SPANISH,
    TEST_ACTOR,
    assign_survey,
    bilingual,
    enroll_fully,
    load_spanish_gad7,
    load_study,
    make_invites,
)

GAD7 = registry.builtin()["gad-7"]
SOURCE = GAD7_SPANISH.read_text(encoding="utf-8")


def _without(*path: str | int) -> str:
    """The fixture with the text at ``path`` left out."""
    document = yaml.safe_load(SOURCE)
    node = document
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return yaml.safe_dump(document, allow_unicode=True)


def test_a_complete_translation_keeps_ids_values_and_scoring() -> None:
    spanish = parse_translation(SOURCE, GAD7).apply(GAD7)
    assert [item.id for item in spanish.items] == [item.id for item in GAD7.items]
    assert spanish.item("gad7_4").text == "Dificultad para relajarte"
    assert spanish.item("gad7_1").labels[3] == "Casi todos los días"
    assert [o.value for o in spanish.item("gad7_difficulty").options] == ["not_difficult", "somewhat", "very",
                                                                          "extremely"]
    assert spanish.item("gad7_difficulty").options[0].label == "Nada difícil"
    assert spanish.blocks[0].anchors == ("0 = nunca", "3 = casi todos los días")
    answers = {f"gad7_{i}": i % 4 for i in range(1, 8)}
    assert spanish.score(answers) == GAD7.score(answers)


@pytest.mark.parametrize(("missing", "named"), [
    (("items", "gad7_4"), "items.gad7_4: missing"),
    (("items", "gad7_1", "labels", 2), "items.gad7_1.labels.2: missing"),
    (("items", "gad7_difficulty", "options", "very"), "items.gad7_difficulty.options.very: missing"),
    (("blocks", "often"), "blocks.often.anchors: missing"),
    (("instructions",), "instructions: missing"),
])
def test_a_translation_missing_a_text_is_refused_naming_it(missing: tuple[str | int, ...], named: str) -> None:
    with pytest.raises(InstrumentError) as caught:
        parse_translation(_without(*missing), GAD7)
    assert f"gad-7@2006 in es: {named}" in caught.value.problems


def test_a_translation_naming_what_the_instrument_lacks_is_refused() -> None:
    document = yaml.safe_load(SOURCE)
    document["items"]["gad7_8"] = {"text": "Una pregunta de más"}
    document["items"]["gad7_1"]["labels"][4] = "Siempre"
    document["language"] = "fr"
    with pytest.raises(InstrumentError) as caught:
        parse_translation(yaml.safe_dump(document, allow_unicode=True), GAD7)
    assert "gad-7@2006 in fr: items.gad7_8: not an item of gad-7@2006" in caught.value.problems
    assert "gad-7@2006 in fr: items.gad7_1.labels.4: not a label of the item" in caught.value.problems
    assert any("language 'fr' is not a language of the interface" in p for p in caught.value.problems)


def test_loading_a_translation_is_audited_and_a_changed_one_replaces_it(engine: Engine) -> None:
    load_spanish_gad7(engine)
    load_spanish_gad7(engine)  # the same file again changes nothing
    with session_scope(engine) as session:
        changed = SOURCE.replace("Dificultad para relajarte", "Te cuesta relajarte")
        registry.load_custom(session, changed, TEST_ACTOR)
        shown, language = registry.in_language(session, GAD7, "es")
        assert (shown.item("gad7_4").text, language) == ("Te cuesta relajarte", "es")
        assert registry.in_language(session, GAD7, "en") == (GAD7, "en")
        from study.models import AuditEntry

        assert session.query(AuditEntry).filter_by(action="instrument.translation_loaded").count() == 2


def test_a_participant_reading_spanish_answers_the_spanish_items_and_the_export_says_so(
        app_client: TestClient, engine: Engine, example_protocol: str, tmp_path: Path) -> None:
    load_spanish_gad7(engine)
    slug = load_study(engine, bilingual(example_protocol))
    spanish, english = make_invites(engine, slug, count=2)
    reader = enroll_fully(app_client, spanish)
    app_client.put("/api/v1/me/language", headers=reader.headers, json={"language": "es"})
    other = enroll_fully(app_client, english)
    answers = {f"gad7_{i}": 1 for i in range(1, 8)}
    for who, language in ((reader, "es"), (other, "en")):
        assignment = assign_survey(engine, who.code, "gad-7")
        read = app_client.get(f"/api/v1/me/surveys/{assignment}", headers=who.headers).json()
        assert read["language"] == language
        assert read["items"][3]["text"] == ("Dificultad para relajarte" if language == "es" else "Trouble relaxing")
        submitted = app_client.post(f"/api/v1/me/surveys/{assignment}/submit", headers=who.headers,
                                    json={"answers": answers, "submission_id": f"submit-{language}-1"})
        assert submitted.status_code == 200, submitted.text
    result = export_study(engine, slug, tmp_path, format="csv", actor=TEST_ACTOR)
    assert result is not None
    responses = pd.read_csv(tmp_path / "responses_gad_7.csv")
    submitted_only = responses[responses["submitted_at"].notna()]
    assert dict(zip(submitted_only["participant_code"], submitted_only["language"], strict=True)) == {
        reader.code: "es", other.code: "en"}
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert set(scores["language"]) == {"es", "en"}
    assert set(scores.loc[scores["name"] == "total", "value"]) == {7.0}


def test_a_translation_keeps_the_placeholders_the_participants_answers_are_piped_into() -> None:
    regret = registry.builtin()["decision-regret"]
    assert "{decision}" in regret.instructions
    texts: dict[str, dict[str, object]] = {
        item.id: {"text": f"Pregunta {item.id}", "labels": dict(item.labels),
                  "options": {o.value: o.label for o in item.options}} for item in regret.items}
    document = {"translation_of": "decision-regret", "version": regret.version, "language": "es",
                "title": "Arrepentimiento",
                "instructions": "Piensa en la decisión que tomaste.",
                "blocks": {b.id: {k: v for k, v in (("title", b.title), ("anchors", b.anchors)) if v}
                           for b in regret.blocks},
                "items": texts}
    with pytest.raises(InstrumentError) as caught:
        parse_translation(yaml.safe_dump(document, allow_unicode=True), regret)
    wanted = f"decision-regret@{regret.version} in es: instructions: keep the placeholder {{decision}}"
    assert wanted in caught.value.problems
    document["instructions"] = "Piensa en la decisión que tomaste: {decision}"
    assert parse_translation(yaml.safe_dump(document, allow_unicode=True), regret).instructions.endswith("{decision}")
