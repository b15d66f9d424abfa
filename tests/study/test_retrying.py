"""study.db.retrying: batch work runs again while the database answers busy, within a bound."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from study.db import DatabaseBusy, retrying


def test_busy_work_runs_again_until_it_goes_through() -> None:
    calls: list[int] = []

    def work() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise DatabaseBusy("another writer held the database for more than 5 s")
        return "stored"

    assert retrying(work) == "stored"
    assert len(calls) == 3


def test_a_bug_is_not_retried() -> None:
    calls: list[int] = []

    def work() -> None:
        calls.append(1)
        raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))

    with pytest.raises(IntegrityError):
        retrying(work)
    assert len(calls) == 1


def test_busy_past_the_bound_lets_the_error_through() -> None:
    calls: list[int] = []

    def work() -> None:
        calls.append(1)
        raise DatabaseBusy("another writer held the database for more than 5 s")

    with pytest.raises(DatabaseBusy):
        retrying(work, within=0.2)
    assert 2 <= len(calls) <= 4  # pauses of 0.05, 0.1, ... until the next would pass the bound
