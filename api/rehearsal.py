"""A rehearsal turn before the process serves, on a scratch database of its own.

Much of a chat turn is built on its first use in a process: SQLAlchemy's ORM prepares each
query's loading and each flush's statements, the policy, prompts and replies load their parts, the
request's models are validated for the first time. The first participant to write after start-up
would wait for all of it (bench/first_reply.py measured 20-100 ms more than later replies, beyond
the model's own first call). So start-up sends one message through a second instance of the same
app, bound to a throwaway SQLite database in a temporary folder (the example study, one consented
participant in the well-being arm, a coach conversation) and to the offline model, whatever model
the deployment uses: the study's own database is never written, nobody is told, no model is paid.
The folder is deleted afterwards. What is warmed is the process's code, not the study's
database: on PostgreSQL each statement's SQL is still compiled once on its first use (a few ms).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI

from chat import service as chat_service
from chat.gateway import Gateway
from chat.offline import PROVIDER, WARM_UP
from study import audit, participants, studies
from study.db import make_engine, migrate, session_scope
from study.settings import Settings, get_settings
from surveys import registry

log = logging.getLogger("afterward.api")

PROTOCOL = Path(__file__).resolve().parent.parent / "examples" / "wellbeing-pilot.yaml"
MESSAGE = "Nobody at work ever listens to me, so I'm quitting tomorrow. I'm right, aren't I?"
ACTOR = audit.Actor.system("rehearsal")


async def asgi_request(app: FastAPI, method: str, path: str, *, token: str | None = None,
                       body: object | None = None) -> tuple[int, bytes]:
    """One request to ``app`` in process (no socket, no lifespan): its status and body."""
    payload = b"" if body is None else json.dumps(body).encode()
    headers = [(b"host", b"localhost"), (b"accept", b"application/json")]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": payload, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("localhost", 80), "state": {}}
    await app(scope, receive, send)  # type: ignore[arg-type]
    status = next((int(m["status"]) for m in sent if m["type"] == "http.response.start"), 0)  # type: ignore[call-overload]
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")  # type: ignore[misc]


def _participant(url: str) -> tuple[str, int]:
    """The example study with one consented participant in the well-being arm and a coach
    conversation, on the scratch database: (their session token, the conversation's id)."""
    migrate(url)
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            study = studies.load_protocol(session, PROTOCOL.read_text(encoding="utf-8"), ACTOR,
                                          instruments=registry.catalog(session)).study
            code, = participants.create_invites(session, study, ACTOR)
        with session_scope(engine) as session:
            enrollment = participants.enroll(session, code)
            who = enrollment.participant
            consent = studies.current_consent(session, study.id)
            participants.sign_consent(session, who, version=consent.version,
                                      confirmations=[c["id"] for c in consent.confirmations],
                                      typed_signature="rehearsal")
            participants.update_profile(session, who, timezone="UTC", contact_email=None)
            who.arm = "wellbeing"
            return enrollment.token, chat_service.start_conversation(session, who, "coach").id
    finally:
        engine.dispose()


async def rehearse(create_app: Callable[..., FastAPI]) -> None:
    """Send one message through a scratch instance of the app (``create_app(engine, gateway)``) and
    wait for its reply. Raises when the turn does not complete (the caller logs it and serves anyway)."""
    with tempfile.TemporaryDirectory(prefix="afterward-rehearsal-") as folder:
        url = f"sqlite:///{Path(folder) / 'rehearsal.db'}"
        token, conversation = await asyncio.to_thread(_participant, url)
        engine = make_engine(url)
        try:
            # The offline provider's start-up model: answered at once. The provider is one per
            # process, so its configured delay is passed on unchanged (a test's slow model stays slow).
            offline = Gateway(Settings(llm_model=f"{PROVIDER}/{WARM_UP}", llm_fallback_model=None, llm_api_base=None,
                                       llm_reader_model=None, allow_offline_model=True,
                                       offline_llm_delay_ms=get_settings().offline_llm_delay_ms))
            stage = create_app(engine, offline)
            status, body = await asgi_request(stage, "POST", f"/api/v1/me/conversations/{conversation}/messages",
                                              token=token, body={"content": MESSAGE})
            if status != 200:
                raise RuntimeError(f"the rehearsal turn answered {status}: {body[:300]!r}")
            await stage.state.replies.stop()
        finally:
            engine.dispose()
