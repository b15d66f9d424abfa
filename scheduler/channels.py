"""Delivery channels: email (SMTP), webhook (signed JSON POST) and in-app; the on-call
channels that tell the protocol's safety contacts about an escalation (email, webhook); and the
email of a sign-in link a participant asked for.

A channel either returns (delivered) or raises ``DeliveryError`` naming the problem, so the
dispatcher can retry, give up on one address, or alert staff about the channel itself. (The
dispatcher treats any other exception from a channel as a retryable failure too.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import html
import json
import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate
from typing import Protocol

import httpx

from study import i18n
from study.settings import Settings
from study.validation import email_address


class DeliveryError(Exception):
    """``problem``: about the channel itself, auth_refused | unreachable | rejected; about one
    delivery, bouncing (no, invalid or refused address) | unreadable_contact | error (an unexpected
    exception). ``permanent`` means this message will never go through on this channel (retrying
    cannot help)."""

    def __init__(self, problem: str, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.problem = problem
        self.permanent = permanent


@dataclass(frozen=True)
class Invitation:
    idempotency_key: str
    kind: str  # invitation | reminder
    participant_code: str
    to_email: str | None
    study_title: str
    survey_title: str
    link: str
    closes_at_text: str  # in the participant's time zone and language
    sign_in_link: str | None = None  # signs the participant in to "My study", once (study.signin)
    language: str = "en"  # the participant's: the email is written in it (study.i18n)


@dataclass(frozen=True)
class SignInLinkMessage:
    """A sign-in link a participant asked for, to the address on file. It names no study: the
    address may be someone else's who typed it, and a study's title may say what it tests."""

    idempotency_key: str
    to_email: str
    link: str
    expires_at_text: str  # in the participant's time zone and language
    language: str = "en"  # the participant's: the email is written in it


@dataclass(frozen=True)
class OnCallNotice:
    """What a safety contact is told of a safety event whose level pages (an escalation, an
    unanswered check-in): the study, the level, the category, the time and where staff read the
    event. Never who the participant is or what they wrote."""

    idempotency_key: str
    recipient: str  # an email address or a webhook URL
    study: str  # the study's slug
    study_title: str
    event_id: int
    category: str
    raised_at: dt.datetime
    round: int  # 0: newly paging; n: still unreviewed n re-notify periods after it started to page
    link: str
    level: str = "escalation"  # study.safety.SafetyLevel
    source: str = "chat"  # what raised it: a chat message, or "survey" (a safety rule on survey answers)


# How each level is named to the on-call contacts, and what it means.
LEVEL_NAMES = {"escalation": "Safety escalation", "unanswered": "Unanswered safety check-in",
               "check_in": "Safety check-in"}
LEVEL_OPENINGS = {
    "escalation": "A participant's message was escalated for safety review.",
    "unanswered": ("A participant who showed a sign of risk did not answer the safety check-in in time (or withdrew "
                   "before answering)."),
    "check_in": "A participant's message showed a sign of risk and was met by a safety check-in.",
}


class Channel(Protocol):
    name: str

    def send(self, message: Invitation) -> None: ...


class OnCallChannel(Protocol):
    name: str

    def notify(self, notice: OnCallNotice) -> None: ...


class SignInChannel(Protocol):
    name: str

    def send_sign_in(self, message: SignInLinkMessage) -> None: ...


def subject(message: Invitation) -> str:
    values = {"survey": message.survey_title, "study": message.study_title}
    if message.kind == "reminder":
        return i18n.gettext(message.language, "Reminder: %(survey)s (%(study)s)", **values)
    return i18n.gettext(message.language, "%(survey)s (%(study)s)", **values)


def _opening(message: Invitation) -> str:
    if message.kind == "reminder":
        return i18n.gettext(message.language, "A reminder: your survey is still open.")
    return i18n.gettext(message.language, "It's time for a short follow-up survey in the study you joined.")


def _until(message: Invitation) -> str:
    return i18n.gettext(message.language, "The link works until %(closes)s and only for you.",
                        closes=message.closes_at_text)


def text_body(message: Invitation) -> str:
    hello = i18n.gettext(message.language, "Hello,")
    return (f"{hello}\n\n{_opening(message)}\n\n{message.survey_title}\n{message.link}\n\n"
            f"{_until(message)}\n"
            f"{_my_study_text(message)}\n\n"
            f"{message.study_title}\n")


def _my_study_text(message: Invitation) -> str:
    if message.sign_in_link is None:
        return i18n.gettext(message.language, "You can stop taking part at any time from the \"My study\" page.")
    told = i18n.gettext(message.language, "Your surveys, the chat, and stopping at any time are on your \"My study\" "
                        "page. This link signs you in to it (once, until the survey closes):")
    return f"{told}\n{message.sign_in_link}"


def html_body(message: Invitation) -> str:
    e = html.escape
    language = message.language
    if message.sign_in_link is None:
        my_study = e(i18n.gettext(language, "You can stop taking part at any time from the \"My study\" page."))
    else:
        linked = e(i18n.gettext(language, "sign in to My study"))
        my_study = (e(i18n.gettext(language, "Your surveys, the chat, and stopping at any time are on your "
                                             "\"My study\" page:"))
                    + f" <a href=\"{e(message.sign_in_link)}\">{linked}</a> "
                    + e(i18n.gettext(language, "(this link works once, until the survey closes).")))
    hello = e(i18n.gettext(language, "Hello,"))
    return (f"<!doctype html><html lang=\"{e(language)}\"><body style=\"font-family:sans-serif;line-height:1.5\">"
            f"<p>{hello}</p><p>{e(_opening(message))}</p>"
            f"<p><a href=\"{e(message.link)}\">{e(message.survey_title)}</a></p>"
            f"<p>{e(_until(message))}<br>{my_study}</p>"
            f"<p>{e(message.study_title)}</p></body></html>")


def sign_in_text(message: SignInLinkMessage) -> str:
    language = message.language
    return (i18n.gettext(language, "Hello,") + "\n\n"
            + i18n.gettext(language, "Someone asked to sign in again to the study you are taking part in, with this "
                                     "email address. To sign in, open this link:")
            + f"\n\n{message.link}\n\n"
            + i18n.gettext(language, "It works once, until %(expires)s, and only for you: please don't forward it.",
                           expires=message.expires_at_text) + "\n"
            + i18n.gettext(language, "If you did not ask for it, you can ignore this email; nothing changes.") + "\n")


def notice_subject(notice: OnCallNotice) -> str:
    what = f"{LEVEL_NAMES[notice.level]} ({notice.category.replace('_', ' ')}) in {notice.study_title}"
    return f"Not yet reviewed: {what}" if notice.round else what


# A safety rule on survey answers (surveys.safety_rules) opens its notice with what it is.
SURVEY_OPENING = "A participant's answers to a questionnaire met one of the study's safety rules."


def notice_text(notice: OnCallNotice) -> str:
    first = SURVEY_OPENING if notice.source == "survey" else LEVEL_OPENINGS[notice.level]
    opening = first if not notice.round else f"A {LEVEL_NAMES[notice.level].lower()} has not been reviewed yet."
    return (f"{opening}\n\nStudy: {notice.study_title} ({notice.study})\n"
            f"Level: {notice.level.replace('_', '-')}\nCategory: {notice.category.replace('_', ' ')}\n"
            f"Raised: {notice.raised_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC\nEvent: {notice.event_id}\n\n"
            f"Read and review it (staff sign-in needed):\n{notice.link}\n\n"
            "This notice leaves out who the participant is and what they wrote; only staff can read "
            "them, in the platform.\n")


def message_id(idempotency_key: str, domain: str) -> str:
    return f"<{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}@{domain}>"


class EmailChannel:
    name = "email"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _headers(self, recipient: str, subject_line: str, idempotency_key: str, whose: str) -> EmailMessage:
        """A message with its headers. The edge validates addresses too; this is the last line
        before a header is written: one address, no list (strangers in copy) and no CR/LF
        (injected headers). A stored address was normalized at the edge, so a line break here
        (which the validator would strip) means it was bypassed: refused, not repaired."""
        try:
            if "\r" in recipient or "\n" in recipient:
                raise ValueError("a line break in an address could add mail headers")
            to = email_address(recipient)
        except ValueError as exc:
            raise DeliveryError("bouncing", f"{whose} is refused: {exc}", permanent=True) from None
        sender = self.settings.mail_from
        email = EmailMessage()
        email["From"] = sender
        email["To"] = to
        email["Subject"] = subject_line
        email["Date"] = formatdate(localtime=False)
        email["Message-ID"] = message_id(idempotency_key, sender.rsplit("@", 1)[-1].strip(">"))
        email["Auto-Submitted"] = "auto-generated"
        return email

    def compose(self, message: Invitation) -> EmailMessage:
        if not message.to_email:
            raise DeliveryError("bouncing", "the participant has no contact email", permanent=True)
        email = self._headers(message.to_email, subject(message), message.idempotency_key, "the contact email")
        email.set_content(text_body(message))
        email.add_alternative(html_body(message), subtype="html")
        email["Content-Language"] = message.language  # after the content, which sets its own Content- headers
        return email

    def compose_notice(self, notice: OnCallNotice) -> EmailMessage:
        """The on-call email: plain text, no participant and nothing they wrote."""
        email = self._headers(notice.recipient, notice_subject(notice), notice.idempotency_key,
                              "the safety contact's email")
        email["Importance"] = "high"
        email.set_content(notice_text(notice))
        return email

    def compose_sign_in(self, message: SignInLinkMessage) -> EmailMessage:
        email = self._headers(message.to_email, i18n.gettext(message.language, "Your sign-in link"),
                              message.idempotency_key, "the contact email")
        email.set_content(sign_in_text(message))
        email["Content-Language"] = message.language
        return email

    def send(self, message: Invitation) -> None:
        self._transmit(self.compose(message))

    def send_sign_in(self, message: SignInLinkMessage) -> None:
        self._transmit(self.compose_sign_in(message))

    def notify(self, notice: OnCallNotice) -> None:
        self._transmit(self.compose_notice(notice))

    def _transmit(self, email: EmailMessage) -> None:
        s = self.settings
        try:
            with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.smtp_timeout_seconds) as smtp:
                if s.smtp_starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if s.smtp_username:
                    password = s.smtp_password.get_secret_value() if s.smtp_password else ""
                    smtp.login(s.smtp_username, password)
                smtp.send_message(email)
        except smtplib.SMTPAuthenticationError as exc:
            raise DeliveryError("auth_refused", f"the mail server refused the login: {exc.smtp_code}") from exc
        except smtplib.SMTPRecipientsRefused as exc:
            raise DeliveryError("bouncing", "the mail server refused the address", permanent=True) from exc
        except smtplib.SMTPResponseException as exc:
            permanent = 500 <= exc.smtp_code < 600
            raise DeliveryError("rejected", f"the mail server answered {exc.smtp_code}", permanent=permanent) from exc
        except (OSError, smtplib.SMTPException) as exc:
            raise DeliveryError("unreachable", f"cannot reach the mail server at {s.smtp_host}:{s.smtp_port}: "
                                               f"{type(exc).__name__}") from exc


class WebhookChannel:
    """POST JSON to the study's own system (an SMS gateway, say), signed with HMAC-SHA256."""

    name = "webhook"

    def __init__(self, settings: Settings) -> None:
        if not settings.webhook_url or settings.webhook_secret is None:
            raise ValueError("the webhook channel needs AFTERWARD_WEBHOOK_URL and AFTERWARD_WEBHOOK_SECRET")
        self.url = settings.webhook_url
        self.secret = settings.webhook_secret.get_secret_value().encode()
        self.timeout = settings.smtp_timeout_seconds

    def body(self, message: Invitation) -> bytes:
        return json.dumps({"kind": message.kind, "participant": message.participant_code,
                           "survey": message.survey_title, "link": message.link,
                           "closes": message.closes_at_text}, sort_keys=True).encode()

    def signature(self, body: bytes) -> str:
        return "sha256=" + hmac.new(self.secret, body, hashlib.sha256).hexdigest()

    def send(self, message: Invitation) -> None:
        body = self.body(message)
        _post_json(self.url, body, {"Idempotency-Key": message.idempotency_key,
                                    "X-Afterward-Signature": self.signature(body)}, self.timeout)


class OnCallWebhookChannel:
    """POST an on-call notice as JSON to a safety contact's webhook (from the protocol), with an
    ``Idempotency-Key``; signed like the webhook channel when ``AFTERWARD_WEBHOOK_SECRET`` is set."""

    name = "webhook"

    def __init__(self, settings: Settings) -> None:
        self.secret = settings.webhook_secret.get_secret_value().encode() if settings.webhook_secret else None
        self.timeout = settings.smtp_timeout_seconds

    def body(self, notice: OnCallNotice) -> bytes:
        return json.dumps({"kind": f"safety_{notice.level}", "level": notice.level, "study": notice.study,
                           "study_title": notice.study_title, "event_id": notice.event_id, "category": notice.category,
                           "raised_at": notice.raised_at.astimezone(dt.UTC).isoformat(),
                           "round": notice.round, "link": notice.link, "source": notice.source},
                          sort_keys=True).encode()

    def notify(self, notice: OnCallNotice) -> None:
        body = self.body(notice)
        headers = {"Idempotency-Key": notice.idempotency_key}
        if self.secret is not None:
            headers["X-Afterward-Signature"] = "sha256=" + hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        _post_json(notice.recipient, body, headers, self.timeout)


def _post_json(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    try:
        response = httpx.post(url, content=body, headers={"Content-Type": "application/json", **headers},
                              timeout=timeout)
    except httpx.HTTPError as exc:
        raise DeliveryError("unreachable", f"cannot reach the webhook: {type(exc).__name__}") from exc
    if response.status_code in (401, 403):
        raise DeliveryError("auth_refused", f"the webhook refused the signature ({response.status_code})")
    if 400 <= response.status_code < 500:
        raise DeliveryError("rejected", f"the webhook answered {response.status_code}", permanent=True)
    if response.status_code >= 300:
        raise DeliveryError("unreachable", f"the webhook answered {response.status_code}")


class InAppChannel:
    """Nothing to send: an open survey is listed in the app the next time the participant looks."""

    name = "in_app"

    def send(self, message: Invitation) -> None:
        return None
