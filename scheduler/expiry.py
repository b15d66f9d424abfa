"""Expiry: follow-ups whose survey window closed end, completed or expired, and what they still
had to send is cancelled."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.engine import Engine

from scheduler.models import FollowUp, FollowUpStatus
from scheduler.scope import LIVE, Scope
from scheduler.service import cancel_deliveries
from scheduler.tick import TickReport, describe
from study.clock import now
from study.db import is_postgres, session_scope
from surveys.models import SurveyAssignment

log = logging.getLogger("afterward.scheduler")


def expire_closed(engine: Engine, report: TickReport, scope: Scope = LIVE) -> None:
    """Close the follow-ups of the ``scope``'s studies whose window closed, in one transaction; if
    that fails, one by one."""
    try:
        _expire(engine, report, scope, None)
    except Exception as exc:
        log.warning("expiry failed as a batch (%s); expiring one by one", describe(exc))
        with session_scope(engine, read_only=True) as session:
            ids = session.scalars(select(FollowUp.id).where(FollowUp.status == FollowUpStatus.SENT,
                                                            FollowUp.closes_at <= now(),
                                                            scope.covers(FollowUp.study_id))).all()
        for followup_id in ids:
            try:
                _expire(engine, report, scope, followup_id)
            except Exception as row_exc:
                log.exception("follow-up %s could not be expired", followup_id)
                report.errors.append(f"follow-up {followup_id} could not be expired: {describe(row_exc)}")


def _expire(engine: Engine, report: TickReport, scope: Scope, only: int | None) -> None:
    part = TickReport()
    with session_scope(engine) as session:
        at = now()
        query = select(FollowUp, SurveyAssignment).join(
            SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id).where(
            FollowUp.status == FollowUpStatus.SENT, FollowUp.closes_at <= at, scope.covers(FollowUp.study_id))
        if only is not None:
            query = query.where(FollowUp.id == only)
        if is_postgres(session):
            query = query.with_for_update(skip_locked=True)
        for followup, assignment in session.execute(query).all():
            if assignment.status == "completed":
                followup.status, followup.end_reason = FollowUpStatus.COMPLETED, None
                part.completed += 1
            else:
                if assignment.status == "open":
                    assignment.status = "expired"
                followup.status, followup.end_reason = FollowUpStatus.EXPIRED, "the window closed without a response"
                part.expired += 1
            followup.ended_at = followup.updated_at = at
            cancel_deliveries(session, followup.id, "the survey window closed")
    report.add(part)
