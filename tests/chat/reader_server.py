"""The LLM reader on a loopback OpenAI-compatible server (``chat.llm_reader``), for tests: ``reader``
makes a handler answering each message with what ``read`` says, and ``verdict`` writes a verdict."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler
from typing import Any

from chat.reading import CONCERNS, DANGER
from tests.loopback import ChatHandler


def verdict(quotes: dict[str, str] | None = None, acute: Collection[str] = (), about: str = "self_now") -> str:
    """A complete verdict as a model would write it: the concerns of ``quotes`` present, each with
    its quote; the danger concerns of ``acute`` acute."""
    quotes = quotes or {}
    found: dict[str, Any] = {c: {"present": c in quotes, "quote": quotes.get(c, "")} for c in CONCERNS}
    for concern in DANGER:
        found[concern]["acute"] = concern in acute
    return json.dumps({**found, "about": about})


def reader(read: Callable[[str], str]) -> tuple[type[BaseHTTPRequestHandler], list[dict[str, Any]]]:
    """A handler answering each request with ``read(the participant's message)``, and the list of
    the requests it was sent (their JSON bodies), oldest first."""
    requests: list[dict[str, Any]] = []

    class Reader(ChatHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server name
            body = self.body()
            requests.append(body)
            self.complete(body["model"], read(body["messages"][-1]["content"]))

    return Reader, requests
