"""The attacker of the disclosure tests: a viewer who collects every number shown to them (the
aggregate tables as exported and as the dashboard shows them, the staff API's study summary),
knows which counts add up to which (what the tables and the summary say they are, written here
from their documentation, not from the library), that a "< 5" count of participants lies in 0-4
(any other hidden count is 0 or more) and that a "suppressed" count rests on at least 5
participants, so is at least 5; and tries every subtraction, then an exhaustive search for the
hidden counts no other consistent table allows another value for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.aggregates import ALL
from analysis.disclosure import SUPPRESSED, THRESHOLD

LOW = "< 5"
Cell = tuple[str, int, str]  # (table, row, column); the table's name may carry the surface it was seen on
Sum = tuple[Cell, list[Cell]]  # total, parts
CAP = 1_000  # an upper bound the attacker may assume for any count (true values are far below)
# How many label columns each table starts with, and the means, SDs and rates (not counts) with the
# count each rests on.
LABELS = {"enrollment": 1, "followups": 2, "wellbeing": 2, "regret": 2, "conversations": 2, "safety_events": 1,
          "safety_reviews": 1}
DERIVED = {"completion_rate": "due", "mean": "n", "sd": "n", "pushback_rate": "assistant_turns"}
ROLES = {"wellbeing": ("concierge", "collaborator", "coach"), "control": ("standard",)}  # the example protocol's


def by_subtraction(shown: dict[Cell, int], sums: list[Sum]) -> dict[Cell, int]:
    """What a person works out by hand: a sum with one unknown gives it, again and again."""
    known, found = dict(shown), {}
    while True:
        progress = False
        for total, parts in sums:
            unknown = [c for c in (total, *parts) if c not in known]
            if len(unknown) == 1:
                cell = unknown[0]
                value = (sum(known[p] for p in parts) if cell == total
                         else known[total] - sum(known[p] for p in parts if p != cell))
                known[cell] = found[cell] = value
                progress = True
        if not progress:
            return found


Domains = dict[Cell, tuple[int, int]]
Equation = tuple[dict[Cell, int], int]  # sum of coefficient * cell == constant


def equations(shown: dict[Cell, int], sums: list[Sum]) -> list[Equation]:
    found = []
    for total, parts in sums:
        coefficients: dict[Cell, int] = {}
        constant = 0
        for cell, sign in ((total, -1), *((p, 1) for p in parts)):
            if cell in shown:
                constant -= sign * shown[cell]
            else:
                coefficients[cell] = coefficients.get(cell, 0) + sign
        if coefficients:
            found.append((coefficients, constant))
    return found


def propagate(domains: Domains, system: list[Equation]) -> Domains | None:
    """Bounds each equation implies for each of its cells, until nothing changes; None when empty."""
    domains = dict(domains)
    changed = True
    while changed:
        changed = False
        for coefficients, constant in system:
            for cell, c in coefficients.items():
                rest = [(c2 * domains[o][0], c2 * domains[o][1]) for o, c2 in coefficients.items() if o != cell]
                low = constant - sum(max(pair) for pair in rest)
                high = constant - sum(min(pair) for pair in rest)
                if c < 0:
                    low, high = -high, -low
                old_low, old_high = domains[cell]
                new = (max(old_low, -(-low // abs(c))), min(old_high, high // abs(c)))
                if new[0] > new[1]:
                    return None
                if new != (old_low, old_high):
                    domains[cell] = new
                    changed = True
    return domains


def feasible(domains: Domains, system: list[Equation]) -> bool:
    """Whether some table (whole numbers within the domains) satisfies every equation: bounds
    propagation and splitting the widest domain in two, exhaustively."""
    narrowed = propagate(domains, system)
    if narrowed is None:
        return False
    open_cells = [cell for cell, (low, high) in narrowed.items() if low < high]
    if not open_cells:
        return True
    cell = min(open_cells, key=lambda c: narrowed[c][1] - narrowed[c][0])
    low, high = narrowed[cell]
    middle = (low + high) // 2
    return feasible({**narrowed, cell: (low, middle)}, system) or feasible({**narrowed, cell: (middle + 1, high)},
                                                                          system)


def recoverable(truth: dict[Cell, int], shown: dict[Cell, int], bounds: Domains, sums: list[Sum]) -> list[Cell]:
    """The hidden cells no other consistent table gives another value: an exhaustive search."""
    system = equations(shown, sums)
    found = []
    for cell in bounds:
        group, frontier = {cell}, [cell]  # the hidden cells tied to this one
        while frontier:
            frontier = [o for coefficients, _ in system if any(c in coefficients for c in frontier)
                        for o in coefficients if o not in group]
            group.update(frontier)
        tied = [e for e in system if any(c in group for c in e[0])]
        domains = {c: bounds[c] for c in group}
        low, high = bounds[cell]
        others = [(low, truth[cell] - 1), (truth[cell] + 1, high)]
        if not any(a <= b and feasible({**domains, cell: (a, b)}, tied) for a, b in others):
            found.append(cell)
    return found


def knowledge(cells: dict[Cell, Any], participant_counts: set[Cell]) -> tuple[dict[Cell, int], Domains]:
    """The shown counts, and what the markers tell of the hidden ones."""
    shown = {cell: int(v) for cell, v in cells.items() if v not in (LOW, SUPPRESSED)}
    bounds = {cell: ((0, THRESHOLD - 1) if cell in participant_counts else (0, CAP)) if v == LOW
              else (THRESHOLD, CAP) for cell, v in cells.items() if v in (LOW, SUPPRESSED)}
    return shown, bounds


def documented_sums(tables: dict[str, pd.DataFrame], prefix: str = "") -> tuple[list[Sum], set[Cell]]:
    """What the aggregate tables say adds up, and which of their counts are counts of participants;
    the cells named ``prefix + table``."""
    def at(name: str, **labels: str) -> int:
        frame = tables[name]
        mask = np.logical_and.reduce([frame[k] == v for k, v in labels.items()])
        [row] = np.flatnonzero(mask)
        return int(row)

    def cell(name: str, row: int, column: str) -> Cell:
        return (prefix + name, row, column)

    sums: list[Sum] = []
    participant_counts: set[Cell] = set()
    arms = [a for a in tables["enrollment"]["arm"] if a != ALL]
    statuses = ("enrolled", "withdrawn_kept_data", "withdrawn_data_deleted")
    for column in (*statuses, "withdrawn", "participants"):
        sums.append((cell("enrollment", at("enrollment", arm=ALL), column),
                     [cell("enrollment", at("enrollment", arm=a), column) for a in arms]))
    for arm in (*arms, ALL):
        row = at("enrollment", arm=arm)
        sums.append((cell("enrollment", row, "participants"), [cell("enrollment", row, c) for c in statuses]))
        sums.append((cell("enrollment", row, "participants"), [cell("enrollment", row, c)
                                                               for c in ("enrolled", "withdrawn")]))
        sums.append((cell("enrollment", row, "withdrawn"), [cell("enrollment", row, c) for c in statuses[1:]]))
        participant_counts |= {cell("enrollment", row, c) for c in tables["enrollment"].columns[1:]}
    counted = ("due", "completed", "expired", "pending")
    for wave in tables["followups"]["wave"].unique():
        for column in counted:
            sums.append((cell("followups", at("followups", wave=wave, arm=ALL), column),
                         [cell("followups", at("followups", wave=wave, arm=a), column) for a in arms]))
        for arm in (*arms, ALL):
            row = at("followups", wave=wave, arm=arm)
            sums.append((cell("followups", row, "due"), [cell("followups", row, c) for c in counted[1:]]))
            if not wave.startswith("regret"):  # one survey per participant
                participant_counts |= {cell("followups", row, c) for c in counted}
    for wave in tables["wellbeing"]["wave"].unique():
        sums.append((cell("wellbeing", at("wellbeing", wave=wave, arm=ALL), "n"),
                     [cell("wellbeing", at("wellbeing", wave=wave, arm=a), "n") for a in arms]))
        for arm in (*arms, ALL):  # every submitted PERMA-Profiler here has a score
            n = cell("wellbeing", at("wellbeing", wave=wave, arm=arm), "n")
            sums.append((cell("followups", at("followups", wave=wave, arm=arm), "completed"), [n]))
            participant_counts.add(n)
    for wave in tables["regret"]["wave"].unique():
        regret_n = {role: cell("regret", at("regret", wave=wave, starting_role=role), "n")
                    for role in (*(r for a in arms for r in ROLES[a]), ALL)}
        sums.append((regret_n[ALL], [regret_n[r] for r in regret_n if r != ALL]))
        sums.append((cell("followups", at("followups", wave=wave, arm=ALL), "completed"), [regret_n[ALL]]))
        for arm in arms:  # a decision's role belongs to the arm it was made in
            completed = cell("followups", at("followups", wave=wave, arm=arm), "completed")
            sums.append((completed, [regret_n[r] for r in ROLES[arm]]))
    for column in ("participants", "conversations", "assistant_turns", "pushback_turns", "overrides", "reconsiders"):
        def talk(arm: str, role: str, column: str = column) -> Cell:
            return cell("conversations", at("conversations", arm=arm, starting_role=role), column)
        sums.append((talk(ALL, ALL), [talk(a, ALL) for a in arms]))
        for arm in arms:
            if column != "participants" or len(ROLES[arm]) == 1:  # one participant may start in several roles
                sums.append((talk(arm, ALL), [talk(arm, r) for r in ROLES[arm]]))
        if column == "participants":
            participant_counts |= {talk(a, r) for a in (*arms, ALL) for r in (*ROLES.get(a, ()), ALL)}
    categories = [c for c in tables["safety_events"].columns if c not in ("month", "total")]
    for month in tables["safety_events"]["month"]:
        row = at("safety_events", month=month)
        sums.append((cell("safety_events", row, "total"), [cell("safety_events", row, c) for c in categories]))
    months = [at("safety_events", month=m) for m in tables["safety_events"]["month"] if m != ALL]
    for column in (*categories, "total"):
        sums.append((cell("safety_events", at("safety_events", month=ALL), column),
                     [cell("safety_events", r, column) for r in months]))
    reviews = {status: at("safety_reviews", review_status=status) for status in ("reviewed", "unreviewed", ALL)}
    for row in reviews.values():
        sums.append((cell("safety_reviews", row, "total"),
                     [cell("safety_reviews", row, c) for c in ("data_kept", "data_deleted")]))
    for column in ("data_kept", "data_deleted", "total"):
        sums.append((cell("safety_reviews", reviews[ALL], column),
                     [cell("safety_reviews", reviews[s], column) for s in ("reviewed", "unreviewed")]))
    sums.append((cell("safety_events", at("safety_events", month=ALL), "total"),
                 [cell("safety_reviews", reviews[ALL], "total")]))  # the same events
    return sums, participant_counts


def cells_of(tables: dict[str, pd.DataFrame], prefix: str = "") -> dict[Cell, Any]:
    """Every count of the tables (the dashboard shows numbers as text where a column has markers)."""
    counts = {}
    for name, frame in tables.items():
        for row, record in enumerate(frame.to_dict("records")):
            for column, value in list(record.items())[LABELS[name]:]:
                if column not in DERIVED:
                    counts[(prefix + name, row, str(column))] = value
    return counts


# The staff API's study summary as a viewer gets it: what each number is, in the aggregate tables.
SUMMARY: dict[str, tuple[str, dict[str, str], str]] = {
    "participants_by_status.enrolled": ("enrollment", {"arm": ALL}, "enrolled"),
    "participants_by_status.withdrawn": ("enrollment", {"arm": ALL}, "withdrawn"),
    "safety_events_total": ("safety_reviews", {"review_status": ALL}, "total"),
    "safety_events_unreviewed": ("safety_reviews", {"review_status": "unreviewed"}, "total"),
    "safety_events_participant_deleted": ("safety_reviews", {"review_status": ALL}, "data_deleted"),
    "safety_events_unreviewed_participant_deleted": ("safety_reviews", {"review_status": "unreviewed"},
                                                     "data_deleted"),
}


def summary_cells(summary: dict[str, Any]) -> dict[Cell, Any]:
    """Every count of the summary, as cells of a one-row table ``summary`` named by their path
    (``followups_by_wave.baseline.due``); not its versions or the platform's channel alerts."""
    def flat(value: Any, path: str) -> dict[str, Any]:
        if isinstance(value, dict):
            return {key: v for inner, nested in value.items() for key, v in flat(nested, f"{path}.{inner}").items()}
        return {path: value}

    counts = {key: value for key, value in summary.items()
              if key not in ("study", "protocol_version", "consent_version", "channel_alerts_open")}
    return {("summary", 0, path[1:]): value for path, value in flat(counts, "").items()}


def summary_sums(summary: dict[str, Any], tables: dict[str, pd.DataFrame], prefix: str = "") -> list[Sum]:
    """Each number of the summary equals a cell of the tables (``SUMMARY``; the arms: each arm's
    participants); the tables' cells named ``prefix + table``."""
    def row(name: str, labels: dict[str, str]) -> int:
        frame = tables[name]
        [found] = np.flatnonzero(np.logical_and.reduce([frame[k] == v for k, v in labels.items()]))
        return int(found)

    places = dict(SUMMARY)
    places.update({f"enrolled_by_arm.{arm}": ("enrollment", {"arm": arm}, "participants")
                   for arm in summary["enrolled_by_arm"]})
    places.update({f"followups_by_wave.{wave}.{column}": ("followups", {"wave": wave, "arm": ALL}, column)
                   for wave, counts in summary["followups_by_wave"].items() for column in counts})
    cells = summary_cells(summary)
    assert {key for _, _, key in cells} == set(places), "a number of the summary the attacker cannot place"
    return [(("summary", 0, key), [(prefix + name, row(name, labels), column)])
            for key, (name, labels, column) in places.items()]


def copies(first: str, second: str, tables: dict[str, pd.DataFrame]) -> list[Sum]:
    """The same table seen on two surfaces: each cell equals its copy."""
    return [((first + name, row, column), [(second + name, row, column)])
            for (name, row, column) in cells_of(tables)]


def viewer_view(export: dict[str, pd.DataFrame], summary: dict[str, Any],
                dashboard: dict[str, pd.DataFrame] | None = None) -> tuple[dict[Cell, Any], list[Sum], set[Cell]]:
    """Every number a viewer is shown (the aggregate export's tables, the API's summary, the
    tables the dashboard's viewer pages show), every relation between them, and which are counts
    of participants."""
    cells = {**summary_cells(summary), **cells_of(export, "export:")}
    sums, counts = documented_sums(export, "export:")
    sums += summary_sums(summary, export, "export:")
    counts |= {cell for cell in summary_cells(summary)
               if cell[2].startswith(("participants_by_status.", "enrolled_by_arm."))}
    if dashboard:
        cells.update(cells_of(dashboard, "dashboard:"))
        sums += copies("dashboard:", "export:", dashboard)
        counts |= {("dashboard:" + name.removeprefix("export:"), row, column) for name, row, column in counts
                   if name.removeprefix("export:") in dashboard}
    return cells, sums, counts


def attack(cells: dict[Cell, Any], truth: dict[Cell, Any], sums: list[Sum],
           participant_counts: set[Cell]) -> tuple[dict[Cell, int], list[Cell]]:
    """What the attacker works out: the cells found by subtraction, and the hidden cells no other
    table consistent with everything shown gives another value (an exhaustive search)."""
    values = {cell: int(value) for cell, value in truth.items()}
    assert all(values[total] == sum(values[p] for p in parts) for total, parts in sums)  # the relations hold
    shown, bounds = knowledge(cells, participant_counts)
    return by_subtraction(shown, sums), recoverable(values, shown, bounds, sums)
