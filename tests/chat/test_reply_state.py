"""A conversation's reply state: one home (``awaiting_reply_since``), one guard for every way a
reply starts, concern counts that concurrent replies add to instead of overwrite, and claims
nobody will finish taken over, never a live one."""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from chat import service
from chat.gateway import Completion
from chat.models import Conversation, PushbackResponse, Turn
from study import participants, processes
from study.clock import FrozenClock
from study.db import session_factory, session_scope
from study.models import Participant
from study.safety import SafetyEvent
from tests.builders import CONFIRMATIONS, FRAMING, load_study, make_invites
from tests.waiting import WAIT_SECONDS, until

HOPELESS = "I feel hopeless about this"  # the platform's monitors require a check-in on it
PLAIN = Completion(text="Let's look at this together.", model="offline/afterward")


@pytest.fixture
def conversation(engine: Engine, example_protocol: str) -> tuple[str, int]:
    """A participant of the wellbeing arm (through the services) with a conversation with the coach."""
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    with session_scope(engine) as session:
        who = participants.enroll(session, invite).participant
        participants.sign_consent(session, who, version="1.2", confirmations=CONFIRMATIONS, typed_signature="T")
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
    one's lease ran out, so the second may claim the conversation (the only way two replies overlap)."""
    first = _accept(engine, code, conversation_id, HOPELESS)
    clock.advance(service.REPLY_LEASE + dt.timedelta(seconds=1))
    second = _accept(engine, code, conversation_id, HOPELESS)
    assert first.history.raised == second.history.raised == {}  # the same, soon stale, snapshot
    assert first.required.stance == second.required.stance == "check_in"
    return first, second


def _wait_until_blocked(engine: Engine, pid: int) -> None:
    with engine.connect() as connection:
        until(lambda: connection.execute(sa.text("SELECT cardinality(pg_blocking_pids(:pid))"), {"pid": pid})
              .scalar_one(), "the second reply to wait for the first one's row lock")


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
            thread.join(timeout=WAIT_SECONDS)
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


# Claims nobody will finish: taken over at once when their owner is gone, after the lease otherwise


def _set_owner(engine: Engine, conversation_id: int, owner: str) -> None:
    with engine.begin() as connection:
        connection.execute(sa.update(Conversation).where(Conversation.id == conversation_id)
                           .values(reply_claimed_by=owner))


def _owner_that_died() -> str:
    with subprocess.Popen(["sleep", "infinity"]) as child:
        owner = processes.owner_of(child.pid)
        child.kill()
    return owner


def _turns(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(Turn.speaker, Turn.reply_status, Turn.reply_error, Turn.model)
                                       .order_by(Turn.seq)).all())


def test_a_claim_whose_owner_died_is_taken_over_at_once(engine: Engine, frozen_clock: FrozenClock,
                                                        conversation: tuple[str, int]) -> None:
    code, conversation_id = conversation
    _accept(engine, code, conversation_id, "Should I sell the car?")
    _set_owner(engine, conversation_id, _owner_that_died())  # its lease has 20 s to run: the owner is what tells
    with session_scope(engine) as session:
        assert service.abandoned_claims(session) == [conversation_id]
        assert not service.reply_in_flight(session.get_one(Conversation, conversation_id))
    retried = _accept(engine, code, conversation_id, "Hello?")  # not 409: the dead claim was released first
    assert _turns(engine) == [("participant", "failed", "abandoned: the server writing the reply stopped", None),
                              ("participant", None, None, None)]
    assert _state(engine, conversation_id).awaiting_reply_since == retried.claimed_at


def test_a_live_siblings_claim_is_never_taken_and_a_silent_one_only_after_its_lease(
    engine: Engine, frozen_clock: FrozenClock, conversation: tuple[str, int],
) -> None:
    code, conversation_id = conversation
    first = _accept(engine, code, conversation_id, "Should I sell the car?")
    host_and_scope = processes.this_process().partition("@")[2]
    with subprocess.Popen(["sleep", "infinity"]) as sibling:
        try:
            # Another worker of this machine, alive; then one on another machine, whose death no one here sees.
            for owner in (processes.owner_of(sibling.pid), f"4242.1@{host_and_scope.rpartition('.')[0]}.0123456789ab"):
                _set_owner(engine, conversation_id, owner)
                with pytest.raises(service.ReplyInProgress):
                    _accept(engine, code, conversation_id, "Hello?")
                with session_scope(engine) as session:
                    assert service.abandoned_claims(session) == []
                    assert not service.take_over_abandoned(session, conversation_id)
                    assert service.reply_in_flight(session.get_one(Conversation, conversation_id))
                    service.renew_claims(session, [conversation_id])  # not this process's claim: left alone
                frozen_clock.advance(service.REPLY_LEASE - dt.timedelta(seconds=1))
                with pytest.raises(service.ReplyInProgress):
                    _accept(engine, code, conversation_id, "Hello?")
                frozen_clock.advance(-(service.REPLY_LEASE - dt.timedelta(seconds=1)))
        finally:
            sibling.kill()
    frozen_clock.advance(service.REPLY_LEASE)  # the machine's owner said nothing for a whole lease
    second = _accept(engine, code, conversation_id, "Hello?")
    assert _turns(engine)[0] == ("participant", "failed", "abandoned: the server writing the reply stopped answering",
                                 None)
    _record(engine, first)  # a late reply still counts, without releasing the newer claim
    assert _state(engine, conversation_id).awaiting_reply_since == second.claimed_at


def test_renewing_keeps_a_claim_past_its_first_lease(engine: Engine, frozen_clock: FrozenClock,
                                                     conversation: tuple[str, int]) -> None:
    code, conversation_id = conversation
    _accept(engine, code, conversation_id, "Should I sell the car?")
    for _ in range(3):
        frozen_clock.advance(service.REPLY_LEASE - dt.timedelta(seconds=5))
        with session_scope(engine) as session:
            service.renew_claims(session, [conversation_id])
    with pytest.raises(service.ReplyInProgress):
        _accept(engine, code, conversation_id, "Hello?")


def test_an_abandoned_crisis_message_gets_the_platform_safety_reply(engine: Engine, frozen_clock: FrozenClock,
                                                                    conversation: tuple[str, int]) -> None:
    code, conversation_id = conversation
    assert _accept(engine, code, conversation_id, "I have a plan to end it tonight").required.stance == "escalate"
    _set_owner(engine, conversation_id, _owner_that_died())
    with session_scope(engine) as session:
        assert service.take_over_abandoned(session, conversation_id)
    assert _turns(engine) == [("participant", "answered", None, None), ("assistant", None, None, "platform/safety")]
    assert _state(engine, conversation_id).awaiting_reply_since is None
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(SafetyEvent)).scalar_one() == 1
