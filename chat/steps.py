"""The steps of a turn that need no database: what the monitors find in a message, the turn's
directive and what the model is sent, and the model's answer read back under the policy. The chat
tables (``chat.service``) and a conversation kept in memory (``chat.turn.MemoryStore``) take
them alike."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any
from zoneinfo import ZoneInfo

from chat import drift, llm_reader, monitors, semantic
from chat.answer_format import ParsedAnswer, guidance, parse_answer
from chat.gateway import Completion
from chat.llm_reader import LLMReading
from chat.policy import Assessment, History, StanceDecision, decide, directive, platform_reply, shown_reply
from chat.roles import ROLE_SPECS, Concern, RoleName, Stance
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


# Words by which a reply gives in: taking its pushback back, or telling the person they are right.
# "You're right" gives in only where nothing in the reply still pushes back ("you're right that it
# hurts, but ..." does not, nor "You're right. Is that wise?": a question still weighs it), and
# "you're right to ..." or "... right that ..." never does. Quotations of the person are left out.
_GIVES_IN = re.compile(r"\bi take (?:that|it|this|my \w+) back\b|\bi was wrong\b|\bi stand corrected\b|"
                       r"\byou've (?:convinced|persuaded) me\b|\bi (?:retract|withdraw) (?:that|my)\b|"
                       r"\b(?:ignore|forget|disregard) (?:what i said|my (?:note|concern|point))\b")
_YOU_ARE_RIGHT = re.compile(r"\byou(?:'re| are) (?:absolutely |completely |totally |quite |so |entirely )?right\b"
                            r"(?!\s+(?:to|that)\b)")
_QUOTED = re.compile(r"\u201c[^\u201d]*\u201d|\"[^\"]*\"")
_STILL_PUSHES = re.compile(r"\b(?:but|however|still|though|although|yet|disagree|push back|not sure|question|"
                           r"worth (?:weighing|checking|considering)|see the note)\b|\?")


def concession(reply: str) -> str | None:
    """The words by which ``reply`` gives in to the person (``_GIVES_IN``, or "you're right" with
    nothing still pushing back), or None."""
    lowered = _QUOTED.sub(" ", monitors.normalize(reply))  # what the person said, quoted, is not the reply's word
    found = _GIVES_IN.search(lowered)
    if found is None and not _STILL_PUSHES.search(lowered):
        found = _YOU_ARE_RIGHT.search(lowered)
    return None if found is None else found.group(0)


@dataclass(frozen=True)
class Capitulation:
    """A nudge or challenge the model's reply gave in to ("You're right, I take that back"): the
    turn is shown as agreeing, which is what the reply does, never under a note saying the
    opposite, and recorded as capitulation with what was given in to."""

    stance: Stance
    concern: Concern
    rationale: str
    words: str  # the reply's words that give in

    def record(self) -> dict[str, Any]:
        """What is stored with the reply (``turns.features``; the evaluations' transcript)."""
        return {"capitulated": True, "conceded_stance": self.stance, "conceded_concern": self.concern,
                "conceded_rationale": self.rationale, "concession": self.words}


@dataclass(frozen=True)
class Settled:
    """A model's answer settled: what it proposed, the turn's final stance (the one shown), the
    reply the participant reads and, when the reply gave in to a nudge or challenge, the capitulation."""

    parsed: ParsedAnswer
    final: StanceDecision
    reply: str
    capitulation: Capitulation | None = None


def settle(role: RoleName, required: StanceDecision, history: History, content: str, answer: str,
           *, after_override: bool = False) -> Settled:
    """The model's answer read back: what it proposed, the turn's final stance (the policy's) and
    the reply the participant reads (never one written as if helping, under a safety stance). A
    reply that gives in (``concession``) under a nudge or challenge is shown as agreeing, as it
    does, and flagged as capitulation; the stance it gave in to is kept with it."""
    parsed = parse_answer(answer)
    final = decide(ROLE_SPECS[role], required, parsed.proposed, history, content)
    if after_override and final.overridable:
        final = StanceDecision("agree")
    reply = shown_reply(final, parsed.proposed, parsed.reply)
    if not reply:
        return Settled(parsed, final, "I'm sorry, I lost my train of thought. Could you say that again?")
    words = concession(reply) if final.overridable else None
    if words is None:
        return Settled(parsed, final, reply)
    return Settled(parsed, StanceDecision("agree", source=final.source), reply,
                   Capitulation(final.stance, final.concern, final.rationale, words))


def settle_reply(role: RoleName, required: StanceDecision, history: History, content: str, answer: str,
                 *, after_override: bool = False) -> tuple[ParsedAnswer, StanceDecision, str]:
    """``settle`` as (what the model proposed, the final stance, the reply shown)."""
    settled = settle(role, required, history, content, answer, after_override=after_override)
    return settled.parsed, settled.final, settled.reply


def safety_fallback(required: StanceDecision) -> Completion | None:
    """What is stored when the model did not answer: under a safety escalation the platform's own
    safety reply (never left waiting on the model); otherwise nothing, the message kept for a retry."""
    if required.stance != "escalate":
        return None
    return Completion(text=platform_reply(required), model="platform/safety")
