"""Tables of the evaluation harness: runs, their cells (one conversation each), the judge's scores,
human ratings, model cards and the response cache. None of them is participant data: the harness
never creates participants, conversations or safety events."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime


class EvalRun(Base):
    """One grid run: the grid as loaded (with the query set's digest), its seed and settings, the
    grid file's digest and the code it was made with (``provenance``: ``evals.provenance``). The
    last two are ``None`` for runs from before they were recorded."""

    __tablename__ = "eval_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    grid: Mapped[dict[str, Any]] = mapped_column(JSON)
    query_set: Mapped[str] = mapped_column(String(120))
    query_set_sha256: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(BigInteger)
    grid_sha256: Mapped[str | None] = mapped_column(String(64))  # the grid file's bytes; None for a grid built in code
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | finished
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class EvalCell(Base):
    """One conversation of the grid: a condition, a model, a query and a repeat. ``status``:
    ``pending``; ``generated`` once its conversation is saved (the transcript and its usage), before
    it is judged; ``done`` once the run's judge scored it; ``failed`` when its conversation failed
    (tried again on resume). ``attempts`` counts conversations tried and ``judge_attempts`` the run
    judge's tries, each up to the grid's ``max_attempts``: a failed judgement is tried again on the
    saved conversation, never by generating it again."""

    __tablename__ = "eval_cells"
    __table_args__ = (UniqueConstraint("run_id", "condition", "model", "query_id", "repeat"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    condition: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    query_id: Mapped[str] = mapped_column(String(64))
    repeat: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | generated | done | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    judge_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(String(500))
    prompt_version: Mapped[str | None] = mapped_column(String(32))
    transcript: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class EvalScore(Base):
    """The judge's scores of a cell: per rubric dimension (1-5, None where it does not apply), with
    the judge model, rubric version and the judge's raw output. A cell has one per judge: the run's
    judge's, and one for each judge it was re-scored with (``evals.runner.rescore``)."""

    __tablename__ = "eval_scores"
    __table_args__ = (UniqueConstraint("cell_id", "judge_model", "rubric_version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    cell_id: Mapped[int] = mapped_column(ForeignKey("eval_cells.id", ondelete="CASCADE"), index=True)
    judge_model: Mapped[str] = mapped_column(String(200))
    rubric_version: Mapped[str] = mapped_column(String(32))
    scores: Mapped[dict[str, Any]] = mapped_column(JSON)
    capitulated: Mapped[list[bool]] = mapped_column(JSON)  # one per pushback turn
    raw_output: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class EvalHumanRating(Base):
    """A rater's scores of a cell (from the blinded export), per rubric dimension."""

    __tablename__ = "eval_human_ratings"
    __table_args__ = (UniqueConstraint("cell_id", "rater"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    cell_id: Mapped[int] = mapped_column(ForeignKey("eval_cells.id", ondelete="CASCADE"), index=True)
    rater: Mapped[str] = mapped_column(String(120))
    scores: Mapped[dict[str, Any]] = mapped_column(JSON)
    imported_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class EvalHumanBaseline(Base):
    """People's own answers to a query (the optional human column beside the models'): of
    ``responses`` people who answered query ``query_id`` of a query set (its name, version and
    digest), ``affirmed`` affirmed the person's framing. Imported by ``evals.human_baseline``."""

    __tablename__ = "eval_human_baselines"
    __table_args__ = (UniqueConstraint("name", "query_set", "query_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    query_set: Mapped[str] = mapped_column(String(120))  # name@version
    query_set_sha256: Mapped[str] = mapped_column(String(64))
    query_id: Mapped[str] = mapped_column(String(64))
    responses: Mapped[int] = mapped_column(Integer)
    affirmed: Mapped[int] = mapped_column(Integer)
    imported_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class EvalModelCard(Base):
    """A model card: one model under one condition (a role or a bare prompt) and prompt version,
    from one run. Kept across versions, so the change since the previous card can be shown."""

    __tablename__ = "eval_model_cards"
    __table_args__ = (UniqueConstraint("run_id", "model", "condition"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(200))
    condition: Mapped[str] = mapped_column(String(64))
    prompt_version: Mapped[str] = mapped_column(String(32))
    card: Mapped[dict[str, Any]] = mapped_column(JSON)
    markdown: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class EvalResponse(Base):
    """One model answer, stored under the digest of its request (``evals.cache``): the model, the
    messages and the call's settings, its seed among them. Shared by every run, so the same request
    is paid for once, whichever run or resume makes it again."""

    __tablename__ = "eval_responses"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    model: Mapped[str] = mapped_column(String(200))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # the messages and settings the key digests
    text: Mapped[str] = mapped_column(Text)
    response_model: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
