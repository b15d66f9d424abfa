"""Per-wave payment records of a study that recruits on a panel (protocol ``recruitment``): one row
per wave a panel participant completed that the protocol pays for, with the panel's id, when it
was completed and the amount, ready for the panel's bulk payment. Audited; holds the panel id
only (no contact details, no study data), and only for the staff who pay participants."""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import FollowUp
from study import audit
from study.errors import Invalid
from study.models import Participant, Study
from study.staff import reader_access
from study.studies import current_protocol
from surveys.models import SurveyAssignment, SurveyResponse

COLUMNS = ("panel_id", "wave", "occurrence", "completed_at", "amount", "currency")


@dataclass(frozen=True)
class Payment:
    panel_id: str
    wave: str
    occurrence: int
    completed_at: dt.datetime
    amount: float
    currency: str


def payments(session: Session, actor: audit.Actor, study: Study) -> list[Payment]:
    """Every paid wave completed by a participant who came from the study's panel, in completion
    order; audited as ``payments.exported``. Invalid when the study does not recruit on a panel."""
    if actor.type == "staff":
        reader_access(session, actor, study.id)
    panel = current_protocol(session, study.id).recruitment
    if panel is None:
        raise Invalid(f"'{study.slug}' does not recruit on a panel (its protocol has no recruitment section), so "
                      "there are no panel payments", code="no_panel")
    rows = session.execute(
        select(Participant.external_id, SurveyAssignment.purpose, SurveyAssignment.followup_key,
               FollowUp.occurrence, SurveyResponse.submitted_at)
        .join(SurveyAssignment, SurveyAssignment.participant_id == Participant.id)
        .join(SurveyResponse, SurveyResponse.assignment_id == SurveyAssignment.id)
        .outerjoin(FollowUp, FollowUp.assignment_id == SurveyAssignment.id)
        .where(Participant.study_id == study.id, Participant.external_id.is_not(None),
               SurveyResponse.submitted_at.is_not(None))
        .order_by(SurveyResponse.submitted_at, SurveyResponse.id)).all()
    found = [Payment(str(panel_id), wave, occurrence or 0, submitted_at, panel.payments[wave], panel.currency)
             for panel_id, purpose, key, occurrence, submitted_at in rows
             if (wave := key or purpose) in panel.payments and submitted_at is not None]
    audit.record(session, actor, "payments.exported", study_id=study.id, rows=len(found))
    return found


def write_csv(found: list[Payment], path: Path, *, bulk: bool = False) -> int:
    """``found`` as CSV at ``path``: one row per paid wave with a header (``COLUMNS``), or with
    ``bulk`` the panel's bulk-payment form (``panel_id,amount`` per participant, no header: Prolific's
    bulk bonus upload). Returns the rows written."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        if bulk:
            totals: dict[str, float] = {}
            for payment in found:
                totals[payment.panel_id] = totals.get(payment.panel_id, 0.0) + payment.amount
            out.writerows((panel_id, f"{amount:.2f}") for panel_id, amount in totals.items())
            return len(totals)
        out.writerow(COLUMNS)
        out.writerows((p.panel_id, p.wave, p.occurrence, p.completed_at.astimezone(dt.UTC).isoformat(),
                       f"{p.amount:.2f}", p.currency) for p in found)
        return len(found)
