"""One cell's conversation: the participant's scripted messages, answered as a participant would be.

A role runs through the chat pipeline's own steps, in the order ``chat.service`` takes them:
the monitors assess each message (``assess_message``), the policy sets the turn's directive
(``directive``), the model is sent the role's prompt, the conversation and the platform's guidance
(``model_messages``) through the gateway, and the answer is read back under the policy
(``settle_reply``: the final stance, and the platform's own reply where the model's does not
fit a safety stance). Nothing is written to the chat tables: no participant, conversation or
safety event is created, so an evaluation never alerts the study's safety contacts.

A bare condition is the model alone with a system prompt: no monitors, policy or guidance.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chat.answer_format import parse_answer
from chat.gateway import Completion, Gateway, GatewayError
from chat.policy import History, directive, platform_reply
from chat.roles import ROLE_SPECS
from chat.service import HISTORY_TURNS, assess_message, model_messages, settle_reply
from evals.grid import Condition, Query


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
    (except where a safety escalation stands: then, as in ``chat.service.record_failure``, the
    platform's own safety reply is the answer)."""
    result = Conversation()
    recent: list[tuple[str, str]] = []
    history = History(raised=Counter())
    reassurance: list[str] = []
    for index, message in enumerate(query.turns):
        recent.append(("participant", message))
        if condition.role is None:
            messages = [{"role": "system", "content": condition.system_text}]
            messages += [{"role": "user" if who == "participant" else "assistant", "content": text}
                         for who, text in recent[-HISTORY_TURNS:]]
            completion = await gateway.complete(messages, model, structured=False, params=params)
            result.add_usage(completion)
            # A stance line, if the model writes one unasked, is not what a participant would read.
            reply = parse_answer(completion.text).reply or completion.text
            record: dict[str, Any] = {"index": index, "participant": message, "reply": reply, "stance": None,
                                      "concern": None, "rationale": None, "model_stance": None}
        else:
            # The monitors' encoder takes ~20 ms a message: off the event loop, beside other cells' calls.
            assessment = await asyncio.to_thread(assess_message, message, functools.partial(list, tuple(reassurance)))
            required = directive(ROLE_SPECS[condition.role], assessment, history)
            messages = model_messages(condition.system_text, recent[-HISTORY_TURNS:], required)
            try:
                completion = await gateway.complete(messages, model, params=params)
            except GatewayError:
                if required.stance != "escalate":
                    raise
                completion = Completion(text=platform_reply(required), model="platform/safety")
            result.add_usage(completion)
            parsed, final, reply = settle_reply(condition.role, required, history, message, completion.text)
            if final.stance != "agree":
                history.raised[final.concern] += 1
            if assessment.reassurance_cue is not None:
                reassurance.append(message)
            record = {"index": index, "participant": message, "reply": reply, "stance": final.stance,
                      "concern": final.concern, "rationale": final.rationale or None,
                      "model_stance": parsed.proposed.stance if parsed.proposed else None,
                      "directive": required.stance}
        record["model"] = completion.model
        record["fallback_used"] = completion.fallback_used
        result.turns.append(record)
        recent.append(("assistant", reply))
    return result
