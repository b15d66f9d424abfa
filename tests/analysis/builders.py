"""A small hand-built study for the analysis tests, made through the real services: enrollment
(with follow-up planning), chat turns (the policy decides each stance), overrides, reconsiders,
role switches and the exit check. Only the model's answer is chosen by the test: each reply's
text, tokens, cost and model name go in as the gateway's ``Completion``, so word counts and sums
can be worked out by hand."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.routers.chat import EXIT_EFFECTS
from chat import service
from chat.gateway import Completion
from chat.turn import exit_check
from scheduler.service import save_profile
from study import participants, studies
from study.db import session_scope
from study.models import Participant
from tests.builders import CONFIRMATIONS, TEST_ACTOR, load_study


@dataclass(frozen=True)
class Reply:
    id: int
    stance: str
    concern: str | None


class StudyBuilder:
    def __init__(self, engine: Engine, protocol_yaml: str) -> None:
        self.engine = engine
        self.slug = load_study(engine, protocol_yaml)

    def _participant(self, session: Session, code: str) -> Participant:
        return session.scalars(select(Participant).where(Participant.code == code)).one()

    def participant(self, arm: str, timezone: str = "Europe/Berlin") -> str:
        """Enrolled in ``arm`` (randomization overridden) with its follow-ups planned; its code."""
        with session_scope(self.engine) as session:
            [invite] = participants.create_invites(session, studies.get_study(session, self.slug), TEST_ACTOR)
            who = participants.enroll(session, invite).participant
            participants.sign_consent(session, who, version="1.2", confirmations=CONFIRMATIONS,
                                      typed_signature="A. Person")
            save_profile(session, who, timezone=timezone, contact_email=None)
            who.arm = arm
            return who.code

    def start(self, code: str, role: str | None) -> int:
        with session_scope(self.engine) as session:
            return service.start_conversation(session, self._participant(session, code), role).id

    def say(self, code: str, conversation_id: int, text: str, reply: str, *, proposes: str | None = None,
            prompt_tokens: int = 0, completion_tokens: int = 0, cost_usd: float = 0.0,
            model: str = "test/model-a") -> Reply:
        """One turn: the message through the monitors and policy, ``reply`` as the model's answer.
        ``proposes`` ("stance/concern") adds the model's stance line; the policy still decides."""
        with session_scope(self.engine) as session:
            prepared, _ = service.accept_message(session, self._participant(session, code), conversation_id, text)
        if proposes is not None:
            stance, concern = proposes.split("/")
            line = json.dumps({"stance": stance, "concern": concern, "rationale": "The test's model thinks so."})
            reply = f"STANCE: {line}\n{reply}"
        return self._answer(prepared, reply, prompt_tokens, completion_tokens, cost_usd, model)

    def _answer(self, prepared: service.PreparedTurn, reply: str, prompt_tokens: int, completion_tokens: int,
                cost_usd: float, model: str) -> Reply:
        completion = Completion(text=reply, model=model, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, cost_usd=cost_usd, latency_ms=1.0)
        with session_scope(self.engine) as session:
            turn = service.record_reply(session, prepared, completion)
            return Reply(turn.id, turn.stance or "", turn.concern)

    def override(self, code: str, conversation_id: int, turn_id: int, reply: str, *, prompt_tokens: int = 0,
                 completion_tokens: int = 0, cost_usd: float = 0.0, model: str = "test/model-a") -> Reply:
        with session_scope(self.engine) as session:
            prepared = service.prepare_override(session, self._participant(session, code), conversation_id,
                                                turn_id)
        return self._answer(prepared, reply, prompt_tokens, completion_tokens, cost_usd, model)

    def reconsider(self, code: str, conversation_id: int, turn_id: int) -> None:
        with session_scope(self.engine) as session:
            service.reconsider(session, self._participant(session, code), conversation_id, turn_id)

    def switch(self, code: str, conversation_id: int, role: str) -> None:
        with session_scope(self.engine) as session:
            service.switch_role(session, self._participant(session, code), conversation_id, role)

    def end(self, code: str, conversation_id: int, *, rating: int | None, decision: str | None = None) -> None:
        with session_scope(self.engine) as session:
            exit_check(session, self._participant(session, code), conversation_id, rating=rating,
                       made_decision=decision is not None, decision=decision, effects=EXIT_EFFECTS)
