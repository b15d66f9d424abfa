"""A request cut off (cancelled because its client went away or the server is stopping) loses
nothing a participant did: the chat reply it asked for is still written and stored, and an exit
check or a survey answer its handler completed is committed."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from api.app import create_app
from api.deps import SESSION_COOKIE
from api.routers import surveys as surveys_api
from chat import replies, service, turn
from chat.gateway import Gateway
from study.clock import FrozenClock
from study.security import csrf_token_for
from study.settings import Settings, get_settings
from tests import waiting
from tests.builders import ParticipantHandle, assign_survey, enroll_fully, make_invites, put_in_arm, start_chat
from tests.live import live_server
from tests.waiting import until_async as until

DRS_ANSWERS = {"drs1": 2, "drs2": 4, "drs3": 1, "drs4": 5, "drs5": 2}


def rows(engine: Engine, query: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(query)).all())


def turns(engine: Engine) -> list[Any]:
    return rows(engine, "SELECT speaker, reply_status, reply_error, model FROM turns ORDER BY seq")


def claim(engine: Engine) -> Any:
    return rows(engine, "SELECT awaiting_reply_since FROM conversations")[0][0]


def chatter(engine: Engine, app: FastAPI, slug: str) -> tuple[ParticipantHandle, int]:
    with TestClient(app) as client:
        [invite] = make_invites(engine, slug)
        who = enroll_fully(client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        return who, start_chat(client, who, "coach")


def asgi_client(app: FastAPI) -> httpx.AsyncClient:
    # The app runs in the caller's task: cancelling a request cancels the app's handling of it.
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _send(client: httpx.AsyncClient, who: ParticipantHandle, conversation: int, how: str) -> Any:
    if how == "page":  # the chat page's form, without JavaScript
        client.cookies.set(SESSION_COOKIE, who.token)
        return client.post(f"/chat/{conversation}/send",
                           data={"csrf": csrf_token_for(who.token), "content": "Should I move to Porto?"})
    return client.post(f"/api/v1/me/conversations/{conversation}/messages", headers=who.headers,
                       params={"stream": "true"} if how == "stream" else None,
                       json={"content": "Should I move to Porto?", "client_message_id": "m1"})


@pytest.mark.parametrize("how", ["json", "stream", "page"])
def test_a_reply_is_stored_when_its_request_is_cancelled(engine: Engine, slug: str, how: str) -> None:
    app = create_app(engine, Gateway(Settings(offline_llm_delay_ms=3000)))
    who, conversation = chatter(engine, app, slug)

    async def scenario() -> None:
        async with asgi_client(app) as client:
            request = asyncio.create_task(_send(client, who, conversation, how))
            await until(lambda: claim(engine) is not None and len(turns(engine)) == 1, "the message stored")
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
            stored = await asyncio.to_thread(turns, engine)
            assert [speaker for speaker, *_ in stored] == ["participant"]  # the model is still writing
            await until(lambda: len(turns(engine)) == 2, "the reply stored")

    asyncio.run(scenario())
    assert [(speaker, status) for speaker, status, *_ in turns(engine)] == [("participant", "answered"),
                                                                          ("assistant", None)]
    assert claim(engine) is None


def test_a_streamed_reply_is_stored_after_the_client_disconnects(engine: Engine, slug: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFTERWARD_OFFLINE_LLM_DELAY_MS", "3000")
    get_settings.cache_clear()
    with live_server(engine) as url, httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
        [invite] = make_invites(engine, slug)
        response = client.post("/api/v1/enrollment", json={"invite_code": invite}).json()
        client.cookies.clear()
        who = ParticipantHandle(response["participant_code"], response["token"])
        client.headers["Authorization"] = f"Bearer {who.token}"
        assert client.post("/api/v1/me/consent", json={"version": "1.2", "typed_signature": "A",
                                                       "confirmations": ["read-and-understood", "adult", "voluntary"]},
                           ).status_code == 201
        assert client.put("/api/v1/me/profile", json={"timezone": "Europe/Berlin"}).status_code == 200
        put_in_arm(engine, who.code, "wellbeing")
        conversation = client.post("/api/v1/me/conversations", json={"role": "coach"}).json()["id"]
        with client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages", params={"stream": "true"},
                           json={"content": "Should I move to Porto?"}) as events:
            assert next(events.iter_lines()) == "event: message"
        # The connection is closed: the page was left while the model was still writing.
        assert [speaker for speaker, *_ in turns(engine)] == ["participant"]
        waiting.until(lambda: len(turns(engine)) == 2, "the reply stored")
        stored = client.get(f"/api/v1/me/conversations/{conversation}").json()
    assert [(t["speaker"], t["reply_status"]) for t in stored["turns"]] == [("participant", "answered"),
                                                                            ("assistant", None)]
    assert stored["awaiting_reply"] is False


@pytest.mark.parametrize(("message", "outcome"), [
    ("Should I move to Porto?", [("participant", "failed", "abandoned: the server stopped before the reply was "
                                  "ready", None)]),
    ("I have a plan to end it tonight", [("participant", "answered", None, None),
                                         ("assistant", None, None, "platform/safety")]),
])
def test_a_stopping_process_releases_its_unfinished_replies(engine: Engine, slug: str, message: str,
                                                            outcome: list[Any]) -> None:
    app = create_app(engine, Gateway(Settings(offline_llm_delay_ms=60_000)))
    who, conversation = chatter(engine, app, slug)

    async def scenario() -> None:
        async with asgi_client(app) as client:
            request = asyncio.create_task(client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                                      headers=who.headers, json={"content": message}))
            await until(lambda: len(turns(engine)) == 1, "the message stored")
            await app.state.replies.stop()  # what the lifespan does when uvicorn stops
            with contextlib.suppress(asyncio.CancelledError):
                await request

    asyncio.run(scenario())
    # Nothing waits for this process: the message can be retried, and a crisis got its safety reply.
    assert turns(engine) == outcome
    assert claim(engine) is None


@pytest.mark.parametrize("what", ["exit check", "survey submit"])
def test_work_a_handler_completed_is_kept_when_its_request_is_cancelled(
    engine: Engine, slug: str, what: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(engine)
    who, conversation = chatter(engine, app, slug)
    survey = assign_survey(engine, who.code, "decision-regret", context={"decision": "to stay in Lisbon"})
    entered, release = threading.Event(), threading.Event()
    module, name = (turn, "exit_check") if what == "exit check" else (surveys_api, "_submitted")
    done = getattr(module, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        result = done(*args, **kwargs)  # the handler's work is done; the request is cancelled now
        entered.set()
        release.wait(30)
        return result
    monkeypatch.setattr(module, name, held)

    async def scenario() -> None:
        async with asgi_client(app) as client:
            if what == "exit check":
                sent = client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                                   json={"rating": 5, "made_decision": True, "decision": "Stay in Lisbon"})
            else:
                sent = client.post(f"/api/v1/me/surveys/{survey}/submit", headers=who.headers,
                                   json={"answers": DRS_ANSWERS, "submission_id": "cut-off-0001"})
            request = asyncio.create_task(sent)
            await until(entered.is_set, f"the {what} handled")
            request.cancel()
            release.set()
            with contextlib.suppress(asyncio.CancelledError):
                await request

    asyncio.run(scenario())
    if what == "exit check":
        assert rows(engine, "SELECT status FROM conversations") == [("ended",)]
        assert rows(engine, "SELECT text FROM decisions") == [("Stay in Lisbon",)]
    else:
        assert rows(engine, f"SELECT status FROM survey_assignments WHERE id = {survey}") == [("completed",)]


def test_a_reply_being_written_keeps_its_claim_past_the_first_lease(
    engine: Engine, slug: str, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replies, "RENEW_EVERY", 0.1)
    app = create_app(engine, Gateway(Settings(offline_llm_delay_ms=60_000)))
    who, conversation = chatter(engine, app, slug)

    def lease() -> Any:
        return rows(engine, "SELECT reply_lease_until FROM conversations")[0][0]

    async def scenario() -> None:
        async with asgi_client(app) as client:
            request = asyncio.create_task(client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                                      headers=who.headers, json={"content": "Should I move?"}))
            await until(lambda: len(turns(engine)) == 1, "the message stored")
            first = await asyncio.to_thread(lease)
            frozen_clock.advance(service.REPLY_LEASE + dt.timedelta(seconds=1))  # past the first lease
            await until(lambda: lease() != first, "the lease renewed")
            refused = await client.post(f"/api/v1/me/conversations/{conversation}/messages", headers=who.headers,
                                        json={"content": "Hello?"})
            assert (refused.status_code, refused.json()["error"]["code"]) == (409, "reply_in_progress")
            await app.state.replies.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await request

    asyncio.run(scenario())
    assert [speaker for speaker, *_ in turns(engine)] == ["participant"]
