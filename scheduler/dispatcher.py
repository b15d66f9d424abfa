"""The dispatcher: opens due follow-ups, sends invitations and reminders, expires closed windows.

It runs in its own process (``afterward scheduler``), one or several at once. Opening a
follow-up is database work only and happens inside the transaction that claims it (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL; SQLite serializes writers), so it happens exactly once. Sending
talks to the outside world, so a delivery is first claimed with a lease and committed, then
sent, then marked; a dispatcher that dies mid-send leaves an expired lease and another one sends
again with the same idempotency key (the email's Message-ID, the webhook's Idempotency-Key).
Every step reads the injectable clock.

Nothing one row can do stops the others: each phase of a tick is isolated, a failing batch is
retried row by row, and every failure kind (a channel's ``DeliveryError``, an unexpected
exception, a message that cannot be composed, a study that cannot be re-planned, a row that
cannot be opened) counts an attempt, backs off, and is given up with its reason and a staff
alert after ``delivery_max_attempts``.

Each tick starts with the on-call notices of safety events (``scheduler.oncall``): planned from
the unreviewed events, then claimed and sent like deliveries, so an escalation reaches the
protocol's safety contacts within one poll; a failing notice raises a staff alert at once.
The sign-in links participants ask for (``study.signin``) go next, claimed and sent the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, cast

from sqlalchemy import ColumnElement, and_, exists, func, insert, not_, or_, select, text, update
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from scheduler import oncall
from scheduler.channels import (
    Channel,
    DeliveryError,
    EmailChannel,
    InAppChannel,
    Invitation,
    OnCallChannel,
    OnCallNotice,
    SignInChannel,
    SignInLinkMessage,
    WebhookChannel,
    local_time_text,
)
from scheduler.models import ChannelAlert, Delivery, FollowUp, SafetyNotification
from scheduler.planner import replan_study
from scheduler.service import cancel_deliveries
from study import audit, signin
from study.clock import now
from study.db import bulk_insert, is_postgres, session_scope
from study.models import Participant, ParticipantStatus, ProtocolVersion, SignInEmail
from study.security import decrypt_contact
from study.settings import Settings
from study.studies import current_protocol, current_version
from surveys import registry
from surveys import service as survey_service
from surveys.models import SurveyAssignment

log = logging.getLogger("afterward.scheduler")
SENDING_CHANNELS = ("email", "webhook")
# Problems with a channel as a whole: a delivery that goes through on it resolves their alert.
# The others are about particular deliveries (an address, a contact, a bug one message hits) and
# stay open for staff once raised.
CHANNEL_PROBLEMS = ("auth_refused", "unreachable", "rejected")
# The alert "channel" for follow-ups given up before any channel was involved (problems
# replan_failed and open_failed).
SCHEDULER_ALERTS = "scheduler"
AUDIT_ALERTS = "audit"  # the alert "channel" of a failed audit anchor
SIGN_IN_ALERTS = "sign-in email"  # the alert "channel" of failing sign-in link emails
STOP_GRACE_SECONDS = 3.0  # how long SIGTERM waits for the delivery in flight before exiting anyway


def build_channels(settings: Settings) -> dict[str, Channel]:
    channels: dict[str, Channel] = {"in_app": InAppChannel(), "email": EmailChannel(settings)}
    if settings.webhook_url and settings.webhook_secret is not None:
        channels["webhook"] = WebhookChannel(settings)
    return channels


@dataclass
class TickReport:
    opened: int = 0
    expired: int = 0
    cancelled: int = 0
    sent: int = 0
    failed: int = 0
    retrying: int = 0
    completed: int = 0
    notified: int = 0  # on-call notices of safety events sent
    sign_in_sent: int = 0  # sign-in links participants asked for, emailed
    errors: list[str] = field(default_factory=list)

    def add(self, other: TickReport) -> None:
        for counter in fields(self):
            value = getattr(other, counter.name)
            setattr(self, counter.name, getattr(self, counter.name) + value)


def _attempt(name: str, send: Callable[[], None] | None) -> DeliveryError | None:
    """Send once; the failure, if any, as a DeliveryError (``send`` None: the channel is not
    configured). A bug in a channel counts like any failure: retried, then given up."""
    try:
        if send is None:
            raise DeliveryError("rejected", f"{name} is not configured", permanent=True)
        send()
    except DeliveryError as exc:
        return exc
    except Exception as exc:
        return DeliveryError("error", f"{name} failed: {_describe(exc)}")
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def backoff(settings: Settings, attempts: int) -> dt.timedelta:
    """The wait after the ``attempts``-th failure: doubling from the first retry delay, at most an hour."""
    return dt.timedelta(seconds=min(settings.delivery_retry_seconds * 2 ** (attempts - 1), 3600))


class _Retries:
    """Attempts and backoff for work with no attempts column of its own (re-planning a study,
    opening a follow-up). Kept in the dispatcher's memory, so a restart starts counting again."""

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}
        self.not_before: dict[int, dt.datetime] = {}

    def failed(self, key: int, settings: Settings, at: dt.datetime) -> int:
        attempts = self.attempts[key] = self.attempts.get(key, 0) + 1
        self.not_before[key] = at + backoff(settings, attempts)
        return attempts

    def waiting(self, at: dt.datetime) -> set[int]:
        return {key for key, until in self.not_before.items() if until > at}

    def succeeded(self, keys: Sequence[int]) -> None:
        if self.attempts:
            for key in keys:
                self.attempts.pop(key, None)
                self.not_before.pop(key, None)


class _Claimed(NamedTuple):
    id: int
    channel: str
    kind: str
    idempotency_key: str
    followup_id: int
    participant_id: int


@dataclass
class _Outgoing:
    delivery: _Claimed
    message: Invitation | None = None
    skip_reason: str | None = None  # nothing to send any more: cancel it
    failure: DeliveryError | None = None  # the message could not even be composed


class _ClaimedNotice(NamedTuple):
    id: int
    channel: str
    safety_event_id: int


class Dispatcher:
    """``channels`` send to participants, ``oncall_channels`` to the protocol's safety contacts,
    ``sign_in_channel`` the sign-in links participants ask for. All are built from the settings by
    default; given ``channels`` (a simulation, a test), on-call notices and sign-in links go only
    through the ones given too (none if none are: sign-in links then wait for another dispatcher)."""

    def __init__(self, engine: Engine, settings: Settings, name: str | None = None,
                 channels: dict[str, Channel] | None = None,
                 oncall_channels: dict[str, OnCallChannel] | None = None,
                 sign_in_channel: SignInChannel | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        if oncall_channels is None:
            oncall_channels = oncall.build_oncall_channels(settings) if channels is None else {}
        self.oncall_channels = oncall_channels
        if sign_in_channel is None and channels is None:
            sign_in_channel = EmailChannel(settings)
        self.sign_in_channel = sign_in_channel
        self.channels = channels if channels is not None else build_channels(settings)
        self.stopping = threading.Event()  # set by SIGTERM: finish the delivery in flight, then return
        self._seen_versions: dict[int, int] = {}
        self._replans = _Retries()  # by study id
        self._openings = _Retries()  # by follow-up id

    def stop(self) -> None:
        self.stopping.set()

    # One pass of everything; the scheduler process runs it every poll interval. It never raises:
    # what failed is logged and listed in the report, and the other phases still run.

    def tick(self) -> TickReport:
        report = TickReport()
        unplannable: dict[int, int] = {}
        # Safety first: on-call notices go out before a batch of survey invitations can delay them.
        self._phase(report, "on-call planning", self.plan_notifications)
        self._phase(report, "on-call sending", lambda: self.notify_due(report))
        # Then the sign-in links: someone is waiting for each, on the page that said it is on its way.
        self._phase(report, "sign-in links", lambda: self.send_sign_in_links(report))
        self._phase(report, "re-planning", lambda: unplannable.update(self.replan_changed_protocols(report)))
        self._phase(report, "opening", lambda: self.open_due(report, unplannable=unplannable))
        self._phase(report, "expiry", lambda: self.expire_closed(report))
        self._phase(report, "sending", lambda: self.send_due(report))
        return report

    def _phase(self, report: TickReport, name: str, work: Callable[[], object]) -> None:
        if self.stopping.is_set():
            return
        try:
            work()
        except Exception as exc:
            log.exception("dispatcher: %s failed", name)
            report.errors.append(f"{name}: {_describe(exc)}")

    def _claim(self, session: Session, query: Any) -> Any:
        return query.with_for_update(skip_locked=True) if is_postgres(session) else query

    # Protocol edits: follow-ups not yet sent follow the newest version before anything is sent.

    def replan_changed_protocols(self, report: TickReport | None = None,
                                 studies: set[int] | None = None) -> dict[int, int]:
        """Re-plan the studies whose protocol changed (or ``studies``), each in its own
        transaction. Returns the studies that could not be re-planned, with their newest version:
        their follow-ups planned under an older one must not be opened."""
        report = report if report is not None else TickReport()
        with session_scope(self.engine, read_only=True) as session:
            versions = dict(session.execute(select(ProtocolVersion.study_id, func.max(ProtocolVersion.version))
                                            .group_by(ProtocolVersion.study_id)).all())
        at = now()
        waiting = self._replans.waiting(at)
        unplannable: dict[int, int] = {}
        for study_id, version in versions.items():
            if (studies is None and self._seen_versions.get(study_id) == version) or (
                    studies is not None and study_id not in studies):
                continue
            if study_id in waiting:
                unplannable[study_id] = version
                continue
            try:
                with session_scope(self.engine) as session:
                    _replan(session, study_id, version)
            except Exception as exc:
                unplannable[study_id] = version
                self._replan_failed(report, study_id, version, exc)
                continue
            self._seen_versions[study_id] = version
            self._replans.succeeded([study_id])
        return unplannable

    def _replan_failed(self, report: TickReport, study_id: int, version: int, exc: Exception) -> None:
        """Back off; after the attempt limit give up the study's due follow-ups still planned
        under an older version (they would go out on a schedule the protocol no longer has)."""
        attempts = self._replans.failed(study_id, self.settings, now())
        log.error("study %s: re-planning for protocol version %s failed (attempt %s): %s", study_id, version,
                  attempts, _describe(exc), exc_info=exc)
        report.errors.append(f"study {study_id}: re-planning for protocol version {version} failed: {_describe(exc)}")
        if attempts < self.settings.delivery_max_attempts:
            return
        reason = f"re-planning for protocol version {version} failed {attempts} times: {_describe(exc)}"
        with session_scope(self.engine) as session:
            at = now()
            given_up = _changed(session, update(FollowUp).where(
                FollowUp.study_id == study_id, FollowUp.status == "planned", FollowUp.protocol_version != version,
                FollowUp.due_at <= at).values(status="cancelled", ended_at=at, updated_at=at,
                                              end_reason=f"not sent: {reason}"[:200]))
            if given_up:
                report.cancelled += given_up
                _record_alert(session, SCHEDULER_ALERTS, DeliveryError("replan_failed", (
                    f"study {study_id}: {given_up} due follow-up(s) given up, {reason}")),
                    self.settings.channel_alert_after_failures, gave_up=True)

    # Opening follow-ups

    def open_due(self, report: TickReport, only: int | None = None,
                 unplannable: dict[int, int] | None = None) -> None:
        """Open due follow-ups a batch at a time, each batch in the transaction that claims it: a
        survey assignment per follow-up (what the in-app channel shows) and its delivery rows.
        Written as a few set-based statements per batch; a dispatcher's throughput is this loop.
        A batch that fails is opened again row by row, so a poisoned row fails alone; it backs off
        (it is not selected again ahead of the others) and is given up after the attempt limit.
        ``unplannable``: studies whose follow-ups under an older protocol version must wait."""
        unplannable = dict(unplannable or {})
        replanned: set[int] = set()
        while not self.stopping.is_set():
            skip = self._openings.waiting(now()) if only is None else set()
            batch: list[Any] = []
            try:
                stale = self._open_next(report, only, unplannable, skip, batch)
            except Exception as exc:
                if not batch or isinstance(exc, OperationalError):
                    raise  # the select failed, or the database is unavailable or busy: no row's doing
                if len(batch) == 1:
                    self._open_failed(report, batch[0], exc)
                else:
                    for row in batch:
                        try:
                            self._open_next(report, row.id, {}, set(), [])
                        except OperationalError:
                            raise
                        except Exception as row_exc:
                            self._open_failed(report, row, row_exc)
                if only is not None:
                    return
                continue
            if not batch:
                return
            if stale:
                # Re-plan outside the claiming transaction (its row locks are released now), then
                # select again: the rows may have moved. A study still stale after its re-plan in
                # this pass is treated as failing, so this loop always ends.
                self._seen_versions = {k: v for k, v in self._seen_versions.items() if k not in stale}
                failed = self.replan_changed_protocols(report, studies=set(stale) - replanned)
                for study_id in set(stale) & replanned:
                    self._replan_failed(report, study_id, stale[study_id], RuntimeError(
                        "its follow-ups were still planned under an older version after re-planning"))
                    failed[study_id] = stale[study_id]
                replanned |= set(stale)
                unplannable.update(failed)
                if only is not None and set(failed) & set(stale):
                    return
                continue
            if only is not None:
                return

    def _open_next(self, report: TickReport, only: int | None, unplannable: dict[int, int], skip: set[int],
                   batch: list[Any]) -> dict[int, int]:
        """Claim and open one batch (``batch`` is filled with the rows claimed). Returns the studies
        with rows planned under an older protocol version, and that version: nothing was opened."""
        part = TickReport()
        with session_scope(self.engine) as session:
            at = now()
            query = (select(FollowUp.id, FollowUp.participant_id, FollowUp.study_id, FollowUp.instrument_id,
                            FollowUp.followup_key, FollowUp.context, FollowUp.due_at, FollowUp.closes_at,
                            FollowUp.reminder_offsets, FollowUp.protocol_version, Participant.status,
                            Participant.contact_email_encrypted.is_not(None).label("has_email"))
                     .join(Participant, Participant.id == FollowUp.participant_id))
            if only is not None:
                query = query.where(FollowUp.id == only, FollowUp.status == "planned")
            else:
                query = (query.where(FollowUp.status == "planned", FollowUp.due_at <= at)
                         .order_by(FollowUp.due_at).limit(self.settings.scheduler_batch_size))
                # Only when something failed: the happy path's query stays as it is.
                if skip:
                    query = query.where(FollowUp.id.not_in(skip))
                for study_id, version in unplannable.items():
                    query = query.where(not_(and_(FollowUp.study_id == study_id,
                                                  FollowUp.protocol_version != version)))
            if is_postgres(session):
                query = query.with_for_update(skip_locked=True, of=FollowUp)
            batch += session.execute(query).all()
            if not batch:
                return {}
            stale = self._stale(session, batch)
            if not stale:
                self._open_batch(session, batch, at, part)
        if not stale:
            report.add(part)
            self._openings.succeeded([row.id for row in batch])
        return stale

    def _open_failed(self, report: TickReport, row: Any, exc: Exception) -> None:
        attempts = self._openings.failed(row.id, self.settings, now())
        log.error("study %s: follow-up %s could not be opened (attempt %s): %s", row.study_id, row.id, attempts,
                  _describe(exc), exc_info=exc)
        report.errors.append(f"study {row.study_id}: follow-up {row.id} could not be opened: {_describe(exc)}")
        if attempts < self.settings.delivery_max_attempts:
            return
        reason = f"could not be opened after {attempts} attempts: {_describe(exc)}"
        try:
            with session_scope(self.engine) as session:
                at = now()
                given_up = _changed(session, update(FollowUp).where(FollowUp.id == row.id, FollowUp.status == "planned")
                                    .values(status="cancelled", ended_at=at, updated_at=at,
                                            end_reason=f"not sent: {reason}"[:200]))
                if given_up:
                    _record_alert(session, SCHEDULER_ALERTS, DeliveryError("open_failed", (
                        f"study {row.study_id}: follow-up {row.id} given up, {reason}")),
                        self.settings.channel_alert_after_failures, gave_up=True)
        except Exception as give_up_exc:  # it stays planned and backing off; the next give-up tries again
            log.exception("follow-up %s: giving up failed", row.id)
            report.errors.append(f"follow-up {row.id}: giving up failed: {_describe(give_up_exc)}")
            return
        if given_up:
            report.cancelled += 1
            self._openings.succeeded([row.id])

    def _stale(self, session: Session, batch: Sequence[Any]) -> dict[int, int]:
        """The studies with a claimed row planned under an older protocol version, and the newest."""
        stale: dict[int, int] = {}
        for study_id in {row.study_id for row in batch}:
            version = current_version(session, study_id).version
            if any(row.protocol_version != version for row in batch if row.study_id == study_id):
                stale[study_id] = version
        return stale

    def _open_batch(self, session: Session, batch: Sequence[Any], at: dt.datetime, report: TickReport) -> None:
        ended: list[dict[str, Any]] = []
        opening = []
        for row in batch:
            if row.status != ParticipantStatus.ENROLLED:
                ended.append({"id": row.id, "status": "cancelled", "ended_at": at, "updated_at": at,
                              "end_reason": "participant withdrew"})
                report.cancelled += 1
            elif at >= row.closes_at:
                ended.append({"id": row.id, "status": "expired", "ended_at": at, "updated_at": at, "end_reason": (
                    f"not sent: due {row.due_at:%Y-%m-%d %H:%M} UTC, but no dispatcher ran before the window "
                    f"closed at {row.closes_at:%Y-%m-%d %H:%M} UTC")})
                report.expired += 1
            else:
                opening.append(row)
        if ended:
            session.execute(update(FollowUp), ended)
        if not opening:
            return
        versions = {row.instrument_id: registry.get(session, row.instrument_id).version for row in opening}
        assignment_ids = _insert_with_ids(session, SurveyAssignment, [
            dict(participant_id=row.participant_id, instrument_id=row.instrument_id,
                 instrument_version=versions[row.instrument_id], purpose="followup", followup_key=row.followup_key,
                 context=row.context, intended_at=row.due_at, closes_at=row.closes_at, status="open",
                 created_at=at) for row in opening])
        _mark_sent(session, [row.id for row in opening], assignment_ids,
                   [(at - row.due_at).total_seconds() for row in opening], at)
        channels_of = {study_id: [c for c in current_protocol(session, study_id).channels
                                  if c in SENDING_CHANNELS and c in self.channels]
                       for study_id in {row.study_id for row in opening}}
        deliveries: list[dict[str, Any]] = []
        for row in opening:
            channels = [c for c in channels_of[row.study_id] if c != "email" or row.has_email]
            deliveries += _delivery_rows(row, channels, at)
        bulk_insert(session, Delivery, deliveries)
        report.opened += len(opening)

    # Expiry

    def expire_closed(self, report: TickReport) -> None:
        """Close the follow-ups whose window closed, in one transaction; if that fails, one by one."""
        try:
            self._expire(report, None)
        except Exception as exc:
            log.warning("expiry failed as a batch (%s); expiring one by one", _describe(exc))
            with session_scope(self.engine, read_only=True) as session:
                ids = session.scalars(select(FollowUp.id).where(FollowUp.status == "sent",
                                                                FollowUp.closes_at <= now())).all()
            for followup_id in ids:
                try:
                    self._expire(report, followup_id)
                except Exception as row_exc:
                    log.exception("follow-up %s could not be expired", followup_id)
                    report.errors.append(f"follow-up {followup_id} could not be expired: {_describe(row_exc)}")

    def _expire(self, report: TickReport, only: int | None) -> None:
        part = TickReport()
        with session_scope(self.engine) as session:
            at = now()
            query = select(FollowUp, SurveyAssignment).join(
                SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id).where(
                FollowUp.status == "sent", FollowUp.closes_at <= at)
            if only is not None:
                query = query.where(FollowUp.id == only)
            for followup, assignment in session.execute(self._claim(session, query)).all():
                if assignment.status == "completed":
                    followup.status, followup.end_reason = "completed", None
                    part.completed += 1
                else:
                    if assignment.status == "open":
                        assignment.status = "expired"
                    followup.status, followup.end_reason = "expired", "the window closed without a response"
                    part.expired += 1
                followup.ended_at = followup.updated_at = at
                cancel_deliveries(session, followup.id, "the survey window closed")
        report.add(part)

    # Sending

    def send_due(self, report: TickReport, only: int | None = None) -> None:
        """Claim a batch (committed, with a lease), compose each message, send them one at a time.
        Whatever one delivery does is recorded on it alone; on SIGTERM the rest of the batch is
        handed back unsent."""
        while not self.stopping.is_set():
            claimed = self._claim_deliveries(report, only)
            if not claimed:
                return
            outgoing = self._compose(claimed)
            for index, item in enumerate(outgoing):
                if self.stopping.is_set():
                    self._release([later.delivery.id for later in outgoing[index:]])
                    return
                try:
                    self._deliver(item, report)
                except Exception as exc:  # recording the outcome failed: the lease brings it back
                    log.exception("delivery %s: recording the outcome failed", item.delivery.id)
                    report.errors.append(f"delivery {item.delivery.id}: {_describe(exc)}")
            if only is not None:
                return

    def _claim_deliveries(self, report: TickReport, only: int | None) -> list[_Claimed]:
        s = self.settings
        with session_scope(self.engine) as session:
            at = now()
            query = select(Delivery.id, Delivery.channel, Delivery.kind, Delivery.idempotency_key,
                           Delivery.followup_id, Delivery.participant_id, Delivery.status, Delivery.attempts)
            if only is not None:
                query = query.where(Delivery.id == only, Delivery.status.in_(("pending", "failed")))
            else:
                query = (query.where(_due(Delivery, at), Delivery.channel != "in_app")
                         .order_by(Delivery.next_attempt_at).limit(s.scheduler_batch_size))
            rows = session.execute(self._claim(session, query)).all()
            taken, exhausted = self._lease(session, Delivery, rows, at)
            for row in exhausted:
                _record_alert(session, row.channel, NEVER_FINISHED, s.channel_alert_after_failures, gave_up=True,
                              about=f"delivery {row.id} given up after {row.attempts} attempt(s)")
                report.failed += 1
                report.errors.append(f"{row.channel}: delivery {row.id}: {NEVER_FINISHED}")
            return [_Claimed(*row[:6]) for row in taken]

    def _compose(self, claimed: list[_Claimed]) -> list[_Outgoing]:
        """Each delivery's message, read in one read-only transaction; a failure stays with its delivery."""
        outgoing = []
        with session_scope(self.engine, read_only=True) as session:
            for delivery in claimed:
                try:
                    message, skip_reason = self._message(session, delivery)
                    outgoing.append(_Outgoing(delivery, message, skip_reason))
                except DeliveryError as exc:
                    outgoing.append(_Outgoing(delivery, failure=exc))
                except Exception as exc:
                    session.rollback()  # a failed statement must not fail the reads of the others
                    outgoing.append(_Outgoing(delivery, failure=DeliveryError(
                        "error", f"the message could not be composed: {_describe(exc)}")))
        return outgoing

    def _message(self, session: Session, delivery: _Claimed) -> tuple[Invitation | None, str | None]:
        followup = session.get(FollowUp, delivery.followup_id)
        assert followup is not None
        participant = session.get(Participant, delivery.participant_id)
        assignment = session.get(SurveyAssignment, followup.assignment_id) if followup.assignment_id else None
        if participant is None or participant.status != ParticipantStatus.ENROLLED:
            return None, "the participant withdrew"
        if assignment is None or assignment.status != "open" or followup.status != "sent":
            return None, "the survey is no longer open (completed, expired or cancelled)"
        if assignment.closes_at is not None and assignment.closes_at <= now():
            return None, "the survey window closed"
        # Participants see the public title only: the internal one may name the hypothesis.
        study_title = current_protocol(session, participant.study_id).study.participant_title
        instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
        email = None
        if delivery.channel == "email" and participant.contact_email_encrypted:
            try:
                email = decrypt_contact(participant.contact_email_encrypted)
            except ValueError as exc:  # a key was rotated out: no retry can read it
                raise DeliveryError("unreadable_contact", str(exc), permanent=True) from None
        closes = (local_time_text(assignment.closes_at, participant.timezone) if assignment.closes_at
                  else "it is done")
        # Signs the participant in to My study once, for as long as the survey is open.
        sign_in = signin.link_url(self.settings.base_url, signin.link_token(
            signin.FOLLOWUP_LINK, participant.id, delivery.idempotency_key, followup.closes_at))
        return Invitation(
            idempotency_key=delivery.idempotency_key, kind=delivery.kind, participant_code=participant.code,
            to_email=email, study_title=study_title, survey_title=instrument.title,
            link=f"{self.settings.base_url.rstrip('/')}/s/{survey_service.link_token(assignment)}",
            closes_at_text=closes, sign_in_link=sign_in), None

    def _deliver(self, item: _Outgoing, report: TickReport) -> None:
        delivery = item.delivery
        ours = and_(Delivery.id == delivery.id, Delivery.claimed_by == self.name, Delivery.status == "sending")
        if item.skip_reason is not None:
            with session_scope(self.engine) as session:
                session.execute(update(Delivery).where(ours).values(status="cancelled", last_error=item.skip_reason))
            report.cancelled += 1
            return
        failure = item.failure
        if failure is None:
            channel = self.channels.get(delivery.channel)
            message = item.message
            assert message is not None
            failure = _attempt(f"the {delivery.channel} channel",
                               None if channel is None else lambda: channel.send(message))
        if failure is not None:
            self._failed(delivery, failure, report)
            return
        with session_scope(self.engine) as session:
            at = now()
            marked = _changed(session, update(Delivery).where(ours).values(
                status="sent", sent_at=at, lease_until=None, last_error=None))
            if marked and delivery.kind == "reminder":
                session.execute(update(FollowUp).where(FollowUp.id == delivery.followup_id)
                                .values(reminders_sent=FollowUp.reminders_sent + 1))
            session.execute(update(ChannelAlert).where(
                ChannelAlert.channel == delivery.channel, ChannelAlert.resolved_at.is_(None),
                or_(ChannelAlert.problem.in_(CHANNEL_PROBLEMS), ChannelAlert.raised_at.is_(None)))
                .values(resolved_at=at))
        report.sent += 1

    def _failed(self, claimed: _Claimed, exc: DeliveryError, report: TickReport) -> None:
        s = self.settings
        with session_scope(self.engine) as session:
            delivery = session.get(Delivery, claimed.id)
            followup = session.get(FollowUp, claimed.followup_id)
            if (delivery is None or followup is None or delivery.claimed_by != self.name
                    or delivery.status != "sending"):
                return  # no longer ours (cancelled meanwhile, or its lease passed to another dispatcher)
            give_up = _retry_or_give_up(delivery, exc, s, report, deadline=followup.closes_at)
            _record_alert(session, claimed.channel, exc, s.channel_alert_after_failures, gave_up=give_up,
                          about=f"delivery {claimed.id} given up after {delivery.attempts} attempt(s)")
        report.errors.append(f"{claimed.channel}: delivery {claimed.id}: {exc}")
        log.warning("delivery %s on %s failed (%s, attempt %s%s): %s", claimed.id, claimed.channel, exc.problem,
                    delivery.attempts, ", given up" if give_up else "", exc)

    # Leases, shared by deliveries, on-call notices and sign-in emails (tables with status,
    # next_attempt_at, lease_until, claimed_by, attempts and last_error).

    def _lease(self, session: Session, model: Any, rows: Sequence[Any],
               at: dt.datetime) -> tuple[list[Any], list[Any]]:
        """Lease the claimed ``rows`` of ``model`` to this dispatcher (sending, one more attempt)
        and give up the exhausted ones: an attempt that never finished counts too, so a row that
        kills its dispatcher every time is given up like any other instead of claimed forever.
        Returns (leased rows, exhausted rows); the caller alerts about the exhausted."""
        s = self.settings
        exhausted = [row for row in rows if row.status == "sending" and row.attempts >= s.delivery_max_attempts]
        leased = [row for row in rows if row not in exhausted]
        if leased:
            session.execute(update(model).where(model.id.in_([row.id for row in leased])).values(
                status="sending", claimed_by=self.name, attempts=model.attempts + 1,
                lease_until=at + dt.timedelta(seconds=s.delivery_lease_seconds)))
        for row in exhausted:
            session.execute(update(model).where(model.id == row.id).values(
                status="failed", lease_until=None, last_error=f"{NEVER_FINISHED.problem}: {NEVER_FINISHED}"))
        return leased, exhausted

    def _hand_back(self, model: Any, ids: list[int], what: str) -> None:
        """Hand claimed rows back unsent (stopping): pending again, the attempt not counted."""
        try:
            with session_scope(self.engine) as session:
                session.execute(update(model).where(
                    model.id.in_(ids), model.claimed_by == self.name, model.status == "sending")
                    .values(status="pending", lease_until=None, attempts=model.attempts - 1))
        except Exception:  # their leases expire and another dispatcher takes them
            log.exception("could not hand back %s claimed %s", len(ids), what)

    def _release(self, ids: list[int]) -> None:
        """Hand claimed deliveries back unsent (stopping): pending again, the attempt not counted."""
        self._hand_back(Delivery, ids, "deliveries")

    # On-call notices of safety events

    def plan_notifications(self) -> int:
        """Plan the notices now due (new events, and events unreviewed for another period)."""
        if not self.oncall_channels:
            return 0
        with session_scope(self.engine) as session:
            return oncall.plan(session, now(), self.oncall_channels)

    def notify_due(self, report: TickReport) -> None:
        """Claim due notices (committed, with a lease), then send them one at a time; each
        failure stays with its notice. On SIGTERM the rest of the batch is handed back."""
        while not self.stopping.is_set():
            claimed = self._claim_notices(report)
            if not claimed:
                return
            for index, notice in enumerate(claimed):
                if self.stopping.is_set():
                    self._release_notices([later.id for later in claimed[index:]])
                    return
                try:
                    self._notify(notice, report)
                except Exception as exc:  # recording the outcome failed: the lease brings it back
                    log.exception("on-call notice %s: recording the outcome failed", notice.id)
                    report.errors.append(f"on-call notice {notice.id}: {_describe(exc)}")

    def _claim_notices(self, report: TickReport) -> list[_ClaimedNotice]:
        s = self.settings
        with session_scope(self.engine) as session:
            at = now()
            rows = session.execute(self._claim(session, select(
                SafetyNotification.id, SafetyNotification.channel, SafetyNotification.safety_event_id,
                SafetyNotification.status, SafetyNotification.attempts).where(_due(SafetyNotification, at))
                .order_by(SafetyNotification.next_attempt_at).limit(s.scheduler_batch_size))).all()
            taken, exhausted = self._lease(session, SafetyNotification, rows, at)
            for row in exhausted:
                _record_alert(session, oncall.ALERT_PREFIX + row.channel, NEVER_FINISHED, 1, gave_up=True, about=(
                    f"on-call notice {row.id} of safety event {row.safety_event_id} given up after "
                    f"{row.attempts} attempt(s)"))
                report.failed += 1
                report.errors.append(f"on-call {row.channel}: notice {row.id}: {NEVER_FINISHED}")
            return [_ClaimedNotice(row.id, row.channel, row.safety_event_id) for row in taken]

    def _notify(self, claimed: _ClaimedNotice, report: TickReport) -> None:
        ours = and_(SafetyNotification.id == claimed.id, SafetyNotification.claimed_by == self.name,
                    SafetyNotification.status == "sending")
        notice: OnCallNotice | None = None
        failure: DeliveryError | None = None
        try:
            with session_scope(self.engine, read_only=True) as session:
                notice, skip_reason = oncall.compose(session, self.settings, claimed.id)
        except Exception as exc:
            skip_reason = None
            failure = DeliveryError("error", f"the notice could not be composed: {_describe(exc)}")
        if skip_reason is not None:
            with session_scope(self.engine) as session:
                session.execute(update(SafetyNotification).where(ours).values(
                    status="cancelled", lease_until=None, last_error=skip_reason))
            report.cancelled += 1
            return
        if failure is None:
            oncall_channel = self.oncall_channels.get(claimed.channel)
            assert notice is not None
            sent_notice = notice
            failure = _attempt(f"the on-call {claimed.channel} channel",
                               None if oncall_channel is None else lambda: oncall_channel.notify(sent_notice))
        if failure is not None:
            self._notice_failed(claimed, failure, report)
            return
        with session_scope(self.engine) as session:
            at = now()
            session.execute(update(SafetyNotification).where(ours).values(
                status="sent", sent_at=at, lease_until=None, last_error=None))
            session.execute(update(ChannelAlert).where(
                ChannelAlert.channel == oncall.ALERT_PREFIX + claimed.channel, ChannelAlert.resolved_at.is_(None),
                or_(ChannelAlert.problem.in_(CHANNEL_PROBLEMS), ChannelAlert.raised_at.is_(None)))
                .values(resolved_at=at))
        report.notified += 1

    def _notice_failed(self, claimed: _ClaimedNotice, exc: DeliveryError, report: TickReport) -> None:
        """Back off and retry, up to the attempt limit; staff are alerted at the first failure
        (an on-call notice that does not arrive is a safety problem, not a nuisance)."""
        with session_scope(self.engine) as session:
            notification = session.get(SafetyNotification, claimed.id)
            if notification is None or notification.claimed_by != self.name or notification.status != "sending":
                return  # no longer ours (its lease passed to another dispatcher)
            give_up = _retry_or_give_up(notification, exc, self.settings, report)
            attempts = notification.attempts
            _record_alert(session, oncall.ALERT_PREFIX + claimed.channel, exc, 1, gave_up=give_up, about=(
                f"on-call notice {claimed.id} of safety event {claimed.safety_event_id} given up after "
                f"{attempts} attempt(s)"))
        report.errors.append(f"on-call {claimed.channel}: notice {claimed.id}: {exc}")
        log.warning("on-call notice %s on %s failed (%s, attempt %s%s): %s", claimed.id, claimed.channel,
                    exc.problem, attempts, ", given up" if give_up else "", exc)

    def _release_notices(self, ids: list[int]) -> None:
        """Hand claimed notices back unsent (stopping): pending again, the attempt not counted."""
        self._hand_back(SafetyNotification, ids, "on-call notices")

    # Sign-in links participants asked for (study.signin queues them)

    def send_sign_in_links(self, report: TickReport) -> None:
        """Claim the sign-in emails due (committed, with a lease), then send them one at a time;
        each failure stays with its email. On SIGTERM the rest of the batch is handed back."""
        if self.sign_in_channel is None:
            return
        while not self.stopping.is_set():
            claimed = self._claim_sign_in_emails(report)
            if not claimed:
                return
            for index, email_id in enumerate(claimed):
                if self.stopping.is_set():
                    self._release_sign_in_emails(claimed[index:])
                    return
                try:
                    self._send_sign_in_email(email_id, report)
                except Exception as exc:  # recording the outcome failed: the lease brings it back
                    log.exception("sign-in email %s: recording the outcome failed", email_id)
                    report.errors.append(f"sign-in email {email_id}: {_describe(exc)}")

    def _claim_sign_in_emails(self, report: TickReport) -> list[int]:
        s = self.settings
        with session_scope(self.engine) as session:
            at = now()
            rows = session.execute(self._claim(session, select(
                SignInEmail.id, SignInEmail.status, SignInEmail.attempts).where(_due(SignInEmail, at))
                .order_by(SignInEmail.next_attempt_at).limit(s.scheduler_batch_size))).all()
            taken, exhausted = self._lease(session, SignInEmail, rows, at)
            for row in exhausted:
                _record_alert(session, SIGN_IN_ALERTS, NEVER_FINISHED, s.channel_alert_after_failures, gave_up=True,
                              about=f"sign-in email {row.id} given up after {row.attempts} attempt(s)")
                report.failed += 1
                report.errors.append(f"sign-in email {row.id}: {NEVER_FINISHED}")
            return [row.id for row in taken]

    def _sign_in_message(self, session: Session, email_id: int) -> tuple[SignInLinkMessage | None, str | None]:
        """The email to send, or why there is nothing to send any more."""
        row = session.get(SignInEmail, email_id)
        assert row is not None
        participant = session.get(Participant, row.participant_id)
        if participant is None or participant.is_withdrawn or participant.contact_email_encrypted is None:
            return None, "the participant withdrew or has no contact email any more"
        if row.expires_at <= now():
            return None, "the link expired before it could be sent"
        try:
            address = decrypt_contact(participant.contact_email_encrypted)
        except ValueError as exc:  # a key was rotated out: no retry can read it
            raise DeliveryError("unreadable_contact", str(exc), permanent=True) from None
        token = signin.link_token(signin.EMAIL_LINK, participant.id, row.idempotency_key, row.expires_at)
        return SignInLinkMessage(
            idempotency_key=row.idempotency_key, to_email=address, link=signin.link_url(self.settings.base_url, token),
            expires_at_text=local_time_text(row.expires_at, participant.timezone)), None

    def _send_sign_in_email(self, email_id: int, report: TickReport) -> None:
        ours = and_(SignInEmail.id == email_id, SignInEmail.claimed_by == self.name, SignInEmail.status == "sending")
        message: SignInLinkMessage | None = None
        skip_reason: str | None = None
        failure: DeliveryError | None = None
        try:
            with session_scope(self.engine, read_only=True) as session:
                message, skip_reason = self._sign_in_message(session, email_id)
        except DeliveryError as exc:
            failure = exc
        except Exception as exc:
            failure = DeliveryError("error", f"the sign-in email could not be composed: {_describe(exc)}")
        if skip_reason is not None:
            with session_scope(self.engine) as session:
                session.execute(update(SignInEmail).where(ours).values(
                    status="cancelled", lease_until=None, last_error=skip_reason))
            report.cancelled += 1
            return
        if failure is None:
            channel = self.sign_in_channel
            assert message is not None
            assert channel is not None
            sent_message = message
            failure = _attempt("the sign-in email", lambda: channel.send_sign_in(sent_message))
        if failure is not None:
            self._sign_in_email_failed(email_id, failure, report)
            return
        with session_scope(self.engine) as session:
            at = now()
            session.execute(update(SignInEmail).where(ours).values(
                status="sent", sent_at=at, lease_until=None, last_error=None))
            session.execute(update(ChannelAlert).where(
                ChannelAlert.channel == SIGN_IN_ALERTS, ChannelAlert.resolved_at.is_(None),
                or_(ChannelAlert.problem.in_(CHANNEL_PROBLEMS), ChannelAlert.raised_at.is_(None)))
                .values(resolved_at=at))
        report.sign_in_sent += 1

    def _sign_in_email_failed(self, email_id: int, exc: DeliveryError, report: TickReport) -> None:
        """Back off and retry while the link is still good; give up after the attempt limit."""
        s = self.settings
        with session_scope(self.engine) as session:
            row = session.get(SignInEmail, email_id)
            if row is None or row.claimed_by != self.name or row.status != "sending":
                return  # no longer ours (its lease passed to another dispatcher)
            give_up = _retry_or_give_up(row, exc, s, report, deadline=row.expires_at)
            attempts = row.attempts
            _record_alert(session, SIGN_IN_ALERTS, exc, s.channel_alert_after_failures, gave_up=give_up,
                          about=f"sign-in email {email_id} given up after {attempts} attempt(s)")
        report.errors.append(f"sign-in email {email_id}: {exc}")
        log.warning("sign-in email %s failed (%s, attempt %s%s): %s", email_id, exc.problem, attempts,
                    ", given up" if give_up else "", exc)

    def _release_sign_in_emails(self, ids: list[int]) -> None:
        """Hand claimed sign-in emails back unsent (stopping): pending again, the attempt not counted."""
        self._hand_back(SignInEmail, ids, "sign-in emails")

    # One-off actions for the CLI

    def anchor_audit(self) -> audit.Anchored | None:
        """Record the audit chain's head outside the database (run on a schedule); a failure
        raises a staff alert at once instead of stopping the dispatcher."""
        try:
            anchored = audit.anchor(self.engine, self.settings)
        except Exception as exc:  # noqa: BLE001 - whatever failed, staff must hear of it
            log.exception("anchoring the audit chain failed")
            with session_scope(self.engine) as session:
                _record_alert(session, AUDIT_ALERTS, DeliveryError("anchor_failed", f"audit anchor: {exc}"), 1)
            return None
        if anchored.new:
            log.info("audit chain anchored at seq %s", anchored.anchor.seq)
        return anchored

    def send_now(self, followup_id: int) -> TickReport:
        """Open a planned follow-up now (moving its due time) and send what it has due."""
        report = TickReport()
        with session_scope(self.engine) as session:
            followup = session.get(FollowUp, followup_id)
            if followup is None:
                raise LookupError(f"no follow-up {followup_id}")
            if followup.status == "planned":
                followup.due_at = min(followup.due_at, now())
        self.open_due(report, only=followup_id)
        with session_scope(self.engine) as session:
            ids = session.scalars(select(Delivery.id).where(
                Delivery.followup_id == followup_id, Delivery.status.in_(("pending", "failed")),
                Delivery.sequence == 0, Delivery.channel != "in_app")).all()
        for delivery_id in ids:
            self.send_due(report, only=delivery_id)
        return report

def _replan(session: Session, study_id: int, version: int) -> None:
    """Re-plan a study's unsent follow-ups for protocol ``version``; on PostgreSQL one dispatcher
    at a time (the others wait on the lock, then find nothing left to do)."""
    if is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x5C4ED000 + study_id})
    stale = session.scalar(select(exists().where(
        FollowUp.study_id == study_id, FollowUp.status == "planned", FollowUp.protocol_version != version)))
    if stale:
        log.info("study %s has protocol version %s: re-planned %s", study_id, version, replan_study(session, study_id))


def _mark_sent(session: Session, ids: list[int], assignment_ids: list[int], lateness: list[float],
               at: dt.datetime) -> None:
    """Record the opened follow-ups: one statement over arrays on PostgreSQL, one per row elsewhere."""
    if is_postgres(session):
        session.execute(text(
            "UPDATE followups AS f SET status = 'sent', sent_at = :at, updated_at = :at, assignment_id = v.aid, "
            "lateness_seconds = v.late FROM unnest(CAST(:ids AS integer[]), CAST(:aids AS integer[]), "
            "CAST(:late AS double precision[])) AS v(id, aid, late) WHERE f.id = v.id"),
            {"at": at, "ids": ids, "aids": assignment_ids, "late": lateness})
        return
    session.execute(update(FollowUp), [
        {"id": id_, "status": "sent", "sent_at": at, "assignment_id": aid, "updated_at": at, "lateness_seconds": late}
        for id_, aid, late in zip(ids, assignment_ids, lateness, strict=True)])


def _insert_with_ids(session: Session, table: Any, rows: list[dict[str, Any]]) -> list[int]:
    """Insert rows and return their ids in order. On PostgreSQL the ids are drawn from the
    sequence first, so the insert is one cached statement run as a pipelined executemany (a
    multi-row INSERT ... RETURNING costs more to build and parse than the insert itself)."""
    if not is_postgres(session):
        return list(session.scalars(insert(table).returning(table.id, sort_by_parameter_order=True), rows))
    ids = list(session.scalars(text(f"SELECT nextval(pg_get_serial_sequence('{table.__tablename__}', 'id')) "
                                    "FROM generate_series(1, :n)"), {"n": len(rows)}))
    bulk_insert(session, table, [{**row, "id": id_} for row, id_ in zip(rows, ids, strict=True)])
    return ids


def _delivery_rows(followup: Any, channels: Sequence[str], at: dt.datetime) -> list[dict[str, Any]]:
    """The in-app record (delivered by opening) plus the invitation and each reminder per channel.
    A reminder whose time passed before the follow-up was opened (a late start) is skipped: it
    would arrive together with the invitation."""
    key = f"followup-{followup.id}"
    common = {"followup_id": followup.id, "participant_id": followup.participant_id, "created_at": at,
              "detail": {}, "claimed_by": None, "lease_until": None, "sent_at": None, "last_error": None}
    rows = [{**common, "kind": "invitation", "sequence": 0, "channel": "in_app", "idempotency_key": f"{key}-0-in_app",
             "due_at": followup.due_at, "status": "sent", "attempts": 1, "next_attempt_at": at, "sent_at": at}]
    for sequence, after in enumerate([0, *followup.reminder_offsets]):
        due = followup.due_at + dt.timedelta(seconds=after)
        skipped = sequence > 0 and due <= at
        rows += [{**common, "kind": "reminder" if sequence else "invitation", "sequence": sequence,
                  "channel": channel, "idempotency_key": f"{key}-{sequence}-{channel}", "due_at": due,
                  "status": "cancelled" if skipped else "pending", "attempts": 0, "next_attempt_at": max(due, at),
                  "last_error": "skipped: its time passed before the invitation went out" if skipped else None}
                 for channel in channels]
    return rows


def _due(model: Any, at: dt.datetime) -> ColumnElement[bool]:
    """Rows of ``model`` to send now: pending and due, or leased by a dispatcher that died."""
    return or_(and_(model.status == "pending", model.next_attempt_at <= at),
               and_(model.status == "sending", model.lease_until < at))


NEVER_FINISHED = DeliveryError("error", "the last attempt never finished (its dispatcher stopped mid-send)")


def _retry_or_give_up(row: Any, exc: DeliveryError, settings: Settings, report: TickReport, *,
                      deadline: dt.datetime | None = None) -> bool:
    """Record a failed attempt on a claimed row (a delivery, an on-call notice, a sign-in email):
    pending again after the backoff, or failed for good when the error is permanent, the attempt
    limit is reached or the next try would fall after ``deadline``. Returns whether it gave up."""
    delay = backoff(settings, row.attempts)
    retry_at = now() + delay
    give_up = (exc.permanent or row.attempts >= settings.delivery_max_attempts
               or (deadline is not None and retry_at >= deadline))
    row.last_error = f"{exc.problem}: {exc}"
    if give_up:
        row.status = "failed"
        report.failed += 1
    else:
        row.status, row.next_attempt_at = "pending", retry_at
        report.retrying += 1
    row.lease_until = None
    return give_up


def _record_alert(session: Session, channel: str, exc: DeliveryError, threshold: int, *, gave_up: bool = False,
                  about: str | None = None) -> None:
    """Count the failure on the channel's open alert for that problem; staff see it once it is
    raised: at once for a refused login or a delivery given up for good (a participant will not
    hear from the study), after ``threshold`` failures otherwise. ``about`` prefixes a give-up."""
    alert = session.scalar(select(ChannelAlert).where(ChannelAlert.channel == channel,
                                                      ChannelAlert.problem == exc.problem,
                                                      ChannelAlert.resolved_at.is_(None)))
    at = now()
    message = f"{about}: {exc}" if gave_up and about else str(exc)
    if alert is None:
        alert = ChannelAlert(channel=channel, problem=exc.problem, message=message, failures=0, first_at=at)
        session.add(alert)
    alert.failures += 1
    alert.last_at, alert.message = at, message
    if alert.raised_at is None and (exc.problem == "auth_refused" or gave_up or alert.failures >= threshold):
        alert.raised_at = at
        log.error("ALERT on %s (%s): %s", channel, exc.problem, message)


def run(engine: Engine, settings: Settings, name: str | None = None,
        on_tick: Callable[[TickReport], None] | None = None) -> None:
    """The scheduler process: APScheduler runs the dispatcher every poll interval until SIGTERM,
    then the tick in flight stops before its next delivery and the process exits within seconds."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    dispatcher = Dispatcher(engine, settings, name)
    idle = threading.Event()
    idle.set()

    def tick() -> None:
        idle.clear()
        try:
            report = dispatcher.tick()
        finally:
            idle.set()
        if on_tick is not None:
            on_tick(report)
        if (report.opened or report.sent or report.notified or report.sign_in_sent or report.failed or report.expired
                or report.errors):
            log.info("tick %s", report)

    scheduler = BlockingScheduler(timezone=dt.UTC)
    scheduler.add_job(tick, "interval", seconds=settings.scheduler_poll_seconds, id="dispatch",
                      max_instances=1, coalesce=True, next_run_time=dt.datetime.now(dt.UTC))
    scheduler.add_job(dispatcher.anchor_audit, "interval", minutes=settings.audit_anchor_interval_minutes,
                      id="audit-anchor", max_instances=1, coalesce=True, next_run_time=dt.datetime.now(dt.UTC))

    def stop(signum: int, _frame: object) -> None:
        log.info("stopping on signal %s", signum)
        dispatcher.stop()
        if scheduler.running:
            scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("dispatcher %s polling every %ss", dispatcher.name, settings.scheduler_poll_seconds)
    if not dispatcher.stopping.is_set():
        scheduler.start()  # returns once stop() has shut it down
    # The tick in flight returns before its next delivery, handing the rest of its batch back. A
    # send stuck on a dead server is cut off instead: its lease lets it be sent again later, with
    # the same idempotency key.
    if not idle.wait(STOP_GRACE_SECONDS):
        log.warning("a delivery was still in flight %ss after the signal; exiting anyway", STOP_GRACE_SECONDS)
        logging.shutdown()
        os._exit(1)
    log.info("dispatcher %s stopped", dispatcher.name)


def _changed(session: Session, statement: Any) -> int:
    """Run an UPDATE and return how many rows it changed."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount
