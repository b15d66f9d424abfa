from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from scheduler.planner import in_quiet_hours, out_of_quiet_hours, timing
from study.protocol import FollowUp, QuietHours

UTC = dt.UTC
QUIET = QuietHours(start="21:00", end="08:00")


def wall(year: int, month: int, day: int, hour: int, minute: int) -> dt.datetime:
    """A wall-clock time: no zone, on purpose."""
    return dt.datetime(year, month, day, hour, minute)  # noqa: DTZ001


def spec(offset: str = "P7D", at: str = "10:00", window: str = "P3D", reminders: tuple[str, ...] = ()) -> FollowUp:
    return FollowUp.model_validate({"id": "f", "instrument": "perma-profiler", "anchor": "enrollment",
                                    "offset": offset, "window": window, "reminders": list(reminders),
                                    "send_at_local": at})


@pytest.mark.parametrize(("zone", "enrolled", "due_utc"), [
    # Berlin leaves summer time on 2026-10-25: 10:00 local is 08:00 UTC before, 09:00 UTC after.
    ("Europe/Berlin", dt.datetime(2026, 10, 15, 12, 0, tzinfo=UTC), dt.datetime(2026, 10, 22, 8, 0, tzinfo=UTC)),
    ("Europe/Berlin", dt.datetime(2026, 10, 20, 12, 0, tzinfo=UTC), dt.datetime(2026, 10, 27, 9, 0, tzinfo=UTC)),
    # New York leaves summer time a week later, on 2026-11-01: 14:00 UTC before, 15:00 UTC after.
    ("America/New_York", dt.datetime(2026, 10, 20, 16, 0, tzinfo=UTC), dt.datetime(2026, 10, 27, 14, 0, tzinfo=UTC)),
    ("America/New_York", dt.datetime(2026, 10, 28, 16, 0, tzinfo=UTC), dt.datetime(2026, 11, 4, 15, 0, tzinfo=UTC)),
    # Spring: both zones move forward in March; the local hour stays 10:00.
    ("Europe/Berlin", dt.datetime(2026, 3, 25, 12, 0, tzinfo=UTC), dt.datetime(2026, 4, 1, 8, 0, tzinfo=UTC)),
    ("America/New_York", dt.datetime(2026, 3, 5, 16, 0, tzinfo=UTC), dt.datetime(2026, 3, 12, 14, 0, tzinfo=UTC)),
])
def test_local_send_time_survives_daylight_saving(zone: str, enrolled: dt.datetime, due_utc: dt.datetime) -> None:
    when = timing(spec(), enrolled, zone, QUIET)
    assert when.due_at == due_utc
    assert when.due_at.astimezone(ZoneInfo(zone)).strftime("%H:%M") == "10:00"
    assert when.closes_at == due_utc + dt.timedelta(days=3)


def test_a_skipped_wall_time_moves_with_the_clock_and_a_repeated_one_takes_the_first() -> None:
    berlin = "Europe/Berlin"
    # 2026-03-29 02:30 does not exist in Berlin: it becomes 03:30 CEST (01:30 UTC).
    skipped = timing(spec("P1D", "02:30"), dt.datetime(2026, 3, 28, 12, 0, tzinfo=UTC), berlin, QuietHours(
        start="00:00", end="00:00"))
    assert skipped.due_at == dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    # 2026-10-25 02:30 happens twice: the first one (CEST, 00:30 UTC).
    repeated = timing(spec("P1D", "02:30"), dt.datetime(2026, 10, 24, 12, 0, tzinfo=UTC), berlin, QuietHours(
        start="00:00", end="00:00"))
    assert repeated.due_at == dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


def test_quiet_hours_move_invitations_and_reminders_to_the_morning() -> None:
    assert in_quiet_hours(wall(2026, 1, 1, 23, 0), QUIET)
    assert in_quiet_hours(wall(2026, 1, 1, 7, 59), QUIET)
    assert not in_quiet_hours(wall(2026, 1, 1, 8, 0), QUIET)
    assert out_of_quiet_hours(wall(2026, 1, 1, 22, 15), QUIET) == wall(2026, 1, 2, 8, 0)
    assert out_of_quiet_hours(wall(2026, 1, 2, 6, 0), QUIET) == wall(2026, 1, 2, 8, 0)
    lunch = QuietHours(start="12:00", end="13:30")
    assert out_of_quiet_hours(wall(2026, 1, 1, 12, 45), lunch) == wall(2026, 1, 1, 13, 30)
    tokyo = "Asia/Tokyo"
    late = timing(spec("P3D", "22:30", window="P2D", reminders=("PT12H",)),
                  dt.datetime(2026, 5, 1, 3, 0, tzinfo=UTC), tokyo, QUIET)
    assert late.intended_local == "2026-05-04T22:30"
    assert late.due_at.astimezone(ZoneInfo(tokyo)) == dt.datetime(2026, 5, 5, 8, 0, tzinfo=ZoneInfo(tokyo))
    # 12 h after 08:00 is 20:00, outside quiet hours: kept.
    assert late.reminder_offsets == [12 * 3600]
    night = timing(spec("P3D", "10:00", window="P2D", reminders=("PT13H",)),
                   dt.datetime(2026, 5, 1, 3, 0, tzinfo=UTC), tokyo, QUIET)
    # 10:00 + 13 h = 23:00, inside quiet hours: moved to 08:00 the next morning (22 h after).
    assert night.reminder_offsets == [22 * 3600]


def test_never_before_the_anchor() -> None:
    enrolled = dt.datetime(2026, 6, 1, 15, 0, tzinfo=UTC)  # 17:00 in Berlin
    when = timing(spec("P0D", "10:00"), enrolled, "Europe/Berlin", QUIET)
    assert when.due_at == dt.datetime(2026, 6, 2, 8, 0, tzinfo=UTC)
