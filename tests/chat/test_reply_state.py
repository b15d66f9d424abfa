"""A conversation's reply state: one home (``awaiting_reply_since``), one guard for every way a
reply starts, and concern counts that concurrent replies add to instead of overwrite."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from chat import service
from chat.gateway import Completion
from chat.models import Conversation, PushbackResponse
from study import participants
from study.clock import FrozenClock
from study.db import session_factory, session_scope
from study.models import Participant
from tests.builders import CONFIRMATIONS, FRAMING, load_study, make_invites

HOPELESS = "I feel hopeless about this"  # the platform's monitors require a check-in on it
PLAIN = Completion(text="Let's look at this together.", model="offline/afterward")


@pytest.fixture
def conversation(engine: Engine, example_protocol: str) -> tuple[str, int]:
    """A participant of the wellbeing arm (through the services) with a conversation with the coach."""
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    with session_scope(engine) as session:
        who = participants.enroll(session, invite).participant
        participants.sign_consent(session, who, version="1.1", confirmations=CONFIRMATIONS, typed_signature="T")
        participants.update_profile(session, who, timezone="Europe/Berlin", contact_email=None)
        who.arm = "wellbeing"
        session.flush()
        return who.code, service.start_conversation(session, who, "coach").id


def _who(session: Session, code: str) -> Participant:
    return session.scalars(sa.select(Participant).where(Participant.code == code)).one()


def _as_participant(engine: Engine, code: str, work: Callable[[Session, Participant], object]) -> None:
    with session_scope(engine) as session:
        work(session, _who(session, code))


def _accept(engine: Engine, code: str, conversation_id: int, text: str) -> service.PreparedTurn:
    with session_scope(engine) as session:
        return service.accept_message(session, _who(session, code), conversation_id, text)[0]


def _record(engine: Engine, prepared: service.PreparedTurn, completion: Completion = PLAIN) -> int:
    with session_scope(engine) as session:
        return service.record_reply(session, prepared, completion).id


def _state(engine: Engine, conversation_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(sa.select(Conversation.concern_counts, Conversation.awaiting_reply_since,
                                            Conversation.turn_count).where(Conversation.id == conversation_id)).one()


def _two_replies_in_flight(engine: Engine, clock: FrozenClock, code: str,
                           conversation_id: int) -> tuple[service.PreparedTurn, service.PreparedTurn]:
    """Two prepared turns of one conversation, both read before either is answered: the first
    got stuck, so the second may claim the conversation (the only way two replies overlap)."""
    first = _accept(engine, code, conversation_id, HOPELESS)
    clock.advance(service.STUCK_AFTER + dt.timedelta(seconds=1))
    second = _accept(engine, code, conversation_id, HOPELESS)
    assert first.history.raised == second.history.raised == {}  # the same, soon stale, snapshot
    assert first.required.stance == second.required.stance == "check_in"
    return first, second


def _wait_until_blocked(engine: Engine, pid: int) -> None:
    with engine.connect() as connection:
        for _ in range(200):
            if connection.execute(sa.text("SELECT cardinality(pg_blocking_pids(:pid))"), {"pid": pid}).scalar_one():
                return
            time.sleep(0.05)
    raise AssertionError("the second reply never waited for the first one's row lock")


def test_concurrent_replies_both_count(engine: Engine, frozen_clock: FrozenClock,
                                       conversation: tuple[str, int]) -> None:
    code, conversation_id = conversation
    first, second = _two_replies_in_flight(engine, frozen_clock, code, conversation_id)
    concern = first.required.concern
    if engine.dialect.name != "postgresql":
        # SQLite serializes writers: the interleaving that matters is both prepared, then both stored.
        _record(engine, second)
        _record(engine, first)
    else:
        # Really concurrent: the second store runs while the first holds the row, and waits for it.
        errors: list[BaseException] = []
        with session_factory(engine)() as holder, session_factory(engine)() as waiter:
            service.record_reply(holder, second, PLAIN)  # the conversation row is locked until commit
            pid = waiter.scalar(sa.select(sa.func.pg_backend_pid()))
            assert pid is not None

            def store() -> None:
                try:
                    service.record_reply(waiter, first, PLAIN)
                    waiter.commit()
                except BaseException as exc:
                    errors.append(exc)
            thread = threading.Thread(target=store)
            thread.start()
            _wait_until_blocked(engine, pid)
            holder.commit()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert not errors, errors
    counts, awaiting, turn_count = _state(engine, conversation_id)
    assert counts == {concern: 2}
    assert awaiting is None
    assert turn_count == 4


def test_a_late_reply_does_not_release_the_newer_claim(engine: Engine, frozen_clock: FrozenClock,
                                                        conversation: tuple[str, int]) -> None:
    code, conversation_id = conversation
    first, second = _two_replies_in_flight(engine, frozen_clock, code, conversation_id)
    _record(engine, first)  # the stuck reply comes back after all
    assert _state(engine, conversation_id).awaiting_reply_since == second.claimed_at
    with pytest.raises(service.ReplyInProgress):
        _accept(engine, code, conversation_id, "Hello?")
    _record(engine, second)
    assert _state(engine, conversation_id).awaiting_reply_since is None
    _accept(engine, code, conversation_id, "Hello?")


def test_an_override_waits_for_the_reply_in_flight_like_a_message(
    engine: Engine, frozen_clock: FrozenClock, conversation: tuple[str, int],
) -> None:
    code, conversation_id = conversation
    challenge_id = _record(engine, _accept(engine, code, conversation_id, FRAMING), Completion(
        text='STANCE: {"stance": "challenge", "concern": "unsupported_framing", "rationale": "One view only."}\n'
             "Is that the whole picture?"))
    in_flight = _accept(engine, code, conversation_id, "Anyway, what should I pack?")

    attempts: list[Callable[[Session, Participant], object]] = [
        lambda session, who: service.prepare_override(session, who, conversation_id, challenge_id),
        lambda session, who: service.accept_message(session, who, conversation_id, "Hello?")]
    for attempt in attempts:
        with pytest.raises(service.ReplyInProgress) as refused:
            _as_participant(engine, code, attempt)
        assert (refused.value.code, refused.value.retry_after_seconds) == ("reply_in_progress", 5)
        assert "still answering" in refused.value.message
    with engine.connect() as connection:  # the refused override left nothing behind
        assert connection.execute(sa.select(sa.func.count()).select_from(PushbackResponse)).scalar_one() == 0

    _record(engine, in_flight)
    with session_scope(engine) as session:
        override = service.prepare_override(session, _who(session, code), conversation_id, challenge_id)
    assert override.after_override
    assert override.history.overridden == {"unsupported_framing"}
    _record(engine, override)
    counts, awaiting, turn_count = _state(engine, conversation_id)
    assert (counts, awaiting, turn_count) == ({"unsupported_framing": 1}, None, 5)
