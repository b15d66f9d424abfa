"""The dispatcher: opens due follow-ups, sends invitations and reminders, expires closed windows.

It runs in its own process (``afterward scheduler``), one or several at once. Opening a
follow-up is database work only and happens inside the transaction that claims it (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL; SQLite serializes writers), so it happens exactly once. Sending
talks to the outside world, so a delivery is first claimed with a lease and committed, then
sent, then marked; a dispatcher that dies mid-send leaves an expired lease and another one sends
again with the same idempotency key (the email's Message-ID, the webhook's Idempotency-Key).
Every step reads the injectable clock.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, exists, func, insert, or_, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from scheduler.channels import Channel, DeliveryError, EmailChannel, InAppChannel, Invitation, WebhookChannel
from scheduler.models import ChannelAlert, Delivery, FollowUp
from scheduler.planner import replan_study
from scheduler.service import cancel_deliveries
from study.clock import now
from study.db import bulk_insert, is_postgres, session_scope
from study.models import Participant, ParticipantStatus, ProtocolVersion, Study
from study.security import decrypt_contact
from study.settings import Settings
from study.studies import current_protocol, current_version
from surveys import registry
from surveys import service as survey_service
from surveys.models import SurveyAssignment

log = logging.getLogger("afterward.scheduler")
SENDING_CHANNELS = ("email", "webhook")


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
    errors: list[str] = field(default_factory=list)


class Dispatcher:
    def __init__(self, engine: Engine, settings: Settings, name: str | None = None,
                 channels: dict[str, Channel] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.channels = channels if channels is not None else build_channels(settings)
        self._seen_versions: dict[int, int] = {}

    # One pass of everything; the scheduler process runs it every poll interval.

    def tick(self) -> TickReport:
        report = TickReport()
        self.replan_changed_protocols()
        self.open_due(report)
        self.expire_closed(report)
        self.send_due(report)
        return report

    def _claim(self, session: Session, query: Any) -> Any:
        return query.with_for_update(skip_locked=True) if is_postgres(session) else query

    # Protocol edits: follow-ups not yet sent follow the newest version before anything is sent.

    def replan_changed_protocols(self) -> None:
        with session_scope(self.engine) as session:
            versions = dict(session.execute(select(ProtocolVersion.study_id, func.max(ProtocolVersion.version))
                                            .group_by(ProtocolVersion.study_id)).all())
        for study_id, version in versions.items():
            if self._seen_versions.get(study_id) == version:
                continue
            with session_scope(self.engine) as session:
                _replan(session, study_id, version)
            self._seen_versions[study_id] = version

    # Opening follow-ups

    def open_due(self, report: TickReport, only: int | None = None) -> None:
        """Open due follow-ups a batch at a time, each batch in the transaction that claims it: a
        survey assignment per follow-up (what the in-app channel shows) and its delivery rows.
        Written as a few set-based statements per batch; a dispatcher's throughput is this loop."""
        while True:
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
                if is_postgres(session):
                    query = query.with_for_update(skip_locked=True, of=FollowUp)
                batch = session.execute(query).all()
                if not batch:
                    return
                stale = self._stale(session, batch)
                if not stale:
                    self._open_batch(session, batch, at, report)
            if stale:
                # Re-plan outside this transaction (its row locks are released now), then select
                # again: the rows may have moved.
                self._seen_versions.clear()
                self.replan_changed_protocols()
                continue
            if only is not None:
                return

    def _stale(self, session: Session, batch: Sequence[Any]) -> bool:
        """Whether any claimed row was planned under an older protocol version."""
        for study_id in {row.study_id for row in batch}:
            version = current_version(session, study_id).version
            if any(row.protocol_version != version for row in batch if row.study_id == study_id):
                return True
        return False

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
        with session_scope(self.engine) as session:
            at = now()
            rows = session.execute(self._claim(session, select(FollowUp, SurveyAssignment).join(
                SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id).where(
                FollowUp.status == "sent", FollowUp.closes_at <= at))).all()
            for followup, assignment in rows:
                if assignment.status == "completed":
                    followup.status, followup.end_reason = "completed", None
                    report.completed += 1
                else:
                    if assignment.status == "open":
                        assignment.status = "expired"
                    followup.status, followup.end_reason = "expired", "the window closed without a response"
                    report.expired += 1
                followup.ended_at = followup.updated_at = at
                cancel_deliveries(session, followup.id, "the survey window closed")

    # Sending

    def send_due(self, report: TickReport, only: int | None = None) -> None:
        while True:
            claimed = self._claim_deliveries(only)
            if not claimed:
                return
            for delivery_id, channel, message, skip_reason in claimed:
                self._deliver(delivery_id, channel, message, skip_reason, report)
            if only is not None:
                return

    def _claim_deliveries(self, only: int | None) -> list[tuple[int, str, Invitation | None, str | None]]:
        with session_scope(self.engine) as session:
            at = now()
            due = or_(and_(Delivery.status == "pending", Delivery.next_attempt_at <= at),
                      and_(Delivery.status == "sending", Delivery.lease_until < at))  # a dispatcher died
            query = select(Delivery).where(due, Delivery.channel != "in_app")
            if only is not None:
                query = select(Delivery).where(Delivery.id == only, Delivery.status.in_(("pending", "failed")))
            deliveries = list(session.scalars(self._claim(session, query.order_by(Delivery.next_attempt_at)
                                                          .limit(self.settings.scheduler_batch_size))))
            out = []
            for delivery in deliveries:
                delivery.status, delivery.claimed_by = "sending", self.name
                delivery.lease_until = at + dt.timedelta(seconds=self.settings.delivery_lease_seconds)
                delivery.attempts += 1
                out.append((delivery.id, delivery.channel, *self._message(session, delivery)))
            return out

    def _message(self, session: Session, delivery: Delivery) -> tuple[Invitation | None, str | None]:
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
        study = session.get(Study, participant.study_id)
        assert study is not None
        instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
        email = decrypt_contact(participant.contact_email_encrypted) if participant.contact_email_encrypted else None
        closes = (assignment.closes_at.strftime("%Y-%m-%d %H:%M UTC") if assignment.closes_at else "it is done")
        return Invitation(
            idempotency_key=delivery.idempotency_key, kind=delivery.kind, participant_code=participant.code,
            to_email=email, study_title=study.title, survey_title=instrument.title,
            link=f"{self.settings.base_url.rstrip('/')}/s/{survey_service.link_token(assignment)}",
            closes_at_text=closes), None

    def _deliver(self, delivery_id: int, channel_name: str, message: Invitation | None, skip_reason: str | None,
                 report: TickReport) -> None:
        ours = and_(Delivery.id == delivery_id, Delivery.claimed_by == self.name, Delivery.status == "sending")
        if message is None:
            with session_scope(self.engine) as session:
                session.execute(update(Delivery).where(ours).values(status="cancelled", last_error=skip_reason))
            report.cancelled += 1
            return
        channel = self.channels.get(channel_name)
        try:
            if channel is None:
                raise DeliveryError("rejected", f"the {channel_name} channel is not configured", permanent=True)
            channel.send(message)
        except DeliveryError as exc:
            self._failed(delivery_id, channel_name, exc, report)
            return
        with session_scope(self.engine) as session:
            at = now()
            session.execute(update(Delivery).where(ours).values(status="sent", sent_at=at, last_error=None))
            delivery = session.get(Delivery, delivery_id)
            if delivery is not None and delivery.kind == "reminder":
                session.execute(update(FollowUp).where(FollowUp.id == delivery.followup_id)
                                .values(reminders_sent=FollowUp.reminders_sent + 1))
            session.execute(update(ChannelAlert).where(ChannelAlert.channel == channel_name,
                                                       ChannelAlert.resolved_at.is_(None)).values(resolved_at=at))
        report.sent += 1

    def _failed(self, delivery_id: int, channel: str, exc: DeliveryError, report: TickReport) -> None:
        s = self.settings
        with session_scope(self.engine) as session:
            delivery = session.get(Delivery, delivery_id)
            followup = session.get(FollowUp, delivery.followup_id) if delivery else None
            if delivery is None or followup is None or delivery.claimed_by != self.name:
                return
            at = now()
            delay = dt.timedelta(seconds=min(s.delivery_retry_seconds * 2 ** (delivery.attempts - 1), 3600))
            give_up = exc.permanent or delivery.attempts >= s.delivery_max_attempts or at + delay >= followup.closes_at
            delivery.last_error = f"{exc.problem}: {exc}"
            if give_up:
                delivery.status = "failed"
                report.failed += 1
            else:
                delivery.status, delivery.next_attempt_at = "pending", at + delay
                report.retrying += 1
            delivery.lease_until = None
            _record_alert(session, channel, exc, s.channel_alert_after_failures)
        report.errors.append(f"{channel}: {exc}")
        log.warning("delivery %s on %s failed (%s): %s", delivery_id, channel, exc.problem, exc)

    # One-off actions for the CLI

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


def _record_alert(session: Session, channel: str, exc: DeliveryError, threshold: int) -> None:
    """Count the failure on the channel's open alert; staff see it once it is raised (at once for a
    refused login, after ``threshold`` failures otherwise)."""
    alert = session.scalar(select(ChannelAlert).where(ChannelAlert.channel == channel,
                                                      ChannelAlert.problem == exc.problem,
                                                      ChannelAlert.resolved_at.is_(None)))
    at = now()
    if alert is None:
        alert = ChannelAlert(channel=channel, problem=exc.problem, message=str(exc), failures=0, first_at=at)
        session.add(alert)
    alert.failures += 1
    alert.last_at, alert.message = at, str(exc)
    if alert.raised_at is None and (exc.problem == "auth_refused" or alert.failures >= threshold):
        alert.raised_at = at
        log.error("ALERT: the %s channel is failing (%s): %s", channel, exc.problem, exc)


def run(engine: Engine, settings: Settings, name: str | None = None,
        on_tick: Callable[[TickReport], None] | None = None) -> None:
    """The scheduler process: APScheduler runs the dispatcher every poll interval until SIGTERM."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    dispatcher = Dispatcher(engine, settings, name)

    def tick() -> None:
        report = dispatcher.tick()
        if on_tick is not None:
            on_tick(report)
        if report.opened or report.sent or report.failed or report.expired:
            log.info("tick %s", report)

    scheduler = BlockingScheduler(timezone=dt.UTC)
    scheduler.add_job(tick, "interval", seconds=settings.scheduler_poll_seconds, id="dispatch",
                      max_instances=1, coalesce=True, next_run_time=dt.datetime.now(dt.UTC))

    def stop(signum: int, _frame: object) -> None:
        log.info("stopping on signal %s", signum)
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("dispatcher %s polling every %ss", dispatcher.name, settings.scheduler_poll_seconds)
    scheduler.start()
