"""On-call notices of safety events: what the dispatcher plans and what a notice says.

Every risk finding is a safety event (``study.safety.SafetyEvent``) at a level, committed with the
reply that raised it (or raised by the check-in's answers, or by its deadline: ``scheduler.checkins``);
it is the durable record these notices are derived from. Only levels the protocol's
``safety.triage.page`` lists page (default: escalations and unanswered check-ins), from when the
level started to (``page_since``). Each poll, the dispatcher plans one notice per safety contact
of the study's protocol for every paging event that waits for review: round 0 while it has paged
for less than the protocol's ``renotify_after``, round n once it has paged n periods and is still
unreviewed. A notice's idempotency key names the event, the level (but for escalations, whose
keys predate levels), the round and the contact, and is unique, so however many dispatchers plan
at once each notice exists once (and is sent once, claimed like a delivery); a contact is told
again when a new period starts, and at once when the event rises to another paging level.

Notices are about the study's safety, not contact with the participant: they name no
participant, carry no message text, and withdrawal does not cancel them. A dispatcher plans only
for the channels it can send on (a simulation's dispatcher, with none, tells nobody), and the live
dispatcher plans none for a simulated study's events (``scheduler.scope``). Notices are
sent through the outbox (``OnCallNotices``); a failing one raises a staff alert at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import Row, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.channels import EmailChannel, OnCallChannel, OnCallNotice, OnCallWebhookChannel
from scheduler.models import SafetyNotification
from scheduler.outbox import OutboxKind
from scheduler.scope import LIVE, Scope
from study.db import is_postgres
from study.models import Study
from study.outbox import OutboxStatus
from study.protocol import Protocol
from study.safety import SafetyEvent, SafetyLevel
from study.settings import Settings
from study.studies import current_protocol

log = logging.getLogger("afterward.scheduler")
ALERT_PREFIX = "on-call "  # the alert "channel" of a failing notice: "on-call email", "on-call webhook"


def build_oncall_channels(settings: Settings) -> dict[str, OnCallChannel]:
    return {"email": EmailChannel(settings), "webhook": OnCallWebhookChannel(settings)}


def event_link(settings: Settings, study_slug: str, event_id: int) -> str:
    """Where staff read and review the event: the dashboard's safety review of it, after signing in
    (``dashboard.views.safety`` reads these parameters). Only the study's slug and the event's id:
    no participant, nothing they wrote, no secret."""
    query = urlencode({"study": study_slug, "event": event_id})
    return f"{settings.dashboard_url.rstrip('/')}/safety?{query}"


def notification_round(protocol: Protocol, page_since: dt.datetime, at: dt.datetime) -> int:
    """0 for an event that just started to page; n once it has paged unreviewed for n re-notify periods."""
    return max(0, (at - page_since) // protocol.safety.renotify_after)


def contacts(protocol: Protocol, channels: Collection[str]) -> list[tuple[str, str]]:
    """(channel, recipient) of every safety contact reachable on one of ``channels``."""
    return [(channel, recipient) for contact in protocol.safety.contacts
            for channel, recipient in (("email", contact.email), ("webhook", contact.webhook))
            if recipient is not None and channel in channels]


def idempotency_key(event_id: int, round_: int, channel: str, recipient: str, level: str = "escalation") -> str:
    contact = hashlib.sha256(recipient.encode()).hexdigest()[:16]
    paging = "" if level == SafetyLevel.ESCALATION else f"{level}-"
    return f"safety-{event_id}-{paging}{round_}-{channel}-{contact}"


def plan(session: Session, at: dt.datetime, channels: Collection[str], scope: Scope = LIVE) -> int:
    """Add the notices due now for every paging safety event of the ``scope``'s studies that waits
    for review (none twice, whoever else is planning: inserts that would repeat a key are skipped
    by the database). Returns how many this call added, or tried to add when another dispatcher
    got there first."""
    if not channels:
        return 0
    # In id order, so dispatchers planning at once insert in the same order (no deadlock).
    unreviewed = session.execute(select(SafetyEvent.id, SafetyEvent.study_id, SafetyEvent.page_since,
                                        SafetyEvent.level)
                                 .where(SafetyEvent.reviewed_at.is_(None), SafetyEvent.page_since.is_not(None),
                                        scope.covers(SafetyEvent.study_id))
                                 .order_by(SafetyEvent.id)).all()
    wanted: dict[str, dict[str, Any]] = {}
    protocols: dict[int, Protocol | None] = {}
    for event_id, study_id, page_since, level in unreviewed:
        if study_id not in protocols:
            try:
                protocols[study_id] = current_protocol(session, study_id)
            except Exception:  # one study's unreadable protocol must not silence the others' notices
                log.exception("study %s: its protocol cannot be read; its safety contacts are not notified", study_id)
                protocols[study_id] = None
        protocol = protocols[study_id]
        if protocol is None or page_since is None or not protocol.safety.triage.pages(level):
            continue  # unreadable, or the protocol no longer pages this level
        round_ = notification_round(protocol, page_since, at)
        for channel, recipient in contacts(protocol, channels):
            key = idempotency_key(event_id, round_, channel, recipient, level)
            wanted[key] = {"safety_event_id": event_id, "study_id": study_id, "round": round_, "channel": channel,
                           "recipient": recipient, "idempotency_key": key, "status": OutboxStatus.PENDING,
                           "attempts": 0, "next_attempt_at": at, "created_at": at}
    if not wanted:
        return 0
    known = set(session.scalars(select(SafetyNotification.idempotency_key)
                                .where(SafetyNotification.idempotency_key.in_(list(wanted)))))
    missing = [row for key, row in wanted.items() if key not in known]
    if missing:
        insert = postgresql.insert if is_postgres(session) else sqlite.insert
        session.execute(insert(SafetyNotification).on_conflict_do_nothing(index_elements=["idempotency_key"]),
                        missing)
    return len(missing)


def compose(session: Session, settings: Settings, notification_id: int) -> tuple[OnCallNotice | None, str | None]:
    """The notice to send, or why there is nothing to send any more (the event was reviewed)."""
    notification = session.get(SafetyNotification, notification_id)
    assert notification is not None
    event = session.get(SafetyEvent, notification.safety_event_id)
    if event is None:
        return None, "the safety event no longer exists"
    if event.reviewed_at is not None:
        return None, "the event was reviewed before this notice went out"
    if event.page_since is None:
        return None, "the event no longer pages"
    study = session.get(Study, event.study_id)
    assert study is not None
    return OnCallNotice(
        idempotency_key=notification.idempotency_key, recipient=notification.recipient, study=study.slug,
        study_title=study.title, event_id=event.id, category=event.category, raised_at=event.created_at,
        round=notification.round, link=event_link(settings, study.slug, event.id), level=event.level,
        source="survey" if event.source == "survey" else "chat"), None


class OnCallNotices(OutboxKind[OnCallNotice]):
    model = SafetyNotification
    noun = "on-call notice"
    message_noun = "the notice"
    counter = "notified"

    def __init__(self, settings: Settings, channels: dict[str, OnCallChannel]) -> None:
        super().__init__(settings)
        self.channels = channels
        self.alert_after = 1  # a notice that does not arrive is a safety problem, not a nuisance

    def columns(self) -> Sequence[Any]:
        return (SafetyNotification.channel, SafetyNotification.safety_event_id)

    def study(self) -> Any:
        return SafetyNotification.study_id

    def about(self, row: Row[Any]) -> str:
        return f"on-call notice {row.id} of safety event {row.safety_event_id}"

    def where(self, row: Row[Any]) -> str:
        return f"on-call {row.channel}: notice {row.id}"

    def alert_channel(self, row: Row[Any]) -> str:
        return ALERT_PREFIX + row.channel

    def compose(self, session: Session, row: Row[Any]) -> tuple[OnCallNotice | None, str | None]:
        return compose(session, self.settings, row.id)

    def sender(self, row: Row[Any]) -> tuple[str, Callable[[OnCallNotice], None] | None]:
        channel = self.channels.get(row.channel)
        return f"the on-call {row.channel} channel", None if channel is None else channel.notify
