"""A chat turn, in one place: the participant's message taken through every step to the stored reply.

1. ``prepare``: the message is read by the semantic crisis encoder first, outside any transaction
   (on SQLite a write transaction holds the database's one writer lock, and encoding takes tens of
   milliseconds, a second for the first message after start-up), then the caller's unit of work
   stores it and claims the reply (``chat.service.accept_message``, ``prepare_retry``,
   ``prepare_override``) and returns the ``PreparedTurn``;
2. ``answer``: the optional LLM reader reads the message and its verdict is fused with the local
   reading (``Store.reassess``, ``chat.llm_reader.fuse``), the model is asked (whole, or
   streamed), and the outcome is settled by the policy and stored
   (``Store.record``, or ``Store.record_failure`` when the model did not answer);
3. ``exit_check``: the exit check (the decision, its follow-ups, the immediate rating).

Where the turn's state lives is the caller's ``Store``: ``DatabaseStore`` runs each step as a
unit of work the caller provides (``Units``: the API on worker threads, ``analysis.simulation``
with its injected clock), ``MemoryStore`` keeps one conversation in memory and writes nothing
(the evaluation harness: no participant, conversation or safety event, so nobody is alerted).
The same messages therefore meet the same monitors, policy, LLM reader and model wherever they
come from, and get the same stances and replies.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from chat import drift, semantic, service, steps
from chat.answer_format import StreamSplitter
from chat.gateway import Completion, Gateway, GatewayError
from chat.llm_reader import LLMReading
from chat.models import Decision
from chat.policy import Assessment, History
from chat.roles import RoleName
from chat.schemas import ConversationEnded, ConversationRead
from study.clock import now
from study.models import Participant
from study.protocol import Pushback
from study.settings import get_settings

T = TypeVar("T")


class Units(Protocol):
    """Runs ``work`` in its own committed transaction, off the event loop (``api.deps.run_unit``)."""

    def __call__(self, work: Callable[[Session], T], /) -> Awaitable[T]: ...


class Store(Protocol):
    """Where a turn's steps read and write (``DatabaseStore``, ``MemoryStore``)."""

    async def reassess(self, prepared: service.PreparedTurn, reader: LLMReading) -> service.PreparedTurn: ...

    async def record(self, prepared: service.PreparedTurn, completion: Completion) -> int: ...

    async def record_failure(self, prepared: service.PreparedTurn, error: str) -> int | None: ...


@dataclass(frozen=True)
class Outcome:
    prepared: service.PreparedTurn  # as the LLM reader left it
    reply_id: int | None  # the stored reply; None: the model did not answer, the message is marked failed
    error: GatewayError | None = None


# 1. Preparing


async def prepare(run: Units, work: Callable[[Session], T], message: str | None = None) -> T:
    """Read ``message`` (a new participant message) with the crisis encoder on a worker thread,
    then run ``work`` in its own unit: the verdict is kept by ``chat.semantic.classify``, so the
    unit finds it and encodes nothing while it holds a write lock."""
    text = (message or "").strip()
    if text and len(text) <= get_settings().chat_max_message_chars:  # a refused message is not read
        await asyncio.to_thread(semantic.read, text)
    return await run(work)


# 2. Answering


async def answer(store: Store, gateway: Gateway, prepared: service.PreparedTurn, *,
                 pieces: asyncio.Queue[str | None] | None = None, params: dict[str, Any] | None = None) -> Outcome:
    """Screen, ask the model and store the outcome, within the model's time limit. ``pieces``:
    stream the reply's text into it as it comes (``None`` at the end). ``params``: further call
    settings (the evaluation harness's)."""
    # The reader's call, the reply's call, and as long again for a stream's chunks.
    limit = gateway.call_limit * (3 if gateway.reader_model else 2)
    completion = Completion(streamed=pieces is not None)
    error: GatewayError | None = None
    try:
        async with asyncio.timeout(limit):
            prepared = await _screened(store, gateway, prepared)
            if pieces is None:
                completion = await gateway.complete(prepared.messages, prepared.model, params=params)
            else:
                await _stream(gateway, prepared, completion, pieces)
    except GatewayError as exc:
        error = exc
    except TimeoutError:
        error = GatewayError("timeout", f"no reply within {limit:g} s")
    finally:
        if pieces is not None:
            pieces.put_nowait(None)
    if error is None:
        return Outcome(prepared, await store.record(prepared, completion))
    return Outcome(prepared, await store.record_failure(prepared, f"{error.kind}: {error}"), error)


async def _screened(store: Store, gateway: Gateway, prepared: service.PreparedTurn) -> service.PreparedTurn:
    """Run the optional LLM reader (after the message is stored, before the reply) and fuse its
    verdict with the local reading; a message the platform already escalates is not sent to it."""
    if not gateway.reader_model or prepared.required.stance == "escalate":
        return prepared
    reader = await gateway.read_message(prepared.content)
    return prepared if reader is None else await store.reassess(prepared, reader)


async def _stream(gateway: Gateway, prepared: service.PreparedTurn, sink: Completion,
                  pieces: asyncio.Queue[str | None]) -> None:
    """The reply text as it comes, without the stance line. When the platform already requires a
    safety stance nothing is passed on: a reply written as if helping is replaced
    (``chat.policy.shown_reply``), so it must not be shown as it comes."""
    live = prepared.required.stance in ("agree", "nudge", "challenge")
    splitter = StreamSplitter()
    async for text in gateway.stream(prepared.messages, prepared.model, sink):
        shown = splitter.feed(text)
        if shown and live:
            pieces.put_nowait(shown)
    rest = splitter.flush()
    if rest and live:
        pieces.put_nowait(rest)


class DatabaseStore:
    """The chat tables, each step one unit of work run by ``run``."""

    def __init__(self, run: Units) -> None:
        self.run = run

    async def reassess(self, prepared: service.PreparedTurn, reader: LLMReading) -> service.PreparedTurn:
        return await self.run(lambda session: service.reassess(session, prepared, reader))

    async def record(self, prepared: service.PreparedTurn, completion: Completion) -> int:
        return await self.run(lambda session: service.record_reply(session, prepared, completion).id)

    async def record_failure(self, prepared: service.PreparedTurn, error: str) -> int | None:
        def fail(session: Session) -> int | None:
            reply = service.record_failure(session, prepared, error)
            return reply.id if reply is not None else None
        return await self.run(fail)


@dataclass
class _Message:
    content: str
    reassurance_seeking: bool = False
    dependence: bool = False  # flagged for dependence (the feature dependence_signal)
    at: dt.datetime | None = None  # when it was taken (the injected clock)


@dataclass
class MemoryStore:
    """One conversation in memory, taken through the same steps as the chat tables (the monitors'
    history, the concerns raised and overridden, the recent turns the model is sent), writing
    nothing. ``replies`` holds each stored reply as the evaluation harness records it;
    ``completions`` the model's answers (the platform's safety reply where it failed)."""

    role: RoleName
    system_text: str
    model: str | None = None
    tz: ZoneInfo = drift.UTC  # the days reliance is counted in (chat.drift)
    recent: list[tuple[str, str]] = field(default_factory=list)  # (speaker, content), oldest first
    messages: list[_Message] = field(default_factory=list)
    raised: Counter[str] = field(default_factory=Counter)
    overridden: dict[str, int] = field(default_factory=dict)  # concern -> the message it was last overridden on
    raise_again_after: int | str = Pushback().raise_again_after  # the protocol's (study.protocol.Pushback)
    replies: list[dict[str, Any]] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    reply_to: list[int] = field(default_factory=list)  # each reply's message (an index of ``messages``)

    async def accept(self, content: str) -> service.PreparedTurn:
        """Take a participant message (``chat.service.accept_message``)."""
        index = len(self.messages)
        assessment = await asyncio.to_thread(self._assess, content, index)
        self.messages.append(_Message(content, assessment.reassurance_cue is not None,
                                      assessment.dependence_cue is not None, now()))
        self.recent.append(("participant", content))
        return self._prepare(index, assessment, overridden=False)

    def override(self, reply_id: int) -> service.PreparedTurn:
        """"Go ahead anyway" to the note ``reply_id`` (``chat.service.prepare_override``)."""
        note = self.replies[reply_id]
        index = self.reply_to[reply_id]
        if note["concern"]:
            self.overridden[note["concern"]] = index
        return self._prepare(index, self._assess(self.messages[index].content, index), overridden=True)

    def _assess(self, content: str, index: int, reader: LLMReading | None = None) -> Assessment:
        earlier = [m.content for i, m in enumerate(self.messages) if m.reassurance_seeking and i != index]
        since = drift.window_start(now())
        leaned = [m.at for i, m in enumerate(self.messages) if m.dependence and m.at and m.at >= since and i != index]
        return steps.assess_message(content, lambda: list(reversed(earlier)), lambda: leaned, tz=self.tz, reader=reader)

    def _prepare(self, index: int, assessment: Assessment, *, overridden: bool) -> service.PreparedTurn:
        history = History(raised=Counter(self.raised), overridden=self._muted(index))
        required, messages = steps.plan(self.role, assessment, history, self.system_text, self.recent,
                                          overridden=overridden)
        return service.PreparedTurn(
            conversation_id=0, participant_turn_id=index, role=self.role, model=self.model, prompt_version="",
            messages=messages, required=required, history=history, after_override=overridden,
            content=self.messages[index].content,
            crisis_source=assessment.crisis.source if assessment.crisis else None, features=assessment.features())

    def _muted(self, index: int) -> frozenset[str]:
        """As ``chat.service.muted_concerns``: the messages since each override, up to ``index``'s."""
        if self.raise_again_after == "never":
            return frozenset(self.overridden)
        return frozenset(c for c, at in self.overridden.items() if index - at < int(self.raise_again_after))

    async def reassess(self, prepared: service.PreparedTurn, reader: LLMReading) -> service.PreparedTurn:
        index = prepared.participant_turn_id
        assessment = self._assess(prepared.content, index, reader)
        self.messages[index].reassurance_seeking = assessment.reassurance_cue is not None
        return self._prepare(index, assessment, overridden=prepared.after_override)

    async def record(self, prepared: service.PreparedTurn, completion: Completion) -> int:
        settled = steps.settle(prepared.role, prepared.required, prepared.history, prepared.content, completion.text,
                               after_override=prepared.after_override)
        parsed, final, reply = settled.parsed, settled.final, settled.reply
        if final.stance != "agree":
            self.raised[final.concern] += 1
        self.recent.append(("assistant", reply))
        self.reply_to.append(prepared.participant_turn_id)
        self.replies.append({
            "participant": prepared.content, "reply": reply,
            "stance": final.stance, "concern": final.concern, "rationale": final.rationale or None,
            "model_stance": parsed.proposed.stance if parsed.proposed else None,
            "directive": prepared.required.stance, **(settled.capitulation.record() if settled.capitulation else {})})
        self.completions.append(completion)
        return len(self.replies) - 1

    async def record_failure(self, prepared: service.PreparedTurn, error: str) -> int | None:
        fallback = steps.safety_fallback(prepared.required)
        return None if fallback is None else await self.record(prepared, fallback)


# 3. The exit check


@dataclass(frozen=True)
class ExitEffects:
    """What the exit check sets off in packages chat may not import; the API and the simulation
    pass ``scheduler.planner.on_decision`` and ``surveys.service.assign`` and ``submit``."""

    plan_decision: Callable[[Session, Participant, int, dt.datetime, str], object]
    assign_survey: Callable[..., Any]
    submit_survey: Callable[..., Any]


def exit_check(session: Session, participant: Participant, conversation_id: int, *, rating: int | None,
                     made_decision: bool, decision: str | None, effects: ExitEffects) -> ConversationEnded:
    """End the conversation; a decision is recorded and gets its decision-anchored follow-ups, and
    the rating becomes an immediate-rating survey response."""
    record: Decision | None = service.end_conversation(session, participant, conversation_id,
                                                       made_decision=made_decision, decision=decision)
    if record is not None:
        effects.plan_decision(session, participant, record.id, record.decided_at, record.text)
    survey_id = None
    if rating is not None:
        assignment = effects.assign_survey(session, participant, "immediate-rating", purpose="exit",
                                           context={"conversation_id": str(conversation_id)})
        effects.submit_survey(session, participant, assignment.id, {"helpful": rating},
                              submission_id=f"exit-{conversation_id}")
        survey_id = assignment.id
    conversation = service.get_conversation(session, participant, conversation_id)
    return ConversationEnded(conversation=ConversationRead.of(conversation),
                             decision_id=record.id if record else None, exit_survey_id=survey_id)
