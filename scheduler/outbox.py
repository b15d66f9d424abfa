"""The outbox pipeline: claim → lease → compose → send → record, for every kind of message the
dispatcher sends (follow-up deliveries, on-call notices, sign-in emails; ``study.outbox`` has
their shared columns and statuses).

Sending talks to the outside world, so a row is first claimed with a lease and committed (``FOR
UPDATE SKIP LOCKED`` on PostgreSQL, so replicas claim different rows; SQLite serializes writers),
then composed in a read-only transaction, sent with no transaction open, then recorded only if it
is still ours. A dispatcher that dies mid-send leaves an expired lease and another one sends again
with the same idempotency key (the email's Message-ID, the webhook's Idempotency-Key). Each claim
counts an attempt, so a row that kills its dispatcher every time is given up like any other.
Whatever one row does is recorded on it alone: a failed attempt backs off (doubling) and is given
up with its reason and a staff alert when the error is permanent, the attempts are used up or
the next try would fall after the kind's deadline. On stop, the rest of a batch is handed back.

A kind (``OutboxKind``) says what to claim, how to compose a message, which channel sends it,
what a sent one changes besides its row, where its alerts go, and which study a row is of: a
dispatcher claims only the rows of its scope's studies (``scheduler.scope``: the live dispatcher
none of a simulated study's, a simulation's only its own study's).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import ColumnElement, Row, Select, and_, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from scheduler.channels import DeliveryError
from scheduler.scope import LIVE, Scope
from scheduler.tick import TickReport, backoff, changed, describe, record_alert, resolve_alerts
from study.clock import now
from study.db import is_postgres, session_scope
from study.outbox import LeasedRow, OutboxStatus
from study.settings import Settings

log = logging.getLogger("afterward.scheduler")
M = TypeVar("M")
NEVER_FINISHED = DeliveryError("error", "the last attempt never finished (its dispatcher stopped mid-send)")


def due(model: Any, at: dt.datetime) -> ColumnElement[bool]:
    """Rows of ``model`` to send now: pending and due, or leased by a dispatcher that died."""
    return or_(and_(model.status == OutboxStatus.PENDING, model.next_attempt_at <= at),
               and_(model.status == OutboxStatus.SENDING, model.lease_until < at))


class OutboxKind(ABC, Generic[M]):
    """One kind of message: its table, what to claim and how to compose, send and record it.
    Claimed rows are the columns ``id``, ``status``, ``attempts`` and the kind's ``columns``."""

    model: ClassVar[type[LeasedRow]]
    noun: ClassVar[str]  # in logs and errors: "delivery 7: ..."
    message_noun: ClassVar[str]  # "... could not be composed"
    counter: ClassVar[str]  # the TickReport field that counts the sent ones

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.alert_after = settings.channel_alert_after_failures  # failures before staff are alerted

    def columns(self) -> Sequence[Any]:
        return ()

    def claim(self, at: dt.datetime, only: int | None) -> Select[Any]:
        """The rows to claim now (``only``: that one row, if it may be sent)."""
        model = self.model
        return (select(model.id, model.status, model.attempts, *self.columns()).where(due(model, at))
                .order_by(model.next_attempt_at).limit(self.settings.scheduler_batch_size))

    @abstractmethod
    def study(self) -> Any:
        """The study a row is of, as SQL on the kind's table (a column, or a correlated scalar
        subquery): what a dispatcher's scope is checked against where the rows are claimed."""

    @abstractmethod
    def about(self, row: Row[Any]) -> str:
        """What a give-up alert names: "delivery 7"."""

    @abstractmethod
    def where(self, row: Row[Any]) -> str:
        """How errors and logs name it: "email: delivery 7"."""

    @abstractmethod
    def alert_channel(self, row: Row[Any]) -> str:
        """The alert "channel" its failures count on."""

    @abstractmethod
    def compose(self, session: Session, row: Row[Any]) -> tuple[M | None, str | None]:
        """The message, or why there is nothing to send any more (the row is then cancelled).
        Raises DeliveryError when it can never be composed."""

    @abstractmethod
    def sender(self, row: Row[Any]) -> tuple[str, Callable[[M], None] | None]:
        """The channel's name in an error, and what sends the message (None: not configured)."""

    def deadline(self, session: Session, record: Any) -> dt.datetime | None:
        """No retry at or after this time."""
        return None

    def sent(self, session: Session, row: Row[Any]) -> None:
        """What else a sent message changes, in the transaction that records it."""


class Outbox(Generic[M]):
    """Sends one kind's due rows of the ``scope``'s studies on behalf of the dispatcher ``name``."""

    def __init__(self, engine: Engine, settings: Settings, name: str, stopping: threading.Event,
                 kind: OutboxKind[M], scope: Scope = LIVE) -> None:
        self.engine, self.settings, self.name, self.stopping, self.kind = engine, settings, name, stopping, kind
        self.scope = scope

    def send_due(self, report: TickReport, only: int | None = None) -> None:
        """Claim a batch (committed, with a lease), then compose and send it one row at a time;
        each outcome is recorded on its row alone. On stop the rest of the batch is handed back."""
        noun = self.kind.noun
        while not self.stopping.is_set():
            claimed = self._claim(report, only)
            if not claimed:
                return
            for index, row in enumerate(claimed):
                if self.stopping.is_set():
                    self._hand_back([later.id for later in claimed[index:]])
                    return
                try:
                    self._send(row, report)
                except Exception as exc:  # recording the outcome failed: the lease brings it back
                    log.exception("%s %s: recording the outcome failed", noun, row.id)
                    report.errors.append(f"{noun} {row.id}: {describe(exc)}")
            if only is not None:
                return

    def _claim(self, report: TickReport, only: int | None) -> list[Row[Any]]:
        kind = self.kind
        with session_scope(self.engine) as session:
            at = now()
            query = kind.claim(at, only).where(self.scope.covers(kind.study()))
            if is_postgres(session):
                query = query.with_for_update(skip_locked=True)
            taken, exhausted = self._lease(session, session.execute(query).all(), at)
            for row in exhausted:
                record_alert(session, kind.alert_channel(row), NEVER_FINISHED, kind.alert_after, gave_up=True,
                             about=f"{kind.about(row)} given up after {row.attempts} attempt(s)")
                report.failed += 1
                report.errors.append(f"{kind.where(row)}: {NEVER_FINISHED}")
            return taken

    def _lease(self, session: Session, rows: Sequence[Row[Any]],
               at: dt.datetime) -> tuple[list[Row[Any]], list[Row[Any]]]:
        """Lease the claimed ``rows`` to this dispatcher (sending, one more attempt) and give up
        the exhausted ones: an attempt that never finished counts too. Returns (leased, exhausted)."""
        model, s = self.kind.model, self.settings
        exhausted = [row for row in rows
                     if row.status == OutboxStatus.SENDING and row.attempts >= s.delivery_max_attempts]
        leased = [row for row in rows if row not in exhausted]
        if leased:
            session.execute(update(model).where(model.id.in_([row.id for row in leased])).values(
                status=OutboxStatus.SENDING, claimed_by=self.name, attempts=model.attempts + 1,
                lease_until=at + dt.timedelta(seconds=s.delivery_lease_seconds)))
        for row in exhausted:
            session.execute(update(model).where(model.id == row.id).values(
                status=OutboxStatus.FAILED, lease_until=None, last_error=f"{NEVER_FINISHED.problem}: {NEVER_FINISHED}"))
        return leased, exhausted

    def _ours(self, row: Row[Any]) -> ColumnElement[bool]:
        model = self.kind.model
        return and_(model.id == row.id, model.claimed_by == self.name, model.status == OutboxStatus.SENDING)

    def _send(self, row: Row[Any], report: TickReport) -> None:
        kind = self.kind
        message: M | None = None
        skip_reason: str | None = None
        failure: DeliveryError | None = None
        try:
            with session_scope(self.engine, read_only=True) as session:
                message, skip_reason = kind.compose(session, row)
        except DeliveryError as exc:
            failure = exc
        except Exception as exc:
            failure = DeliveryError("error", f"{kind.message_noun} could not be composed: {describe(exc)}")
        if skip_reason is not None:
            with session_scope(self.engine) as session:
                session.execute(update(kind.model).where(self._ours(row)).values(
                    status=OutboxStatus.CANCELLED, lease_until=None, last_error=skip_reason))
            report.cancelled += 1
            return
        if failure is None:
            assert message is not None
            name, send = kind.sender(row)
            failure = attempt(name, None if send is None else lambda: send(message))
        if failure is not None:
            self._failed(row, failure, report)
            return
        with session_scope(self.engine) as session:
            at = now()
            if changed(session, update(kind.model).where(self._ours(row)).values(
                    status=OutboxStatus.SENT, sent_at=at, lease_until=None, last_error=None)):
                kind.sent(session, row)
            resolve_alerts(session, kind.alert_channel(row), at)
        setattr(report, kind.counter, getattr(report, kind.counter) + 1)

    def _failed(self, row: Row[Any], exc: DeliveryError, report: TickReport) -> None:
        kind = self.kind
        with session_scope(self.engine) as session:
            record = session.get(kind.model, row.id)
            if record is None or record.claimed_by != self.name or record.status != OutboxStatus.SENDING:
                return  # no longer ours (cancelled meanwhile, or its lease passed to another dispatcher)
            give_up = retry_or_give_up(record, exc, self.settings, report, deadline=kind.deadline(session, record))
            attempts = record.attempts
            record_alert(session, kind.alert_channel(row), exc, kind.alert_after, gave_up=give_up,
                         about=f"{kind.about(row)} given up after {attempts} attempt(s)")
        report.errors.append(f"{kind.where(row)}: {exc}")
        log.warning("%s failed (%s, attempt %s%s): %s", kind.where(row), exc.problem, attempts,
                    ", given up" if give_up else "", exc)

    def _hand_back(self, ids: list[int]) -> None:
        """Hand claimed rows back unsent (stopping): pending again, the attempt not counted."""
        model = self.kind.model
        try:
            with session_scope(self.engine) as session:
                session.execute(update(model).where(
                    model.id.in_(ids), model.claimed_by == self.name, model.status == OutboxStatus.SENDING)
                    .values(status=OutboxStatus.PENDING, lease_until=None, attempts=model.attempts - 1))
        except Exception:  # their leases expire and another dispatcher takes them
            log.exception("could not hand back %s claimed rows of %s", len(ids), model.__tablename__)


def attempt(name: str, send: Callable[[], None] | None) -> DeliveryError | None:
    """Send once; the failure, if any, as a DeliveryError (``send`` None: the channel is not
    configured). A bug in a channel counts like any failure: retried, then given up."""
    try:
        if send is None:
            raise DeliveryError("rejected", f"{name} is not configured", permanent=True)
        send()
    except DeliveryError as exc:
        return exc
    except Exception as exc:
        return DeliveryError("error", f"{name} failed: {describe(exc)}")
    return None


def retry_or_give_up(record: Any, exc: DeliveryError, settings: Settings, report: TickReport, *,
                     deadline: dt.datetime | None = None) -> bool:
    """Record a failed attempt on a claimed row: pending again after the backoff, or failed for
    good when the error is permanent, the attempt limit is reached or the next try would fall
    after ``deadline``. Returns whether it gave up."""
    retry_at = now() + backoff(settings, record.attempts)
    give_up = (exc.permanent or record.attempts >= settings.delivery_max_attempts
               or (deadline is not None and retry_at >= deadline))
    record.last_error = f"{exc.problem}: {exc}"
    if give_up:
        record.status = OutboxStatus.FAILED
        report.failed += 1
    else:
        record.status, record.next_attempt_at = OutboxStatus.PENDING, retry_at
        report.retrying += 1
    record.lease_until = None
    return give_up
