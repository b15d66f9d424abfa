"""The steps of a turn that need no database: what the monitors find in a message, the turn's
directive and what the model is sent, and the model's answer read back under the policy. The chat
tables (``chat.service``) and a conversation kept in memory (``chat.turn.MemoryStore``) take
them alike."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from zoneinfo import ZoneInfo

from chat import drift, llm_reader, monitors, semantic
from chat.answer_format import ParsedAnswer, guidance, parse_answer
from chat.gateway import Completion
from chat.llm_reader import LLMReading
from chat.policy import Assessment, History, StanceDecision, decide, directive, platform_reply, shown_reply
from chat.roles import ROLE_SPECS, RoleName
from study.clock import now

HISTORY_TURNS = 20  # turns of the conversation sent to the model


def assess_message(content: str, earlier_reassurance: Callable[[], Sequence[str]],
                   earlier_reliance: Callable[[], Sequence[dt.datetime]], *,
                   tz: ZoneInfo = drift.UTC, reader: LLMReading | None = None) -> Assessment:
    """What the monitors find in one message: the crisis finding (``chat.semantic.read``) and the
    concerns pushback follows, each found by the reading (``chat.reading``, quoting the sentence
    that carries it) or by its lexicon cue,
    with the LLM reader's verdict added when one ran (``reader``; ``chat.llm_reader.fuse``).
    ``earlier_reassurance`` gives the participant's
    earlier reassurance-seeking messages (asked for only when this one seeks reassurance); they
    count as repeats when they are about the same worry (``chat.semantic.same_worry``); the
    evaluation harness (``evals``) passes its own conversation's. ``earlier_reliance`` gives the
    times of the participant's earlier dependence-flagged messages since ``chat.drift.window_start``
    (read from what was stored with them, never encoded again): with this message's own flag, the
    days of the last week on which they leaned on the assistant (``reliance_days``, counted in
    their time zone ``tz`` on the injected clock)."""
    crisis, verdict = semantic.read(content)
    reading = verdict.reading

    def found(concern: str, lexical: str | None) -> str | None:
        if reading is not None and concern in reading.flagged:
            return reading.quotes.get(concern) or lexical or content
        return lexical

    assessment = Assessment(crisis=crisis, crisis_score=verdict.score,
                            reassurance_cue=found("reassurance_seeking", monitors.reassurance_cue(content)),
                            dependence_cue=found("dependence", monitors.dependence_cue(content)),
                            validation_cue=found("validation_seeking", monitors.validation_cue(content)),
                            framing_cue=found("one_sided", None),
                            sentiment=monitors.sentiment(content), message=content, reading=reading)
    if reader is not None:
        assessment = llm_reader.fuse(assessment, reader)
    at = now()
    leaned = [*earlier_reliance(), *([at] if assessment.dependence_cue is not None else [])]
    assessment = replace(assessment, reliance_days=drift.reliance_days(leaned, at, tz))
    if assessment.reassurance_cue is None:
        return assessment
    earlier = list(earlier_reassurance())
    return replace(assessment, reassurance_repeats=sum(semantic.same_worry(content, earlier)) if earlier else 0)


def warm_up() -> None:
    """Load the crisis encoder and run every monitor once (the sentiment lexicon loads on first
    use too), so the first participant message waits for neither: the API does this at start-up."""
    semantic.load()
    assess_message("Loading the monitors: I'm not sure, am I right?", list, list)


def model_messages(system_text: str, recent: Sequence[tuple[str, str]], required: StanceDecision,
                   *, overridden: bool = False, muted: Collection[str] = ()) -> list[dict[str, str]]:
    """What the model is sent: the role's prompt, the recent turns (``(speaker, content)``, oldest
    first, the new message last) and the platform's guidance for this turn (``muted``: the
    overridden concerns not to raise yet)."""
    messages = [{"role": "system", "content": system_text}]
    messages += [{"role": "user" if speaker == "participant" else "assistant", "content": content}
                 for speaker, content in recent]
    note = guidance(required, overridden=overridden, muted=muted)
    if note:
        messages.append({"role": "system", "content": note})
    return messages


def plan(role: RoleName, assessment: Assessment, history: History, system_text: str,
         recent: Sequence[tuple[str, str]], *, overridden: bool = False) -> tuple[StanceDecision, list[dict[str, str]]]:
    """The turn's directive and what the model is sent (the last ``HISTORY_TURNS`` of ``recent``).
    After "go ahead anyway" the reply does what was asked; safety stances stand whatever was overridden."""
    required = directive(ROLE_SPECS[role], assessment, history)
    if overridden and required.overridable:
        required = StanceDecision("agree")
    return required, model_messages(system_text, recent[-HISTORY_TURNS:], required, overridden=overridden,
                                    muted=history.overridden)


def settle_reply(role: RoleName, required: StanceDecision, history: History, content: str, answer: str,
                 *, after_override: bool = False) -> tuple[ParsedAnswer, StanceDecision, str]:
    """The model's answer read back: what it proposed, the turn's final stance (the policy's) and
    the reply the participant reads (never one written as if helping, under a safety stance)."""
    parsed = parse_answer(answer)
    final = decide(ROLE_SPECS[role], required, parsed.proposed, history, content)
    if after_override and final.overridable:
        final = StanceDecision("agree")
    reply = shown_reply(final, parsed.proposed, parsed.reply)
    if not reply:
        reply = "I'm sorry, I lost my train of thought. Could you say that again?"
    return parsed, final, reply


def safety_fallback(required: StanceDecision) -> Completion | None:
    """What is stored when the model did not answer: under a safety escalation the platform's own
    safety reply (never left waiting on the model); otherwise nothing, the message kept for a retry."""
    if required.stance != "escalate":
        return None
    return Completion(text=platform_reply(required), model="platform/safety")
