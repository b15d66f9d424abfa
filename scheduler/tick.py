"""What every phase of a dispatcher's tick shares: its report, and what it does with a failure
(describe it, back off, count it on a staff alert)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

from sqlalchemy import or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from scheduler.channels import DeliveryError
from scheduler.models import ChannelAlert
from study.clock import now
from study.settings import Settings

log = logging.getLogger("afterward.scheduler")
# Problems with a channel as a whole: a delivery that goes through on it resolves their alert.
# The others are about particular deliveries (an address, a contact, a bug one message hits) and
# stay open for staff once raised.
CHANNEL_PROBLEMS = ("auth_refused", "unreachable", "rejected")
# The alert "channel" for follow-ups given up before any channel was involved (problems
# replan_failed and open_failed).
SCHEDULER_ALERTS = "scheduler"
AUDIT_ALERTS = "audit"  # the alert "channel" of a failed audit anchor


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
    unanswered: int = 0  # safety check-ins that went unanswered past their deadline
    sign_in_sent: int = 0  # sign-in links participants asked for, emailed
    errors: list[str] = field(default_factory=list)

    def add(self, other: TickReport) -> None:
        for counter in fields(self):
            value = getattr(other, counter.name)
            setattr(self, counter.name, getattr(self, counter.name) + value)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def backoff(settings: Settings, attempts: int) -> dt.timedelta:
    """The wait after the ``attempts``-th failure: doubling from the first retry delay, at most an hour."""
    return dt.timedelta(seconds=min(settings.delivery_retry_seconds * 2 ** (attempts - 1), 3600))


class Retries:
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


def record_alert(session: Session, channel: str, exc: DeliveryError, threshold: int, *, gave_up: bool = False,
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


def resolve_alerts(session: Session, channel: str, at: dt.datetime) -> None:
    """A message went through on ``channel``: its problems with the channel as a whole are over,
    and so are the failures not yet raised to staff."""
    session.execute(update(ChannelAlert).where(
        ChannelAlert.channel == channel, ChannelAlert.resolved_at.is_(None),
        or_(ChannelAlert.problem.in_(CHANNEL_PROBLEMS), ChannelAlert.raised_at.is_(None)))
        .values(resolved_at=at))


def changed(session: Session, statement: Any) -> int:
    """Run an UPDATE and return how many rows it changed."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount
