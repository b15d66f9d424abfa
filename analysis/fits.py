"""The report's models fitted outside any page view, and stored (``analysis.tables.ModelFit``).

A mixed model over every participant and wave takes minutes on a large study, so the dashboard
never fits one while a page waits: a fit is claimed (one running per study), made in a process of
its own (``python -m analysis.fit_worker``; ``afterward models fit`` from a shell) by the same
``analysis.report.fit_models`` as the report, and its tables stored with the time its data were
read. Pages show the newest finished fit and say how old it is; one older than the setting
``model_fit_max_age_minutes`` is fitted again in the background.

    >>> fit_id = request_fit(engine, "wellbeing-pilot", requested_by="r@uni.example")
    >>> run_fit(engine, fit_id)          # what analysis.fit_worker does, in its own process
    >>> latest_fit(engine, "wellbeing-pilot").tables["regret.coefficients"]
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from analysis.estimates import StudyData
from analysis.reading import Source, connect, resolve_study_id
from analysis.report import MODEL_TITLES, ModelSuite, fit_models
from analysis.tables import ModelFit
from study import audit
from study.clock import now
from study.db import session_scope

BOOTSTRAP = 200  # replicates of the immediate-vs-delayed table (the report's default is 500)
LEASE = dt.timedelta(hours=3)  # a fit still running after this is taken as abandoned (its worker died)
ACTION = "analysis.models_fitted"  # the audit log's action
KEEP = 24  # finished fits kept per study (the newest; 1.4 MB each at 100,000 participants)


@dataclass(frozen=True)
class StoredFit:
    """A fit as stored: ``tables`` maps ``<model>.<table>`` (and ``perma.marginal_means``) to
    frames; ``notes`` says which models the data could not support and why; ``requested_by`` is
    ``<actor type>:<name>``, e.g. ``staff:r@uni.example``."""

    id: int
    status: str
    requested_by: str
    options: dict[str, Any]
    started_at: dt.datetime
    finished_at: dt.datetime | None
    data_read_at: dt.datetime | None
    participants: int | None
    seconds: float | None
    tables: dict[str, pd.DataFrame]
    notes: tuple[str, ...]
    error: str | None

    @classmethod
    def of(cls, row: ModelFit) -> StoredFit:
        tables = {name: _loaded(text) for name, text in (row.tables or {}).items()}
        return cls(row.id, row.status, row.requested_by, dict(row.options), row.started_at, row.finished_at,
                   row.data_read_at, row.participants, row.seconds, tables, tuple(row.notes or ()), row.error)


def suite_tables(suite: ModelSuite) -> dict[str, pd.DataFrame]:
    """The fitted models' tables by ``<model>.<table>``, and the PERMA marginal means."""
    frames: dict[str, pd.DataFrame] = {}
    for name in MODEL_TITLES:
        fit = getattr(suite, name)
        if fit is not None:
            frames.update({f"{name}.{table}": frame for table, frame in fit.tables().items()})
    if suite.perma is not None:
        frames["perma.marginal_means"] = suite.perma.marginal_means
    return frames


def _stored(frame: pd.DataFrame) -> str:
    """A frame as Parquet, base64 in the JSON column: its dtypes, missing values and infinities
    (a normal interval's df) come back as they were."""
    return base64.b64encode(frame.reset_index(drop=True).to_parquet(index=False)).decode("ascii")


def _loaded(text: str) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(base64.b64decode(text)))


def request_fit(engine: Engine, study: int | str, *, requested_by: audit.Actor, n_boot: int = BOOTSTRAP,
                seed: int = 0) -> int | None:
    """Claim a new fit of ``study`` for ``requested_by`` (the fit is audited under them): its id, or
    None when a fit of it is running already. A running fit whose lease ran out (the worker
    stopped) is marked failed first."""
    with session_scope(engine) as session:
        study_id = resolve_study_id(session.connection(), study)
        moment = now()
        session.execute(update(ModelFit).where(
            ModelFit.study_id == study_id, ModelFit.status == "running", ModelFit.lease_until < moment,
        ).values(status="failed", finished_at=moment, error="the fitting process stopped before it finished"))
    try:
        with session_scope(engine) as session:
            claimed = ModelFit(study_id=study_id, status="running",
                               requested_by=f"{requested_by.type}:{requested_by.name}",
                               options={"n_boot": n_boot, "seed": seed}, started_at=moment,
                               lease_until=moment + LEASE)
            session.add(claimed)
            session.flush()
            return claimed.id
    except IntegrityError:  # uq_model_fits_running: another fit of this study holds the claim
        return None


def run_fit(engine: Engine, fit_id: int) -> StoredFit:
    """Fit the models of a claimed fit, store their tables, audit the read (``ACTION``) and keep
    only the study's newest ``KEEP`` finished fits. A failure is stored with its message and raised."""
    with session_scope(engine, read_only=True) as session:
        claimed = session.get(ModelFit, fit_id)
        if claimed is None or claimed.status != "running":
            raise LookupError(f"no running model fit {fit_id}")
        study_id, options, requested_by = claimed.study_id, dict(claimed.options), claimed.requested_by
    began = time.perf_counter()
    try:
        data = StudyData.load(engine, study_id).for_models()
        # The tables pages show: without the report's diagnostics and sensitivity analyses (minutes more).
        suite = fit_models(data, n_boot=int(options["n_boot"]), seed=int(options["seed"]), checks=False)
        tables = {name: _stored(frame) for name, frame in suite_tables(suite).items()}
    except Exception as exc:
        with session_scope(engine) as session:
            session.execute(update(ModelFit).where(ModelFit.id == fit_id).values(
                status="failed", finished_at=now(), error=f"{type(exc).__name__}: {exc}"[:2000]))
        raise
    notes = [f"{name}: not estimated ({reason})" for name, reason in suite.not_estimated.items()]
    participants = int(data.panel["participant_code"].nunique()) if len(data.panel) else 0
    with session_scope(engine) as session:
        session.execute(update(ModelFit).where(ModelFit.id == fit_id).values(
            status="done", finished_at=now(), data_read_at=data.read_at, participants=participants,
            seconds=round(time.perf_counter() - began, 2), tables=tables, notes=notes))
        kind, _, name = requested_by.partition(":")
        audit.record(session, audit.Actor(kind, name), ACTION, study_id=study_id, fit_id=fit_id,
                     read_at=data.read_at.isoformat() if data.read_at else None, options=options,
                     fitted=[name for name in MODEL_TITLES if name not in suite.not_estimated],
                     not_estimated=suite.not_estimated)
        kept = select(ModelFit.id).where(ModelFit.study_id == study_id, ModelFit.status == "done") \
            .order_by(ModelFit.finished_at.desc(), ModelFit.id.desc()).limit(KEEP).scalar_subquery()
        session.execute(delete(ModelFit).where(ModelFit.study_id == study_id, ModelFit.status == "done",
                                               ModelFit.id.not_in(kept)))
        stored = session.get(ModelFit, fit_id)
        assert stored is not None
        return StoredFit.of(stored)


@dataclass(frozen=True)
class FitStatus:
    """Where a study's fits stand, read without their tables: the newest finished fit (id and
    when it finished), the fit running now (id and when it started), and the error of the newest
    ended fit when it failed."""

    latest_id: int | None
    latest_finished_at: dt.datetime | None
    running_id: int | None
    running_since: dt.datetime | None
    failed: str | None

    def stale(self, at: dt.datetime, max_age: dt.timedelta | None) -> bool:
        """No finished fit, or the newest finished more than ``max_age`` before ``at`` (None: a
        finished fit never goes stale)."""
        if self.latest_finished_at is None:
            return True
        return max_age is not None and at - self.latest_finished_at > max_age


def fit_status(source: Source, study: int | str) -> FitStatus:
    """The study's ``FitStatus`` (a few small rows; the tables are not read)."""
    with connect(source) as connection:
        study_id = resolve_study_id(connection, study)
        newest = (select(ModelFit.id, ModelFit.status, ModelFit.started_at, ModelFit.finished_at, ModelFit.error)
                  .where(ModelFit.study_id == study_id).order_by(ModelFit.started_at.desc(), ModelFit.id.desc()))
        done = connection.execute(newest.where(ModelFit.status == "done").limit(1)).first()
        running = connection.execute(newest.where(ModelFit.status == "running", ModelFit.lease_until >= now())
                                     .limit(1)).first()
        ended = connection.execute(newest.where(ModelFit.status != "running").limit(1)).first()
    return FitStatus(done.id if done else None, done.finished_at if done else None,
                     running.id if running else None, running.started_at if running else None,
                     ended.error if ended is not None and ended.status == "failed" else None)


def load_fit(source: Source, fit_id: int) -> StoredFit:
    """A stored fit with its tables. Raises LookupError for an unknown id."""
    with connect(source) as connection:
        row = Session(connection).get(ModelFit, fit_id)
        if row is None:
            raise LookupError(f"no model fit {fit_id}")
        return StoredFit.of(row)


def latest_fit(source: Source, study: int | str) -> StoredFit | None:
    """The newest finished fit of ``study`` with its tables, or None."""
    found = fit_status(source, study).latest_id
    return None if found is None else load_fit(source, found)


def start_fit(database_url: str, fit_id: int) -> subprocess.Popen[bytes]:
    """Run a claimed fit in a new process (``python -m analysis.fit_worker``), detached from the
    caller: a page that asked for it returns at once. Its output goes to ``var/model-fits.log``."""
    root = Path(__file__).resolve().parent.parent
    log = root / "var" / "model-fits.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AFTERWARD_DATABASE_URL": database_url}
    with log.open("ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "analysis.fit_worker", str(fit_id)],
                                cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
