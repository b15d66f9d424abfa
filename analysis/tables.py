"""Tables of the analysis package: the record of each simulated study, so the statistics can be
checked against the effects it was generated with."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer
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
