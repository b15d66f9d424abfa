"""The dashboard's reads, cached for ``CACHE_SECONDS`` per database, study and read.

Every number comes from ``analysis`` (the same code as the exports and the report): the aggregate
tables, the report's participant numbers, the panel's survey counts and attrition, each computed
in grouped SQL, and the report's models as last fitted and stored (``analysis.fits``: fitting
takes minutes on a large study, so it runs in a process of its own, never while a page waits),
or from the SQL aggregates of ``analysis.operations`` (the model cards page's from ``evals``, read
by ``dashboard.evaluations`` in the same way). Each read returns its frames with the time it was
read, for the "refreshed at" line. Of a study's data, viewers only ever reach ``aggregates(..., viewer=True)``:
the tables with the suppression rule applied (``analysis.aggregates``). Whether the study is blinded
(``analysis.plan.blinding``) is read afresh at every page view, never cached, and is part of the
aggregates' cache key: a blinded study's outcome tables are pooled over the arms.

A study's cached reads are dropped together by ``refresh`` (the sidebar's button): the cache key
carries the study's generation, so refreshing one study leaves every other as it is.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from sqlalchemy.engine import Engine
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from analysis import aggregates as aggregate_tables
from analysis import fits, operations, plan
from analysis.panel import attrition, regret_scores, survey_cells
from analysis.plan import OutcomeBlinding
from analysis.reading import connect, resolve_study_id
from analysis.report import study_numbers
from study import audit
from study.clock import now
from study.db import engine_for
from study.settings import get_settings

CACHE_SECONDS = 300
REFRESH_SECONDS = 30  # a study's figures are read again at most this often on request


@dataclass(frozen=True)
class Read:
    frames: dict[str, pd.DataFrame]
    refreshed_at: dt.datetime

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]


_generations: dict[tuple[str, str], tuple[int, dt.datetime]] = {}  # (database, study) -> (generation, when)
_lock = threading.Lock()


def generation(database_url: str, slug: str) -> int:
    return _generations.get((database_url, slug), (0, dt.datetime.min.replace(tzinfo=dt.UTC)))[0]


def refresh(database_url: str, slug: str) -> bool:
    """Read the study's figures again on their next use (every session's, this study's only), at
    most once per ``REFRESH_SECONDS``: returns whether it took effect."""
    key = (database_url, slug)
    with _lock:
        current, at = _generations.get(key, (0, dt.datetime.min.replace(tzinfo=dt.UTC)))
        if now() - at < dt.timedelta(seconds=REFRESH_SECONDS):
            return False
        _generations[key] = (current + 1, now())
    return True


def blinding(database_url: str, study: int | str) -> OutcomeBlinding:
    """Whether the study's outcome views are blinded now (``analysis.plan.blinding``): read at every
    page view, so a plan frozen, or a protocol asking for blinding, shows at once."""
    with connect(engine_for(database_url)) as connection:
        return plan.blinding(connection, resolve_study_id(connection, study))


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False, max_entries=64)
def _aggregates(database_url: str, slug: str, viewer: bool, pooled: bool, generation: int) -> Read:
    threshold = aggregate_tables.THRESHOLD if viewer else 0
    return Read(aggregate_tables.aggregate_tables(engine_for(database_url), slug, threshold=threshold, pooled=pooled),
                now())


def aggregates(database_url: str, slug: str, *, viewer: bool) -> Read:
    """``analysis.aggregates.aggregate_tables``: suppressed for viewers, whole for the others; the
    outcome tables pooled over the arms while the study is blinded."""
    pooled = blinding(database_url, slug).blinded
    return _aggregates(database_url, slug, viewer, pooled, generation(database_url, slug))


# The study's summaries for researchers and admins: name -> what reads it.
SUMMARIES: dict[str, Callable[[Engine, str], pd.DataFrame]] = {
    "numbers": study_numbers,  # the report's participants by arm and status
    "surveys": survey_cells,  # the panel's surveys by wave, arm and status
    "attrition": attrition,  # how each participant's follow-up ended or stands
    "regret": regret_scores,  # each regret score with the starting role of its decision's conversation
}


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False, max_entries=128)
def _summary(database_url: str, slug: str, name: str, generation: int) -> Read:
    return Read({name: SUMMARIES[name](engine_for(database_url), slug)}, now())


def summary(database_url: str, slug: str, name: str) -> Read:
    """One of ``SUMMARIES``. Researchers and admins only."""
    return _summary(database_url, slug, name, generation(database_url, slug))


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False, max_entries=256)
def _count(database_url: str, study_id: int, name: str, generation: int) -> Read:
    with connect(engine_for(database_url)) as connection:
        return Read({name: operations.QUERIES[name](connection, study_id)}, now())


def counts(database_url: str, slug: str, study_id: int, *names: str) -> Read:
    """The named SQL aggregates of ``analysis.operations`` (each cached on its own). Researchers and
    admins only; the refreshed-at time is the oldest of them."""
    reads = [_count(database_url, study_id, name, generation(database_url, slug)) for name in names]
    return Read({name: read[name] for name, read in zip(names, reads, strict=True)},
                min(read.refreshed_at for read in reads))


def together(*reads: Callable[[], Read]) -> list[Read]:
    """The page's reads (each a call of one of the reads above), run at the same time on two
    threads under one spinner: a cold page waits for its longest reads, not their sum. Each read
    is cached on its own, so a warm one returns at once."""
    context = get_script_run_ctx()

    def run(read: Callable[[], Read]) -> Read:
        add_script_run_ctx(threading.current_thread(), context)
        return read()

    with st.spinner("Reading the study's figures…"), ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(run, reads))


@dataclass(frozen=True)
class Models:
    """The newest stored fit's tables (empty when there is none yet) and where fitting stands."""

    fit: fits.StoredFit | None
    status: fits.FitStatus
    started: bool  # this view started a new fit

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        return self.fit.tables if self.fit is not None else {}


@st.cache_data(show_spinner="Reading the fitted models…", max_entries=16)
def _stored_fit(database_url: str, fit_id: int) -> fits.StoredFit:
    return fits.load_fit(engine_for(database_url), fit_id)  # a stored fit never changes


def models(database_url: str, slug: str, actor: audit.Actor) -> Models:
    """The report's models as last fitted (``analysis.fits``). When there is no fit yet, or the
    newest is older than the setting ``model_fit_max_age_minutes``, and none is running, a new fit
    is claimed for ``actor`` and started in its own process; the page shows the previous one
    meanwhile."""
    engine = engine_for(database_url)
    status = fits.fit_status(engine, slug)
    minutes = get_settings().model_fit_max_age_minutes
    started = False
    if status.running_id is None and status.stale(now(), dt.timedelta(minutes=minutes) if minutes else None):
        claimed = fits.request_fit(engine, slug, requested_by=actor)
        if claimed is not None:
            fits.start_fit(database_url, claimed)
            started = True
            status = fits.fit_status(engine, slug)
    fit = _stored_fit(database_url, status.latest_id) if status.latest_id is not None else None
    return Models(fit, status, started)


def live_alerts(database_url: str, study_id: int) -> tuple[int, int]:
    """Unreviewed safety events and open channel alerts, read at every page view (not cached: a
    review must leave the count at once)."""
    with connect(engine_for(database_url)) as connection:
        return operations.unreviewed_events(connection, study_id), len(operations.open_alerts(connection))
