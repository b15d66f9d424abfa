"""Staff transcript endpoints: a study's conversations, one whole transcript, and a safety event
with the turns around it. Admins and researchers only (viewers see aggregates); every read is
audited with who read what, by the reads of ``analysis.transcripts`` themselves."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from analysis import transcripts
from analysis.schemas import ConversationPageRead, SafetyEventContextRead, TranscriptRead
from api.deps import RowId, SessionDep
from api.errors import DocumentedRoute, refusals
from api.routers.staff import ParticipantLevelAccess, staff_actor
from chat.roles import RoleName, Stance
from study import audit
from study.validation import MAX_ROW_ID, AwareDatetime, Line

staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)
Actor = Annotated[audit.Actor, Depends(staff_actor)]
MAX_PAGE = 200


def conversation_filters(
    participant: Annotated[Line | None, Query(max_length=16, description="a participant code")] = None,
    arm: Annotated[Line | None, Query(min_length=1, max_length=64)] = None,
    role: Annotated[RoleName | None, Query(description="held in this role at some point")] = None,
    stance: Annotated[Stance | None, Query(description="at least one assistant turn took this stance")] = None,
    started_from: Annotated[AwareDatetime | None, Query(description="started at or after (with a time zone)")] = None,
    started_before: Annotated[AwareDatetime | None, Query(description="started before (with a time zone)")] = None,
) -> transcripts.ConversationFilters:
    return transcripts.ConversationFilters(participant=participant, arm=arm, role=role, stance=stance,
                                           started_from=started_from, started_before=started_before)


@staff_router.get("/studies/{slug}/conversations", responses=refusals({
    422: "a filter names what the study does not have: an arm or a participant code "
         "(codes unknown_arm, unknown_participant)"}))
def list_conversations(
    session: SessionDep, access: ParticipantLevelAccess, actor: Actor,
    filters: Annotated[transcripts.ConversationFilters, Depends(conversation_filters)],
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ROW_ID)] = 0,
) -> ConversationPageRead:
    """A study's conversations, newest first, filtered and paginated (``total`` counts every match)."""
    return transcripts.list_conversations(session, actor, access.study.id, filters, limit=limit, offset=offset)


@staff_router.get("/studies/{slug}/conversations/{conversation_id}", name="staff_transcript")
def read_conversation(conversation_id: RowId, session: SessionDep, access: ParticipantLevelAccess,
                      actor: Actor) -> TranscriptRead:
    """One conversation with every turn, stance, rationale, pushback response, role switch, the
    decision, the exit rating and its safety events."""
    return transcripts.get_transcript(session, actor, access.study.id, conversation_id)


@staff_router.get("/studies/{slug}/safety-events/{event_id}", responses=refusals({
    410: "a de-identified record: the participant withdrew and deleted their data, so no turns are kept"}))
def read_safety_event(
    event_id: RowId, slug: Line, request: Request, session: SessionDep, access: ParticipantLevelAccess, actor: Actor,
    around: Annotated[int, Query(ge=0, le=50, description="turns shown on each side of the triggering one")] = 3,
) -> SafetyEventContextRead:
    """A safety event with its review history and the turns around the one that triggered it,
    linking to the full transcript."""
    context = transcripts.safety_event_context(session, actor, access.study.id, event_id, around=around)
    if context.conversation_id is None:  # raised by a safety rule on survey answers
        return context
    path = request.app.url_path_for("staff_transcript", slug=slug, conversation_id=str(context.conversation_id))
    return context.model_copy(update={"transcript_path": str(path)})
