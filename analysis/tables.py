"""Tables of the analysis package: the record of each simulated study, so the statistics can be
checked against the effects it was generated with, and the report's models as fitted and stored
for the dashboard (``analysis.fits``), and each study's frozen analysis plan (``analysis.plan``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy import text as sa_text
from sqlalchemy.orm import Mapped, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime


class SimulationRun(Base):
    """One ``afterward simulate`` run: its seed, the generative model's parameters and the true
    effects they imply (the targets of parameter-recovery tests), and what it produced. Its
    participants are those who redeemed the invites labelled ``simulation <id>``."""

    __tablename__ = "simulation_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    participants: Mapped[int] = mapped_column(Integer)
    weeks: Mapped[int] = mapped_column(Integer)
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON)
    true_effects: Mapped[dict[str, Any]] = mapped_column(JSON)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # set when the run finishes
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class ModelFit(Base):
    """One fit of the report's models (``analysis.report.fit_models``) to a study, made in a
    process of its own (``afterward models fit``) and stored so a page shows it without fitting:
    ``running`` while a worker holds it (until ``lease_until``), then ``done`` with the models'
    tables, or ``failed`` with the error. At most one fit of a study runs at a time."""

    __tablename__ = "model_fits"
    __table_args__ = (Index("uq_model_fits_running", "study_id", unique=True,
                            sqlite_where=sa_text("status = 'running'"),
                            postgresql_where=sa_text("status = 'running'")),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | done | failed
    requested_by: Mapped[str] = mapped_column(String(320))
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    lease_until: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    data_read_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    participants: Mapped[int | None] = mapped_column(Integer)
    seconds: Mapped[float | None] = mapped_column(Float)
    tables: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # table name -> frame (Parquet, base64)
    notes: Mapped[list[str] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)


class AnalysisPlanRecord(Base):
    """A study's frozen analysis plan (``analysis.plan``): the plan file's text and SHA-256 as they
    were when ``afterward plan freeze`` recorded them, the plan as validated, where the file was, who
    froze it and when, and how many reads of the study's outcomes the audit log held by then (0: frozen
    before any outcome was read). One per study; never changed once written."""

    __tablename__ = "analysis_plans"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), unique=True)
    sha256: Mapped[str] = mapped_column(String(64))
    source_text: Mapped[str] = mapped_column(Text)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_path: Mapped[str] = mapped_column(String(1000))
    frozen_by: Mapped[str] = mapped_column(String(320))
    frozen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    outcome_reads_before: Mapped[int] = mapped_column(Integer)
