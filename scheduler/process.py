"""The scheduler process (``afterward scheduler``): APScheduler runs the dispatcher's tick every
poll interval and anchors the audit chain on its own schedule, until SIGTERM or SIGINT."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import threading
from collections.abc import Callable

from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from scheduler.tick import TickReport
from study.settings import Settings

log = logging.getLogger("afterward.scheduler")
STOP_GRACE_SECONDS = 3.0  # how long SIGTERM waits for the delivery in flight before exiting anyway


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
