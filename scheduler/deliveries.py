"""Follow-up deliveries as an outbox kind: the invitation and reminders of an open survey, on
email and webhook (the in-app record is written sent when the follow-up is opened)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Row, Select, select, update
from sqlalchemy.orm import Session

from scheduler.channels import Channel, DeliveryError, Invitation
from scheduler.models import Delivery, FollowUp, FollowUpStatus
from scheduler.outbox import OutboxKind
from study import i18n, signin
from study.clock import now
from study.models import Participant, ParticipantStatus
from study.outbox import OutboxStatus
from study.security import decrypt_contact
from study.settings import Settings
from study.studies import current_protocol
from surveys import service as survey_service
from surveys.models import SurveyAssignment


class Deliveries(OutboxKind[Invitation]):
    model = Delivery
    noun = "delivery"
    message_noun = "the message"
    counter = "sent"

    def __init__(self, settings: Settings, channels: dict[str, Channel]) -> None:
        super().__init__(settings)
        self.channels = channels

    def columns(self) -> Sequence[Any]:
        return (Delivery.channel, Delivery.kind, Delivery.idempotency_key, Delivery.followup_id,
                Delivery.participant_id)

    def study(self) -> Any:
        return select(FollowUp.study_id).where(FollowUp.id == Delivery.followup_id).scalar_subquery()

    def claim(self, at: dt.datetime, only: int | None) -> Select[Any]:
        if only is None:
            return super().claim(at, only).where(Delivery.channel != "in_app")
        return select(Delivery.id, Delivery.status, Delivery.attempts, *self.columns()).where(
            Delivery.id == only, Delivery.status.in_((OutboxStatus.PENDING, OutboxStatus.FAILED)))

    def about(self, row: Row[Any]) -> str:
        return f"delivery {row.id}"

    def where(self, row: Row[Any]) -> str:
        return f"{row.channel}: delivery {row.id}"

    def alert_channel(self, row: Row[Any]) -> str:
        return str(row.channel)

    def compose(self, session: Session, row: Row[Any]) -> tuple[Invitation | None, str | None]:
        followup = session.get(FollowUp, row.followup_id)
        assert followup is not None
        participant = session.get(Participant, row.participant_id)
        assignment = session.get(SurveyAssignment, followup.assignment_id) if followup.assignment_id else None
        if participant is None or participant.status != ParticipantStatus.ENROLLED:
            return None, "the participant withdrew"
        if assignment is None or assignment.status != "open" or followup.status != FollowUpStatus.SENT:
            return None, "the survey is no longer open (completed, expired or cancelled)"
        if assignment.closes_at is not None and assignment.closes_at <= now():
            return None, "the survey window closed"
        # Participants see the public title only: the internal one may name the hypothesis.
        instrument, language = survey_service.shown(session, assignment)  # in the participant's language
        study_title = current_protocol(session, participant.study_id).study.title_in(participant.language)
        email = None
        if row.channel == "email" and participant.contact_email_encrypted:
            try:
                email = decrypt_contact(participant.contact_email_encrypted)
            except ValueError as exc:  # a key was rotated out: no retry can read it
                raise DeliveryError("unreadable_contact", str(exc), permanent=True) from None
        closes = (i18n.moment_text(assignment.closes_at, participant.timezone, language) if assignment.closes_at
                  else i18n.gettext(language, "it is done"))
        # Signs the participant in to My study once, for as long as the survey is open.
        sign_in = signin.link_url(self.settings.base_url, signin.link_token(
            signin.FOLLOWUP_LINK, participant.id, row.idempotency_key, followup.closes_at))
        return Invitation(
            idempotency_key=row.idempotency_key, kind=row.kind, participant_code=participant.code,
            to_email=email, study_title=study_title, survey_title=instrument.title,
            link=f"{self.settings.base_url.rstrip('/')}/s/{survey_service.link_token(assignment)}",
            closes_at_text=closes, sign_in_link=sign_in, language=language), None

    def sender(self, row: Row[Any]) -> tuple[str, Callable[[Invitation], None] | None]:
        channel = self.channels.get(row.channel)
        return f"the {row.channel} channel", None if channel is None else channel.send

    def deadline(self, session: Session, record: Any) -> dt.datetime | None:
        followup = session.get(FollowUp, record.followup_id)
        return None if followup is None else followup.closes_at

    def sent(self, session: Session, row: Row[Any]) -> None:
        if row.kind == "reminder":
            session.execute(update(FollowUp).where(FollowUp.id == row.followup_id)
                            .values(reminders_sent=FollowUp.reminders_sent + 1))

