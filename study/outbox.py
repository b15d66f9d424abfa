"""Outbox rows: messages that a dispatcher claims with a lease, sends and records.

Deliveries of follow-ups (``scheduler.models.Delivery``), on-call notices of safety events
(``scheduler.models.SafetyNotification``) and sign-in emails (``study.models.SignInEmail``) share
these columns and their life: ``pending`` until due (``next_attempt_at``), ``sending`` while a
dispatcher holds the lease (``claimed_by``, ``lease_until``; each claim counts an attempt), then
``sent``, ``failed`` (given up, ``last_error`` says why) or ``cancelled`` (nothing to send any
more). The idempotency key is stable across retries and dispatchers. The pipeline that moves
them is ``scheduler.outbox``; this is the kernel's part, so ``study`` can queue one too.
"""

from __future__ import annotations

import datetime as dt
import enum

from sqlalchemy import CheckConstraint, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from study.clock import now
from study.db import UTCDateTime


def one_of(column: str, values: type[enum.StrEnum], name: str = "status_known") -> CheckConstraint:
    """The CHECK constraint that keeps ``column`` to the enum's values (``ck_<table>_<name>``)."""
    return CheckConstraint(f"{column} IN ({', '.join(repr(value.value) for value in values)})", name=name)


class OutboxStatus(enum.StrEnum):
    PENDING = "pending"  # waiting for next_attempt_at
    SENDING = "sending"  # leased to a dispatcher (claimed_by) until lease_until
    SENT = "sent"
    FAILED = "failed"  # given up: permanent error, attempt limit or deadline
    CANCELLED = "cancelled"  # nothing to send any more (withdrawn, closed, reviewed, expired)


class LeasedRow:
    """The columns of an outbox table, its due index (``ix_<table>_due``) and its status check."""

    id: Mapped[int] = mapped_column(primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16), default=OutboxStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)

    @declared_attr.directive
    @classmethod
    def __table_args__(cls) -> tuple[object, ...]:
        return (Index(f"ix_{cls.__tablename__}_due", "status", "next_attempt_at"), one_of("status", OutboxStatus))

    __tablename__: str
