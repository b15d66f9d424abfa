"""Participant-level reads and the safety review, through the services the staff API uses
(``analysis.transcripts``, ``chat.service``) and audited the way the API audits them
(``study.audit``, the same actions and details). Researchers and admins only.

Every deliberate read is audited: each time a transcript, a safety event, a page of the
conversation listing or the safety queue *comes into view*, that is, when the script run before
this one did not show it (the staff member chose it, chose another one and came back to it, or
opened the page afresh from another page or a new session). Streamlit runs the whole script again
on every click, so a read shown by the previous run is kept in the Streamlit session and shown
again without a new read or audit record while it stays in view (a click on another widget of the
same page, Refresh, a review form being typed in). ``app`` calls ``begin_run`` at the start of
every run of the script, which is what tells one run from the next; what the previous run did not
show is dropped, so nothing read stays in the session longer than it is on screen. A run cut short
by a quicker click may record a read again; the rule errs towards more records, never fewer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import streamlit as st
from sqlalchemy import func, select

from analysis import transcripts
from analysis.schemas import ConversationPageRead, SafetyEventContextRead, TranscriptRead
from chat import service as chat_service
from chat.schemas import SafetyEventRead
from dashboard.auth import Context
from study import audit
from study.db import engine_for, session_scope
from study.errors import Forbidden, NotFound
from study.models import Participant
from study.safety import SafetyEvent

READS_KEY = "afterward_reads"
QUEUE_LIMIT = 200
T = TypeVar("T")


def actor(context: Context) -> audit.Actor:
    return audit.Actor("staff", context.email)


def _allowed(context: Context) -> None:
    if not context.participant_level:
        raise Forbidden("your role in this study (viewer) sees aggregate figures only",
                        code="participant_data_forbidden")


@dataclass
class _Shown:
    """What the previous run of the script showed and what this run has shown so far, by kind
    (one item of each kind is in view at a time): kind -> (key of the read, its result)."""

    before: dict[str, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)
    now: dict[str, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)


def _shown() -> _Shown:
    shown = st.session_state.get(READS_KEY)
    if not isinstance(shown, _Shown):
        shown = st.session_state[READS_KEY] = _Shown()
    return shown


def begin_run() -> None:
    """Start a run of the script (``app`` calls it before the page runs): what the last run showed
    is what is in view; this run's reads start afresh."""
    shown = _shown()
    shown.before, shown.now = shown.now, {}


def _in_view(kind: str, key: tuple[Any, ...]) -> tuple[bool, Any]:
    """Whether the read ``key`` of ``kind`` is already in view (shown by the previous run or
    earlier in this one), and its kept result."""
    shown = _shown()
    for kept in (shown.now.get(kind), shown.before.get(kind)):
        if kept is not None and kept[0] == key:
            return True, kept[1]
    return False, None


def _open(kind: str, key: tuple[Any, ...], read: Callable[[], T]) -> T:
    """The read ``key`` of ``kind``: the kept result while it is in view, else ``read()`` (which
    reads and audits); either way it is what this run shows of that kind."""
    seen, kept = _in_view(kind, key)
    result: T = kept if seen else read()
    _shown().now[kind] = (key, result)
    return result


def forget(kind: str) -> None:
    """Drop the kept read of one kind (e.g. after a review changed it): the next is read afresh."""
    shown = _shown()
    shown.before.pop(kind, None)
    shown.now.pop(kind, None)


@dataclass(frozen=True)
class SafetyQueue:
    """The newest unreviewed safety events (at most ``QUEUE_LIMIT``) and how many wait in all."""

    events: list[SafetyEventRead]
    total: int

    @property
    def truncated(self) -> bool:
        """More events wait than are listed."""
        return self.total > len(self.events)


def safety_queue(context: Context) -> SafetyQueue:
    """The unreviewed safety events, newest first, at most ``QUEUE_LIMIT`` of them, with the count
    of all (read at every view: the queue must be current); audited as the API's
    ``safety_events.read`` when it comes into view or what it lists changes."""
    _allowed(context)
    unreviewed = (SafetyEvent.study_id == context.study_id, SafetyEvent.reviewed_at.is_(None))
    with session_scope(engine_for(context.database_url)) as session:
        rows = session.execute(
            select(SafetyEvent, Participant.code).outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
            .where(*unreviewed)
            .order_by(SafetyEvent.created_at.desc(), SafetyEvent.id.desc()).limit(QUEUE_LIMIT)).all()
        events = [SafetyEventRead.of(event, code, []) for event, code in rows]
        total = len(events) if len(events) < QUEUE_LIMIT else (
            session.scalar(select(func.count()).select_from(SafetyEvent).where(*unreviewed)) or 0)
        key = (context.study_id, tuple(event.id for event in events))
        if not _in_view("queue", key)[0]:
            audit.record(session, actor(context), "safety_events.read", study_id=context.study_id, count=len(events))
    _shown().now["queue"] = (key, None)
    return SafetyQueue(events, total)


def safety_event(context: Context, event_id: int, around: int = 3) -> SafetyEventContextRead:
    """A safety event with the turns around it (``analysis.transcripts.safety_event_context``),
    audited as ``safety_event.read``. Raises NotFound, or Gone for a de-identified record."""
    _allowed(context)

    def read() -> SafetyEventContextRead:
        with session_scope(engine_for(context.database_url)) as session:
            found = transcripts.safety_event_context(session, context.study_id, event_id, around=around)
            audit.record(session, actor(context), "safety_event.read", study_id=context.study_id,
                         participant_code=found.event.participant, event_id=event_id,
                         conversation_id=found.conversation_id, turn_ids=[turn.id for turn in found.turns])
        return found

    return _open("event", (context.study_id, event_id, around), read)


def review(context: Context, event_id: int, note: str) -> SafetyEventRead:
    """Add a review to the event's history (``chat.service.review_safety_event``), audited as
    ``safety_event.reviewed``; the event leaves the queue."""
    _allowed(context)
    with session_scope(engine_for(context.database_url)) as session:
        row = session.execute(select(SafetyEvent, Participant.code)
                              .outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
                              .where(SafetyEvent.id == event_id, SafetyEvent.study_id == context.study_id)).first()
        if row is None:
            raise NotFound(f"no safety event {event_id} in this study")
        event, code = row
        who = actor(context)
        added = chat_service.review_safety_event(session, event, who.name, note)
        audit.record(session, who, "safety_event.reviewed", study_id=context.study_id, participant_code=code,
                     event_id=event.id, review_id=added.id)
        result = SafetyEventRead.of(event, code, chat_service.safety_reviews(session, event_id=event.id)[event.id])
    forget("event")
    return result


def conversations(context: Context, filters: transcripts.ConversationFilters, *, limit: int,
                  offset: int) -> ConversationPageRead:
    """A page of the study's conversations (``analysis.transcripts.list_conversations``), audited
    as ``conversations.listed``. Raises Invalid for an unknown arm or participant."""
    _allowed(context)

    def read() -> ConversationPageRead:
        with session_scope(engine_for(context.database_url)) as session:
            transcripts.check_filters(session, context.study_id, filters)
            page = transcripts.list_conversations(session, context.study_id, filters, limit=limit, offset=offset)
            audit.record(session, actor(context), "conversations.listed", study_id=context.study_id,
                         filters=filters.as_audit_detail(), limit=limit, offset=offset, count=len(page.items),
                         conversation_ids=[item.id for item in page.items])
        return page

    return _open("listing", (context.study_id, filters, limit, offset), read)


def transcript(context: Context, conversation_id: int) -> TranscriptRead:
    """One whole conversation (``analysis.transcripts.get_transcript``), audited as ``conversation.read``."""
    _allowed(context)

    def read() -> TranscriptRead:
        with session_scope(engine_for(context.database_url)) as session:
            found = transcripts.get_transcript(session, context.study_id, conversation_id)
            audit.record(session, actor(context), "conversation.read", study_id=context.study_id,
                         participant_code=found.participant, conversation_id=found.id)
        return found

    return _open("transcript", (context.study_id, conversation_id), read)
