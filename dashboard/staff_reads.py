"""Participant-level reads and the safety review, through the services the staff API uses
(``analysis.transcripts``, ``chat.service``) and audited the way the API audits them
(``study.audit``, the same actions and details). Researchers and admins only.

A read is made (and audited) once per signed-in session: the result is kept in the Streamlit
session, so the reruns Streamlit makes on every click show it again without reading it again.
"""

from __future__ import annotations

from typing import Any, TypeVar

import streamlit as st
from sqlalchemy import select

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


def _kept() -> dict[tuple[Any, ...], Any]:
    kept: dict[tuple[Any, ...], Any] = st.session_state.setdefault(READS_KEY, {})
    return kept


def forget(kind: str) -> None:
    """Drop the kept reads of one kind (e.g. after a review changed them)."""
    kept = _kept()
    for key in [k for k in kept if k[0] == kind]:
        del kept[key]


def safety_queue(context: Context) -> list[SafetyEventRead]:
    """The unreviewed safety events, newest first (read at every view: the queue must be current);
    audited as the API's ``safety_events.read``."""
    _allowed(context)
    with session_scope(engine_for(context.database_url)) as session:
        rows = session.execute(
            select(SafetyEvent, Participant.code).outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
            .where(SafetyEvent.study_id == context.study_id, SafetyEvent.reviewed_at.is_(None))
            .order_by(SafetyEvent.created_at.desc(), SafetyEvent.id.desc()).limit(QUEUE_LIMIT)).all()
        events = [SafetyEventRead.of(event, code, []) for event, code in rows]
        key = ("queue", context.study_id, tuple(event.id for event in events))
        if key not in _kept():
            audit.record(session, actor(context), "safety_events.read", study_id=context.study_id, count=len(events))
            _kept()[key] = True
    return events


def safety_event(context: Context, event_id: int, around: int = 3) -> SafetyEventContextRead:
    """A safety event with the turns around it (``analysis.transcripts.safety_event_context``),
    audited as ``safety_event.read``. Raises NotFound, or Gone for a de-identified record."""
    _allowed(context)
    key = ("event", context.study_id, event_id, around)
    if key not in _kept():
        with session_scope(engine_for(context.database_url)) as session:
            found = transcripts.safety_event_context(session, context.study_id, event_id, around=around)
            audit.record(session, actor(context), "safety_event.read", study_id=context.study_id,
                         participant_code=found.event.participant, event_id=event_id,
                         conversation_id=found.conversation_id, turn_ids=[turn.id for turn in found.turns])
        _kept()[key] = found
    found_kept: SafetyEventContextRead = _kept()[key]
    return found_kept


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
    key = ("listing", context.study_id, filters, limit, offset)
    if key not in _kept():
        with session_scope(engine_for(context.database_url)) as session:
            transcripts.check_filters(session, context.study_id, filters)
            page = transcripts.list_conversations(session, context.study_id, filters, limit=limit, offset=offset)
            audit.record(session, actor(context), "conversations.listed", study_id=context.study_id,
                         filters=filters.as_audit_detail(), limit=limit, offset=offset, count=len(page.items),
                         conversation_ids=[item.id for item in page.items])
        _kept()[key] = page
    page_kept: ConversationPageRead = _kept()[key]
    return page_kept


def transcript(context: Context, conversation_id: int) -> TranscriptRead:
    """One whole conversation (``analysis.transcripts.get_transcript``), audited as ``conversation.read``."""
    _allowed(context)
    key = ("transcript", context.study_id, conversation_id)
    if key not in _kept():
        with session_scope(engine_for(context.database_url)) as session:
            found = transcripts.get_transcript(session, context.study_id, conversation_id)
            audit.record(session, actor(context), "conversation.read", study_id=context.study_id,
                         participant_code=found.participant, conversation_id=found.id)
        _kept()[key] = found
    found_kept: TranscriptRead = _kept()[key]
    return found_kept
