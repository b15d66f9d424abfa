from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study import studies
from study.db import session_scope
from study.errors import Conflict
from study.protocol import ProtocolError
from study.settings import get_settings
from surveys import registry
from tests.builders import TEST_ACTOR, assign_survey, enroll_fully, load_study, make_invites

CUSTOM = """
id: sleep-quality
version: "1"
title: Sleep this week
items:
  - {id: rested, type: likert, min: 1, max: 5, text: "I woke up rested."}
  - {id: restless, type: likert, min: 1, max: 5, reverse: true, text: "My sleep was restless."}
  - {id: hours, type: number, min: 0, max: 24, text: "Hours of sleep on a typical night"}
  - {id: aids, type: multiple_choice, required: false, text: "What helped?",
     options: [{value: tea, label: Tea}, {value: reading, label: Reading}, {value: none, label: Nothing}]}
  - {id: note, type: text, required: false, text: "Anything else?"}
scores:
  - {name: sleep_quality, method: mean, items: [rested, restless]}
  - {name: sleep_quality_sum, method: sum, items: [rested, restless]}
"""


def test_custom_instrument_with_reverse_item_is_loaded_answered_and_scored(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM, TEST_ACTOR)
    slug = load_study(engine, example_protocol.replace("baseline: [perma-profiler]",
                                                       "baseline: [perma-profiler, sleep-quality]"))
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite)
    listed = app_client.get("/api/v1/me/surveys", headers=who.headers).json()
    pending = {s["instrument"]: s["assignment_id"] for s in listed}
    survey_id = pending["sleep-quality"]
    bad = app_client.put(f"/api/v1/me/surveys/{survey_id}/answers", headers=who.headers,
                         json={"answers": {"aids": ["tea", "coffee"]}})
    assert bad.json()["error"]["fields"] == [{"field": "aids", "message": "unknown choices: coffee"}]
    done = app_client.post(f"/api/v1/me/surveys/{survey_id}/submit", headers=who.headers, json={
        "answers": {"rested": 4, "restless": 2, "hours": 7.5, "aids": ["reading", "tea"]},
        "submission_id": "sleep-00001"})
    assert done.status_code == 200, done.text
    scores = {s["name"]: (s["value"], s["n_items"]) for s in done.json()["scores"]}
    # restless 2 reversed on 1-5 is 4: mean (4 + 4) / 2, sum 8
    assert scores == {"sleep_quality": (4.0, 2), "sleep_quality_sum": (8.0, 2)}


def test_changed_custom_instrument_needs_a_new_version(engine: Engine) -> None:
    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM, TEST_ACTOR)
        registry.load_custom(session, CUSTOM, TEST_ACTOR)  # same definition: a no-op
        with pytest.raises(Conflict, match="raise its version"):
            registry.load_custom(session, CUSTOM.replace("I woke up rested.", "I felt rested."), TEST_ACTOR)
        registry.load_custom(session, CUSTOM.replace('version: "1"', 'version: "2"').replace(
            "I woke up rested.", "I felt rested."), TEST_ACTOR)
        assert registry.get(session, "sleep-quality").item("rested").text == "I felt rested."
        assert registry.get(session, "sleep-quality", "1").item("rested").text == "I woke up rested."


def test_protocol_naming_an_unknown_instrument_fails_to_load(
    engine: Engine, example_protocol: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object,
) -> None:
    """Refused with the field, its line, the nearest known id and how to load a custom one (the API's
    instrument filter of responses suggests the same way: tests/api/test_transcripts.py)."""
    broken = example_protocol.replace("baseline: [perma-profiler]", "baseline: [perma-profiller]")
    line = 1 + next(i for i, text in enumerate(broken.splitlines()) if "perma-profiller" in text)
    with session_scope(engine) as session, pytest.raises(ProtocolError) as refused:
        studies.load_protocol(session, broken, TEST_ACTOR, instruments=registry.catalog(session))
    assert refused.value.problems == [
        f"baseline[0] (line {line}): unknown instrument 'perma-profiller'; did you mean 'perma-profiler'? (known: "
        "decision-clarity, decision-regret, gad-7, goal-progress, immediate-rating, perma-profiler, phq-9; a custom "
        "one is loaded with `afterward instruments load FILE`)"]
    with session_scope(engine) as session, pytest.raises(ProtocolError) as far:
        studies.load_protocol(session, broken.replace("perma-profiller", "wellbeing-index"), TEST_ACTOR,
                              instruments=registry.catalog(session))
    assert "did you mean" not in far.value.problems[0]
    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM, TEST_ACTOR)
    with session_scope(engine) as session, pytest.raises(ProtocolError, match="known: .*, sleep-quality;"):
        studies.load_protocol(session, broken, TEST_ACTOR, instruments=registry.catalog(session))
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()  # load_custom's audit entry read the settings before the URL was set
    path = f"{tmp_path}/protocol.yaml"
    with open(path, "w") as handle:
        handle.write(broken)
    result = CliRunner().invoke(app, ["study", "load", path])
    assert result.exit_code == 1
    assert f"baseline[0] (line {line}): unknown instrument 'perma-profiller'; did you mean" in result.output


def test_custom_instrument_answers_feed_a_followup(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM, TEST_ACTOR)
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    who = enroll_fully(app_client, invite)
    survey_id = assign_survey(engine, who.code, "sleep-quality")
    survey = app_client.get(f"/api/v1/me/surveys/{survey_id}", headers=who.headers).json()
    assert survey["instrument_version"] == "1"
    assert "reverse" not in survey["items"][1]  # scoring details are not shown to participants


def test_a_custom_instrument_is_never_served_stale(engine: Engine) -> None:
    """The parsed definition is kept by row and digest: a new version, or a row rewritten under the
    same version (a repair by hand), is read afresh."""
    from sqlalchemy import update

    from surveys.models import CustomInstrument

    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM, TEST_ACTOR)
        first = registry.get(session, "sleep-quality")
        assert registry.get(session, "sleep-quality", "1") is first  # served from the cache
    with session_scope(engine) as session:
        registry.load_custom(session, CUSTOM.replace('version: "1"', 'version: "2"')
                             .replace("I woke up rested.", "I woke up refreshed."), TEST_ACTOR)
    with session_scope(engine) as session:
        newest = registry.get(session, "sleep-quality")
        assert (newest.version, newest.items[0].text) == ("2", "I woke up refreshed.")
        assert registry.get(session, "sleep-quality", "1").items[0].text == "I woke up rested."
        repaired = first.model_dump(mode="json")
        repaired["items"][0]["text"] = "I woke up well rested."
        session.execute(update(CustomInstrument).where(CustomInstrument.version == "1")
                        .values(definition=repaired, source_sha256="0" * 64))
    with session_scope(engine) as session:
        assert registry.get(session, "sleep-quality", "1").items[0].text == "I woke up well rested."
