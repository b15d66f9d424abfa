"""Scheduler operations used outside the dispatcher: completing enrollment (which plans the
follow-ups), what a participant has scheduled, and the hooks that stop everything pending when a
survey is completed or a participant withdraws."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler import planner
from scheduler.models import Anchor, Delivery, FollowUp
from study import participants
from study.clock import now
from study.models import Participant, WithdrawalLevel
from study.studies import current_protocol
from study.wiring import Lifecycle
from surveys import service as survey_service
from surveys.models import SurveyAssignment


def save_profile(session: Session, participant: Participant, *, timezone: str,
                 contact_email: str | None) -> list[SurveyAssignment]:
    """Update the profile; the first time, complete enrollment: arm, baseline surveys and the
    enrollment-anchored follow-ups. Returns the baseline surveys assigned now. The one way to
    complete enrollment, for the API, the pages and simulated participants (it lives here, the
    lowest package that sees both the surveys and the planner)."""
    was_enrolled = participant.enrolled_at is not None
    participants.update_profile(session, participant, timezone=timezone, contact_email=contact_email)
    if was_enrolled:
        return []
    baseline = survey_service.assign_baseline(session, participant,
                                              current_protocol(session, participant.study_id).baseline)
    planner.on_enrollment(session, participant)
    return baseline


def cancel_deliveries(session: Session, followup_id: int, reason: str) -> None:
    session.execute(update(Delivery).where(Delivery.followup_id == followup_id,
                                           Delivery.status.in_(("pending", "sending")))
                    .values(status="cancelled", last_error=reason))



def schedule(session: Session, participant: Participant) -> list[FollowUp]:
    return list(session.scalars(select(FollowUp).where(FollowUp.participant_id == participant.id)
                                .order_by(FollowUp.due_at, FollowUp.id)))


def deliveries(session: Session, followup: FollowUp) -> list[Delivery]:
    return list(session.scalars(select(Delivery).where(Delivery.followup_id == followup.id)
                                .order_by(Delivery.sequence, Delivery.channel)))


def _on_completion(session: Session, assignment: SurveyAssignment) -> None:
    for followup in session.scalars(select(FollowUp).where(FollowUp.assignment_id == assignment.id)):
        followup.status, followup.ended_at, followup.updated_at = "completed", now(), now()
        cancel_deliveries(session, followup.id, "the survey was completed")


def _on_withdrawal(session: Session, participant: Participant, level: WithdrawalLevel) -> None:
    at = now()
    session.execute(update(FollowUp).where(FollowUp.participant_id == participant.id,
                                           FollowUp.status.in_(("planned", "sent")))
                    .values(status="cancelled", ended_at=at, updated_at=at, end_reason="participant withdrew"))
    session.execute(update(Delivery).where(Delivery.participant_id == participant.id,
                                           Delivery.status.in_(("pending", "sending")))
                    .values(status="cancelled", last_error="participant withdrew"))


def wire_lifecycle(lifecycle: Lifecycle) -> None:
    """The ``afterward.lifecycle`` entry point (pyproject.toml): completing a survey ends its
    follow-up and reminders, withdrawal cancels everything pending, deletion removes the schedule."""
    lifecycle.on_completion(_on_completion)
    lifecycle.on_withdrawal(_on_withdrawal)
    lifecycle.research_data(Anchor, FollowUp, Delivery)


