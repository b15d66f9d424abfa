"""``analysis.disclosure`` on tables of counts alone: the cells under 5 participants are exactly the
primary ones, and an attacker who knows every shown cell, every sum and the bounds the markers
give away (an exhaustive search of the consistent tables) cannot work out a hidden one."""

from __future__ import annotations

import random

import pytest

from analysis.disclosure import SUPPRESSED, THRESHOLD, Count, Disclosure
from tests.analysis.attacker import LOW, Cell, Sum, by_subtraction, knowledge, recoverable


@pytest.mark.parametrize("seed", range(6))
def test_random_tables_keep_every_hidden_cell_hidden(seed: int) -> None:
    """Small tables of counts with row and column totals, many cells under 5: the primary cells
    are exactly those under 5 participants, and an exhaustive search finds every hidden cell
    could have had another value."""
    rng = random.Random(seed)
    leaks = 0  # tables where hiding only the cells under 5 would have given one away
    for _ in range(12):
        n_rows, n_columns = rng.randint(1, 3), rng.randint(2, 4)
        of_participants = rng.random() < 0.5
        inner = [[rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 12, 20]) for _ in range(n_columns)] for _ in range(n_rows)]
        grid = [[*row, sum(row)] for row in inner]
        grid.append([sum(row[c] for row in grid) for c in range(n_columns + 1)])
        disclosure = Disclosure()
        truth: dict[Cell, int] = {}
        for r, row in enumerate(grid):
            for c, value in enumerate(row):
                truth[("t", r, str(c))] = value
                disclosure.add_count(("t", r, str(c)), Count(value, value, of_participants))
        sums: list[Sum] = [(("t", r, str(n_columns)), [("t", r, str(c)) for c in range(n_columns)])
                           for r in range(n_rows + 1)]
        sums += [(("t", n_rows, str(c)), [("t", r, str(c)) for r in range(n_rows)]) for c in range(n_columns + 1)]
        for total, parts in sums:
            disclosure.add_sum(total, parts)
        status = disclosure.protect()
        assert {k for k, s in status.items() if s == "below"} == {k for k, v in truth.items() if v < THRESHOLD}
        shown_cells = {k: (LOW if s == "below" else SUPPRESSED if s == "suppressed" else truth[k])
                       for k, s in status.items()}
        shown, bounds = knowledge(shown_cells, set(truth) if of_participants else set())
        assert recoverable(truth, shown, bounds, sums) == [], (grid, shown_cells)
        naive = {k: truth[k] for k, s in status.items() if s == "suppressed"}
        leaks += bool(recoverable(truth, {**shown, **naive}, {k: b for k, b in bounds.items() if k not in naive},
                                  sums))
    assert leaks > 0


def test_a_margin_never_has_one_hidden_cell_and_totals_do_not_pin_small_cells() -> None:
    def protect(values: list[int]) -> list[str]:
        disclosure = Disclosure()
        cells = [("t", 0, str(i)) for i in range(len(values) + 1)]
        for cell, value in zip(cells, [*values, sum(values)], strict=True):
            disclosure.add_count(cell, Count(value, value, True))
        disclosure.add_sum(cells[-1], cells[:-1])
        status = disclosure.protect()
        return [status[c] for c in cells]

    # 3 alone would be 53 - 20 - 30: the next smallest, 20, goes too.
    assert protect([3, 20, 30]) == ["below", "suppressed", "shown", "shown"]
    # 4 and 4 under 28 with 20 shown: both "< 5" and adding to 8, each must be 4.
    assert protect([4, 4, 20]) == ["below", "below", "suppressed", "shown"]
    # 2 and 2 under 24 with 20 shown: 0+4, 1+3, 2+2, 3+1 or 4+0; nothing more to hide.
    assert protect([2, 2, 20]) == ["below", "below", "shown", "shown"]
    # Every cell under 5, the total too: all hidden, nothing to work out.
    assert protect([1, 2]) == ["below", "below", "below"]
    # Had 20 been shown, an exhaustive search pins both 4s (so the search is a real attacker).
    truth = {("t", 0, "0"): 4, ("t", 0, "1"): 4, ("t", 0, "2"): 20, ("t", 0, "3"): 28}
    sums: list[Sum] = [(("t", 0, "3"), [("t", 0, "0"), ("t", 0, "1"), ("t", 0, "2")])]
    shown, bounds = knowledge({**truth, ("t", 0, "0"): LOW, ("t", 0, "1"): LOW}, set(truth))
    assert recoverable(truth, shown, bounds, sums) == [("t", 0, "0"), ("t", 0, "1")]
    assert by_subtraction(shown, sums) == {}  # which subtraction alone does not
