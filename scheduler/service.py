"""Scheduler operations used outside the dispatcher: completing enrollment (which plans the
follow-ups), what a participant has scheduled, and the hooks that stop everything pending when a
survey is completed or a participant withdraws."""

from __future__ import annotations

from dataclasses import dataclass
from zoneinfo import ZoneInfo

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session

from scheduler import planner
from scheduler.models import Anchor, Delivery, FollowUp, FollowUpStatus
from scheduler.schemas import FollowUpPreviewRead, SchedulePreviewQuery, SchedulePreviewRead
from study import audit, i18n, participants, recruitment
from study.clock import now
from study.errors import Conflict
from study.models import Participant, Study, StudyStatus, WithdrawalLevel
from study.outbox import OutboxStatus
from study.studies import current_protocol, current_version
from study.wiring import Lifecycle
from surveys import registry
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
    _cancel_deliveries(session, Delivery.followup_id == followup_id, reason)


def _cancel_deliveries(session: Session, deliveries: ColumnElement[bool], reason: str) -> None:
    """Cancel the deliveries among ``deliveries`` not sent yet (a claimed one too: it is recorded
    only while it is still sending)."""
    session.execute(update(Delivery)
                    .where(deliveries, Delivery.status.in_((OutboxStatus.PENDING, OutboxStatus.SENDING)))
                    .values(status=OutboxStatus.CANCELLED, last_error=reason))



def schedule(session: Session, participant: Participant) -> list[FollowUp]:
    return list(session.scalars(select(FollowUp).where(FollowUp.participant_id == participant.id)
                                .order_by(FollowUp.due_at, FollowUp.id)))


@dataclass(frozen=True)
class ComingUp:
    """What a participant is told is coming (My study): one instrument for one anchor, e.g. the Decision
    Regret Scale about one decision, with each time it is open now or due (the participant's local date)."""

    title: str
    decision: str | None
    times: list[str]


def coming_up(session: Session, participant: Participant) -> list[ComingUp]:
    """The planned and open follow-ups, by instrument and anchor (a decision is named once), soonest first."""
    groups: dict[tuple[str, str], list[FollowUp]] = {}
    for followup in schedule(session, participant):
        if followup.status in PENDING:
            groups.setdefault((followup.instrument_id, followup.anchor_key), []).append(followup)
    language = participant.language or i18n.SOURCE  # titles and days in the participant's language
    titles = {instrument: registry.in_language(session, registry.get(session, instrument), language)[0].title
              for instrument, _ in groups}

    def when(followup: FollowUp) -> str:
        local = followup.due_at.astimezone(ZoneInfo(followup.timezone))
        if followup.status == FollowUpStatus.SENT:
            return i18n.gettext(language, "open now")
        return i18n.gettext(language, "around %(day)s", day=i18n.day_text(local, language))

    return [ComingUp(titles[instrument], followups[0].context.get("decision"), [when(f) for f in followups])
            for (instrument, _), followups in groups.items()]


def deliveries(session: Session, followup: FollowUp) -> list[Delivery]:
    return list(session.scalars(select(Delivery).where(Delivery.followup_id == followup.id)
                                .order_by(Delivery.sequence, Delivery.channel)))


def schedule_preview(session: Session, study: Study, query: SchedulePreviewQuery) -> SchedulePreviewRead:
    """What the protocol in force would send one participant enrolled (and deciding) at the given
    times, by the planner's own timing; nothing is stored."""
    version = current_version(session, study.id)
    protocol = current_protocol(session, study.id)
    zone = ZoneInfo(query.timezone)
    previews = planner.preview(protocol, query.timezone, query.enrolled_at, query.decision_at)
    decided = query.decision_at
    return SchedulePreviewRead(
        study=study.slug, protocol_version=version.version, timezone=query.timezone,
        quiet_hours={"start": protocol.quiet_hours.start, "end": protocol.quiet_hours.end},
        enrolled_at_utc=query.enrolled_at, enrolled_at_local=query.enrolled_at.astimezone(zone),
        decision_at_utc=decided, decision_at_local=decided.astimezone(zone) if decided else None,
        followups=[FollowUpPreviewRead.of(p, zone) for p in previews],
        decision_followups_not_shown=[] if decided else [f.id for f in protocol.followups if f.anchor == "decision"])


def _on_completion(session: Session, assignment: SurveyAssignment) -> None:
    """A completed survey completes its follow-up and cancels the follow-up's deliveries not sent yet.
    Only a follow-up's own survey has one (``scheduler.opening`` opens it with the follow-up's key), so
    another (baseline, exit) costs no statement, and a follow-up's two."""
    if assignment.followup_key is None:
        return
    at, answered = now(), FollowUp.assignment_id == assignment.id
    session.execute(update(FollowUp).where(answered)
                    .values(status=FollowUpStatus.COMPLETED, ended_at=at, updated_at=at))
    _cancel_deliveries(session, Delivery.followup_id.in_(select(FollowUp.id).where(answered)),
                       "the survey was completed")


PENDING = (FollowUpStatus.PLANNED, FollowUpStatus.SENT)  # follow-ups still to come: not yet sent, or sent and open


def _cancel_pending(session: Session, followups: ColumnElement[bool], deliveries: ColumnElement[bool],
                    reason: str) -> int:
    """Cancel the follow-ups still to come among ``followups`` and the pending deliveries among
    ``deliveries``; returns the follow-ups cancelled."""
    at = now()
    cancelled: int = session.execute(
        update(FollowUp).where(followups, FollowUp.status.in_(PENDING))
        .values(status=FollowUpStatus.CANCELLED, ended_at=at, updated_at=at, end_reason=reason)).rowcount  # type: ignore[attr-defined]
    _cancel_deliveries(session, deliveries, reason)
    return cancelled


def _on_withdrawal(session: Session, participant: Participant, level: WithdrawalLevel) -> None:
    _cancel_pending(session, FollowUp.participant_id == participant.id,
                    Delivery.participant_id == participant.id, "participant withdrew")


def stop_study_followups(session: Session, study: Study, reason: str) -> int:
    """Cancel every follow-up of the study still to come, as withdrawal does for one participant,
    and the open surveys they sent; returns the follow-ups cancelled."""
    opened = select(FollowUp.assignment_id).where(FollowUp.study_id == study.id, FollowUp.status == FollowUpStatus.SENT,
                                                  FollowUp.assignment_id.is_not(None))
    session.execute(update(SurveyAssignment).where(SurveyAssignment.id.in_(opened), SurveyAssignment.status == "open")
                    .values(status="cancelled"))
    of_study = select(FollowUp.id).where(FollowUp.study_id == study.id)
    return _cancel_pending(session, FollowUp.study_id == study.id, Delivery.followup_id.in_(of_study), reason)


@dataclass(frozen=True)
class StatusChange:
    study: Study
    transition: recruitment.Transition
    followups_cancelled: int


def change_study_status(session: Session, study: Study, action: recruitment.StudyAction, actor: audit.Actor,
                        *, stop_followups: bool = False) -> StatusChange:
    """Pause, resume, close or archive a study: the one way, for the API and the CLI (audited).
    Participants already enrolled go on; closing with ``stop_followups`` cancels every follow-up
    still to come. A study is archived only once none is left."""
    transition = recruitment.check_transition(study, action, stop_followups=stop_followups)
    if transition.to_status == StudyStatus.ARCHIVED:
        pending = session.scalar(select(func.count()).select_from(FollowUp).where(
            FollowUp.study_id == study.id, FollowUp.status.in_(PENDING))) or 0
        if pending:
            raise Conflict(f"study '{study.slug}' still has {pending} follow-up(s) to come; archive it once they "
                           f"have ended, or stop them first (afterward study close {study.slug} --stop-followups)",
                           code="followups_pending")
    cancelled = stop_study_followups(session, study, "the study's follow-ups were stopped") \
        if transition.stop_followups else 0
    recruitment.apply(session, study, transition, actor, followups_cancelled=cancelled)
    return StatusChange(study, transition, cancelled)


def wire_lifecycle(lifecycle: Lifecycle) -> None:
    """The ``afterward.lifecycle`` entry point (pyproject.toml): completing a survey ends its
    follow-up and reminders, withdrawal cancels everything pending, deletion removes the schedule."""
    lifecycle.on_completion(_on_completion)
    lifecycle.on_withdrawal(_on_withdrawal)
    lifecycle.research_data(Anchor, FollowUp, Delivery)


