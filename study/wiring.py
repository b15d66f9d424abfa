"""What must happen when a participant withdraws or completes a survey, and which tables are
deleted on withdrawal with deletion: wired explicitly, once per process, from the packages'
``afterward.lifecycle`` entry points (pyproject.toml).

The kernel may not import the other packages, and a process must not depend on which of them it
happened to import: the API, the CLI and the dispatcher call ``wire()`` at start-up, and
``withdraw()`` and survey completion call it too, so even a process that imported only ``study``
ends conversations, cancels follow-ups and deletes every package's research data.

An entry point is a function taking the ``Lifecycle`` and registering into it::

    def wire_lifecycle(lifecycle: Lifecycle) -> None:
        lifecycle.on_withdrawal(end_conversations)
        lifecycle.research_data(Conversation, Turn)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from sqlalchemy.orm import Session

from study.models import Participant, ParticipantResearchData, WithdrawalLevel

GROUP = "afterward.lifecycle"

WithdrawalHook = Callable[[Session, Participant, WithdrawalLevel], None]
# The completed survey's assignment (a surveys model, which the kernel cannot name).
CompletionHook = Callable[[Session, Any], None]


@dataclass
class Lifecycle:
    """The registry the entry points fill. Hooks run inside the caller's transaction, in the
    order registered (entry points are loaded sorted by name)."""

    withdrawal_hooks: list[WithdrawalHook] = field(default_factory=list)
    completion_hooks: list[CompletionHook] = field(default_factory=list)
    # The tables deleted on withdrawal with deletion; each has a ``participant_id`` column.
    research_tables: set[type[Any]] = field(default_factory=set)

    def on_withdrawal(self, hook: WithdrawalHook) -> None:
        self.withdrawal_hooks.append(hook)

    def on_completion(self, hook: CompletionHook) -> None:
        self.completion_hooks.append(hook)

    def research_data(self, *tables: type[Any]) -> None:
        for table in tables:
            if not issubclass(table, ParticipantResearchData):
                raise TypeError(f"{table.__name__} is not ParticipantResearchData (it needs participant_id)")
            self.research_tables.add(table)


# The process's registry. Its table set is the one ``ParticipantResearchData.registered`` names.
lifecycle = Lifecycle(research_tables=ParticipantResearchData.registered)
_wired: list[str] = []  # names of the entry points loaded, once wired
_lock = threading.Lock()


def wire() -> Lifecycle:
    """Load every ``afterward.lifecycle`` entry point into ``lifecycle``, once per process
    (later calls return at once). Refuses to run without any: an uninstalled checkout would
    otherwise withdraw people without ending or deleting anything."""
    if _wired:
        return lifecycle
    with _lock:
        if _wired:
            return lifecycle
        found = sorted(entry_points(group=GROUP), key=lambda entry: entry.name)
        if not found:
            raise RuntimeError(f"no '{GROUP}' entry points are installed, so withdrawal could not end or delete "
                               "anything; install the project (pip install -e .)")
        # Registered into a scratch registry first, so a failing entry point leaves nothing half-wired
        # and the next call tries again.
        scratch = Lifecycle(research_tables=set())
        for entry in found:
            entry.load()(scratch)
        lifecycle.withdrawal_hooks.extend(scratch.withdrawal_hooks)
        lifecycle.completion_hooks.extend(scratch.completion_hooks)
        lifecycle.research_tables.update(scratch.research_tables)
        _wired.extend(entry.name for entry in found)
    return lifecycle


def wired_entry_points() -> list[str]:
    """The entry points loaded so far (empty before ``wire()``)."""
    return list(_wired)
