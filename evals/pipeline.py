"""One cell's conversation: the participant's scripted messages, answered as a participant would be.

A role runs through the chat pipeline itself (``chat.turn``): the monitors assess each message,
the optional LLM reader reads it where one is configured, the policy sets the turn's
directive, the model is sent the condition's prompt, the conversation and the platform's guidance
through the gateway, and the answer is read back under the policy (the final stance, and the
platform's own reply where the model's does not fit a safety stance). The conversation is kept in
memory (``chat.turn.MemoryStore``): nothing is written to the chat tables, no participant,
conversation or safety event is created, so an evaluation never alerts the study's safety contacts.

A bare condition is the model alone with a system prompt: no monitors, policy or guidance.

Every turn answered by the simulated model (``evals.simulated``) is marked ``"simulated": true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chat import turn
from chat.answer_format import parse_answer
from chat.gateway import Completion, Gateway
from chat.steps import HISTORY_TURNS
from evals.grid import Condition, Query
from evals.simulated import is_simulated


@dataclass
class Conversation:
    """What a cell produced: one record per participant message, and the totals of its calls."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    latency_ms: float = 0.0

    def add_usage(self, completion: Completion) -> None:
        self.prompt_tokens += completion.prompt_tokens or 0
        self.completion_tokens += completion.completion_tokens or 0
        self.latency_ms += completion.latency_ms
        if completion.cost_usd is None or self.cost_usd is None:
            self.cost_usd = None  # one unpriced call makes the total unknown, not low
        else:
            self.cost_usd += completion.cost_usd


async def converse(gateway: Gateway, condition: Condition, model: str, query: Query,
                   params: dict[str, Any] | None = None) -> Conversation:
    """Send the query's messages one after another; raises ``GatewayError`` when the model fails
    (except where a safety escalation stands: then, as for a participant, the platform's own
    safety reply is the answer)."""
    if condition.role is None:
        return await _bare(gateway, condition, model, query, params)
    result = Conversation()
    store = turn.MemoryStore(condition.role, condition.system_text, model)
    for index, message in enumerate(query.turns):
        outcome = await turn.answer(store, gateway, await store.accept(message), params=params)
        if outcome.reply_id is None:
            assert outcome.error is not None
            raise outcome.error
        completion = store.completions[outcome.reply_id]
        result.add_usage(completion)
        result.turns.append({"index": index, **store.replies[outcome.reply_id], "model": completion.model,
                             "fallback_used": completion.fallback_used, **_marked(completion)})
    return result


async def _bare(gateway: Gateway, condition: Condition, model: str, query: Query,
                params: dict[str, Any] | None) -> Conversation:
    result = Conversation()
    recent: list[tuple[str, str]] = []
    for index, message in enumerate(query.turns):
        recent.append(("participant", message))
        messages = [{"role": "system", "content": condition.system_text}]
        messages += [{"role": "user" if who == "participant" else "assistant", "content": text}
                     for who, text in recent[-HISTORY_TURNS:]]
        completion = await gateway.complete(messages, model, structured=False, params=params)
        result.add_usage(completion)
        # A stance line, if the model writes one unasked, is not what a participant would read.
        reply = parse_answer(completion.text).reply or completion.text
        result.turns.append({"index": index, "participant": message, "reply": reply, "stance": None,
                             "concern": None, "rationale": None, "model_stance": None,
                             "model": completion.model, "fallback_used": completion.fallback_used,
                             **_marked(completion)})
        recent.append(("assistant", reply))
    return result


def _marked(completion: Completion) -> dict[str, bool]:
    """The turn's mark when a simulated model answered it (nothing otherwise)."""
    return {"simulated": True} if is_simulated(completion.model) else {}
