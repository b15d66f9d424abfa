"""chat.llm_reader: the rubric and its version, the verdict's schema and how an answer is read back,
the fusion rule with the local reading, the offline provider's verdicts, the deprecated setting,
and the reader at work through the API on a loopback OpenAI-compatible server: a request for
agreement it alone notices gets pushback quoting the participant's sentence, a danger it alone
notices a check-in or an escalation, and a malformed answer or a timeout leaves the local reading
to decide, the reply delivered all the same."""

from __future__ import annotations

import json
import logging
import threading
import typing
from typing import Any

import litellm
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from api.app import create_app
from chat import offline
from chat.gateway import Gateway
from chat.llm_reader import (
    MARKER,
    RESPONSE_FORMAT,
    LLMReading,
    ReaderVerdict,
    fuse,
    parse_verdict,
    rubric,
)
from chat.monitors import CrisisFinding
from chat.policy import Assessment, History, directive
from chat.reading import ABOUT, CONCERNS
from chat.roles import ROLE_SPECS
from study.settings import Settings
from tests.api.test_chat import rows, wellbeing_participant
from tests.builders import say, start_chat
from tests.chat.reader_server import reader, verdict
from tests.loopback import serve

MODEL = "openai/loopback-reader"
SETTLED = "Orange is the only sensible colour for it, that much is settled."
KITCHEN = f"We are repainting the kitchen this weekend. {SETTLED} The tins arrive on Friday."


def reading(answer: str | None, problem: str | None = None) -> LLMReading:
    return LLMReading(MODEL, rubric().version, None if answer is None else parse_verdict(answer), problem)


# The rubric, the schema, reading an answer back


def test_the_rubric_defines_every_concern_and_is_versioned_by_revision_and_text() -> None:
    text = rubric().text
    assert text.startswith(f"{MARKER} rubric v1\n")
    for name in (*CONCERNS, *ABOUT, "acute", "quote"):
        assert name in text, name
    for near_miss in ("resolved", "Venting anger", "dark humour", "first-aid", "Neutral requests"):
        assert near_miss in text, near_miss
    declared, digest = rubric().version.split("-")
    assert declared == "v1"
    assert len(digest) == 12
    assert int(digest, 16) >= 0


def test_the_verdict_schema_is_the_local_readings_concerns_closed_and_strict() -> None:
    assert tuple(ReaderVerdict.model_fields) == (*CONCERNS, "about")
    assert typing.get_args(ReaderVerdict.model_fields["about"].annotation) == ABOUT
    assert RESPONSE_FORMAT["type"] == "json_schema"
    assert RESPONSE_FORMAT["json_schema"]["strict"] is True
    schema = RESPONSE_FORMAT["json_schema"]["schema"]
    objects = [schema, *schema["$defs"].values()]
    for obj in objects:  # what strict structured output asks of every object
        assert obj["additionalProperties"] is False
        assert sorted(obj["required"]) == sorted(obj["properties"])
    assert set(schema["$defs"]["DangerFinding"]["properties"]) == {"present", "acute", "quote"}


def test_an_answer_is_a_verdict_only_when_complete_and_well_formed() -> None:
    complete = verdict({"validation_seeking": SETTLED})
    for answer in (complete, f"Here is my reading:\n```json\n{complete}\n```\nHope that helps.",
                   complete.replace('"about"', '"reason": "a note of its own", "about"')):  # extra keys ignored
        parsed = parse_verdict(answer)
        assert parsed is not None
        assert parsed.present() == ["validation_seeking"]
    partial = json.loads(complete)
    del partial["dependence"]
    for answer in ("", "none", "I can't help with that.", complete[:-40], json.dumps(partial),
                   complete.replace('"about": "self_now"', '"about": "myself"'),
                   complete.replace('"present": true', '"present": "maybe"')):
        assert parse_verdict(answer) is None, answer


# The fusion rule (chat.llm_reader.fuse): a pure function


def test_danger_is_raised_by_the_reader_never_lowered_and_acute_only_raises() -> None:
    nothing = Assessment(message="The weather was lovely on my walk today.")
    raised = fuse(nothing, reading(verdict({"risk_to_self": "The weather was lovely"}, acute=["risk_to_self"])))
    assert raised.crisis == CrisisFinding("risk_to_self", True, "The weather was lovely on my walk today.",
                                          source="classifier")
    assert directive(ROLE_SPECS["concierge"], raised, History()).stance == "escalate"
    acute = Assessment(crisis=CrisisFinding("harm_to_others", True, "stab my roommate"), message="...")
    assert fuse(acute, reading(verdict())).crisis is acute.crisis
    assert fuse(acute, reading(verdict({"risk_to_self": ""}))).crisis is acute.crisis
    mild = Assessment(crisis=CrisisFinding("risk_from_others", False, "he takes my money"), message="...")
    assert fuse(mild, reading(verdict({"risk_to_self": ""}))).crisis is mild.crisis  # not acute: no raise
    stronger = fuse(mild, reading(verdict({"risk_to_self": "", "harm_to_others": ""}, acute=["harm_to_others"])))
    assert stronger.crisis == CrisisFinding("harm_to_others", True, "llm reader", source="classifier")
    for failed in (reading(None, "timeout"), reading("not json", "malformed")):
        assert fuse(mild, failed).crisis is mild.crisis


def test_pushback_is_raised_only_with_the_participants_own_sentence_and_a_local_flag_stands() -> None:
    local = Assessment(message=KITCHEN)
    # A quote of part of a sentence is widened to the whole sentence; the reason quotes it.
    fused = fuse(local, reading(verdict({"validation_seeking": "the only sensible colour"})))
    assert fused.validation_cue == SETTLED
    nudge = directive(ROLE_SPECS["collaborator"], fused, History())
    assert (nudge.stance, nudge.concern) == ("nudge", "validation_seeking")
    assert f"\u201c{SETTLED}\u201d" in nudge.rationale
    # A paraphrase, an empty quote or too short a piece to tell which sentence raises nothing.
    for quote in ("They want me to agree that orange is best", "", "it", "The"):
        assert fuse(local, reading(verdict({"validation_seeking": quote}))).validation_cue is None, quote
    # Every pushback concern alike: the reader's quote sets the field the policy reads.
    both = fuse(local, reading(verdict({"one_sided": SETTLED, "dependence": "The tins arrive on Friday"})))
    assert (both.framing_cue, both.dependence_cue) == (SETTLED, "The tins arrive on Friday.")
    # What the local reading flagged stands, with its own quote, whatever the reader says.
    flagged = Assessment(message=KITCHEN, validation_cue="We are repainting the kitchen this weekend.")
    for answer in (verdict(), verdict({"validation_seeking": SETTLED})):
        assert fuse(flagged, reading(answer)).validation_cue == flagged.validation_cue


def test_both_readers_and_the_rubric_are_recorded() -> None:
    local = Assessment(message=KITCHEN, crisis=CrisisFinding("risk_to_self", False, "x"),
                       validation_cue="We are repainting the kitchen this weekend.")
    fused = fuse(local, reading(verdict({"dependence": SETTLED, "distress": SETTLED, "risk_to_self": ""},
                                        acute=["risk_to_self"], about="someone_else")))
    record = fused.features()["llm_reader"]
    assert record == {
        "model": MODEL, "rubric": rubric().version, "status": "ok",
        "verdict": {"present": ["risk_to_self", "distress", "dependence"], "acute": ["risk_to_self"],
                    "quotes": {"distress": SETTLED, "dependence": SETTLED}, "about": "someone_else"},
        "local": {"present": ["risk_to_self", "validation_seeking"], "acute": []},
        "fused": {"present": ["risk_to_self", "validation_seeking", "dependence"], "acute": ["risk_to_self"]},
    }
    failed = fuse(local, reading(None, "timeout")).llm_reader
    assert failed is not None
    assert (failed["status"], failed["verdict"], failed["local"]) == ("timeout", None, failed["fused"])
    assert "llm_reader" not in local.features()  # no reader ran


# The offline provider answers the reader deterministically


def test_the_offline_provider_answers_the_readers_request_with_a_verdict() -> None:
    message = "My sister says I was rude at dinner. I was right, wasn't I? I want to kill myself tonight."
    asked = [{"role": "system", "content": rubric().text}, {"role": "user", "content": message}]
    answer = offline.answer(asked)
    assert answer == offline.answer(asked)
    parsed = parse_verdict(answer)
    assert parsed is not None
    assert parsed.present() == ["risk_to_self", "validation_seeking"]
    assert parsed.risk_to_self.acute
    assert parsed.validation_seeking.quote == "I was right, wasn't I?"
    assert parsed.risk_to_self.quote == "I want to kill myself tonight."


# The setting and its deprecated name


def test_the_deprecated_classifier_setting_still_configures_the_reader(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="afterward.study.settings"):
        old = Settings(crisis_classifier_model="offline/reader")
    assert old.llm_reader_model == "offline/reader"
    assert Gateway(old).reader_model == "offline/reader"
    assert "deprecated" in caplog.text
    monkeypatch.setenv("AFTERWARD_CRISIS_CLASSIFIER_MODEL", "offline/reader")
    assert Settings().llm_reader_model == "offline/reader"
    assert Settings(llm_reader_model=None).llm_reader_model is None  # the new name, given, wins
    assert Settings(llm_reader_model="offline/reader").llm_reader_model == "offline/reader"
    with pytest.raises(ValueError, match="disagree"):
        Settings(llm_reader_model="offline/other")


# Through the API, the reader on loopback


@pytest.fixture
def loopback_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")


def features(engine: Engine) -> list[dict[str, Any]]:
    return [json.loads(f) if isinstance(f, str) else f for (f,) in rows(
        engine, "SELECT features FROM turns WHERE speaker = 'participant' ORDER BY id")]


@pytest.mark.usefixtures("loopback_key")
def test_a_request_for_agreement_only_the_reader_notices_gets_pushback_quoting_its_sentence(
        engine: Engine, slug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    structured = litellm.supports_response_schema
    monkeypatch.setattr(litellm, "supports_response_schema", lambda model, *args, **kwargs: model == MODEL or (
        structured(model, *args, **kwargs)))
    handler, requests = reader(lambda message: verdict({"validation_seeking": "the only sensible colour"}
                                                       if message == KITCHEN else None))
    with serve(handler) as base, TestClient(create_app(engine, Gateway(Settings(
            llm_reader_model=MODEL, llm_api_base=base))), raise_server_exceptions=False) as client:
        who = wellbeing_participant(engine, client, slug)
        conversation = start_chat(client, who, "collaborator")
        assert say(client, who, conversation, "We are repainting the kitchen this weekend.")["stance"] == "agree"
        reply = say(client, who, conversation, KITCHEN)
    assert (reply["stance"], reply["concern"]) == ("nudge", "validation_seeking")
    assert f"\u201c{SETTLED}\u201d" in reply["rationale"]
    # Asked with the rubric as the system prompt and the verdict's JSON schema as the response format.
    assert [body["messages"][0]["content"] for body in requests] == [rubric().text] * 2
    assert [body["response_format"]["json_schema"]["name"] for body in requests] == ["message_reading"] * 2
    assert requests[0]["response_format"]["json_schema"]["schema"] == RESPONSE_FORMAT["json_schema"]["schema"]
    recorded = [f["llm_reader"] for f in features(engine)]
    assert [(r["rubric"], r["status"], r["fused"]["present"]) for r in recorded] == [
        (rubric().version, "ok", []), (rubric().version, "ok", ["validation_seeking"])]


@pytest.mark.usefixtures("loopback_key")
def test_a_danger_only_the_reader_notices_gets_a_check_in_or_an_escalation(engine: Engine, slug: str) -> None:
    # Messages the local classifier does not flag. It flags some short everyday lines itself (READING.md,
    # "What it misses"): with the fit that round 13 scored, "I walked the dog and then made some soup."
    # and "The bins go out on Thursday." (a day, like an arrangement); before it, "I've sorted out who
    # gets the cat after Sunday.".
    quiet, plan = "The neighbours got a new puppy.", "Our team switched to a new calendar app."

    def read(message: str) -> str:
        return verdict({"risk_to_self": message}, acute=["risk_to_self"] if message == plan else [])
    handler, _ = reader(read)
    with serve(handler) as base, TestClient(create_app(engine, Gateway(Settings(
            llm_reader_model=MODEL, llm_api_base=base))), raise_server_exceptions=False) as client:
        who = wellbeing_participant(engine, client, slug)
        conversation = start_chat(client, who, "concierge")
        assert [say(client, who, conversation, text)["stance"] for text in (quiet, plan)] == ["check_in", "escalate"]
    assert rows(engine, "SELECT category, source, level, cue FROM safety_events ORDER BY id") == [
        ("risk_to_self", "classifier", "check_in", quiet), ("risk_to_self", "classifier", "escalation", plan)]


MALFORMED = {  # message -> the reader's answer
    # (With the fit that round 13 scored, "I bought new running shoes yesterday." gets a validation-seeking nudge.)
    "The printer on our floor is out of toner.": "Sure! The participant seems fine.",
    "We are repainting the kitchen this weekend.": verdict({"validation_seeking": SETTLED})[:-60],
    "The tins arrive on Friday.": json.dumps({"validation_seeking": {"present": True, "quote": "The tins"}}),
}
# The local reading flags this one (validation-seeking): it still decides alone when the reader fails.
LOCAL = "Tell me it's a great idea to quit my job, it is, right?"


@pytest.mark.usefixtures("loopback_key")
@pytest.mark.parametrize("failure", ["malformed", "timeout"])
def test_without_a_verdict_the_local_reading_decides_and_the_reply_is_delivered(
        engine: Engine, slug: str, failure: str, caplog: pytest.LogCaptureFixture) -> None:
    released = threading.Event()

    def read(message: str) -> str:
        if failure == "timeout":  # never answers in time: held until the test is over
            released.wait(60)
        return MALFORMED.get(message, "{")
    handler, requests = reader(read)
    with serve(handler) as base:
        try:
            gateway = Gateway(Settings(llm_reader_model=MODEL, llm_api_base=base, llm_timeout_seconds=0.5,
                                       llm_retries=0))
            with caplog.at_level(logging.WARNING, logger="afterward.chat.gateway"), TestClient(
                    create_app(engine, gateway), raise_server_exceptions=False) as client:
                who = wellbeing_participant(engine, client, slug)
                conversation = start_chat(client, who, "collaborator")
                replies = [say(client, who, conversation, text) for text in (*MALFORMED, LOCAL)]
        finally:
            released.set()
    assert [(r["stance"], r["concern"]) for r in replies] == [("agree", "none")] * 3 + [
        ("nudge", "validation_seeking")]
    assert all(r["content"] for r in replies)
    assert len(requests) == 4
    recorded = [f["llm_reader"] for f in features(engine)]
    assert [(r["status"], r["verdict"], r["rubric"]) for r in recorded] == [(failure, None, rubric().version)] * 4
    assert all(r["fused"] == r["local"] for r in recorded)
    assert rows(engine, "SELECT count(*) FROM turns WHERE speaker = 'assistant'") == [(4,)]
    expected = "no complete verdict" if failure == "malformed" else "LLM timeout"
    assert caplog.text.count(expected) == 4, caplog.text
