"""Staff reads of a study's participants, checked and audited here, whoever calls: a staff actor must
be a researcher or admin of the study (``study.staff.reader_access``; the system actor is the command
line, which holds the database anyway), and the audit entry is written in the caller's transaction.
(Invites are listed by ``study.recruitment.list_invites``.)"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from study import audit
from study.models import ConsentSignature, ConsentVersion, Participant, ParticipantStatus
from study.schemas import StaffParticipantRead
from study.staff import reader_access


@dataclass(frozen=True)
class ParticipantFilter:
    """What the staff API's query and ``afterward participants list`` narrow a listing by (all given
    conditions hold; an enrollment bound compares with ``enrolled_at``, so it leaves out the never enrolled)."""

    status: ParticipantStatus | None = None
    arm: str | None = None
    consent_version: str | None = None
    enrolled_since: dt.datetime | None = None
    enrolled_before: dt.datetime | None = None

    def given(self) -> dict[str, str]:
        return {name: str(value) for name, value in asdict(self).items() if value is not None}


def participants(session: Session, actor: audit.Actor, study_id: int,
                 where: ParticipantFilter = ParticipantFilter()) -> list[StaffParticipantRead]:
    """The study's participants that ``where`` admits, with their status, arm and the consent version
    they last signed (pseudonymous: no contact details); audited as ``participants.listed`` with the
    filter. Arms stay visible while a study is blinded: blinding hides outcomes by arm, and enrollment
    by arm is no outcome (``analysis.plan``)."""
    if actor.type == "staff":
        reader_access(session, actor, study_id)
    latest = (select(ConsentSignature.participant_id, func.max(ConsentSignature.id).label("sig_id"))
              .group_by(ConsentSignature.participant_id).subquery())
    rows = session.execute(
        select(Participant, ConsentVersion.version)
        .outerjoin(latest, latest.c.participant_id == Participant.id)
        .outerjoin(ConsentSignature, ConsentSignature.id == latest.c.sig_id)
        .outerjoin(ConsentVersion, ConsentVersion.id == ConsentSignature.consent_version_id)
        .where(Participant.study_id == study_id, *_conditions(where)).order_by(Participant.id)).all()
    audit.record(session, actor, "participants.listed", study_id=study_id, count=len(rows), **where.given())
    return [StaffParticipantRead(participant_code=p.code, status=p.status, arm=p.arm, consent_version=version,
                                 enrolled_at=p.enrolled_at, withdrawn_at=p.withdrawn_at,
                                 withdrawal_level=p.withdrawal_level)
            for p, version in rows]


def _conditions(where: ParticipantFilter) -> list:
    conditions = []
    if where.status is not None:
        conditions.append(Participant.status == where.status)
    if where.arm is not None:
        conditions.append(Participant.arm == where.arm)
    if where.consent_version is not None:
        conditions.append(ConsentVersion.version == where.consent_version)
    if where.enrolled_since is not None:
        conditions.append(Participant.enrolled_at >= where.enrolled_since)
    if where.enrolled_before is not None:
        conditions.append(Participant.enrolled_at < where.enrolled_before)
    return conditions
