"""A real `afterward api` process stopped while it is busy, on the same database the tests use
(SQLite or PostgreSQL): SIGTERM stops it without waiting for the slow chat replies, streams and
autosaves in flight, and releases the replies it leaves unfinished; after SIGKILL, the next
process releases them before it serves, so the participant's resend is answered at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from study.db import DatabaseBusy
from tests.builders import CONFIRMATIONS, load_study, make_invites, put_in_arm
from tests.mail import free_port
from tests.waiting import WAIT_SECONDS, answers, until

AFTERWARD = Path(sys.executable).parent / "afterward"
REPLY_MS = 600_000  # far longer than any wait of these tests


def start_api(engine: Engine, log: Path, delay_ms: int) -> tuple[subprocess.Popen[bytes], str]:
    """`afterward api` on a free port, its model taking ``delay_ms`` per reply (within the model's time
    limit); returns once it answers."""
    port = free_port()
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_OFFLINE_LLM_DELAY_MS": str(delay_ms), "AFTERWARD_ENVIRONMENT": "test",
           "AFTERWARD_LLM_TIMEOUT_SECONDS": str(max(30, 2 * delay_ms / 1000)), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with log.open("w") as output:
        server = subprocess.Popen([str(AFTERWARD), "api", "--port", str(port), "--no-access-log"], env=env,
                                  stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: answers(f"{url}/healthz"), f"the API to start (log: {log})", processes=[server])
    except AssertionError:
        server.kill()
        server.wait()
        raise AssertionError(f"the API did not start: {log.read_text()}") from None
    return server, url


def awaiting_replies(engine: Engine) -> int | None:
    """How many replies are being written; None while the busy API keeps SQLite's lock (asked again)."""
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.text(
                "SELECT count(*) FROM conversations WHERE awaiting_reply_since IS NOT NULL")).scalar_one())
    except DatabaseBusy:
        return None


def test_sigterm_under_load_exits_without_waiting_for_the_replies(engine: Engine, example_protocol: str,
                                                                  tmp_path: Path) -> None:
    """Measured against the replies, not the clock: a reply takes ten minutes, the process is gone
    (within the wait's bound) and not one reply was stored."""
    slug = load_study(engine, example_protocol)
    server, url = start_api(engine, tmp_path / "api.log", delay_ms=REPLY_MS)
    try:
        participants = []
        for invite in make_invites(engine, slug, count=4):
            client = httpx.Client(base_url=url, timeout=WAIT_SECONDS)
            body = client.post("/api/v1/enrollment", json={"invite_code": invite}).json()
            client.cookies.clear()
            client.headers["Authorization"] = f"Bearer {body['token']}"
            client.post("/api/v1/me/consent", json={"version": "1.2", "confirmations": CONFIRMATIONS,
                                                    "typed_signature": "A"})
            assert client.put("/api/v1/me/profile", json={"timezone": "Europe/Berlin"}).status_code == 200
            put_in_arm(engine, body["participant_code"], "control")
            conversation = client.post("/api/v1/me/conversations", json={}).json()["id"]
            survey = client.get("/api/v1/me/surveys").json()[0]["assignment_id"]
            participants.append((client, conversation, survey))

        stop = threading.Event()
        statuses: list[int] = []

        def chat(client: httpx.Client, conversation: int, survey: int, stream: bool) -> None:
            while not stop.is_set():
                try:
                    statuses.append(client.post(f"/api/v1/me/conversations/{conversation}/messages",
                                                params={"stream": "true"} if stream else None,
                                                json={"content": "Should I take the new job?"}).status_code)
                    statuses.append(client.put(f"/api/v1/me/surveys/{survey}/answers",
                                               json={"answers": {"A1": 3}}).status_code)
                except httpx.TransportError:
                    return  # the server went away: that is the point

        threads = [threading.Thread(target=chat, args=(*p, i % 2 == 0), daemon=True)
                   for i, p in enumerate(participants)]
        for thread in threads:
            thread.start()
        until(lambda: awaiting_replies(engine) == len(participants), "every participant's message in flight",
              processes=[server])
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError("the API was still running after SIGTERM: it waits for the replies") from None
        stop.set()
        for thread in threads:
            thread.join(timeout=WAIT_SECONDS)
        assert not any(thread.is_alive() for thread in threads), "a request never ended after the API stopped"
        with engine.connect() as connection:
            speakers = connection.execute(sa.text("SELECT speaker FROM turns")).scalars().all()
        assert speakers == ["participant"] * len(participants)  # it stopped before any reply was ready
        # Requests cut off by the shutdown see the connection close or a 503, never a 500.
        assert 500 not in statuses, statuses
        for client, _, _ in participants:
            client.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _chatter(engine: Engine, slug: str, url: str) -> tuple[httpx.Client, int]:
    [invite] = make_invites(engine, slug)
    client = httpx.Client(base_url=url, timeout=WAIT_SECONDS, trust_env=False)
    body = client.post("/api/v1/enrollment", json={"invite_code": invite}).json()
    client.cookies.clear()
    client.headers["Authorization"] = f"Bearer {body['token']}"
    assert client.post("/api/v1/me/consent", json={"version": "1.2", "confirmations": CONFIRMATIONS,
                                                   "typed_signature": "A"}).status_code == 201
    assert client.put("/api/v1/me/profile", json={"timezone": "Europe/Berlin"}).status_code == 200
    put_in_arm(engine, body["participant_code"], "wellbeing")
    return client, client.post("/api/v1/me/conversations", json={"role": "coach"}).json()["id"]


def _message_stored(client: httpx.Client, conversation: int, message: dict[str, str]) -> None:
    """Send ``message`` as the chat page does (streamed); return once it is stored, the reply still coming."""
    with client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages", params={"stream": "true"},
                       json=message) as events:
        assert next(events.iter_lines()) == "event: message"


def _cut_off_mid_reply(engine: Engine, slug: str, log: Path, stop: signal.Signals,
                       message: dict[str, str]) -> tuple[httpx.Client, int]:
    """A participant's message stored by a new API process, which gets ``stop`` while the model is still writing."""
    server, url = start_api(engine, log, delay_ms=30000)
    try:
        client, conversation = _chatter(engine, slug, url)
        _message_stored(client, conversation, message)
        server.send_signal(stop)
        server.wait(timeout=WAIT_SECONDS)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return client, conversation


def _reply_state(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        claims = connection.execute(sa.text("SELECT awaiting_reply_since IS NOT NULL FROM conversations")).all()
        turns = connection.execute(sa.text("SELECT speaker, reply_status, reply_error FROM turns ORDER BY seq")).all()
    return [[tuple(row) for row in claims], [tuple(row) for row in turns]]


def test_a_reply_cut_off_by_sigkill_is_answered_when_resent_after_the_restart(
    engine: Engine, example_protocol: str, tmp_path: Path,
) -> None:
    message = {"content": "Should I take the job in Porto?", "client_message_id": "porto-1"}
    client, conversation = _cut_off_mid_reply(engine, load_study(engine, example_protocol),
                                              tmp_path / "killed.log", signal.SIGKILL, message)
    # The dead process's claim is still there, and the message has no reply.
    assert _reply_state(engine) == [[(True,)], [("participant", None, None)]]

    restarted, url = start_api(engine, tmp_path / "restarted.log", delay_ms=0)
    try:
        # Released before the new process serves (not after a lease ran out): there once it answers.
        assert _reply_state(engine) == [[(False,)], [("participant", "failed",
                                                      "abandoned: the server writing the reply stopped")]]
        client.base_url = httpx.URL(url)
        shown = client.get(f"/api/v1/me/conversations/{conversation}").json()
        assert (shown["awaiting_reply"], [t["reply_status"] for t in shown["turns"]]) == (False, ["failed"])
        resent = client.post(f"/api/v1/me/conversations/{conversation}/messages", json=message)
        assert resent.status_code == 200, resent.text
        assert resent.json()["message"]["id"] == shown["turns"][0]["id"]  # the same message, answered
        assert _reply_state(engine) == [[(False,)], [("participant", "answered", None), ("assistant", None, None)]]
    finally:
        restarted.terminate()
        restarted.wait(timeout=WAIT_SECONDS)
        client.close()


def test_sigterm_releases_the_replies_it_leaves_unfinished(engine: Engine, example_protocol: str,
                                                           tmp_path: Path) -> None:
    client, _ = _cut_off_mid_reply(engine, load_study(engine, example_protocol), tmp_path / "api.log",
                                   signal.SIGTERM, {"content": "Should I take the job in Porto?"})
    client.close()
    assert _reply_state(engine) == [[(False,)], [("participant", "failed",
                                                  "abandoned: the server stopped before the reply was ready")]]
