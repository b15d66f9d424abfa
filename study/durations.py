"""How a protocol says how long and how often: durations (``P7D``, ``7 days``), intervals of
repetition on the participant's calendar (``P1D``, ``P2M``) and the ``repeat`` of a follow-up,
each refused with a message a researcher can act on (``study.protocol`` reads them)."""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

DURATION_FORMS = ("an ISO 8601 duration like P7D or PT2H, or a number with a unit like "
                  "'7 days', '3d', '2 hours' or '90 minutes'")
_NUMBER = r"\d+(?:\.\d+)?"
_ISO_DURATION = re.compile(
    rf"^P(?:(?P<weeks>{_NUMBER})W)?(?:(?P<days>{_NUMBER})D)?"
    rf"(?:T(?=\d)(?:(?P<hours>{_NUMBER})H)?(?:(?P<minutes>{_NUMBER})M)?(?:(?P<seconds>{_NUMBER})S)?)?$")
_UNITS = {"w": "weeks", "wk": "weeks", "wks": "weeks", "week": "weeks", "weeks": "weeks",
          "d": "days", "day": "days", "days": "days",
          "h": "hours", "hr": "hours", "hrs": "hours", "hour": "hours", "hours": "hours",
          "min": "minutes", "mins": "minutes", "minute": "minutes", "minutes": "minutes",
          "s": "seconds", "sec": "seconds", "secs": "seconds", "second": "seconds", "seconds": "seconds"}
_TERM = re.compile(rf"({_NUMBER})\s*([a-z]+)")
_TERMS = re.compile(rf"^(?:{_NUMBER}\s*[a-z]+)(?:\s*,?\s*(?:and\s+)?{_NUMBER}\s*[a-z]+)*$")


def parse_duration(value: object) -> dt.timedelta:
    """A protocol duration: an ISO 8601 duration (``P7D``, ``PT2H``, ``P1DT12H``) or numbers with
    units (``7 days``, ``3d``, ``2 hours``, ``90 minutes``, ``1 day 12 hours``). A bare number is
    refused: ``offset: 7`` used to load silently as seven seconds. A ``timedelta`` (a protocol built
    in code) passes unchanged."""
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"give a duration: {DURATION_FORMS}")
    text = str(value).strip()
    if isinstance(value, int | float) or re.fullmatch(_NUMBER, text):
        raise ValueError(f"'{text}' has no unit; write {DURATION_FORMS}")
    if text[:1] in ("P", "p"):
        upper = text.upper()
        iso = _ISO_DURATION.match(upper)
        if iso is not None and upper != "P":
            return dt.timedelta(**{unit: float(amount) for unit, amount in iso.groupdict().items() if amount})
        if re.match(r"^P[\d.]+[YM]", upper):
            raise ValueError(f"'{text}': years and months have no fixed length; give days or weeks, like P30D")
        raise ValueError(f"'{text}' is not a duration; write {DURATION_FORMS}")
    lowered = text.lower()
    if _TERMS.match(lowered):
        parts: dict[str, float] = {}
        for amount, unit in _TERM.findall(lowered):
            if unit == "m":
                raise ValueError(f"'{text}': m could be minutes or months; write '{amount} min' or PT{amount}M")
            if unit in ("mo", "month", "months", "y", "yr", "year", "years"):
                raise ValueError(f"'{text}': years and months have no fixed length; give days or weeks, like P30D")
            if unit not in _UNITS:
                break
            name = _UNITS[unit]
            if name in parts:
                raise ValueError(f"'{text}' names {name} twice")
            parts[name] = float(amount)
        else:
            return dt.timedelta(**parts)
    raise ValueError(f"'{text}' is not a duration; write {DURATION_FORMS} (units: weeks, days, hours, "
                     "minutes, seconds)")


Duration = Annotated[dt.timedelta, BeforeValidator(parse_duration)]


@dataclass(frozen=True)
class Interval:
    """The spacing of a repeating follow-up on the participant's calendar: whole ``months`` (``P2M``:
    the same day of the month two months on, the last day when that month is shorter) or whole
    ``days`` (``P1D``, ``P1W``), counted in local dates so the send time stays put across DST."""

    months: int = 0
    days: int = 0

    def after(self, day: dt.date, times: int) -> dt.date:
        """The date ``times`` intervals after ``day``."""
        if not self.months:
            return day + dt.timedelta(days=self.days * times)
        month0 = day.month - 1 + self.months * times
        year, month = day.year + month0 // 12, month0 % 12 + 1
        return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))

    @property
    def shortest(self) -> dt.timedelta:
        """The least time between two occurrences (28 days a month)."""
        return dt.timedelta(days=self.months * 28 + self.days)

    @property
    def iso(self) -> str:
        """As ISO 8601 (``P2M``, ``P1D``): how a stored protocol keeps it."""
        return f"P{self.months}M" if self.months else f"P{self.days}D"


_MONTHS = re.compile(r"^(?:P(\d+)M|(\d+)\s*(?:months?|mo))$", re.IGNORECASE)


def parse_interval(value: object) -> Interval:
    """A repetition interval: calendar months (``P2M``, ``2 months``) or whole days and weeks
    (``P1D``, ``P1W``, ``7 days``): any duration ``parse_duration`` takes, if it is whole days."""
    if isinstance(value, Interval):
        return value
    months = _MONTHS.match(str(value).strip()) if isinstance(value, str) else None
    if months is not None:
        count = int(months.group(1) or months.group(2))
        if count < 1:
            raise ValueError("repeat every at least one month")
        return Interval(months=count)
    span = parse_duration(value)
    if span < dt.timedelta(days=1) or span % dt.timedelta(days=1):
        raise ValueError(f"'{value}': repeat every whole number of days, weeks or months (P1D, P1W, P2M)")
    return Interval(days=span.days)


IntervalField = Annotated[Interval, BeforeValidator(parse_interval),
                          PlainSerializer(lambda interval: interval.iso, return_type=str)]
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Repeat(BaseModel):
    """How a follow-up repeats after its first occurrence (``offset`` after the anchor): ``every``
    interval (``P1D`` daily, ``P1W`` weekly, ``P2M`` every two calendar months) or on ``days`` of the
    week (``[mon, thu]``; not ``on:``, which YAML reads as true); ``count`` occurrences in all, or
    every one starting up to ``until`` after the first. Each occurrence has the follow-up's window,
    reminders and local send time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: IntervalField | None = None
    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = None
    count: int | None = Field(default=None, ge=1, le=400)
    until: Duration | None = None

    @model_validator(mode="after")
    def _one_rhythm_and_one_end(self) -> Repeat:
        if (self.every is None) == (self.days is None):
            raise ValueError("repeat needs either every (an interval such as P1D, P1W or P2M) or days (days of "
                             "the week such as [mon, thu]), not both")
        if self.days is not None and (not self.days or len(set(self.days)) != len(self.days)):
            raise ValueError("repeat.days lists each day of the week at most once, and at least one")
        if (self.count is None) == (self.until is None):
            raise ValueError("repeat needs either count (how many occurrences) or until (how long after the first "
                             "one), not both")
        if self.until is not None and not dt.timedelta(0) < self.until <= dt.timedelta(days=800):
            raise ValueError("repeat.until must be positive and at most 800 days")
        return self

    @property
    def shortest(self) -> dt.timedelta:
        """The least time between two occurrences."""
        if self.every is not None:
            return self.every.shortest
        days = sorted(WEEKDAYS.index(day) for day in self.days or ())
        gaps = [b - a for a, b in zip(days, days[1:], strict=False)] + [7 - days[-1] + days[0]]
        return dt.timedelta(days=min(gaps))

    def dates(self, first: dt.date) -> list[dt.date]:
        """The local dates of every occurrence from ``first`` (the anchor plus the offset): with
        ``every``, the first on ``first``; with ``on``, the first listed day on or after it (at most 400)."""
        last = first + dt.timedelta(days=self.until.days) if self.until is not None else None
        limit = self.count or 400
        found: list[dt.date] = []
        if self.every is not None:
            while len(found) < limit:
                day = self.every.after(first, len(found))
                if last is not None and day > last:
                    break
                found.append(day)
            return found
        wanted = {WEEKDAYS.index(day) for day in self.days or ()}
        day = first
        while len(found) < limit and (last is None or day <= last):
            if day.weekday() in wanted:  # the first listed day on or after the first date, and so on
                found.append(day)
            day += dt.timedelta(days=1)
        return found
