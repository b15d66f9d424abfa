"""Sign-in links participants asked for (``study.signin`` queues them) as an outbox kind: emailed
to the address on file while the link is still good."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from scheduler.channels import DeliveryError, SignInChannel, SignInLinkMessage
from scheduler.outbox import OutboxKind
from study import i18n, signin
from study.clock import now
from study.models import Participant, SignInEmail
from study.security import decrypt_contact
from study.settings import Settings

SIGN_IN_ALERTS = "sign-in email"  # the alert "channel" of failing sign-in link emails


class SignInEmails(OutboxKind[SignInLinkMessage]):
    model = SignInEmail
    noun = "sign-in email"
    message_noun = "the sign-in email"
    counter = "sign_in_sent"

    def __init__(self, settings: Settings, channel: SignInChannel) -> None:
        super().__init__(settings)
        self.channel = channel

    def study(self) -> Any:
        return select(Participant.study_id).where(Participant.id == SignInEmail.participant_id).scalar_subquery()

    def about(self, row: Row[Any]) -> str:
        return f"sign-in email {row.id}"

    def where(self, row: Row[Any]) -> str:
        return f"sign-in email {row.id}"

    def alert_channel(self, row: Row[Any]) -> str:
        return SIGN_IN_ALERTS

    def compose(self, session: Session, row: Row[Any]) -> tuple[SignInLinkMessage | None, str | None]:
        email = session.get(SignInEmail, row.id)
        assert email is not None
        participant = session.get(Participant, email.participant_id)
        if participant is None or participant.is_withdrawn or participant.contact_email_encrypted is None:
            return None, "the participant withdrew or has no contact email any more"
        if email.expires_at <= now():
            return None, "the link expired before it could be sent"
        try:
            address = decrypt_contact(participant.contact_email_encrypted)
        except ValueError as exc:  # a key was rotated out: no retry can read it
            raise DeliveryError("unreadable_contact", str(exc), permanent=True) from None
        token = signin.link_token(signin.EMAIL_LINK, participant.id, email.idempotency_key, email.expires_at)
        language = participant.language or i18n.SOURCE
        return SignInLinkMessage(
            idempotency_key=email.idempotency_key, to_email=address,
            link=signin.link_url(self.settings.base_url, token),
            expires_at_text=i18n.moment_text(email.expires_at, participant.timezone, language), language=language), None

    def sender(self, row: Row[Any]) -> tuple[str, Callable[[SignInLinkMessage], None] | None]:
        return "the sign-in email", self.channel.send_sign_in

    def deadline(self, session: Session, record: Any) -> dt.datetime | None:
        return record.expires_at
