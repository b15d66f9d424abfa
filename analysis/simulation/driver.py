"""A simulated participant's side of the chat, through the same pipeline as the API (``chat.turn``).

Each request is one unit of work (one transaction, on a worker thread, never on the event loop),
the model is asked between two of them, and the injectable clock moves on as a participant's
would: the reply is stored five seconds after the message. What the simulation does with the
replies (overrides, reconsiders, the exit check) is its own; how a turn is taken is not.

The model is the offline one, asked through ``OfflineGateway``: the gateway, with the offline
provider's answer taken without LiteLLM's Router (the same answer, at a fraction of the cost).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from litellm.types.utils import ModelResponse
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from chat import service as chat
from chat import turn
from chat.answer_format import STANCE_SCHEMA
from chat.gateway import Completion, Gateway
from chat.models import Turn
from chat.offline import PROVIDER, OfflineLLM
from scheduler import planner
from study import participants
from study.clock import FrozenClock
from study.db import session_scope
from study.models import Participant
from study.settings import Settings
from surveys import service as surveys

T = TypeVar("T")
REPLY_AFTER = dt.timedelta(seconds=5)  # simulated time from a message to its stored reply
EXIT_EFFECTS = turn.ExitEffects(planner.on_decision, surveys.assign, surveys.submit)


@dataclass(frozen=True)
class Reply:
    turn_id: int
    stance: str


class OfflineGateway(Gateway):
    """The gateway a simulation asks (it answers every arm with the offline model). An offline
    model's answer is the offline provider's own (``chat.offline.OfflineLLM``, called as LiteLLM
    calls it) made into a ``Completion`` by the gateway's own code, with the same limit and the
    same errors; only LiteLLM's Router is not in between. The Router's routing, retries and
    fallbacks are for providers elsewhere, and on this provider they cost most of a turn's time
    (bench/simulation.py). Any other model, or call settings, go through the Router as usual."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._provider = OfflineLLM()
        self._schemas: dict[str, bool] = {}

    def _structured(self, model: str) -> bool:
        if model not in self._schemas:  # LiteLLM's model table, read once per model
            self._schemas[model] = super()._structured(model)
        return self._schemas[model]

    async def complete(self, messages: list[dict[str, str]], model: str | None = None,
                       *, structured: bool = True, params: dict[str, Any] | None = None,
                       check: Callable[[Completion], object] | None = None) -> Completion:
        model = model or self.default_model
        provider, _, name = model.partition("/")
        if provider != PROVIDER or params or check:
            return await super().complete(messages, model, structured=structured, params=params, check=check)
        optional: dict[str, Any] = {}
        if structured and self._structured(model):
            optional["response_format"] = {"type": "json_schema", "json_schema": STANCE_SCHEMA}
        started = time.perf_counter()
        try:
            response = await asyncio.wait_for(self._provider.acompletion(
                name, messages, "", {}, ModelResponse(), None, None, None, None, optional), timeout=self.call_limit)
        except Exception as exc:
            raise self._error(exc, model) from exc
        return self._completion(response, model, started)


class _Clocked(turn.DatabaseStore):
    """The chat tables, with the simulated time moved on while the model answers; the stance of
    the reply it stored last is kept (so no unit of work is spent reading it back)."""

    def __init__(self, run: turn.Units, clock: FrozenClock) -> None:
        super().__init__(run)
        self.clock = clock
        self.stored: tuple[int, str] | None = None  # the reply stored last: its id and stance

    async def record(self, prepared: chat.PreparedTurn, completion: Completion) -> int:
        self.clock.advance(REPLY_AFTER)

        def store(session: Session) -> int:  # as DatabaseStore.record, keeping the stance
            reply = chat.record_reply(session, prepared, completion)
            self.stored = (reply.id, reply.stance or "agree")
            return reply.id
        return await self.run(store)

    async def record_failure(self, prepared: chat.PreparedTurn, error: str) -> int | None:
        self.clock.advance(REPLY_AFTER)
        return await super().record_failure(prepared, error)


class Driver:
    """Chat as one participant at a time would, in ``engine``; ``model`` answers every arm (a
    simulation never reaches a real model unless told to), ``runner`` is the loop the model calls
    run on."""

    def __init__(self, engine: Engine, gateway: Gateway, clock: FrozenClock, runner: asyncio.Runner,
                 *, model: str | None) -> None:
        self.engine, self.gateway, self.runner, self.model = engine, gateway, runner, model
        self.store = _Clocked(self._units, clock)

    def unit(self, work: Callable[[Session], T]) -> T:
        """One unit of work, committed (as one request at the real edge)."""
        with session_scope(self.engine) as session:
            return work(session)

    async def _units(self, work: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.unit, work)

    @staticmethod
    def participant(session: Session, participant_id: int) -> Participant:
        """The participant as the API's consented-participant dependency gives it."""
        participant = session.get(Participant, participant_id)
        assert participant is not None
        participants.require_current_consent(session, participant)
        return participant

    def start(self, participant_id: int, role: str | None) -> int:  # POST /me/conversations
        return self.unit(lambda s: chat.start_conversation(s, self.participant(s, participant_id), role).id)

    def send(self, participant_id: int, conversation_id: int, text: str, client_message_id: str) -> Reply:
        def accept(session: Session) -> chat.PreparedTurn:  # POST .../messages
            participant = self.participant(session, participant_id)
            return chat.accept_message(session, participant, conversation_id, text, client_message_id)[0]
        return self._turn(accept, text)

    def override(self, participant_id: int, conversation_id: int, turn_id: int) -> Reply:
        return self._turn(lambda s: chat.prepare_override(  # POST .../turns/{turn}/override
            s, self.participant(s, participant_id), conversation_id, turn_id))

    def reconsider(self, participant_id: int, conversation_id: int, turn_id: int) -> None:
        self.unit(lambda s: chat.reconsider(s, self.participant(s, participant_id), conversation_id, turn_id))

    def switch(self, participant_id: int, conversation_id: int, role: str) -> None:  # PUT .../role
        self.unit(lambda s: chat.switch_role(s, self.participant(s, participant_id), conversation_id, role))

    def end(self, participant_id: int, conversation_id: int, *, rating: int | None,
            decision: str | None) -> int | None:
        """The exit check (POST /me/conversations/{id}/end); returns the decision's id."""
        ended = self.unit(lambda s: turn.exit_check(
            s, self.participant(s, participant_id), conversation_id, rating=rating,
            made_decision=decision is not None, decision=decision, effects=EXIT_EFFECTS))
        return ended.decision_id

    def _turn(self, prepare: Callable[[Session], chat.PreparedTurn], message: str | None = None) -> Reply:
        def work(session: Session) -> chat.PreparedTurn:
            prepared = prepare(session)
            return dataclasses.replace(prepared, model=self.model) if self.model else prepared
        reply_id = self.runner.run(self._take(work, message))
        stored, self.store.stored = self.store.stored, None
        if stored is not None and stored[0] == reply_id:
            return Reply(*stored)
        return Reply(reply_id, self.unit(lambda s: _stance(s, reply_id)))


    async def _take(self, work: Callable[[Session], chat.PreparedTurn], message: str | None) -> int:
        """One turn through ``chat.turn``: the message prepared (read, stored, the reply claimed),
        then answered and the reply stored. Returns the reply's id."""
        prepared = await turn.prepare(self._units, work, message)
        if prepared.existing_reply_id is not None:  # a resent message, already answered
            return prepared.existing_reply_id
        outcome = await turn.answer(self.store, self.gateway, prepared)
        if outcome.reply_id is None:
            assert outcome.error is not None
            raise outcome.error
        return outcome.reply_id


def _stance(session: Session, reply_id: int) -> str:
    reply = session.get(Turn, reply_id)
    assert reply is not None
    return reply.stance or "agree"
