"""Staff reads of a study's follow-ups, each checked and audited here, whoever calls: the actor
must be a researcher or admin of the study (``study.staff.reader_access``), and the audit entry is
written in the caller's transaction. Also the delivery-channel alerts every staff member sees
(no participant data, so not audited) and their resolution (audited)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.models import ChannelAlert, Delivery, FollowUp
from scheduler.schemas import ChannelAlertRead, FollowUpRead, SchedulePreviewQuery, SchedulePreviewRead
from scheduler.service import schedule_preview
from study import audit
from study.clock import now
from study.errors import NotFound
from study.models import Participant
from study.outbox import OutboxStatus
from study.staff import reader_access


def followups(session: Session, actor: audit.Actor, study_id: int, status: str | None = None) -> list[FollowUpRead]:
    """Every follow-up of the study (only those in ``status``) with its timing and delivery record,
    in due order; audited as ``followups.read``."""
    reader_access(session, actor, study_id)
    failed = (select(Delivery.followup_id, func.count().label("n")).where(Delivery.status == OutboxStatus.FAILED)
              .group_by(Delivery.followup_id).subquery())
    query = (select(FollowUp, Participant.code, func.coalesce(failed.c.n, 0))
             .join(Participant, Participant.id == FollowUp.participant_id)
             .outerjoin(failed, failed.c.followup_id == FollowUp.id)
             .where(FollowUp.study_id == study_id).order_by(FollowUp.due_at, FollowUp.id))
    if status:
        query = query.where(FollowUp.status == status)
    rows = session.execute(query).all()
    audit.record(session, actor, "followups.read", study_id=study_id, count=len(rows))
    return [FollowUpRead.staff_view(followup, code, n) for followup, code, n in rows]


def preview(session: Session, actor: audit.Actor, study_id: int, query: SchedulePreviewQuery) -> SchedulePreviewRead:
    """What the protocol in force would send a participant enrolled (and deciding) at the query's
    times (``scheduler.service.schedule_preview``; nothing is stored); audited as ``followups.previewed``."""
    access = reader_access(session, actor, study_id)
    found = schedule_preview(session, access.study, query)
    audit.record(session, actor, "followups.previewed", study_id=study_id, timezone=query.timezone,
                 enrolled_at=query.enrolled_at.isoformat(),
                 decision_at=query.decision_at.isoformat() if query.decision_at else None)
    return found


def channel_alerts(session: Session, *, include_resolved: bool = False) -> list[ChannelAlertRead]:
    """Delivery channels that keep failing, newest first (the open ones unless ``include_resolved``)."""
    query = select(ChannelAlert).where(ChannelAlert.raised_at.is_not(None))
    if not include_resolved:
        query = query.where(ChannelAlert.resolved_at.is_(None))
    return [ChannelAlertRead.of(alert) for alert in session.scalars(query.order_by(ChannelAlert.raised_at.desc()))]


def resolve_alert(session: Session, actor: audit.Actor, alert_id: int, note: str) -> ChannelAlertRead:
    """Close an alert (once; resolving it again keeps the first time), audited as
    ``channel_alert.resolved`` with the note. Raises NotFound."""
    alert = session.get(ChannelAlert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    if alert.resolved_at is None:
        alert.resolved_at = now()
    session.flush()
    audit.record(session, actor, "channel_alert.resolved", alert_id=alert.id, channel=alert.channel,
                 problem=alert.problem, note=note)
    return ChannelAlertRead.of(alert)
