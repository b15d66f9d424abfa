"""chat.turn: one pipeline for a turn, whoever drives it. The same scripted conversation (a plain
message, one that gets pushback, "go ahead anyway", a reassurance request, a request for agreement
and a risk only an LLM reader notices, an explicit crisis statement, the exit check) taken through
the API, the simulation's driver and the evaluation pipeline gets the same stances, reasons,
replies and safety events; with an LLM reader configured (an OpenAI-compatible server on loopback)
all three ask it the same questions and record its verdicts alike. And the crisis encoder reads a
message before its write transaction."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis.simulation.driver import Driver
from api.app import create_app
from chat import semantic, turn
from chat.gateway import Gateway
from chat.llm_reader import rubric
from chat.roles import RoleName, system_prompt
from study.clock import FrozenClock, set_clock
from study.settings import Settings
from tests.builders import FRAMING, ParticipantHandle, enroll_fully, make_invites, put_in_arm, start_chat
from tests.chat.reader_server import reader, verdict
from tests.conftest import POSTGRES_URL
from tests.loopback import serve

ROLE: RoleName = "coach"
# Messages the lexicons and the local reading pass, which the loopback reader reads as a request
# for agreement and as a risk to self (stand-ins for what only a larger model would notice): the
# challenge and the check-in they get come from the reader alone.
SETTLED = "Orange is the only sensible colour for it, that much is settled."
QUIET_VALIDATION = f"We are repainting the kitchen this weekend. {SETTLED}"
QUIET_RISK = "The weather was lovely on my walk today."
SCRIPT: list[tuple[str, str]] = [  # ("say", text) or ("override", "") the last reply
    ("say", "I'm thinking about asking for a raise next month."),
    ("say", FRAMING),
    ("override", ""),
    ("say", "Am I doing the right thing here?"),
    ("say", QUIET_VALIDATION),
    ("say", QUIET_RISK),
    ("say", "I want to kill myself tonight."),
]


def read(message: str) -> str:
    """The loopback reader's verdicts: a risk to self for ``QUIET_RISK`` and (acute) "kill myself",
    validation-seeking quoting part of ``SETTLED``, nothing otherwise."""
    if message == QUIET_VALIDATION:
        return verdict({"validation_seeking": "Orange is the only sensible colour"})
    if message == QUIET_RISK or "kill myself" in message:
        return verdict({"risk_to_self": message}, acute=["risk_to_self"] if "kill" in message else [])
    return verdict()


@pytest.fixture
def reader_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    handler, requests = reader(read)
    with serve(handler) as base:
        yield base, requests


def rows(engine: Engine, query: str, **params: Any) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(query), params).all())


def participant(engine: Engine, client: TestClient, slug: str) -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite)
    put_in_arm(engine, who.code, "wellbeing")
    return who


def replies_stored(engine: Engine, conversation: int) -> list[tuple[str, str, str | None, str]]:
    return [tuple(row) for row in rows(engine, "SELECT stance, concern, rationale, content FROM turns "
                                               "WHERE conversation_id = :c AND speaker = 'assistant' ORDER BY seq",
                                       c=conversation)]


def readers_recorded(engine: Engine, conversation: int) -> list[Any]:
    """Each participant message's ``llm_reader`` feature (None where the reader did not run)."""
    return [(json.loads(f) if isinstance(f, str) else f).get("llm_reader") for (f,) in rows(
        engine, "SELECT features FROM turns WHERE conversation_id = :c AND speaker = 'participant' ORDER BY seq",
        c=conversation)]


def safety_events(engine: Engine, conversation: int) -> list[tuple[str, str]]:
    return [tuple(row) for row in rows(engine, "SELECT category, source FROM safety_events WHERE conversation_id = :c "
                                               "ORDER BY id", c=conversation)]


def through_the_api(engine: Engine, client: TestClient, slug: str) -> int:
    who = participant(engine, client, slug)
    conversation = start_chat(client, who, ROLE)
    last: dict[str, Any] = {}
    for step, text in SCRIPT:
        path = (f"/api/v1/me/conversations/{conversation}/messages" if step == "say" else
                f"/api/v1/me/conversations/{conversation}/turns/{last['id']}/override")
        response = client.post(path, headers=who.headers, json={"content": text} if step == "say" else None)
        assert response.status_code == 200, response.text
        last = response.json()["reply"]
    ended = client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                        json={"rating": 5, "made_decision": True, "decision": "Asked for the raise"})
    assert ended.status_code == 200, ended.text
    return conversation


def through_the_driver(engine: Engine, client: TestClient, slug: str, gateway: Gateway) -> int:
    who = participant(engine, client, slug)
    [(participant_id,)] = rows(engine, "SELECT id FROM participants WHERE code = :c", c=who.code)
    clock = FrozenClock(dt.datetime.now(dt.UTC))
    previous = set_clock(clock)
    try:
        with asyncio.Runner() as runner:
            driver = Driver(engine, gateway, clock, runner, model=None)
            conversation = driver.start(participant_id, ROLE)
            last = None
            for number, (step, text) in enumerate(SCRIPT):
                last = (driver.send(participant_id, conversation, text, f"m{number}") if step == "say" else
                        driver.override(participant_id, conversation, last.turn_id if last else 0))
            assert driver.end(participant_id, conversation, rating=5, decision="Asked for the raise") is not None
    finally:
        set_clock(previous)
    return conversation


def through_the_evals(gateway: Gateway) -> list[tuple[str, str, str | None, str]]:
    """As ``evals.pipeline.converse`` takes a role condition's messages, plus the override."""
    store = turn.MemoryStore(ROLE, system_prompt(ROLE).text)

    async def converse() -> None:
        last = None
        for step, text in SCRIPT:
            prepared = await store.accept(text) if step == "say" else store.override(last or 0)
            outcome = await turn.answer(store, gateway, prepared)
            assert outcome.reply_id is not None
            last = outcome.reply_id
    asyncio.run(converse())
    return [(r["stance"], r["concern"], r["rationale"], r["reply"]) for r in store.replies]


@pytest.mark.parametrize("with_reader", [False, True], ids=["local reading", "with an LLM reader"])
def test_the_api_the_simulation_and_the_evaluations_take_a_turn_alike(
        engine: Engine, slug: str, with_reader: bool, request: pytest.FixtureRequest) -> None:
    settings = Settings()
    requests: list[dict[str, Any]] = []
    if with_reader:
        base, requests = request.getfixturevalue("reader_server")
        settings = Settings(llm_reader_model="openai/loopback-reader", llm_api_base=base)
    asked: dict[str, list[str]] = {}

    def taken() -> list[str]:
        messages = [body["messages"][-1]["content"] for body in requests]
        requests.clear()
        return messages
    with TestClient(create_app(engine, Gateway(settings)), raise_server_exceptions=False) as client:
        by_api = through_the_api(engine, client, slug)
        asked["api"] = taken()
        by_driver = through_the_driver(engine, client, slug, Gateway(settings))
        asked["simulation"] = taken()
    before = rows(engine, "SELECT count(*) FROM turns"), rows(engine, "SELECT count(*) FROM safety_events")
    by_evals = through_the_evals(Gateway(settings))
    asked["evals"] = taken()

    api = replies_stored(engine, by_api)
    assert replies_stored(engine, by_driver) == api
    assert by_evals == api
    stances = [stance for stance, *_ in api]
    assert stances[1] in ("nudge", "challenge")
    assert stances[2] == "agree"
    assert stances[-1] == "escalate"
    # Only the reader notices the request for agreement (the coach challenges it, quoting the whole
    # sentence the reader's quote comes from) and the quiet risk.
    assert stances[4:6] == (["challenge", "check_in"] if with_reader else ["agree", "agree"])
    if with_reader:
        assert api[4][1] == "validation_seeking"
        assert f"\u201c{SETTLED}\u201d" in (api[4][2] or "")
    # Safety events are written where a participant's chat is (API and simulation), never by an evaluation:
    # every risk finding, the check-in the reader's verdict gets as well as the escalation.
    events = [("risk_to_self", "lexicon+semantic")]
    assert safety_events(engine, by_api) == safety_events(engine, by_driver) == (
        [("risk_to_self", "classifier"), *events] if with_reader else events)
    assert (rows(engine, "SELECT count(*) FROM turns"), rows(engine, "SELECT count(*) FROM safety_events")) == before
    for conversation in (by_api, by_driver):
        assert rows(engine, "SELECT status, made_decision FROM conversations WHERE id = :c", c=conversation) == [
            ("ended", True)]
    # The reader is asked about every message the lexicon did not already escalate, the overridden
    # one again; identically by all three, and its verdicts are recorded alike with the rubric's version.
    expected = [text for step, text in SCRIPT[:-1] if step == "say"]
    expected.insert(2, FRAMING)
    assert asked == {"api": expected if with_reader else [], "simulation": expected if with_reader else [],
                     "evals": expected if with_reader else []}
    recorded = readers_recorded(engine, by_api)
    assert readers_recorded(engine, by_driver) == recorded
    if not with_reader:
        assert recorded == [None] * 6
        return
    assert [r["rubric"] if r else None for r in recorded] == [rubric().version] * 5 + [None]
    assert [r["status"] if r else None for r in recorded] == ["ok"] * 5 + [None]
    validation = recorded[3]
    assert (validation["local"]["present"], validation["fused"]["present"]) == ([], ["validation_seeking"])
    assert validation["verdict"]["quotes"] == {"validation_seeking": "Orange is the only sensible colour"}


@pytest.mark.skipif(bool(POSTGRES_URL), reason="SQLite's one writer lock; PostgreSQL has no such lock to hold")
def test_a_writer_is_not_blocked_while_the_first_message_is_encoded(
        engine: Engine, slug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    read = semantic.read

    def held(text: str) -> Any:
        if not release.is_set():
            entered.set()
            assert release.wait(60), "the test never released the encoder"
        return read(text)
    monkeypatch.setattr(semantic, "read", held)
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        assert client.get("/healthz").json()["encoder"] == "loaded"  # loaded at start-up (lifespan)
        first, second = participant(engine, client, slug), participant(engine, client, slug)
        conversation = start_chat(client, first, ROLE)
        sent: list[Any] = []
        sender = threading.Thread(target=lambda: sent.append(client.post(
            f"/api/v1/me/conversations/{conversation}/messages", headers=first.headers,
            json={"content": "Should I move to Porto?"})))
        sender.start()
        try:
            assert entered.wait(30), "the message was never read by the encoder"
            # While the encoder reads the message, another participant's write commits at once
            # (behind a held write lock it would wait out the busy timeout and answer 503).
            other = client.post("/api/v1/me/conversations", headers=second.headers, json={"role": ROLE})
            assert other.status_code == 201, other.text
            assert not release.is_set()
            assert rows(engine, "SELECT count(*) FROM turns") == [(0,)]
        finally:
            release.set()
            sender.join(60)
        assert [response.status_code for response in sent] == [200], sent
    assert [speaker for (speaker,) in rows(engine, "SELECT speaker FROM turns ORDER BY id")] == [
        "participant", "assistant"]
