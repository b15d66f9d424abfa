"""Survey endpoints: for the signed-in participant (``/me/surveys``) and by signed one-time link
(``/survey-links/{token}``), plus staff reads of definitions and responses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from api.deps import (
    CONSENTED,
    CSRF_MISSING,
    SESSION_ENDED,
    Bearer,
    ConsentedParticipant,
    CurrentStaff,
    ParticipantToken,
    RowId,
    SessionDep,
    current_participant,
    participant_cookie,
    run_as_consented,
    token_from,
)
from api.errors import DocumentedRoute, refusals, refuses
from api.routers.staff import ParticipantLevelAccess, staff_actor
from study import participants as participant_service
from study.models import Participant
from study.validation import Line
from surveys import registry, safety_rules, service
from surveys import staff as surveys_staff
from surveys.definitions import Instrument
from surveys.models import SurveyAssignment
from surveys.schemas import (
    AnswersUpdate,
    SafetyNoticeRead,
    SavedRead,
    ScoreRead,
    StaffResponseRead,
    SubmittedRead,
    SurveyRead,
    SurveySubmit,
    SurveySummaryRead,
)

router = APIRouter(tags=["surveys"], route_class=DocumentedRoute)
staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)
LINK = {403: "the link belongs to another participant than the one signed in (code link_other_participant), or "
             "its participant withdrew or has not signed the consent in force"}
ANSWERABLE = {409: "the survey was already completed, with another submission_id (code already_completed), "
                   "or is not open yet (code survey_not_open)",
              410: "the survey closed or was cancelled (codes survey_closed, survey_cancelled)",
              422: "an answer does not fit the survey's instrument: an unknown item, a value it does not take, "
                   "or (on submit) a required item left out, one entry per item (code invalid_answers)"}


def _summary(session: SessionDep, assignment: SurveyAssignment,
             instrument: Instrument | None = None) -> SurveySummaryRead:
    instrument = instrument or service.shown(session, assignment)[0]  # its title in the participant's language
    return SurveySummaryRead(assignment_id=assignment.id, instrument=instrument.id, title=instrument.title,
                             purpose=assignment.purpose, intended_at=assignment.intended_at,
                             closes_at=assignment.closes_at)


def _survey_read(session: SessionDep, assignment: SurveyAssignment) -> SurveyRead:
    rendered = service.render(session, assignment)
    summary = _summary(session, assignment, rendered.instrument)
    return SurveyRead(**summary.model_dump(), instrument_version=assignment.instrument_version,
                      language=rendered.language, source=rendered.instrument.source, instructions=rendered.instructions,
                      blocks=[b.model_dump(mode="json") for b in rendered.instrument.blocks],
                      items=rendered.items, saved_answers=rendered.saved_answers, status=assignment.status)


def _safety(found: safety_rules.SafetyNotice | None) -> SafetyNoticeRead | None:
    return None if found is None else SafetyNoticeRead(message=found.message, region=found.region,
                                                      resources=found.resources)


def _submitted(session: Session, participant: Participant, stored: service.Stored) -> SubmittedRead:
    response = stored.response
    assert response.submitted_at is not None
    return SubmittedRead(assignment_id=response.assignment_id, instrument=response.instrument_id,
                         instrument_version=response.instrument_version, submitted_at=response.submitted_at,
                         scores=[ScoreRead(name=s.name, value=s.value, n_items=s.n_items, n_expected=s.n_expected)
                                 for s in stored.scores], safety=_safety(stored.notice),
                         completion_url=participant_service.completion_url(session, participant,
                                                                           service.wave_of(stored.assignment)))


def _saved(stored: service.Stored) -> SavedRead:
    return SavedRead(assignment_id=stored.response.assignment_id, saved_answers=stored.response.answers,
                     safety=_safety(stored.notice), updated_at=stored.response.updated_at)


# The signed-in participant


@router.get("/me/surveys")
def my_pending_surveys(session: SessionDep, participant: ConsentedParticipant) -> list[SurveySummaryRead]:
    return [_summary(session, a) for a in service.pending(session, participant)]


@router.get("/me/surveys/{assignment_id}")
def my_survey(assignment_id: RowId, session: SessionDep, participant: ConsentedParticipant) -> SurveyRead:
    return _survey_read(session, service.owned_assignment(session, participant, assignment_id))


# Autosave and submit run as one unit of work on one worker thread (``run_as_consented``): the hot
# write paths, where a session, a participant and a sync handler would each cost a thread-pool hop.


@router.put("/me/surveys/{assignment_id}/answers", responses=refusals({**CONSENTED, **ANSWERABLE}))
async def save_my_answers(assignment_id: RowId, body: AnswersUpdate, request: Request,
                          token: ParticipantToken) -> SavedRead:
    def work(session: Session, participant: Participant) -> SavedRead:
        return _saved(service.save_partial(session, participant, assignment_id, body.answers))
    return await run_as_consented(request, token, work)


@router.post("/me/surveys/{assignment_id}/submit", responses=refusals({**CONSENTED, **ANSWERABLE}))
async def submit_my_survey(assignment_id: RowId, body: SurveySubmit, request: Request,
                           token: ParticipantToken) -> SubmittedRead:
    def work(session: Session, participant: Participant) -> SubmittedRead:
        return _submitted(session, participant,
                          service.submit(session, participant, assignment_id, body.answers, body.submission_id))
    return await run_as_consented(request, token, work)


# By signed link (from an email); refused if someone else is signed in


@refuses({401: SESSION_ENDED}, on_writes={403: CSRF_MISSING}, sign_in_optional=True)
def _optional_participant(request: Request, session: SessionDep, bearer: Bearer,
                          cookie: Annotated[str | None, Depends(participant_cookie)]) -> Participant | None:
    if bearer is None and not cookie:
        return None
    return current_participant(session, token_from(request, bearer, cookie))


LinkCaller = Annotated[Participant | None, Depends(_optional_participant)]


@router.get("/survey-links/{token}", responses=refusals(LINK))
def linked_survey(token: str, session: SessionDep, caller: LinkCaller) -> SurveyRead:
    assignment, _ = service.assignment_for_link(session, token, caller)
    return _survey_read(session, assignment)


@router.put("/survey-links/{token}/answers", responses=refusals({**LINK, **ANSWERABLE}))
def save_linked_answers(token: str, body: AnswersUpdate, session: SessionDep, caller: LinkCaller) -> SavedRead:
    assignment, participant = service.assignment_for_link(session, token, caller)
    return _saved(service.save_partial(session, participant, assignment.id, body.answers))


@router.post("/survey-links/{token}/submit", responses=refusals({**LINK, **ANSWERABLE}))
def submit_linked_survey(token: str, body: SurveySubmit, session: SessionDep, caller: LinkCaller) -> SubmittedRead:
    assignment, participant = service.assignment_for_link(session, token, caller)
    return _submitted(session, participant,
                      service.submit(session, participant, assignment.id, body.answers, body.submission_id))


# Staff


@staff_router.get("/instruments/{instrument_id}")
def instrument_definition(instrument_id: Line, session: SessionDep, staff: CurrentStaff) -> Instrument:
    """An instrument's items, anchors and scoring rules (newest version)."""
    return registry.get(session, instrument_id)


@staff_router.get("/studies/{slug}/responses", responses=refusals({
    422: "no instrument has this id (code unknown_instrument)"}))
def study_responses(session: SessionDep, access: ParticipantLevelAccess, staff: CurrentStaff,
                    instrument: Annotated[Line | None, Query(max_length=64, description="an instrument id")] = None,
                    ) -> list[StaffResponseRead]:
    return surveys_staff.responses(session, staff_actor(staff), access.study.id, instrument)
