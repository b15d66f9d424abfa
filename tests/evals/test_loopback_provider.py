"""Done-means 5: the real-provider path without the internet. An OpenAI-compatible server on
loopback (written here: chat completions, streaming with usage, JSON-schema response formats, 429
with Retry-After, 5xx, slow answers) is reached through LiteLLM's own HTTP client, by the chat
gateway and by the harness (models and an LLM judge named ``openai/...`` with an ``api_base``)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from chat.answer_format import parse_answer
from chat.gateway import Completion, Gateway, GatewayError
from evals.grid import load_grid
from evals.judge import RUBRIC_VERSION
from evals.models import EvalCell, EvalScore
from evals.runner import create_run, execute_run, plan
from study.db import session_scope
from study.settings import get_settings
from tests.loopback import serve
from tests.waiting import WAIT_SECONDS


class FakeOpenAI(BaseHTTPRequestHandler):
    """Behaviour by model name: ``*-429`` refuses the first call with 429 and Retry-After: 1;
    ``*-down`` always answers 500; ``*-slow`` answers only once the test is over (after the
    client's time limit, however slow the machine); anything else answers."""

    requests: list[dict[str, Any]] = []
    seen_429: set[str] = set()
    test_over = threading.Event()

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.requests.append(body)
        model = body["model"]
        if model.endswith("-429") and model not in FakeOpenAI.seen_429:
            FakeOpenAI.seen_429.add(model)
            self._json(429, {"error": {"message": "rate limited", "type": "rate_limit"}}, {"Retry-After": "1"})
            return
        if model.endswith("-down"):
            self._json(500, {"error": {"message": "upstream down", "type": "server_error"}})
            return
        if model.endswith("-slow"):
            FakeOpenAI.test_over.wait(WAIT_SECONDS)
        text = self._answer(body)
        usage = {"prompt_tokens": 11, "completion_tokens": len(text.split()), "total_tokens": 11 + len(text.split())}
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            pieces = re.findall(r"\S+\s*|\s+", text)
            for piece in pieces:
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
            usage_chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
                           "usage": usage}
            self.wfile.write(f"data: {json.dumps(usage_chunk)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            return
        self._json(200, {"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}], "usage": usage})

    @staticmethod
    def _answer(body: dict[str, Any]) -> str:
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if schema == "wellbeing_rubric":
            user = body["messages"][-1]["content"]
            found = re.search(r"Pushback messages: (\d)", user)
            pushbacks = int(found.group(1)) if found else 0
            return json.dumps({"safety": 5, "empathy": 4, "constructive_support": 4, "inappropriate_affirmation": 1,
                               "calibrated_disagreement": 5, "factual_accuracy": None,
                               "capitulation": 1 if pushbacks else None, "capitulated": [False] * pushbacks,
                               "reasons": "held a reasoned position"})
        reply = "I hear you. I disagree with part of this, because one account is only one side."
        if schema == "assistant_turn":
            return json.dumps({"stance": "challenge", "concern": "unsupported_framing",
                               "rationale": "I've only heard one side.", "reply": reply})
        return 'STANCE {"stance": "nudge", "concern": "unsupported_framing", "rationale": "One side only."}\n\n' + reply


@pytest.fixture
def api_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    FakeOpenAI.requests = []
    FakeOpenAI.seen_429 = set()
    FakeOpenAI.test_over = threading.Event()
    with serve(FakeOpenAI) as base:
        yield base
        FakeOpenAI.test_over.set()  # a request still held answers now, so the server can shut down


def gateway(api_base: str, **changes: Any) -> Gateway:
    return Gateway(get_settings().model_copy(update={"llm_api_base": api_base, "llm_model": "openai/gpt-4o-mini",
                                                     "llm_retries": 1, "llm_timeout_seconds": WAIT_SECONDS, **changes}))


def test_structured_answer_through_litellm(api_base: str) -> None:
    completion = asyncio.run(gateway(api_base).complete([{"role": "user", "content": "tell me I'm right"}]))
    sent = FakeOpenAI.requests[-1]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["name"] == "assistant_turn"
    parsed = parse_answer(completion.text)
    assert parsed.proposed is not None
    assert parsed.proposed.stance == "challenge"
    assert parsed.reply.startswith("I hear you")
    assert completion.prompt_tokens == 11


def test_streaming_with_usage(api_base: str) -> None:
    sink = Completion()

    async def collect() -> list[str]:
        return [piece async for piece in gateway(api_base).stream([{"role": "user", "content": "hi"}], sink=sink)]

    pieces = asyncio.run(collect())
    assert len(pieces) > 3
    assert "".join(pieces) == sink.text
    assert FakeOpenAI.requests[-1]["stream"] is True
    assert parse_answer(sink.text).proposed is not None
    assert sink.prompt_tokens == 11


def test_rate_limit_is_retried_after_retry_after(api_base: str) -> None:
    completion = asyncio.run(gateway(api_base).complete(
        [{"role": "user", "content": "hi"}], "openai/gpt-4o-mini-429", structured=False))
    assert "disagree" in completion.text
    assert [r["model"] for r in FakeOpenAI.requests] == ["gpt-4o-mini-429"] * 2


def test_server_error_falls_back_and_slow_answers_time_out(api_base: str) -> None:
    fallback = gateway(api_base, llm_model="openai/model-down", llm_fallback_model="openai/gpt-4o-mini")
    completion = asyncio.run(fallback.complete([{"role": "user", "content": "hi"}], structured=False))
    # The gateway records the name the provider reports for a fallback (here without "openai/").
    assert completion.fallback_used
    assert completion.model.endswith("gpt-4o-mini")
    with pytest.raises(GatewayError) as error:
        asyncio.run(gateway(api_base, llm_retries=0, llm_timeout_seconds=1.5).complete(
            [{"role": "user", "content": "hi"}], "openai/model-slow", structured=False))
    assert error.value.kind == "timeout"


def test_the_harness_runs_models_and_judge_through_the_server(engine: Engine, api_base: str, tmp_path: Path) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(
        f"name: loopback\nmodels: [openai/gpt-4o-mini, openai/other-down]\nconditions: [bare/neutral, role/coach]\n"
        f"judge: openai/judge-model\napi_base: {api_base}\nlimit_queries: 31\ntimeout_seconds: 120\nretries: 0\n"
        "max_attempts: 2\nconcurrency: {openai: 3}\nparams: {temperature: 0}\n",
        encoding="utf-8")
    run_id = create_run(engine, plan(load_grid(grid_path), tmp_path))
    first = execute_run(engine, run_id, progress=False)
    assert first.executed == 2 * 31
    assert first.failed == 2 * 31
    assert not first.finished
    judge_calls = [r for r in FakeOpenAI.requests if r["model"] == "judge-model"]
    assert judge_calls
    assert all(r["response_format"]["json_schema"]["name"] == "wellbeing_rubric" for r in judge_calls)
    assert all(r.get("temperature") == 0 for r in FakeOpenAI.requests)  # the grid's recorded settings
    assert all(r.get("seed") is not None for r in FakeOpenAI.requests if r["model"] != "judge-model")
    with session_scope(engine, read_only=True) as session:
        score = session.scalars(select(EvalScore)).first()
        assert score is not None
        assert score.judge_model == "openai/judge-model"
        assert score.rubric_version == RUBRIC_VERSION
        assert json.loads(score.raw_output)["reasons"]
        pushback = session.scalars(select(EvalCell).where(EvalCell.query_id == "rel-push-1",
                                                          EvalCell.status == "done")).first()
        assert pushback is not None
        assert pushback.transcript is not None
        assert len(pushback.transcript) == 3
    again = execute_run(engine, run_id, progress=False)  # the second and last attempt of the failed cells
    assert again.executed == 0
    assert again.failed == 2 * 31
    assert again.remaining == 0
