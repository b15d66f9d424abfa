"""Drift over days: growing reliance on the assistant, read from the participant's own earlier messages.

The rule, as a researcher would state it: **reliance is growing when, in the last 7 days (the
participant's own calendar days, today included), they sent a message flagged for dependence on at
least 3 different days.** A message is flagged for dependence when the reading's ``dependence``
head or the lexicon's cue found it (the feature ``dependence_signal`` stored with every
participant message); every conversation counts, and only the participant's own messages.

Why days and not messages: asking the assistant to decide for you five times in one evening is
one episode, which the per-message concern already answers; coming back to it on three separate
days in a week is a habit forming. Three of seven is the smallest count that needs more than one
message and more than one day (a single message, or any number within one day, never fires), and
it keeps to a week so that an old habit long given up does not count. The count (``reliance_days``)
is stored with every participant message, so a study can choose another threshold afterwards.

Nothing here encodes text: the days come from features already stored with earlier messages (the
database) or kept with them (``chat.turn.MemoryStore``), and the current message's own flag.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = ZoneInfo("UTC")
RELIANCE_WINDOW_DAYS = 7  # the last week, today included
RELIANCE_MIN_DAYS = 3  # days of that week with a dependence-flagged message


def zone(name: str | None) -> ZoneInfo:
    """The participant's time zone for counting days (UTC when unknown or not a zone)."""
    try:
        return ZoneInfo(name) if name else UTC
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def window_start(at: dt.datetime) -> dt.datetime:
    """A time no later than the start of the window's first day in any time zone: earlier
    messages are read from here, and ``reliance_days`` keeps those inside the window."""
    return at - dt.timedelta(days=RELIANCE_WINDOW_DAYS + 1)


def reliance_days(flagged_at: Iterable[dt.datetime], at: dt.datetime, tz: ZoneInfo) -> int:
    """The number of calendar days (in ``tz``) of the ``RELIANCE_WINDOW_DAYS`` ending on ``at``'s
    day on which one of ``flagged_at`` (the times of dependence-flagged messages) falls."""
    today = at.astimezone(tz).date()
    first = today - dt.timedelta(days=RELIANCE_WINDOW_DAYS - 1)
    return len({day for when in flagged_at if first <= (day := when.astimezone(tz).date()) <= today})


def reliance_growing(days: int) -> bool:
    """Whether ``days`` (``reliance_days``) meets the rule."""
    return days >= RELIANCE_MIN_DAYS
