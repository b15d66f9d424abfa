"""Staff reads of a study's survey responses, checked and audited here, whoever calls: the actor
must be a researcher or admin of the study (``study.staff.reader_access``), and the audit entry is
written in the caller's transaction."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from study import audit
from study.errors import Invalid
from study.models import Participant
from study.protocol import unknown_instrument
from study.staff import reader_access
from surveys import registry
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore
from surveys.schemas import StaffResponseRead


def responses(session: Session, actor: audit.Actor, study_id: int,
              instrument: str | None = None) -> list[StaffResponseRead]:
    """Every survey response of the study (only those to ``instrument``) with its answers and
    scores, in the order given; audited as ``responses.read``. Raises Invalid for an unknown instrument."""
    reader_access(session, actor, study_id)
    if instrument is not None and instrument not in (known := registry.catalog(session)):
        raise Invalid(unknown_instrument(instrument, known), code="unknown_instrument")
    query = (select(SurveyResponse, SurveyAssignment, Participant.code)
             .join(SurveyAssignment, SurveyAssignment.id == SurveyResponse.assignment_id)
             .join(Participant, Participant.id == SurveyResponse.participant_id)
             .where(Participant.study_id == study_id).order_by(SurveyResponse.id))
    if instrument:
        query = query.where(SurveyResponse.instrument_id == instrument)
    rows = session.execute(query).all()
    scores: dict[int, dict[str, float | None]] = {}
    for score in session.scalars(select(SurveyScore).where(SurveyScore.response_id.in_([r[0].id for r in rows]))):
        scores.setdefault(score.response_id, {})[score.name] = score.value
    audit.record(session, actor, "responses.read", study_id=study_id, instrument=instrument, count=len(rows))
    return [StaffResponseRead(participant_code=code, assignment_id=a.id, instrument=r.instrument_id,
                              instrument_version=r.instrument_version, purpose=a.purpose,
                              followup_key=a.followup_key, intended_at=a.intended_at,
                              submitted_at=r.submitted_at, answers=r.answers, scores=scores.get(r.id, {}))
            for r, a, code in rows]
