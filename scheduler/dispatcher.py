"""The dispatcher: one tick opens due follow-ups, sends invitations, reminders, on-call notices and
sign-in links, and expires closed windows.

It runs in its own process (``scheduler.process``, ``afterward scheduler``), one or several at
once. Each phase is its own module: opening and re-planning (``scheduler.opening``: database work
only, in the transaction that claims the rows, so exactly once), expiry (``scheduler.expiry``)
and the outbox (``scheduler.outbox``: claimed with a lease and committed, then sent, then
recorded, with idempotency keys), whose kinds are follow-up deliveries (``scheduler.deliveries``),
on-call notices (``scheduler.oncall``) and sign-in emails (``scheduler.sign_in_emails``). Every
step reads the injectable clock.

Nothing one row can do stops the others: each phase of a tick is isolated, and every failure
kind counts an attempt, backs off, and is given up with its reason and a staff alert after
``delivery_max_attempts`` (``scheduler.tick``).

A dispatcher works for a scope of studies (``scheduler.scope``), checked where each phase
selects or claims its rows: the live dispatcher (``afterward scheduler``) every live study and no
simulated one, a simulation's (``simulated_study``) its own simulated study alone.

Each tick starts with safety: check-ins past their deadline become unanswered
(``scheduler.checkins``), then the on-call notices of safety events are planned from the paging
events that wait for review, claimed and sent, so an escalation (or a check-in gone unanswered)
reaches the protocol's safety contacts within one poll; a failing notice raises a staff alert at
once. The sign-in links participants ask for go next.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.engine import Engine

from scheduler import checkins, oncall
from scheduler.channels import (
    Channel,
    DeliveryError,
    EmailChannel,
    InAppChannel,
    OnCallChannel,
    SignInChannel,
    WebhookChannel,
)
from scheduler.deliveries import Deliveries
from scheduler.expiry import expire_closed
from scheduler.models import Delivery, FollowUp, FollowUpStatus
from scheduler.opening import Opener
from scheduler.outbox import M, Outbox, OutboxKind
from scheduler.scope import Scope
from scheduler.sign_in_emails import SignInEmails
from scheduler.tick import AUDIT_ALERTS, TickReport, describe, record_alert
from study import audit
from study.clock import now
from study.db import session_scope
from study.outbox import OutboxStatus
from study.settings import Settings

log = logging.getLogger("afterward.scheduler")

__all__ = ["Dispatcher", "TickReport", "build_channels"]


def build_channels(settings: Settings) -> dict[str, Channel]:
    channels: dict[str, Channel] = {"in_app": InAppChannel(), "email": EmailChannel(settings)}
    if settings.webhook_url and settings.webhook_secret is not None:
        channels["webhook"] = WebhookChannel(settings)
    return channels


class Dispatcher:
    """``channels`` send to participants, ``oncall_channels`` to the protocol's safety contacts,
    ``sign_in_channel`` the sign-in links participants ask for. All are built from the settings by
    default; given ``channels`` (a simulation, a test), on-call notices and sign-in links go only
    through the ones given too (none if none are: they then wait for another dispatcher).
    ``simulated_study``: the simulated study a simulation's dispatcher works for, alone; by default
    a dispatcher works for every live study and touches no simulated study's rows."""

    def __init__(self, engine: Engine, settings: Settings, name: str | None = None,
                 channels: dict[str, Channel] | None = None,
                 oncall_channels: dict[str, OnCallChannel] | None = None,
                 sign_in_channel: SignInChannel | None = None, simulated_study: int | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.scope = Scope(simulated_study)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        if oncall_channels is None:
            oncall_channels = oncall.build_oncall_channels(settings) if channels is None else {}
        self.oncall_channels = oncall_channels
        if sign_in_channel is None and channels is None:
            sign_in_channel = EmailChannel(settings)
        self.channels = channels if channels is not None else build_channels(settings)
        self.stopping = threading.Event()  # set by SIGTERM: finish the delivery in flight, then return
        self.opener = Opener(engine, settings, self.channels, self.stopping, self.scope)
        # With nothing to send on but in-app (opened with the follow-up), deliveries wait for another dispatcher.
        self.deliveries = (self._outbox(Deliveries(settings, self.channels))
                           if set(self.channels) - {"in_app"} else None)
        self.notices = self._outbox(oncall.OnCallNotices(settings, oncall_channels)) if oncall_channels else None
        self.sign_in_emails = None if sign_in_channel is None else self._outbox(SignInEmails(settings, sign_in_channel))

    def _outbox(self, kind: OutboxKind[M]) -> Outbox[M]:
        return Outbox(self.engine, self.settings, self.name, self.stopping, kind, self.scope)

    def stop(self) -> None:
        self.stopping.set()

    # One pass of everything; the scheduler process runs it every poll interval. It never raises:
    # what failed is logged and listed in the report, and the other phases still run.

    def tick(self) -> TickReport:
        report = TickReport()
        unplannable: dict[int, int] = {}
        # Safety first: on-call notices go out before a batch of survey invitations can delay them,
        # and a check-in that goes unanswered now is paged about in this same tick.
        self._phase(report, "check-ins", lambda: checkins.mark_unanswered_due(self.engine, report, self.scope))
        self._phase(report, "on-call planning", self.plan_notifications)
        if self.notices is not None:
            notices = self.notices
            self._phase(report, "on-call sending", lambda: notices.send_due(report))
        # Then the sign-in links: someone is waiting for each, on the page that said it is on its way.
        if self.sign_in_emails is not None:
            sign_in_emails = self.sign_in_emails
            self._phase(report, "sign-in links", lambda: sign_in_emails.send_due(report))
        self._phase(report, "re-planning",
                    lambda: unplannable.update(self.opener.replan_changed_protocols(report)))
        self._phase(report, "opening", lambda: self.open_due(report, unplannable=unplannable))
        self._phase(report, "expiry", lambda: expire_closed(self.engine, report, self.scope))
        if self.deliveries is not None:
            deliveries = self.deliveries
            self._phase(report, "sending", lambda: deliveries.send_due(report))
        return report

    def _phase(self, report: TickReport, name: str, work: Callable[[], object]) -> None:
        if self.stopping.is_set():
            return
        try:
            work()
        except Exception as exc:
            log.exception("dispatcher: %s failed", name)
            report.errors.append(f"{name}: {describe(exc)}")

    def plan_notifications(self) -> int:
        """Plan the on-call notices now due (new events, and events unreviewed for another period)."""
        if not self.oncall_channels:
            return 0
        with session_scope(self.engine) as session:
            return oncall.plan(session, now(), self.oncall_channels, self.scope)

    def open_due(self, report: TickReport, only: int | None = None,
                 unplannable: dict[int, int] | None = None) -> None:
        """Open due follow-ups (``scheduler.opening``); ``only``: that one, if it is planned."""
        self.opener.open_due(report, only, unplannable)

    # One-off actions for the CLI

    def anchor_audit(self) -> audit.Anchored | None:
        """Record the audit chain's head outside the database (run on a schedule); a failure
        raises a staff alert at once instead of stopping the dispatcher."""
        try:
            anchored = audit.anchor(self.engine, self.settings)
        except Exception as exc:  # noqa: BLE001 - whatever failed, staff must hear of it
            log.exception("anchoring the audit chain failed")
            with session_scope(self.engine) as session:
                record_alert(session, AUDIT_ALERTS, DeliveryError("anchor_failed", f"audit anchor: {exc}"), 1)
            return None
        if anchored.new:
            log.info("audit chain anchored at seq %s", anchored.anchor.seq)
        return anchored

    def send_now(self, followup_id: int) -> TickReport:
        """Open a planned follow-up now (moving its due time) and send what it has due. A follow-up
        outside the dispatcher's scope (the live dispatcher's: one of a simulated study) is refused."""
        report = TickReport()
        with session_scope(self.engine) as session:
            followup = session.scalar(select(FollowUp).where(FollowUp.id == followup_id,
                                                            self.scope.covers(FollowUp.study_id)))
            if followup is None:
                if session.get(FollowUp, followup_id) is not None:
                    raise LookupError(f"follow-up {followup_id} is a simulated study's: no live dispatcher sends it"
                                      if self.scope.simulated_study is None else
                                      f"follow-up {followup_id} is not study {self.scope.simulated_study}'s")
                raise LookupError(f"no follow-up {followup_id}")
            if followup.status == FollowUpStatus.PLANNED:
                followup.due_at = min(followup.due_at, now())
        self.open_due(report, only=followup_id)
        if self.deliveries is None:
            return report
        with session_scope(self.engine) as session:
            ids = session.scalars(select(Delivery.id).where(
                Delivery.followup_id == followup_id, Delivery.status.in_((OutboxStatus.PENDING, OutboxStatus.FAILED)),
                Delivery.sequence == 0, Delivery.channel != "in_app")).all()
        for delivery_id in ids:
            self.deliveries.send_due(report, only=delivery_id)
        return report

