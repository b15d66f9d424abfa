"""Staff endpoints. Aggregates are open to every role in a study; participant-level data only to
admins and researchers, and every such read is audited."""

from __future__ import annotations

from typing import Annotated, Any

import pandas as pd
from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, Field

from analysis import operations
from analysis.aggregates import ALL, aggregate_tables
from api.client_address import client_address
from api.deps import CurrentStaff, SessionDep
from api.errors import DocumentedRoute, error_body, refusals, refuses
from study import audit, reads
from study import participants as participant_service
from study import staff as service
from study.models import ParticipantStatus, StudyStatus
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
from study.validation import Line

router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)


NO_STUDY_ACCESS = "you have no role in this study (an unknown study looks the same: code no_study_access)"


@refuses({403: NO_STUDY_ACCESS})
def study_access(slug: Line, session: SessionDep, staff: CurrentStaff) -> service.StudyAccess:
    return service.study_access(session, staff, slug)


@refuses({403: "your role in this study (viewer) sees aggregate figures only"})
async def participant_level_access(
    access: Annotated[service.StudyAccess, Depends(study_access)],
) -> service.StudyAccess:
    return service.participant_level(access)


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
    """The summary as a viewer sees it: cells of the study's aggregate tables (``analysis.aggregates``),
    suppressed together with every other number a viewer is shown (the dashboard's pages, the
    aggregate export), so none can be worked out from another. A count is a number, "< 5" or
    "suppressed"."""

    study: str
    protocol_version: int
    consent_version: str
    participants_by_status: dict[str, int | str] = Field(description=(
        "participants assigned to an arm, enrolled or withdrawn (the enrollment table's 'all' row)"))
    enrolled_by_arm: dict[str, int | str] = Field(description="participants assigned to each arm (enrollment table)")
    followups_by_wave: dict[str, dict[str, int | str]] = Field(description=(
        "per wave, the surveys due, completed, expired and pending in all arms (followups table)"))
    safety_events_total: int | str = Field(description="safety events (safety_reviews table, 'all' row)")
    safety_events_unreviewed: int | str
    safety_events_participant_deleted: int | str = Field(description=(
        "de-identified records: the participant withdrew and deleted data"))
    safety_events_unreviewed_participant_deleted: int | str
    channel_alerts_open: int


def viewer_summary(versions: dict[str, Any], tables: dict[str, pd.DataFrame]) -> ViewerStudySummaryRead:
    """The viewer's summary: the study, its versions and the open channel alerts (``versions``),
    and every count a cell of the suppressed aggregate tables ``tables``."""
    enrollment = tables["enrollment"].set_index("arm")
    waves = tables["followups"][tables["followups"]["arm"] == ALL].set_index("wave")
    reviews = tables["safety_reviews"].set_index("review_status")
    return ViewerStudySummaryRead(
        **versions, participants_by_status={status: enrollment.at[ALL, status] for status in ("enrolled", "withdrawn")},
        enrolled_by_arm={arm: enrollment.at[arm, "participants"] for arm in enrollment.index if arm != ALL},
        followups_by_wave={wave: {c: waves.at[wave, c] for c in ("due", "completed", "expired", "pending")}
                           for wave in waves.index},
        safety_events_total=reviews.at[ALL, "total"], safety_events_unreviewed=reviews.at["unreviewed", "total"],
        safety_events_participant_deleted=reviews.at[ALL, "data_deleted"],
        safety_events_unreviewed_participant_deleted=reviews.at["unreviewed", "data_deleted"])


@router.get("/studies/{slug}/summary")
def study_summary(session: SessionDep, access: StudyAccess) -> StudySummaryRead | ViewerStudySummaryRead:
    """The study's counts; for viewers, cells of the aggregate tables with their suppression rule
    (``analysis.aggregates``: under 5 participants "< 5", and "suppressed" where a hidden count
    could be worked out from the others, in this summary, the dashboard or the aggregate export)."""
    study_id = access.study.id
    versions = {"study": access.study.slug, "protocol_version": current_version(session, study_id).version,
                "consent_version": current_consent(session, study_id).version,
                "channel_alerts_open": operations.open_alert_count(session)}
    if not access.participant_level:
        return viewer_summary(versions, aggregate_tables(session, study_id))
    return StudySummaryRead(**versions, **vars(operations.study_counts(session, study_id)))


@router.get("/studies/{slug}/participants")
def list_participants(
    session: SessionDep, access: ParticipantLevelAccess, staff: CurrentStaff,
    status: Annotated[ParticipantStatus | None, Query(description="only participants in this state")] = None,
    arm: Annotated[Line | None, Query(max_length=64, description="only participants randomized to this arm")] = None,
    consent_version: Annotated[Line | None, Query(
        max_length=64, description="only participants whose latest signature is of this consent version")] = None,
    enrolled_since: Annotated[AwareDatetime | None, Query(
        description="only participants enrolled at or after this time (with a time zone)")] = None,
    enrolled_before: Annotated[AwareDatetime | None, Query(
        description="only participants enrolled before this time (with a time zone)")] = None,
) -> list[StaffParticipantRead]:
    """The study's participants (pseudonymous: no contact details), narrowed by the filters given;
    audited with the filters."""
    where = reads.ParticipantFilter(status=status, arm=arm, consent_version=consent_version,
                                    enrolled_since=enrolled_since, enrolled_before=enrolled_before)
    return reads.participants(session, staff_actor(staff), access.study.id, where)


@router.post("/studies/{slug}/invites", status_code=status.HTTP_201_CREATED, responses=refusals({
    409: "the study is closed or archived (codes study_closed, study_archived)",
    422: "expires_at is not in the future (code invalid_expiry)"}))
def create_invites(body: InviteCreate, session: SessionDep, access: ParticipantLevelAccess,
                   staff: CurrentStaff) -> InvitesRead:
    codes = participant_service.create_invites(
        session, access.study, staff_actor(staff), count=body.count, max_uses=body.max_uses,
        label=body.label, expires_at=body.expires_at)
    return InvitesRead(codes=codes, max_uses=body.max_uses)
