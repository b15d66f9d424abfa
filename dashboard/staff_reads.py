"""Participant-level reads and the safety review, through the services the staff API uses
(``analysis.transcripts``, ``chat.staff``), which check the staff member's role in the study and
write the audit entries themselves (the same actions and details, whoever calls). Researchers and
admins only.

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
from sqlalchemy.orm import Session

from analysis import plan, transcripts
from analysis.schemas import ConversationPageRead, SafetyEventContextRead, TranscriptRead
from chat import staff
from chat.schemas import SafetyEventRead
from dashboard.auth import Context
from study import audit
from study.db import engine_for, session_scope

READS_KEY = "afterward_reads"
QUEUE_LIMIT = 200
T = TypeVar("T")


def actor(context: Context) -> audit.Actor:
    return audit.Actor("staff", context.email)


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


def safety_queue(context: Context) -> staff.SafetyEvents:
    """The unreviewed safety events, newest first, at most ``QUEUE_LIMIT`` of them, with the count
    of all (read at every view: the queue must be current); audited as ``safety_events.read``
    when it comes into view or what it lists changes."""
    in_view, shown = _in_view("queue", (context.study_id,))
    with session_scope(engine_for(context.database_url)) as session:
        queue = staff.safety_events(session, actor(context), context.study_id, unreviewed=True, limit=QUEUE_LIMIT,
                                    seen=shown if in_view else None)
    _shown().now["queue"] = ((context.study_id,), tuple(event.id for event in queue.events))
    return queue


def _read(context: Context, kind: str, key: tuple[Any, ...], read: Callable[[Session], T]) -> T:
    """The read ``key`` of ``kind``, kept while in view, else ``read`` (which audits) in a unit of its own."""
    def fresh() -> T:
        with session_scope(engine_for(context.database_url)) as session:
            return read(session)

    return _open(kind, (context.study_id, *key), fresh)


def safety_event(context: Context, event_id: int, around: int = 3) -> SafetyEventContextRead:
    """A safety event with the turns around it (``analysis.transcripts.safety_event_context``,
    audited as ``safety_event.read``). Raises NotFound, or Gone for a de-identified record."""
    return _read(context, "event", (event_id, around), lambda session: transcripts.safety_event_context(
        session, actor(context), context.study_id, event_id, around=around))


def review(context: Context, event_id: int, note: str) -> SafetyEventRead:
    """Add a review to the event's history (``chat.staff.review_safety_event``, audited as
    ``safety_event.reviewed``); the event leaves the queue."""
    with session_scope(engine_for(context.database_url)) as session:
        result = staff.review_safety_event(session, actor(context), context.study_id, event_id, note)
    forget("event")
    return result


def conversations(context: Context, filters: transcripts.ConversationFilters, *, limit: int,
                  offset: int) -> ConversationPageRead:
    """A page of the study's conversations (``analysis.transcripts.list_conversations``, audited
    as ``conversations.listed``). Raises Invalid for an unknown arm or participant."""
    return _read(context, "listing", (filters, limit, offset), lambda session: transcripts.list_conversations(
        session, actor(context), context.study_id, filters, limit=limit, offset=offset))


def unblinded(context: Context, view: str, reason: str) -> plan.OutcomeBlinding:
    """An admin's unblinding of ``view`` while the study is blinded (``analysis.plan.outcome_access``,
    audited as ``blinding.unblinded_read`` each time the unblinded view comes into view). Raises
    Forbidden for anyone but an admin."""
    return _read(context, "unblinded", (view, reason), lambda session: plan.outcome_access(
        session, actor(context), context.study_id, view, unblind=reason))


def transcript(context: Context, conversation_id: int) -> TranscriptRead:
    """One whole conversation (``analysis.transcripts.get_transcript``, audited as ``conversation.read``)."""
    return _read(context, "transcript", (conversation_id,), lambda session: transcripts.get_transcript(
        session, actor(context), context.study_id, conversation_id))
