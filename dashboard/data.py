"""The dashboard's reads, cached for ``CACHE_SECONDS`` per database, study and disclosure level.

Every number comes from ``analysis`` (the aggregate tables, the panel and conversation features,
the report's models: the same code as the exports and the report) or from the SQL aggregates of
``dashboard.queries``. Each read returns its frames with the time it was read, for the
"refreshed at" line. Viewers only ever reach ``aggregates(..., viewer=True)``: the tables with
the suppression rule applied (``analysis.aggregates``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from analysis import aggregates as aggregate_tables
from analysis.models import StudyData
from analysis.reading import connect, resolve_study_id
from analysis.report import deleted_by_arm, fit_models, participant_numbers
from dashboard import queries
from study.clock import now
from study.db import engine_for

CACHE_SECONDS = 300
BOOTSTRAP = 200  # replicates of the immediate-vs-delayed table (the report's default is 500)


@dataclass(frozen=True)
class Read:
    frames: dict[str, pd.DataFrame]
    refreshed_at: dt.datetime
    notes: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]


@st.cache_data(ttl=CACHE_SECONDS, show_spinner="Reading the aggregate tables…", max_entries=64)
def aggregates(database_url: str, slug: str, *, viewer: bool) -> Read:
    """``analysis.aggregates.aggregate_tables``: suppressed for viewers, whole for the others."""
    threshold = aggregate_tables.THRESHOLD if viewer else 0
    return Read(aggregate_tables.aggregate_tables(engine_for(database_url), slug, threshold=threshold), now())


@st.cache_data(ttl=CACHE_SECONDS, show_spinner="Reading the study…", max_entries=16)
def study(database_url: str, slug: str) -> Read:
    """The panel, conversation features and survival table (``StudyData.load``), and the
    participants by arm and status as the report counts them. Researchers and admins only."""
    engine = engine_for(database_url)
    data = StudyData.load(engine, slug)
    with connect(engine) as connection:
        deleted = deleted_by_arm(connection, resolve_study_id(connection, slug))
    return Read({"panel": data.panel, "conversations": data.conversations, "survival": data.survival,
                 "numbers": participant_numbers(data.panel, deleted)}, data.read_at or now())


@st.cache_data(ttl=CACHE_SECONDS, show_spinner="Fitting the models…", max_entries=16)
def models(database_url: str, slug: str) -> Read:
    """The report's models (``analysis.report.fit_models``), as their tables. Researchers and admins."""
    loaded = study(database_url, slug)
    data = StudyData(panel=loaded["panel"], conversations=loaded["conversations"], survival=loaded["survival"],
                     study=slug, read_at=loaded.refreshed_at)
    suite = fit_models(data, n_boot=BOOTSTRAP)
    frames: dict[str, pd.DataFrame] = {}
    for name in ("perma", "headline", "regret", "screen", "dropout", "subgroups"):
        fit = getattr(suite, name)
        if fit is not None:
            frames.update({f"{name}.{table}": frame for table, frame in fit.tables().items()})
    if suite.perma is not None:
        frames["perma.marginal_means"] = suite.perma.marginal_means
    notes = tuple(f"{name}: not estimated ({reason})" for name, reason in suite.not_estimated.items())
    return Read(frames, loaded.refreshed_at, notes)


@st.cache_data(ttl=CACHE_SECONDS, show_spinner="Counting…", max_entries=64)
def counts(database_url: str, study_id: int) -> Read:
    """The SQL aggregates of ``dashboard.queries``. Researchers and admins only."""
    with connect(engine_for(database_url)) as connection:
        frames = {
            "recruitment": queries.recruitment(connection, study_id),
            "funnel": queries.funnel(connection, study_id),
            "withdrawals": queries.withdrawals(connection, study_id),
            "followup_status": queries.followup_status(connection, study_id),
            "lateness": queries.lateness(connection, study_id),
            "deliveries": queries.deliveries(connection, study_id),
            "alerts": queries.open_alerts(connection),
            "escalations": queries.escalations_and_overrides(connection, study_id),
            "model_versions": queries.model_versions(connection, study_id),
            "few_items": queries.few_items(connection, study_id),
        }
    return Read(frames, now())


def live_alerts(database_url: str, study_id: int) -> tuple[int, int]:
    """Unreviewed safety events and open channel alerts, read at every page view (not cached: a
    review must leave the count at once)."""
    with connect(engine_for(database_url)) as connection:
        return queries.unreviewed_events(connection, study_id), len(queries.open_alerts(connection))


def clear() -> None:
    """Forget every cached read (after a review, or from the sidebar's refresh button)."""
    st.cache_data.clear()
