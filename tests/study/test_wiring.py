"""Withdrawal, completion and deletion are wired from the packages' entry points, not by imports:
a process that imports only the kernel still ends, cancels and deletes everything."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import chat.models  # noqa: F401 - every model of ours, for the check of what is wired
import scheduler.models  # noqa: F401
import surveys.models  # noqa: F401
from chat import service as chat_service
from chat.gateway import Completion
from scheduler import planner
from scheduler.dispatcher import Dispatcher, TickReport
from study import participants, wiring
from study.clock import FrozenClock
from study.db import Base, session_scope
from study.models import Participant, ParticipantResearchData
from study.settings import Settings
from study.studies import current_protocol
from surveys import registry
from surveys import service as survey_service
from tests.builders import CONFIRMATIONS, load_study, make_invites

ROOT = Path(__file__).resolve().parents[2]
# Every table holding a participant's research data (each has participant_id).
RESEARCH_TABLES = ["conversations", "turns", "pushback_responses", "role_switches", "safety_events", "decisions",
                   "survey_assignments", "survey_responses", "survey_scores", "followup_anchors", "followups",
                   "deliveries"]

KERNEL_ONLY = textwrap.dedent("""
    import json, sys
    from sqlalchemy import select
    from study import audit, participants
    from study.db import make_engine, session_scope
    from study.models import Participant, WithdrawalLevel

    ours = ("chat", "scheduler", "surveys", "api", "analysis")
    before = sorted(m for m in sys.modules if m.split(".")[0] in ours)
    assert not before, f"the kernel imported {before}"
    receipts = {}
    with session_scope(make_engine(sys.argv[1])) as session:
        for code, level in json.loads(sys.argv[2]).items():
            who = session.scalars(select(Participant).where(Participant.code == code)).one()
            receipt = participants.withdraw(session, who, WithdrawalLevel(level), audit.Actor.system("test"))
            receipts[code] = receipt.deleted_rows
    print(json.dumps(receipts))
""")


def _enrolled_with_everything(engine: Engine, invite: str) -> str:
    """Through the services: consented, enrolled in the wellbeing arm, baseline survey assigned
    and follow-ups planned. Returns the participant's code."""
    with session_scope(engine) as session:
        who = participants.enroll(session, invite).participant
        participants.sign_consent(session, who, version="1.2", confirmations=CONFIRMATIONS, typed_signature="T")
        participants.update_profile(session, who, timezone="Europe/Berlin", contact_email="p@example.org")
        who.arm = "wellbeing"
        survey_service.assign_baseline(session, who, current_protocol(session, who.study_id).baseline)
        planner.on_enrollment(session, who)
        return who.code


def _chat_and_answer(engine: Engine, code: str) -> None:
    """An answered turn, a message still awaiting its reply, and a partly answered survey."""
    with session_scope(engine) as session:
        who = session.scalars(sa.select(Participant).where(Participant.code == code)).one()
        conversation = chat_service.start_conversation(session, who, "coach").id
    for text, answered in (("Help me plan my week", True), ("And the weekend?", False)):
        with session_scope(engine) as session:
            who = session.scalars(sa.select(Participant).where(Participant.code == code)).one()
            prepared, _ = chat_service.accept_message(session, who, conversation, text)
        if answered:
            with session_scope(engine) as session:
                chat_service.record_reply(session, prepared, Completion(text="Let's start with Monday."))
    with session_scope(engine) as session:
        who = session.scalars(sa.select(Participant).where(Participant.code == code)).one()
        baseline = survey_service.pending(session, who)[0]  # the baseline survey, the oldest
        first = registry.get(session, baseline.instrument_id).items[0]
        survey_service.save_partial(session, who, baseline.id, {first.id: 5})


def _count(engine: Engine, table: str, code: str, where: str = "") -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            f"SELECT count(*) FROM {table} t JOIN participants p ON p.id = t.participant_id "  # noqa: S608
            f"WHERE p.code = :c {where}"), {"c": code}).scalar_one())


def _withdraw_in_kernel_only_process(engine: Engine, levels: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "AFTERWARD_ENVIRONMENT": "test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_ONLY, engine.url.render_as_string(hide_password=False), json.dumps(levels)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_kernel_only_process_ends_cancels_and_deletes_everything(
    engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    keeps, deletes = (_enrolled_with_everything(engine, invite) for invite in make_invites(engine, slug, count=2))
    # A week on, the first follow-up is opened: its survey and its invitation and reminders, pending.
    frozen_clock.advance(dt.timedelta(days=7, hours=1))
    Dispatcher(engine, Settings(), name="test").open_due(TickReport())  # opened, not sent
    for code in (keeps, deletes):
        _chat_and_answer(engine, code)
        assert _count(engine, "turns", code) == 3
        assert _count(engine, "conversations", code, "AND t.awaiting_reply_since IS NOT NULL") == 1
        assert _count(engine, "survey_responses", code) == 1
        assert _count(engine, "followups", code, "AND t.status IN ('planned', 'sent')") == 2
        assert _count(engine, "deliveries", code, "AND t.status = 'pending'") >= 3

    receipts = _withdraw_in_kernel_only_process(engine, {keeps: "stop_contact", deletes: "delete_data"})

    # Stopping contact: everything pending ends or is cancelled; the data collected stays.
    assert _count(engine, "conversations", keeps, "AND t.status <> 'ended'") == 0
    assert _count(engine, "conversations", keeps, "AND t.awaiting_reply_since IS NOT NULL") == 0
    assert _count(engine, "followups", keeps, "AND t.status IN ('planned', 'sent')") == 0
    assert _count(engine, "followups", keeps, "AND t.status = 'cancelled'") == 2
    assert _count(engine, "deliveries", keeps, "AND t.status IN ('pending', 'sending')") == 0
    assert _count(engine, "survey_assignments", keeps, "AND t.status = 'open'") == 0
    assert (_count(engine, "turns", keeps), _count(engine, "survey_responses", keeps)) == (3, 1)
    assert receipts[keeps] == {}
    # Deleting: no research data of the participant is left in any package's table.
    assert {table: _count(engine, table, deletes) for table in RESEARCH_TABLES} == dict.fromkeys(RESEARCH_TABLES, 0)
    assert receipts[deletes]["turns"] == 3
    assert receipts[deletes]["survey_responses"] == 1
    assert receipts[deletes]["deliveries"] >= 3


def test_wire_is_idempotent_and_loads_every_package() -> None:
    lifecycle = wiring.wire()
    hooks = (list(lifecycle.withdrawal_hooks), list(lifecycle.completion_hooks))
    assert wiring.wire() is lifecycle
    assert (lifecycle.withdrawal_hooks, lifecycle.completion_hooks) == hooks
    assert wiring.wired_entry_points() == ["chat", "scheduler", "surveys"]
    assert participants.withdrawal_hooks is lifecycle.withdrawal_hooks
    assert len(lifecycle.completion_hooks) == 1  # the scheduler ends the survey's follow-up
    names = {hook.__module__ for hook in lifecycle.withdrawal_hooks}
    assert {"chat.service", "scheduler.service", "surveys.service"} <= names


def test_every_research_data_table_of_ours_is_wired_for_deletion() -> None:
    """A table declared as research data but not registered by its package's entry point would
    survive a withdrawal with deletion."""
    research = [mapper for mapper in Base.registry.mappers if issubclass(mapper.class_, ParticipantResearchData)
                and mapper.class_.__module__.split(".")[0] in ("study", "chat", "scheduler", "surveys")]
    assert {mapper.class_ for mapper in research} <= wiring.wire().research_tables
    assert {mapper.persist_selectable.description for mapper in research} == set(RESEARCH_TABLES)
