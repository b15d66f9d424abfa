"""Staff endpoints. Aggregates are open to every role in a study; participant-level data only to
admins and researchers, and every such read is audited."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import and_, case, distinct, func, select
from sqlalchemy.orm import Session

from analysis.aggregates import BELOW, SHOWN, SUPPRESSED, Count, Disclosure, below
from api.client_address import client_address
from api.deps import CurrentStaff, SessionDep
from api.errors import DocumentedRoute, error_body, refusals, refuses
from scheduler.models import ChannelAlert, FollowUp
from study import audit
from study import participants as participant_service
from study import staff as service
from study.errors import Forbidden
from study.models import ConsentSignature, ConsentVersion, Participant, StudyStatus
from study.safety import SafetyEvent
from study.schemas import (
    InviteCreate,
    InvitesRead,
    StaffLogin,
    StaffParticipantRead,
    StudyAccessRead,
    StudySummaryRead,
    TokenRead,
)
from study.studies import current_consent, current_version

router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)


@refuses({403: "you have no role in this study (an unknown study looks the same: code no_study_access)"})
def study_access(slug: str, session: SessionDep, staff: CurrentStaff) -> service.StudyAccess:
    return service.study_access(session, staff, slug)


@refuses({403: "your role in this study (viewer) sees aggregate figures only"})
async def participant_level_access(
    access: Annotated[service.StudyAccess, Depends(study_access)],
) -> service.StudyAccess:
    if not access.participant_level:
        raise Forbidden("your role in this study (viewer) sees aggregate figures only",
                        code="participant_data_forbidden")
    return access


StudyAccess = Annotated[service.StudyAccess, Depends(study_access)]
ParticipantLevelAccess = Annotated[service.StudyAccess, Depends(participant_level_access)]


def staff_actor(staff: CurrentStaff) -> audit.Actor:
    return audit.Actor("staff", staff.email)


@router.post("/login", response_model=TokenRead, responses=refusals({
    403: "wrong email or password (code login_failed)",
    429: "too many failed attempts for this email from this address, or from this address; "
         "wait the Retry-After seconds"}))
def login(body: StaffLogin, session: SessionDep, request: Request) -> TokenRead | JSONResponse:
    token = service.login(session, email=body.email, password=body.password, client=client_address(request))
    if token is None:
        # Returned, not raised: the failed attempt must be committed to count toward the limit.
        return JSONResponse(error_body("login_failed", "email or password is wrong"), status_code=403)
    return TokenRead(token=token)


@router.get("/studies")
def my_studies(session: SessionDep, staff: CurrentStaff, include_archived: bool = False) -> list[StudyAccessRead]:
    """The studies you have a role in; archived ones only with ``include_archived``."""
    return [StudyAccessRead(study=a.study.slug, title=a.study.title, role=a.role, status=a.study.status)
            for a in service.memberships(session, staff)
            if include_archived or a.study.status != StudyStatus.ARCHIVED]


class ViewerStudySummaryRead(BaseModel):
    """The summary as a viewer sees it: a count is a number, "< 5" or "suppressed"."""

    study: str
    protocol_version: int
    consent_version: str
    participants_by_status: dict[str, int | str]
    enrolled_by_arm: dict[str, int | str]
    followups_by_status: dict[str, int | str]
    safety_events_total: int | str
    safety_events_unreviewed: int | str
    safety_events_participant_deleted: int | str
    safety_events_unreviewed_participant_deleted: int | str
    channel_alerts_open: int


def viewer_summary(session: Session, study_id: int, summary: StudySummaryRead) -> ViewerStudySummaryRead:
    """Every count of ``summary`` under the aggregate tables' disclosure rule: the participants
    behind each count, the sums a viewer knows (each dict adds up to its total; the safety events
    form a reviewed x de-identified table with margins), primary and complementary suppression."""
    disclosure = Disclosure()

    def add(group: str, counts: dict[str, Count], total: int | None = None) -> None:
        for key, count in counts.items():
            disclosure.add_count((group, 0, key), count)
        if total is not None:  # the sum is taken as known: it errs towards hiding more
            disclosure.add_count((group, 0, "(total)"), Count(sum(c.value for c in counts.values()), total, True))
            disclosure.add_sum((group, 0, "(total)"), [(group, 0, key) for key in counts])

    people = {status: Count(n, n, True) for status, n in summary.participants_by_status.items()}
    add("status", people, sum(summary.participants_by_status.values()))
    add("arm", {arm: Count(n, n, True) for arm, n in summary.enrolled_by_arm.items()},
        sum(summary.enrolled_by_arm.values()))
    followup_people = dict(session.execute(select(FollowUp.status, func.count(distinct(FollowUp.participant_id)))
                                           .where(FollowUp.study_id == study_id).group_by(FollowUp.status)).all())
    add("followups", {status: Count(n, followup_people[status], False)
                      for status, n in summary.followups_by_status.items()},
        session.scalar(select(func.count(distinct(FollowUp.participant_id))).where(FollowUp.study_id == study_id)) or 0)
    # Safety events: reviewed or not x de-identified or not (de-identified records count as one participant).
    reviewed = case((SafetyEvent.reviewed_at.is_(None), "unreviewed"), else_="reviewed")
    cells = {(r, bool(d)): (n, p) for r, d, n, p in session.execute(select(
        reviewed, SafetyEvent.participant_data_deleted, func.count(), func.count(distinct(SafetyEvent.participant_id)))
        .where(SafetyEvent.study_id == study_id).group_by(reviewed, SafetyEvent.participant_data_deleted)).all()}
    for (r, d) in [(r, d) for r in ("reviewed", "unreviewed") for d in (False, True)]:
        n, p = cells.get((r, d), (0, 0))
        disclosure.add_count(("safety", 0, f"{r}/{d}"), Count(n, (1 if n else 0) if d else p, False))
    margins = {"total": [f"{r}/{d}" for r in ("reviewed", "unreviewed") for d in (False, True)],
               "unreviewed": ["unreviewed/False", "unreviewed/True"], "reviewed": ["reviewed/False", "reviewed/True"],
               "deleted": ["reviewed/True", "unreviewed/True"], "identified": ["reviewed/False", "unreviewed/False"]}
    for margin, parts in margins.items():
        keys = [("safety", 0, part) for part in parts]
        counts = [disclosure.counts[key] for key in keys]
        disclosure.add_count(("safety", 0, margin), Count(sum(c.value for c in counts),
                                                          sum(c.contributors for c in counts), False))
        disclosure.add_sum(("safety", 0, margin), keys)
    status = disclosure.protect()

    def shown(group: str, key: str) -> int | str:
        state = status[(group, 0, key)]
        return disclosure.counts[(group, 0, key)].value if state == SHOWN else below() if state == BELOW else SUPPRESSED

    return ViewerStudySummaryRead(
        study=summary.study, protocol_version=summary.protocol_version, consent_version=summary.consent_version,
        participants_by_status={k: shown("status", k) for k in summary.participants_by_status},
        enrolled_by_arm={k: shown("arm", k) for k in summary.enrolled_by_arm},
        followups_by_status={k: shown("followups", k) for k in summary.followups_by_status},
        safety_events_total=shown("safety", "total"), safety_events_unreviewed=shown("safety", "unreviewed"),
        safety_events_participant_deleted=shown("safety", "deleted"),
        safety_events_unreviewed_participant_deleted=shown("safety", "unreviewed/True"),
        channel_alerts_open=summary.channel_alerts_open)


@router.get("/studies/{slug}/summary")
def study_summary(session: SessionDep, access: StudyAccess) -> StudySummaryRead | ViewerStudySummaryRead:
    """The study's counts; for viewers with the aggregate tables' suppression rule applied
    (``analysis.aggregates``: under 5 participants "< 5", and "suppressed" where a hidden count
    could be worked out from the others)."""
    study_id = access.study.id
    by_status = dict(session.execute(
        select(Participant.status, func.count()).where(Participant.study_id == study_id)
        .group_by(Participant.status)).all())
    by_arm = dict(session.execute(
        select(Participant.arm, func.count())
        .where(Participant.study_id == study_id, Participant.arm.is_not(None))
        .group_by(Participant.arm)).all())
    followups = dict(session.execute(select(FollowUp.status, func.count()).where(FollowUp.study_id == study_id)
                                     .group_by(FollowUp.status)).all())
    # De-identified records (the participant withdrew and deleted data) count like any other event.
    unreviewed_event = SafetyEvent.reviewed_at.is_(None)
    deidentified = SafetyEvent.participant_data_deleted.is_(True)
    events = session.execute(select(
        func.count(), func.count(case((unreviewed_event, 1))), func.count(case((deidentified, 1))),
        func.count(case((and_(unreviewed_event, deidentified), 1)))).where(SafetyEvent.study_id == study_id)).one()
    alerts = session.scalar(select(func.count()).select_from(ChannelAlert).where(
        ChannelAlert.raised_at.is_not(None), ChannelAlert.resolved_at.is_(None))) or 0
    summary = StudySummaryRead(study=access.study.slug, protocol_version=current_version(session, study_id).version,
                            consent_version=current_consent(session, study_id).version,
                            participants_by_status=by_status, enrolled_by_arm=by_arm, followups_by_status=followups,
                            safety_events_total=events[0], safety_events_unreviewed=events[1],
                            safety_events_participant_deleted=events[2],
                            safety_events_unreviewed_participant_deleted=events[3], channel_alerts_open=alerts)
    return summary if access.participant_level else viewer_summary(session, study_id, summary)


@router.get("/studies/{slug}/participants")
def list_participants(session: SessionDep, access: ParticipantLevelAccess,
                      staff: CurrentStaff) -> list[StaffParticipantRead]:
    latest = (select(ConsentSignature.participant_id, func.max(ConsentSignature.id).label("sig_id"))
              .group_by(ConsentSignature.participant_id).subquery())
    rows = session.execute(
        select(Participant, ConsentVersion.version)
        .outerjoin(latest, latest.c.participant_id == Participant.id)
        .outerjoin(ConsentSignature, ConsentSignature.id == latest.c.sig_id)
        .outerjoin(ConsentVersion, ConsentVersion.id == ConsentSignature.consent_version_id)
        .where(Participant.study_id == access.study.id).order_by(Participant.id)).all()
    audit.record(session, staff_actor(staff), "participants.listed", study_id=access.study.id,
                 count=len(rows))
    return [StaffParticipantRead(participant_code=p.code, status=p.status, arm=p.arm,
                                 consent_version=version, enrolled_at=p.enrolled_at,
                                 withdrawn_at=p.withdrawn_at, withdrawal_level=p.withdrawal_level)
            for p, version in rows]


@router.post("/studies/{slug}/invites", status_code=status.HTTP_201_CREATED, responses=refusals({
    409: "the study is closed or archived (codes study_closed, study_archived)",
    422: "expires_at is not in the future (code invalid_expiry)"}))
def create_invites(body: InviteCreate, session: SessionDep, access: ParticipantLevelAccess,
                   staff: CurrentStaff) -> InvitesRead:
    codes = participant_service.create_invites(
        session, access.study, staff_actor(staff), count=body.count, max_uses=body.max_uses,
        label=body.label, expires_at=body.expires_at)
    return InvitesRead(codes=codes, max_uses=body.max_uses)
