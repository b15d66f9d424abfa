"""Follow-up endpoints: a participant's own schedule; staff views of follow-ups and channel alerts."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from sqlalchemy import func, select

from api.deps import ConsentedParticipant, CurrentStaff, RowId, SessionDep
from api.errors import DocumentedRoute, refusals
from api.routers.staff import ParticipantLevelAccess, staff_actor
from scheduler import service
from scheduler.models import ChannelAlert, Delivery, FollowUp
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
from study.clock import now
from study.errors import Forbidden, NotFound
from study.models import Participant

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
    query = select(ChannelAlert).where(ChannelAlert.raised_at.is_not(None))
    if not include_resolved:
        query = query.where(ChannelAlert.resolved_at.is_(None))
    return [ChannelAlertRead.of(a) for a in session.scalars(query.order_by(ChannelAlert.raised_at.desc()))]


@staff_router.post("/alerts/{alert_id}/resolve", responses=refusals({
    403: "only admins and researchers (of any study) can resolve alerts"}))
def resolve_alert(alert_id: RowId, body: AlertResolve, session: SessionDep, staff: CurrentStaff) -> ChannelAlertRead:
    """Close an alert once its cause is dealt with (a fixed address, a replaced key); the note is
    kept in the audit log. Admins and researchers of any study may do it."""
    if not any(access.participant_level for access in staff_service.memberships(session, staff)):
        raise Forbidden("only admins and researchers can resolve alerts")
    alert = session.get(ChannelAlert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    if alert.resolved_at is None:
        alert.resolved_at = now()
    session.flush()
    audit.record(session, staff_actor(staff), "channel_alert.resolved", alert_id=alert.id, channel=alert.channel,
                 problem=alert.problem, note=body.note)
    return ChannelAlertRead.of(alert)


@staff_router.get("/studies/{slug}/followups/preview")
def preview_followups(session: SessionDep, access: ParticipantLevelAccess,
                      actor: Annotated[audit.Actor, Depends(staff_actor)],
                      query: Annotated[SchedulePreviewQuery, Query()]) -> SchedulePreviewRead:
    """Every invitation and reminder the protocol in force would send a participant enrolled at
    ``enrolled_at`` in ``timezone`` (and deciding at ``decision_at``), in local time and UTC, with
    quiet hours applied, by the planner's own timing. No schedule is stored (the request is audited)."""
    preview = service.schedule_preview(session, access.study, query)
    audit.record(session, actor, "followups.previewed", study_id=access.study.id, timezone=query.timezone,
                 enrolled_at=query.enrolled_at.isoformat(),
                 decision_at=query.decision_at.isoformat() if query.decision_at else None)
    return preview


@staff_router.get("/studies/{slug}/followups")
def study_followups(session: SessionDep, access: ParticipantLevelAccess,
                    actor: Annotated[audit.Actor, Depends(staff_actor)],
                    status: Annotated[FollowUpStatus | None, Query(description="only follow-ups in this state")]
                    = None) -> list[FollowUpRead]:
    """Every follow-up with its timing and delivery record (audited)."""
    failed = (select(Delivery.followup_id, func.count().label("n")).where(Delivery.status == "failed")
              .group_by(Delivery.followup_id).subquery())
    query = (select(FollowUp, Participant.code, func.coalesce(failed.c.n, 0))
             .join(Participant, Participant.id == FollowUp.participant_id)
             .outerjoin(failed, failed.c.followup_id == FollowUp.id)
             .where(FollowUp.study_id == access.study.id).order_by(FollowUp.due_at, FollowUp.id))
    if status:
        query = query.where(FollowUp.status == status)
    rows = session.execute(query).all()
    audit.record(session, actor, "followups.read", study_id=access.study.id, count=len(rows))
    return [FollowUpRead.staff_view(f, code, n) for f, code, n in rows]
