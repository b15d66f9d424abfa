"""Follow-up endpoints: a participant's own schedule; staff views of follow-ups and channel alerts."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from api.deps import ConsentedParticipant, CurrentStaff, RowId, SessionDep
from api.errors import DocumentedRoute, refusals
from api.routers.staff import ParticipantLevelAccess, staff_actor
from scheduler import service
from scheduler import staff as scheduler_staff
from scheduler.schemas import (
    AlertResolve,
    ChannelAlertRead,
    FollowUpRead,
    MyFollowUpRead,
    SchedulePreviewQuery,
    SchedulePreviewRead,
)
from study import audit
from study import staff as staff_service
from study.errors import Forbidden

router = APIRouter(tags=["follow-ups"], route_class=DocumentedRoute)
FollowUpStatus = Literal["planned", "sent", "completed", "expired", "cancelled"]  # FollowUp.status
staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)


@router.get("/me/followups")
def my_followups(session: SessionDep, participant: ConsentedParticipant) -> list[MyFollowUpRead]:
    """Upcoming and past follow-up surveys."""
    return [MyFollowUpRead.of(f) for f in service.schedule(session, participant)]


@staff_router.get("/alerts")
def channel_alerts(session: SessionDep, staff: CurrentStaff, include_resolved: bool = False) -> list[ChannelAlertRead]:
    """Delivery channels that keep failing (no participant data: every staff member sees them)."""
    return scheduler_staff.channel_alerts(session, include_resolved=include_resolved)


@staff_router.post("/alerts/{alert_id}/resolve", responses=refusals({
    403: "only admins and researchers (of any study) can resolve alerts"}))
def resolve_alert(alert_id: RowId, body: AlertResolve, session: SessionDep, staff: CurrentStaff) -> ChannelAlertRead:
    """Close an alert once its cause is dealt with (a fixed address, a replaced key); the note is
    kept in the audit log. Admins and researchers of any study may do it."""
    if not any(access.participant_level for access in staff_service.memberships(session, staff)):
        raise Forbidden("only admins and researchers can resolve alerts")
    return scheduler_staff.resolve_alert(session, staff_actor(staff), alert_id, body.note)


@staff_router.get("/studies/{slug}/followups/preview")
def preview_followups(session: SessionDep, access: ParticipantLevelAccess,
                      actor: Annotated[audit.Actor, Depends(staff_actor)],
                      query: Annotated[SchedulePreviewQuery, Query()]) -> SchedulePreviewRead:
    """Every invitation and reminder the protocol in force would send a participant enrolled at
    ``enrolled_at`` in ``timezone`` (and deciding at ``decision_at``), in local time and UTC, with
    quiet hours applied, by the planner's own timing. No schedule is stored (the request is audited)."""
    return scheduler_staff.preview(session, actor, access.study.id, query)


@staff_router.get("/studies/{slug}/followups")
def study_followups(session: SessionDep, access: ParticipantLevelAccess,
                    actor: Annotated[audit.Actor, Depends(staff_actor)],
                    status: Annotated[FollowUpStatus | None, Query(description="only follow-ups in this state")]
                    = None) -> list[FollowUpRead]:
    """Every follow-up with its timing and delivery record (audited)."""
    return scheduler_staff.followups(session, actor, access.study.id, status)
