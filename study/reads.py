"""Staff reads of a study's participants, checked and audited here, whoever calls: the actor must
be a researcher or admin of the study (``study.staff.reader_access``), and the audit entry is
written in the caller's transaction. (Invites are listed by ``study.recruitment.list_invites``.)"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from study import audit
from study.models import ConsentSignature, ConsentVersion, Participant
from study.schemas import StaffParticipantRead
from study.staff import reader_access


def participants(session: Session, actor: audit.Actor, study_id: int) -> list[StaffParticipantRead]:
    """Every participant of the study with their status, arm and the consent version they last
    signed (pseudonymous: no contact details); audited as ``participants.listed``."""
    reader_access(session, actor, study_id)
    latest = (select(ConsentSignature.participant_id, func.max(ConsentSignature.id).label("sig_id"))
              .group_by(ConsentSignature.participant_id).subquery())
    rows = session.execute(
        select(Participant, ConsentVersion.version)
        .outerjoin(latest, latest.c.participant_id == Participant.id)
        .outerjoin(ConsentSignature, ConsentSignature.id == latest.c.sig_id)
        .outerjoin(ConsentVersion, ConsentVersion.id == ConsentSignature.consent_version_id)
        .where(Participant.study_id == study_id).order_by(Participant.id)).all()
    audit.record(session, actor, "participants.listed", study_id=study_id, count=len(rows))
    return [StaffParticipantRead(participant_code=p.code, status=p.status, arm=p.arm, consent_version=version,
                                 enrolled_at=p.enrolled_at, withdrawn_at=p.withdrawn_at,
                                 withdrawal_level=p.withdrawal_level)
            for p, version in rows]
