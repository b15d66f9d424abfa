"""The edge middleware on its own: a request cut off by the server stopping is told to retry."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive, Scope, Send

from api.edge import Edge


def test_a_request_cancelled_by_shutdown_answers_503_not_500() -> None:
    async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
        raise asyncio.CancelledError  # what uvicorn delivers past its graceful-shutdown timeout

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "path": "/api/v1/me", "raw_path": b"/api/v1/me", "query_string": b"",
                    "headers": [], "method": "GET"}
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Edge(slow_app, max_body_bytes=1000)(scope, receive, send))
    start = sent[0]
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"retry-after"] == b"2"
    assert headers[b"cache-control"] == b"no-store"
    assert b"restarting" in sent[1]["body"]
