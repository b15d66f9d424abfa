"""The single injectable clock. Everything that needs "now" calls ``now()`` so that tests and
simulations can move time forward by weeks."""

from __future__ import annotations

import datetime as dt
import threading


class Clock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FrozenClock(Clock):
    """A clock that only moves when told to (tests, demos)."""

    def __init__(self, start: dt.datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._now = start.astimezone(dt.UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, delta: dt.timedelta) -> None:
        with self._lock:
            self._now += delta

    def set(self, when: dt.datetime) -> None:
        with self._lock:
            self._now = when.astimezone(dt.UTC)


_clock: Clock = Clock()


def now() -> dt.datetime:
    return _clock.now()


def get_clock() -> Clock:
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Install ``clock`` and return the previous one (so a test can put it back)."""
    global _clock
    previous, _clock = _clock, clock
    return previous
