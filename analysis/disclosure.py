"""Disclosure control of tables of counts: small-cell (primary) and complementary suppression.

Counts are registered with the participants contributing to each, and the additive sums that tie
them (a row's parts add up to its total, the arms to the ``all`` row, a count of one table is the
sum of counts of another). ``Disclosure.protect`` then hides each count resting on fewer than
``THRESHOLD`` participants (``below``) and, one at a time, further counts (``suppressed``) until
no hidden count can be pinned down from the shown ones and the sums: for each group of hidden
counts tied by sums it looks for another table within what a viewer knows of their bounds (the
integer kernel of the sums, then a bounded search) that gives the count a different value.

A pure algorithm: no database and no pandas; ``analysis.aggregates`` builds the study's tables
with it.

    >>> disclosure = Disclosure()
    >>> disclosure.add_count(("t", 0, "n"), Count(12, 12, True))
    >>> disclosure.add_count(("t", 1, "n"), Count(9, 9, True))
    >>> disclosure.add_count(("t", 2, "n"), Count(3, 3, True))
    >>> disclosure.add_sum(("t", 0, "n"), [("t", 1, "n"), ("t", 2, "n")])
    >>> disclosure.protect()  # the 3 is below 5; the 9 is suppressed too, or 12 - 9 would give the 3 away
    {('t', 0, 'n'): 'shown', ('t', 1, 'n'): 'suppressed', ('t', 2, 'n'): 'below'}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

THRESHOLD = 5  # a cell resting on fewer participants than this is not shown
SUPPRESSED = "suppressed"


def below(threshold: int = THRESHOLD) -> str:
    """The marker of a cell resting on fewer than ``threshold`` participants: ``"< 5"``."""
    return f"< {threshold}"


CellKey = tuple[str, int, str]  # (table, row position, column)
SHOWN, BELOW = "shown", "below"


@dataclass(frozen=True)
class Count:
    """A count and the participants contributing to it (each contributes at least one unit, so
    ``value >= contributors``). ``counts_participants``: the value is the number of participants
    itself, so a viewer knows a hidden one below the threshold lies between 0 and threshold - 1."""

    value: int
    contributors: int
    counts_participants: bool


class Disclosure:
    """Counts tied by additive sums; ``protect`` decides which are shown, below the threshold,
    or suppressed so that no hidden count can be pinned down (``analysis.aggregates.SUPPRESSION_RULE``
    says the same for readers)."""

    def __init__(self, threshold: int = THRESHOLD) -> None:
        self.threshold = threshold
        self.counts: dict[CellKey, Count] = {}
        self.sums: list[tuple[CellKey, tuple[CellKey, ...]]] = []

    def add_count(self, key: CellKey, count: Count) -> None:
        self.counts[key] = count

    def add_sum(self, total: CellKey, parts: Iterable[CellKey]) -> None:
        """``total`` equals the sum of ``parts`` (a viewer is assumed to know it)."""
        parts = tuple(parts)
        if sum(self.counts[p].value for p in parts) != self.counts[total].value:
            raise ValueError(f"{total} is not the sum of {parts}")
        self.sums.append((total, parts))

    def protect(self) -> dict[CellKey, str]:
        """Each count's status: ``"shown"``, ``"below"`` (primary) or ``"suppressed"``."""
        status = {key: BELOW if count.contributors < self.threshold else SHOWN
                  for key, count in self.counts.items()}
        safe: set[tuple[tuple[CellKey, str], ...]] = set()  # groups of hidden counts found protected
        settled: set[CellKey] = set()  # pinned by the tables' structure alone (see _complement)
        while (pinned := self._first_pinned(status, safe, settled)) is not None:
            extra = self._complement(pinned, status)
            if extra is None:
                settled.add(pinned)
            else:
                status[extra] = SUPPRESSED
        return status

    def _bounds(self, key: CellKey, status: str) -> tuple[int, int | None]:
        """What a viewer knows of a hidden count."""
        if status == BELOW:
            return 0, self.threshold - 1 if self.counts[key].counts_participants else None
        return self.threshold, None

    def _first_pinned(self, status: dict[CellKey, str], safe: set[tuple[tuple[CellKey, str], ...]],
                      settled: set[CellKey]) -> CellKey | None:
        """The first hidden count a viewer could pin down. Hidden counts fall into groups tied by
        sums; a group whose members are unchanged since it was found protected is not checked again."""
        hidden = [key for key in self.counts if status[key] != SHOWN]
        group = {key: key for key in hidden}  # union-find over the sums' hidden counts

        def root(key: CellKey) -> CellKey:
            while group[key] != key:
                group[key] = group[group[key]]
                key = group[key]
            return key

        sums = [[k for k in (total, *parts) if k in group] for total, parts in self.sums]
        for members in sums:
            for key in members[1:]:
                group[root(key)] = root(members[0])
        groups: dict[CellKey, list[CellKey]] = {}
        for key in hidden:
            groups.setdefault(root(key), []).append(key)
        for members in groups.values():
            signature = tuple((key, status[key]) for key in members)
            if signature in safe:
                continue
            index = {key: i for i, key in enumerate(members)}
            rows = []
            for total, parts in self.sums:
                row: dict[int, int] = {}
                for key, coefficient in ((total, -1), *((p, 1) for p in parts)):
                    if key in index:
                        row[index[key]] = row.get(index[key], 0) + coefficient
                if any(row.values()):
                    rows.append(row)
            unknowns = _Unknowns(rows, [self.counts[key].value for key in members],
                                 [self._bounds(key, status[key]) for key in members])
            pinned = next((key for i, key in enumerate(members)
                           if key not in settled and not unknowns.movable(i)), None)
            if pinned is not None:
                return pinned
            safe.add(signature)
        return None

    def _complement(self, pinned: CellKey, status: dict[CellKey, str]) -> CellKey | None:
        """The next count to hide: the smallest shown part (else the total) of a sum containing
        ``pinned``, the sum with the fewest hidden cells first; failing that, of a sum reached
        through hidden cells. None when every count tied to it is hidden already: then no shown
        value pins it, only the tables' structure (e.g. a total over no rows is 0)."""
        order = {key: i for i, key in enumerate(self.counts)}

        def pick(sums: list[tuple[CellKey, tuple[CellKey, ...]]]) -> CellKey | None:
            def hidden_in(item: tuple[CellKey, tuple[CellKey, ...]]) -> int:
                return sum(status[k] != SHOWN for k in (item[0], *item[1]))
            for total, parts in sorted(sums, key=hidden_in):
                shown = sorted((p for p in parts if status[p] == SHOWN),
                               key=lambda p: (self.counts[p].value, order[p]))
                if shown:
                    return shown[0]
                if status[total] == SHOWN:
                    return total
            return None

        reached, frontier = {pinned}, [pinned]
        while frontier:
            sums = [s for s in self.sums if any(k in (s[0], *s[1]) for k in frontier)]
            found = pick(sums)
            if found is not None:
                return found
            frontier = [k for total, parts in sums for k in (total, *parts) if k not in reached]
            reached.update(frontier)
        return None


def _integer_kernel(rows: Sequence[dict[int, int]], size: int) -> list[dict[int, int]]:
    """An integer basis of {v in Z^size : row . v = 0 for every row}, rows and vectors sparse
    (column -> coefficient), by exact Gauss-Jordan elimination over the rationals."""
    pivots: dict[int, dict[int, Fraction]] = {}  # pivot column -> its reduced row (pivot entry 1)
    for given in rows:
        row = {c: Fraction(v) for c, v in given.items() if v}
        for column, pivot_row in pivots.items():
            _subtract(row, pivot_row, row.get(column, Fraction(0)))
        if not row:
            continue
        column = min(row)
        row = {c: v / row[column] for c, v in row.items()}
        for pivot_row in pivots.values():
            _subtract(pivot_row, row, pivot_row.get(column, Fraction(0)))
        pivots[column] = row
    basis = []
    for free in (c for c in range(size) if c not in pivots):
        vector = {free: Fraction(1)}
        for column, pivot_row in pivots.items():
            if free in pivot_row:
                vector[column] = -pivot_row[free]
        scale = math.lcm(*(v.denominator for v in vector.values()))
        basis.append({c: int(v * scale) for c, v in vector.items()})
    return basis


def _subtract(row: dict[int, Fraction], other: dict[int, Fraction], factor: Fraction) -> None:
    if not factor:
        return
    for column, value in other.items():
        updated = row.get(column, Fraction(0)) - factor * value
        if updated:
            row[column] = updated
        else:
            row.pop(column, None)


class _Unknowns:
    """The hidden counts as unknowns: the sums restricted to them (rows: unknown -> coefficient),
    their true values and what a viewer knows of their bounds."""

    SEARCH_BUDGET = 2_000  # steps of the search for a move before a count is taken as pinned
    SEARCH_DEPTH = 200  # unknowns changed along one branch of that search

    def __init__(self, rows: list[dict[int, int]], values: list[int], bounds: list[tuple[int, int | None]]) -> None:
        self.rows, self.values, self.bounds = rows, values, bounds
        self.rows_of: list[list[int]] = [[] for _ in values]
        for r, row in enumerate(rows):
            for i in row:
                self.rows_of[i].append(r)
        self.basis = _integer_kernel(rows, len(values))

    def fits(self, i: int, delta: int) -> bool:
        low, high = self.bounds[i]
        return low <= self.values[i] + delta and (high is None or self.values[i] + delta <= high)

    def movable(self, i: int) -> bool:
        """Whether another table within the bounds gives unknown ``i`` a different value, i.e.
        a move ``v`` (every sum still holds: ``v`` in the kernel) with ``v[i] != 0``. Tried: the
        kernel basis vectors, then a search that starts from ``v[i] = +-1`` and repairs each sum
        it breaks by changing another unknown of it. A count no move is found for is pinned (so a
        search that gives up only ever hides more)."""
        touching = [vector for vector in self.basis if vector.get(i)]
        if not touching:
            return False  # determined by the sums alone
        for vector in touching:
            for sign in (1, -1):
                if all(self.fits(j, sign * d) for j, d in vector.items()):
                    return True
        return any(self._search(i, sign) for sign in (1, -1))

    def _search(self, i: int, sign: int) -> bool:
        if not self.fits(i, sign):
            return False
        move = {i: sign}
        residual = {r: self.rows[r][i] * sign for r in self.rows_of[i]}  # each sum's imbalance
        broken = {r for r, off in residual.items() if off}
        steps = 0

        def change(j: int, delta: int) -> None:
            move[j] = move.get(j, 0) + delta
            for r in self.rows_of[j]:
                residual[r] = residual.get(r, 0) + self.rows[r][j] * delta
                if residual[r]:
                    broken.add(r)
                else:
                    broken.discard(r)

        def repair(depth: int) -> bool:
            nonlocal steps
            steps += 1
            if not broken:
                return True
            if steps > self.SEARCH_BUDGET or depth > self.SEARCH_DEPTH:
                return False
            r = min(broken, key=lambda r: (len(self.rows[r]), r))  # the most constrained sum first
            off = residual[r]
            for j, c in sorted(self.rows[r].items(), key=lambda item: (item[0] in move, len(self.rows_of[item[0]]))):
                if j == i or off % c or not self.fits(j, move.get(j, 0) - off // c):
                    continue
                change(j, -off // c)
                if repair(depth + 1):
                    return True
                change(j, off // c)
            return False

        return repair(0)
