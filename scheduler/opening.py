"""Opening follow-ups: planned ones falling due become open surveys, each batch in the transaction
that claims it, and studies whose protocol changed are re-planned first.

Opening is database work only (a survey assignment per follow-up, what the in-app channel shows,
and its delivery rows for the outbox), so it happens inside the claiming transaction (``FOR
UPDATE SKIP LOCKED`` on PostgreSQL; SQLite serializes writers) and exactly once. A batch that
fails is opened again row by row, so a poisoned row fails alone; it backs off and is given up
with a staff alert after ``delivery_max_attempts``, as is a study that cannot be re-planned.
Both select only the studies of the dispatcher's scope (``scheduler.scope``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, exists, func, insert, not_, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from scheduler.channels import Channel, DeliveryError
from scheduler.models import Delivery, FollowUp, FollowUpStatus
from scheduler.planner import replan_study
from scheduler.scope import LIVE, Scope
from scheduler.tick import SCHEDULER_ALERTS, Retries, TickReport, changed, describe, record_alert
from study.clock import now
from study.db import bulk_insert, is_postgres, session_scope
from study.models import Participant, ParticipantStatus, ProtocolVersion
from study.outbox import OutboxStatus
from study.settings import Settings
from study.studies import current_protocol, current_version
from surveys import registry
from surveys.models import SurveyAssignment

log = logging.getLogger("afterward.scheduler")
SENDING_CHANNELS = ("email", "webhook")


class Opener:
    """Opens due follow-ups of the ``scope``'s studies for the dispatcher; ``channels`` are the
    dispatcher's (a follow-up gets a delivery on each of the protocol's sending channels among them)."""

    def __init__(self, engine: Engine, settings: Settings, channels: dict[str, Channel],
                 stopping: threading.Event, scope: Scope = LIVE) -> None:
        self.engine, self.settings, self.channels, self.stopping = engine, settings, channels, stopping
        self.scope = scope
        self._seen_versions: dict[int, int] = {}
        self._replans = Retries()  # by study id
        self._openings = Retries()  # by follow-up id

    # Protocol edits: follow-ups not yet sent follow the newest version before anything is sent.

    def replan_changed_protocols(self, report: TickReport | None = None,
                                 studies: set[int] | None = None) -> dict[int, int]:
        """Re-plan the studies whose protocol changed (or ``studies``), each in its own
        transaction. Returns the studies that could not be re-planned, with their newest version:
        their follow-ups planned under an older one must not be opened."""
        report = report if report is not None else TickReport()
        with session_scope(self.engine, read_only=True) as session:
            versions = dict(session.execute(select(ProtocolVersion.study_id, func.max(ProtocolVersion.version))
                                            .where(self.scope.covers(ProtocolVersion.study_id))
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
                  attempts, describe(exc), exc_info=exc)
        report.errors.append(f"study {study_id}: re-planning for protocol version {version} failed: {describe(exc)}")
        if attempts < self.settings.delivery_max_attempts:
            return
        reason = f"re-planning for protocol version {version} failed {attempts} times: {describe(exc)}"
        with session_scope(self.engine) as session:
            at = now()
            given_up = changed(session, update(FollowUp).where(
                FollowUp.study_id == study_id, FollowUp.status == FollowUpStatus.PLANNED,
                FollowUp.protocol_version != version, FollowUp.due_at <= at).values(
                status=FollowUpStatus.CANCELLED, ended_at=at, updated_at=at, end_reason=f"not sent: {reason}"[:200]))
            if given_up:
                report.cancelled += given_up
                record_alert(session, SCHEDULER_ALERTS, DeliveryError("replan_failed", (
                    f"study {study_id}: {given_up} due follow-up(s) given up, {reason}")),
                    self.settings.channel_alert_after_failures, gave_up=True)

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
                     .join(Participant, Participant.id == FollowUp.participant_id)
                     .where(self.scope.covers(FollowUp.study_id)))
            if only is not None:
                query = query.where(FollowUp.id == only, FollowUp.status == FollowUpStatus.PLANNED)
            else:
                query = (query.where(FollowUp.status == FollowUpStatus.PLANNED, FollowUp.due_at <= at)
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
                  describe(exc), exc_info=exc)
        report.errors.append(f"study {row.study_id}: follow-up {row.id} could not be opened: {describe(exc)}")
        if attempts < self.settings.delivery_max_attempts:
            return
        reason = f"could not be opened after {attempts} attempts: {describe(exc)}"
        try:
            with session_scope(self.engine) as session:
                at = now()
                given_up = changed(session, update(FollowUp)
                                   .where(FollowUp.id == row.id, FollowUp.status == FollowUpStatus.PLANNED)
                                   .values(status=FollowUpStatus.CANCELLED, ended_at=at, updated_at=at,
                                           end_reason=f"not sent: {reason}"[:200]))
                if given_up:
                    record_alert(session, SCHEDULER_ALERTS, DeliveryError("open_failed", (
                        f"study {row.study_id}: follow-up {row.id} given up, {reason}")),
                        self.settings.channel_alert_after_failures, gave_up=True)
        except Exception as give_up_exc:  # it stays planned and backing off; the next give-up tries again
            log.exception("follow-up %s: giving up failed", row.id)
            report.errors.append(f"follow-up {row.id}: giving up failed: {describe(give_up_exc)}")
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
                ended.append({"id": row.id, "status": FollowUpStatus.CANCELLED, "ended_at": at, "updated_at": at,
                              "end_reason": "participant withdrew"})
                report.cancelled += 1
            elif at >= row.closes_at:
                ended.append({"id": row.id, "status": FollowUpStatus.EXPIRED, "ended_at": at, "updated_at": at,
                              "end_reason": f"not sent: due {row.due_at:%Y-%m-%d %H:%M} UTC, but no dispatcher "
                              f"ran before the window closed at {row.closes_at:%Y-%m-%d %H:%M} UTC"})
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


def _replan(session: Session, study_id: int, version: int) -> None:
    """Re-plan a study's unsent follow-ups for protocol ``version``; on PostgreSQL one dispatcher
    at a time (the others wait on the lock, then find nothing left to do)."""
    if is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x5C4ED000 + study_id})
    stale = session.scalar(select(exists().where(
        FollowUp.study_id == study_id, FollowUp.status == FollowUpStatus.PLANNED,
        FollowUp.protocol_version != version)))
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
        {"id": id_, "status": FollowUpStatus.SENT, "sent_at": at, "assignment_id": aid, "updated_at": at,
         "lateness_seconds": late}
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
             "due_at": followup.due_at, "status": OutboxStatus.SENT, "attempts": 1, "next_attempt_at": at,
             "sent_at": at}]
    for sequence, after in enumerate([0, *followup.reminder_offsets]):
        due = followup.due_at + dt.timedelta(seconds=after)
        skipped = sequence > 0 and due <= at
        rows += [{**common, "kind": "reminder" if sequence else "invitation", "sequence": sequence,
                  "channel": channel, "idempotency_key": f"{key}-{sequence}-{channel}", "due_at": due,
                  "status": OutboxStatus.CANCELLED if skipped else OutboxStatus.PENDING, "attempts": 0,
                  "next_attempt_at": max(due, at),
                  "last_error": "skipped: its time passed before the invitation went out" if skipped else None}
                 for channel in channels]
    return rows
