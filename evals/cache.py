"""The response cache: every model answer the harness pays for, stored in the database
(``eval_responses``) under the SHA-256 of its request, so a rerun, a resume or a re-scoring never
pays twice for the same request, whichever run made it first.

A request is its model, its messages and its settings (``params``: temperature, the response
format, the cell's ``seed`` and the rest, and whether the gateway's stance schema was asked for),
with the API base where one is set (the same name on another server is another model). Not
stored: an answer given by the fallback model (the request named another), an answer its caller
refused (``check``: a judge's verdict that does not fit the rubric is asked for again, not read
back) and the offline provider's (computed here, free and deterministic).

``CachingGateway`` is the chat gateway with the cache in front of ``complete``, so the chat
pipeline's calls (``chat.turn.answer``), bare prompts and the judge all go through it. It also
answers the simulated model (``evals.simulated``: ``offline/simulated``), which only the
evaluations know.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from chat.gateway import Completion, Gateway
from chat.offline import PROVIDER
from evals import simulated
from evals.models import EvalResponse
from study.db import retrying, session_scope
from study.settings import Settings


def request_of(model: str, messages: list[dict[str, str]], structured: bool, params: dict[str, Any] | None,
               api_base: str | None) -> dict[str, Any]:
    """What a cached answer answers: the request's messages and settings."""
    request: dict[str, Any] = {"messages": messages, "structured": structured, "params": dict(params or {})}
    if api_base:
        request["api_base"] = api_base
    return request


def request_key(model: str, request: dict[str, Any]) -> str:
    text = json.dumps({"model": model, **request}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(engine: Engine, key: str) -> Completion | None:
    with session_scope(engine, read_only=True) as session:
        row = session.scalar(select(EvalResponse).where(EvalResponse.key == key))
    if row is None:
        return None
    return Completion(text=row.text, model=row.response_model, prompt_tokens=row.prompt_tokens,
                      completion_tokens=row.completion_tokens, cost_usd=row.cost_usd, latency_ms=row.latency_ms)


def store(engine: Engine, key: str, model: str, request: dict[str, Any], completion: Completion) -> None:
    """Keep an answer (once: the same request answered twice at the same time keeps the first)."""
    try:
        with session_scope(engine) as session:
            if session.scalar(select(EvalResponse.id).where(EvalResponse.key == key)) is None:
                session.add(EvalResponse(
                    key=key, model=model, request=request, text=completion.text, response_model=completion.model,
                    prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens,
                    cost_usd=completion.cost_usd, latency_ms=completion.latency_ms))
    except IntegrityError:
        pass  # stored meanwhile by another call


def discard(engine: Engine, key: str) -> None:
    with session_scope(engine) as session:
        row = session.scalar(select(EvalResponse).where(EvalResponse.key == key))
        if row is not None:
            session.delete(row)


class CachingGateway(Gateway):
    """The chat gateway answering from the cache where it can; ``hits`` and ``calls`` count the
    answers read back and the calls made through it."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        super().__init__(settings)
        self.engine = engine
        self.hits = 0
        self.calls = 0
        self.offline_delay = settings.offline_llm_delay_ms / 1000

    async def complete(self, messages: list[dict[str, str]], model: str | None = None,
                       *, structured: bool = True, params: dict[str, Any] | None = None,
                       check: Callable[[Completion], object] | None = None) -> Completion:
        """``Gateway.complete`` through the cache. ``check``: the caller's test of an answer (raising
        when it cannot be used): an answer that fails it is not kept (or, read back, is dropped)."""
        model = model or self.default_model
        if simulated.is_simulated(model):
            as_json = "response_format" in (params or {}) or (structured and self._structured(model))
            completion = await simulated.complete(messages, model, params, as_json=as_json,
                                                  delay_seconds=self.offline_delay)
            if check is not None:
                check(completion)
            return completion
        if model.startswith(f"{PROVIDER}/"):
            completion = await super().complete(messages, model, structured=structured, params=params)
            if check is not None:
                check(completion)
            return completion
        request = request_of(model, messages, structured, params, self._api_base)
        key = request_key(model, request)
        stored = await asyncio.to_thread(lookup, self.engine, key)
        if stored is not None:
            try:
                if check is not None:
                    check(stored)
            except Exception:
                await asyncio.to_thread(retrying, lambda: discard(self.engine, key))
                raise
            self.hits += 1
            return stored
        self.calls += 1
        completion = await super().complete(messages, model, structured=structured, params=params)
        if check is not None:
            check(completion)
        if not completion.fallback_used:
            # Paid for: kept even when SQLite's writer lock is long in coming.
            await asyncio.to_thread(retrying, lambda: store(self.engine, key, model, request, completion))
        return completion
