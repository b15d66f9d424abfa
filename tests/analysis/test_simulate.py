"""``analysis.simulation.simulate``: a small simulated study through the real services and the dispatcher."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from analysis.simulation.population import Effects
from analysis.simulation.simulate import SimulationResult, load_simulated_study, open_surveys, simulate
from analysis.tables import SimulationRun
from chat.models import Conversation, Turn
from scheduler.models import FollowUp
from study import audit, clock
from study.db import make_engine, session_scope
from study.models import AuditEntry, Participant, Study
from surveys import service as surveys
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore
from tests.builders import enroll_fully, make_invites
from tests.conftest import emptied

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
TICK_MINUTES = 60  # the dispatcher every simulated hour: enough for follow-ups, and quick


def _run(engine: Engine, protocol: str, seed: int = 7, allocation_seed: str | None = None) -> SimulationResult:
    slug = load_simulated_study(engine, protocol)
    if allocation_seed is not None:  # arms come from the study's randomization: make the two studies alike
        with session_scope(engine) as session:
            session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed=allocation_seed))
    return simulate(engine, slug, participants=12, weeks=3, seed=seed, start=START, tick_minutes=TICK_MINUTES)


def _fingerprint(engine: Engine) -> dict[str, Any]:
    """What the data say, beyond the counts: arms, stances in order, and every score."""
    with session_scope(engine, read_only=True) as session:
        return {
            "arms": session.execute(select(Participant.allocation_index, Participant.arm, Participant.timezone)
                                    .order_by(Participant.allocation_index)).all(),
            "stances": session.scalars(select(Turn.stance).where(Turn.speaker == "assistant")
                                       .order_by(Turn.id)).all(),
            "scores": session.execute(select(SurveyScore.name, SurveyScore.value).order_by(SurveyScore.id)).all(),
        }


def test_a_small_study_runs_through_the_services(engine: Engine, example_protocol: str) -> None:
    result = _run(engine, example_protocol)
    s = result.summary
    assert s["enrolled"] == 12
    assert set(s["arms"]) == {"wellbeing", "control"}
    assert sum(s["arms"].values()) == 12
    assert s["conversations"] > 12
    assert s["turns"] > 2 * s["conversations"]
    assert s["stances"].get("agree", 0) > 0
    assert s["stances"].get("nudge", 0) + s["stances"].get("challenge", 0) > 0  # framings drew pushback
    assert s["decisions"] > 0
    # The dispatcher opened follow-ups; some were answered and some left to expire.
    assert s["followups_sent"] > 12
    assert s["followups_completed"] > 0
    assert s["followups_expired"] > 0
    assert s["followups_completed"] + s["followups_expired"] + s["followups_open"] <= s["followups_sent"]
    with session_scope(engine, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(Participant).where(Participant.arm.is_(None))) == 0
        roles = set(session.scalars(select(Conversation.role).distinct()))
        assert "standard" in roles
        assert roles & {"concierge", "collaborator", "coach"}
        opened = session.execute(select(FollowUp.followup_key, FollowUp.sent_at, FollowUp.due_at)
                                 .where(FollowUp.sent_at.is_not(None))).all()
        assert {key for key, _, _ in opened} >= {"perma-week-1", "regret-day-3"}
        # Opened by the dispatcher's tick, within one tick of being due: not written ahead of time.
        assert all(sent is not None and due <= sent <= due + dt.timedelta(minutes=TICK_MINUTES)
                   for _, sent, due in opened)
        perma = session.scalars(select(SurveyScore.value).where(SurveyScore.name == "overall_wellbeing")).all()
        regret = session.scalars(select(SurveyScore.value).where(SurveyScore.name == "regret")).all()
        assert len(perma) > 12
        assert regret
        assert all(v is not None and 0 <= v <= 10 for v in perma)
        assert all(v is not None and 0 <= v <= 100 for v in regret)
    _check_stored_run(engine, result)
    _check_audit(engine)
    assert not isinstance(clock.get_clock(), clock.FrozenClock)  # the process's clock is put back


def _check_stored_run(engine: Engine, result: SimulationResult) -> None:
    with session_scope(engine, read_only=True) as session:
        run = session.get(SimulationRun, result.run_id)
        assert run is not None
        assert (run.seed, run.participants, run.weeks) == (7, 12, 3)
        assert run.true_effects["regret_coach"]["value"] == Effects().regret_coach
        assert run.true_effects["wellbeing_arm_perma_per_wave"]["value"] == Effects().wellbeing_arm_perma_per_wave
        assert run.parameters["effects"]["answer_per_baseline_point"] == Effects().answer_per_baseline_point
        assert run.summary == result.summary
        assert run.finished_at == START + dt.timedelta(weeks=3)


def _check_audit(engine: Engine) -> None:
    """What ``afterward audit verify`` checks passes on the simulated study."""
    with session_scope(engine, read_only=True) as session:
        verified = audit.verify(session)
        actions = set(session.scalars(select(AuditEntry.action)))
    assert verified.ok, verified.problems
    assert {"participant.enrolled", "consent.signed", "simulation.started", "simulation.finished"} <= actions


def test_attrition_depends_on_the_baseline_covariate(engine: Engine, example_protocol: str) -> None:
    """With a strong effect, everyone withdraws or no one does, by their baseline well-being."""
    slug = load_simulated_study(engine, example_protocol)
    certain = Effects(withdraw_weekly_logit=0.0, withdraw_per_baseline_point=60.0, baseline_sd=2.0,
                      delete_data_share=0.0)
    result = simulate(engine, slug, participants=12, weeks=2, seed=3, start=START, effects=certain,
                      tick_minutes=TICK_MINUTES)
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(
            select(Participant.status, SurveyScore.value)
            .join(SurveyScore, SurveyScore.participant_id == Participant.id)
            .join(SurveyResponse, SurveyResponse.id == SurveyScore.response_id)
            .join(SurveyAssignment, SurveyAssignment.id == SurveyResponse.assignment_id)
            .where(SurveyScore.name == "overall_wellbeing", SurveyAssignment.purpose == "baseline")).all()
    assert len(rows) == 12
    withdrawn = [value for status, value in rows if status == "withdrawn" and value is not None]
    stayed = [value for status, value in rows if status != "withdrawn" and value is not None]
    assert result.summary["withdrawn"] > 0
    assert stayed
    assert min(withdrawn) > Effects().baseline_center > max(stayed)


def test_the_same_seed_gives_the_same_data(engine: Engine, example_protocol: str, database_template: str,
                                           tmp_path: Path) -> None:
    first = _run(engine, example_protocol)
    with session_scope(engine, read_only=True) as session:
        allocation_seed = session.scalar(select(Study.allocation_seed))
    fingerprint = _fingerprint(engine)
    for seed, same in ((7, True), (8, False)):
        again = _fresh_database(engine, database_template, tmp_path)
        try:
            result = _run(again, example_protocol, seed=seed, allocation_seed=allocation_seed)
            assert (result.summary == first.summary) is same
            assert (_fingerprint(again) == fingerprint) is same
        finally:
            if again is not engine:
                again.dispose()


def _fresh_database(engine: Engine, database_template: str, tmp_path: Path) -> Engine:
    """An empty migrated database: a new copy of the SQLite template, or the PostgreSQL schema emptied."""
    if engine.dialect.name == "sqlite":
        path = tmp_path / f"again-{len(list(tmp_path.glob('again-*.db')))}.db"
        shutil.copy(database_template, path)
        return make_engine(f"sqlite:///{path}")
    return emptied(engine)


def test_the_surveys_read_for_many_participants_at_once_are_those_each_is_shown(
    engine: Engine, app_client: TestClient, slug: str,
) -> None:
    """``open_surveys`` (the simulation's one read for everyone opening the app in a step) is what
    ``surveys.service.pending`` shows each participant at their own moment: open, already intended,
    not closed, oldest first."""
    codes = [enroll_fully(app_client, invite, email=None).code for invite in make_invites(engine, slug, count=3)]
    now = clock.now()
    hour = dt.timedelta(hours=1)
    for code, (intended, closes) in zip(codes * 2, [(now - hour, None), (now + hour, now + 3 * hour),
                                                      (now - 3 * hour, now + hour), (now - hour, now - hour / 2),
                                                      (now + 2 * hour, None), (now, now + 5 * hour)], strict=True):
        with session_scope(engine) as session:
            participant = session.scalars(select(Participant).where(Participant.code == code)).one()
            surveys.assign(session, participant, "goal-progress", purpose="followup", intended_at=intended,
                           closes_at=closes)
    with session_scope(engine) as session:  # one of them already answered
        session.execute(sa.update(SurveyAssignment).where(SurveyAssignment.id == session.scalar(
            select(func.max(SurveyAssignment.id)))).values(status="completed"))
    moments = [now - 2 * hour, now, now + hour / 2, now + 2 * hour, now + 4 * hour]
    with session_scope(engine, read_only=True) as session:
        people = {code: session.scalars(select(Participant).where(Participant.code == code)).one() for code in codes}
        looking = [(at, people[code].id) for at in moments for code in codes]
        read_at_once = open_surveys(session, looking)
        shown = []
        frozen = clock.FrozenClock(now)
        previous = clock.set_clock(frozen)
        try:
            for at, who in looking:
                frozen.set(at)
                looker = session.get(Participant, who)
                assert looker is not None
                shown.append([(a.id, a.purpose) for a in surveys.pending(session, looker)])
        finally:
            clock.set_clock(previous)
    assert read_at_once == shown
    assert any(read_at_once)  # some see surveys at some moments,
    assert not all(read_at_once)  # none at others
