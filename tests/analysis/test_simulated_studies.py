"""Simulations cannot touch a live study (issue 27, done-means 6).

A simulation writes only to a study marked simulated, made for it under a slug of its own, and
refuses any other study, or one with participants who did not come from a simulation, before it
writes anything. Run beside the live dispatcher (``afterward scheduler`` in a process of its own, on
the real clock, with a real mail server on loopback) on a copy of the same protocol, with the same
on-call contact: the live dispatcher touches none of the simulated study's rows and emails nobody
about it, and the simulation's own counts agree with what it left in the database, every wave there.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from analysis.simulation.driver import OfflineGateway
from analysis.simulation.population import OFFLINE_MODEL, Effects
from analysis.simulation.simulate import load_simulated_study, simulate
from api.cli import app
from chat import turn
from chat.gateway import Gateway, GatewayError
from chat.roles import RoleName, system_prompt
from study import participants, studies
from study.db import session_scope
from study.errors import Conflict, Invalid
from study.models import Participant, Study
from study.settings import Settings, get_settings
from surveys import registry
from tests.builders import FRAMING, TEST_ACTOR, enroll_fully, load_study, make_invites, put_in_arm, say, start_chat
from tests.conftest import EXAMPLE
from tests.mail import Inbox, smtp_server
from tests.waiting import WAIT_SECONDS, until

ROOT = Path(__file__).resolve().parents[2]
ONCALL = "oncall@example.org"  # the example protocol's safety contact: the copy's too
LIVE_EMAIL = "live@example.org"
START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)


def count(engine: Engine, table: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def written(engine: Engine) -> dict[str, int]:
    return {table: count(engine, table) for table in ("simulation_runs", "invite_codes", "participants",
                                                      "conversations", "followups", "audit_log")}


# Refusals


def test_a_simulation_refuses_a_live_study_and_one_with_real_participants_before_writing_anything(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    live = load_study(engine, example_protocol)
    before = written(engine)
    with pytest.raises(Conflict, match=f"'{live}' is not a simulated study: a simulation writes only to a study "
                                       "made for it") as refused:
        simulate(engine, live, participants=3, weeks=1, seed=1, start=START)
    assert refused.value.code == "not_simulated"
    assert written(engine) == before

    # A study marked simulated after a real participant enrolled in it (by hand: nothing in the
    # platform marks an existing study) is refused too.
    enroll_fully(app_client, make_invites(engine, live)[0])
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE studies SET simulated = :yes WHERE slug = :slug"),
                           {"yes": True, "slug": live})
    before = written(engine)
    with pytest.raises(Conflict, match=r"has 1 participant\(s\) who did not come from a simulation") as refused:
        simulate(engine, live, participants=3, weeks=1, seed=1, start=START)
    assert refused.value.code == "real_participants"
    assert written(engine) == before


def test_live_and_simulated_studies_are_kept_apart_when_loading_and_inviting(engine: Engine,
                                                                             example_protocol: str) -> None:
    live = load_study(engine, example_protocol)
    simulated = load_simulated_study(engine, example_protocol)
    assert simulated == f"{live}-simulated"
    with session_scope(engine) as session:
        known = registry.catalog(session)
        with pytest.raises(Conflict, match=f"'{live}' is a live study: a simulation runs in a simulated study of "
                                           "its own"):
            studies.load_simulated(session, example_protocol, TEST_ACTOR, live, instruments=known)
        with pytest.raises(Conflict, match=f"'{simulated}' is a simulated study: a live study's protocol needs an "
                                           "id of its own"):
            studies.load_protocol(session, example_protocol.replace(f"id: {live}", f"id: {simulated}", 1),
                                  TEST_ACTOR, instruments=known)
        with pytest.raises(Invalid, match="cannot be a study's slug"):
            studies.load_simulated(session, example_protocol, TEST_ACTOR, "Not A Slug", instruments=known)
        with pytest.raises(Conflict, match=f"'{simulated}' is a simulated study: it takes no real participants"):
            participants.create_invites(session, studies.get_study(session, simulated), TEST_ACTOR)
        with pytest.raises(Conflict, match=f"'{live}' is not a simulated study: a simulation's invites go to a "
                                           "simulated study only"):
            participants.create_invites(session, studies.get_study(session, live), TEST_ACTOR, simulation=1)
        flags = dict(session.execute(sa.select(Study.slug, Study.simulated)).all())
    assert flags == {live: False, simulated: True}
    # Loading the same file again changes nothing; the simulated study keeps its mark.
    assert load_simulated_study(engine, example_protocol) == simulated
    with session_scope(engine, read_only=True) as session:
        assert studies.current_version(session, studies.get_study(session, simulated).id).version == 1


def test_the_simulate_command_refuses_a_live_study_and_runs_in_a_simulated_one(
    engine: Engine, example_protocol: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = load_study(engine, example_protocol)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    runner = CliRunner()
    refused = runner.invoke(app, ["simulate", live, "--participants", "2", "--weeks", "1"])
    assert refused.exit_code == 1
    assert f"'{live}' is not a simulated study" in refused.output
    assert f"afterward simulate {live}-simulated --protocol FILE" in refused.output
    refused = runner.invoke(app, ["simulate", live, "--protocol", str(EXAMPLE), "--participants", "2"])
    assert refused.exit_code == 1
    assert f"'{live}' is a live study" in refused.output
    assert count(engine, "simulation_runs") == 0

    ran = runner.invoke(app, ["simulate", "pilot-rehearsal", "--protocol", str(EXAMPLE), "--participants", "2",
                              "--weeks", "1", "--start", "2026-03-02"])
    assert ran.exit_code == 0, ran.output
    assert "simulated study 'pilot-rehearsal' loaded from" in ran.output
    assert "simulation 1 of 'pilot-rehearsal' (seed 1) finished" in ran.output
    with session_scope(engine, read_only=True) as session:
        assert studies.get_study(session, "pilot-rehearsal").simulated
        assert not studies.get_study(session, live).simulated
        assert session.scalar(sa.select(sa.func.count()).select_from(Participant).where(
            Participant.study_id == studies.get_study(session, live).id)) == 0


# The simulation's gateway


SCRIPT = ["I'm thinking about asking for a raise next month.", FRAMING, "Am I doing the right thing here?",
          "Just tell me what to do.", "I feel hopeless about all of this lately."]


@pytest.mark.parametrize("role", ["coach", "collaborator", "concierge"])
def test_the_simulations_gateway_answers_as_the_gateway_does(role: RoleName) -> None:
    """The same conversation through ``chat.turn`` with the gateway (LiteLLM's Router and the
    offline provider) and with the simulation's (the provider alone): the same replies, stances and
    completions, but for the time each call took."""
    settings = Settings(llm_model=OFFLINE_MODEL)

    def converse(gateway: Gateway) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
        store = turn.MemoryStore(role, system_prompt(role).text)

        async def run() -> None:
            for text in SCRIPT:
                outcome = await turn.answer(store, gateway, await store.accept(text))
                assert outcome.reply_id is not None
        asyncio.run(run())
        return store.replies, [(c.text, c.model, c.prompt_tokens, c.completion_tokens, c.cost_usd, c.fallback_used)
                               for c in store.completions]

    routed = converse(Gateway(settings))
    direct = converse(OfflineGateway(settings))
    assert direct == routed
    assert {reply["stance"] for reply in routed[0]} != {"agree"}  # the script meets the policy, not only "agree"


def test_the_simulations_gateway_fails_as_the_gateway_does() -> None:
    """A failing model is a GatewayError of the same kind, naming the model (the exception's class
    it names is LiteLLM's mapping of the provider's error on one side, the provider's own on the other)."""
    messages = [{"role": "system", "content": "Role: coach"}, {"role": "user", "content": "Hello"}]
    settings = Settings(llm_model="offline/fail-error")
    for gateway in (Gateway(settings), OfflineGateway(settings)):
        with pytest.raises(GatewayError, match="^offline/fail-error: ") as failed:
            asyncio.run(gateway.complete(messages))
        assert failed.value.kind == "error"


# A simulation beside the live dispatcher


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def live_dispatcher(engine: Engine, smtp_port: int, log: Path) -> subprocess.Popen[bytes]:
    """``afterward scheduler`` as ``make run`` starts it: its own process, the real clock, every channel."""
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_SMTP_PORT": str(smtp_port)}
    return subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "scheduler",
                             "--poll-seconds", "0.5", "--name", "live"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def fall_due_now(engine: Engine, followup_id: int) -> None:
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE followups SET due_at = :due, closes_at = :closes WHERE id = :id"),
                           {"due": now - dt.timedelta(minutes=1), "closes": now + dt.timedelta(days=2),
                            "id": followup_id})


def study_linked(notice: EmailMessage) -> str:
    """The study an on-call notice is about: the one its link to the dashboard's review names."""
    body = notice.get_body(("plain",))
    assert body is not None
    return parse_qs(urlsplit(re.findall(r"https?://\S+", body.get_content())[0]).query)["study"][0]


def rows(engine: Engine, query: str, **params: Any) -> list[Any]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(query), params)]


def test_a_simulation_beside_the_live_dispatcher_is_left_alone_and_its_counts_agree(
    engine: Engine, app_client: TestClient, example_protocol: str, inbox: tuple[Inbox, int], tmp_path: Path,
) -> None:
    messages, port = inbox
    live = load_study(engine, example_protocol)
    dispatcher = live_dispatcher(engine, port, tmp_path / "live.log")
    try:
        # The live dispatcher at work: a live participant's escalation reaches the on-call contact.
        who = enroll_fully(app_client, make_invites(engine, live)[0], email=LIVE_EMAIL)
        put_in_arm(engine, who.code, "wellbeing")
        conversation = start_chat(app_client, who, "coach")
        assert say(app_client, who, conversation, "I want to kill myself")["stance"] == "escalate"
        until(lambda: messages.to(ONCALL), "the on-call notice of the live escalation", processes=[dispatcher])

        # A simulation of the same protocol, with the same on-call contact, over the five weeks that
        # end today: for the live dispatcher's clock every one of its follow-ups, windows and
        # check-in deadlines is long past.
        simulated = load_simulated_study(engine, example_protocol)
        end = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        result = simulate(engine, simulated, participants=12, weeks=5, seed=4, start=end - dt.timedelta(weeks=5),
                          effects=Effects(distress_share=0.1, delete_data_share=0.0))

        # Two live follow-ups made due one after the other, each emailed: the poll that sent the
        # second began after the first was sent, so after the simulation had finished, and it went
        # through every phase (on-call, check-ins, re-planning, opening, expiry) before sending.
        week_1, week_4 = (followup for followup, in rows(engine, "SELECT id FROM followups WHERE study_id = "
                                                          "(SELECT id FROM studies WHERE slug = :s) ORDER BY due_at",
                                                          s=live))
        fall_due_now(engine, week_1)
        until(lambda: len(messages.to(LIVE_EMAIL)) == 1, "the first live invitation", processes=[dispatcher])
        fall_due_now(engine, week_4)
        until(lambda: len(messages.to(LIVE_EMAIL)) == 2, "the second live invitation", processes=[dispatcher])
    finally:
        dispatcher.terminate()
        assert dispatcher.wait(WAIT_SECONDS) == 0
    assert "Traceback" not in (tmp_path / "live.log").read_text()

    # Nobody heard of the simulated study: the on-call contact only of the live escalation, and no
    # email to anyone else.
    assert [study_linked(notice) for notice in messages.to(ONCALL)] == [live]
    assert {str(m["To"]) for m in messages.messages} == {ONCALL, LIVE_EMAIL}
    assert not [m for m in messages.messages if simulated in m.as_string()]

    # ... though it had every reason to: safety events paging, unreviewed, and follow-ups due.
    study = {"s": simulated}
    in_study = "study_id = (SELECT id FROM studies WHERE slug = :s)"
    paging = rows(engine, f"SELECT count(*) FROM safety_events WHERE {in_study} AND page_since IS NOT NULL", **study)
    assert paging[0][0] > 0
    assert rows(engine, f"SELECT count(*) FROM safety_notifications WHERE {in_study}", **study) == [(0,)]
    # Every row of the simulated study was last changed on the simulation's clock, by its services
    # and its own dispatcher: nothing sent, ended or made unanswered after its end, the follow-ups
    # still planned all due after it (the simulation's last poll opened the rest), only in-app records.
    followups = rows(engine, f"SELECT sent_at, ended_at, updated_at, due_at, status FROM followups WHERE {in_study}",
                     **study)
    as_time = (lambda value: value if isinstance(value, dt.datetime)  # noqa: E731
               else dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC))
    assert all(as_time(updated) <= end for _, _, updated, _, _ in followups)
    assert all(as_time(due) > end for *_, due, status in followups if status == "planned")
    unanswered = rows(engine, f"SELECT unanswered_at FROM safety_events WHERE {in_study} AND unanswered_at IS NOT "
                              "NULL", **study)
    assert unanswered
    assert all(as_time(at) <= end for at, in unanswered)
    assert rows(engine, "SELECT DISTINCT channel, claimed_by FROM deliveries WHERE participant_id IN "
                        f"(SELECT id FROM participants WHERE {in_study})", **study) == [("in_app", None)]

    # The simulation's own counts agree with what it left: it opened every follow-up that was
    # opened, answered no more than it opened, and every wave of the protocol is there.
    counts = result.counts
    opened = sum(1 for sent, *_ in followups if sent is not None)
    assert counts["followups_opened"] == opened == result.summary["followups_sent"]
    assert counts["followups_expired"] == sum(1 for *_, status in followups if status == "expired")
    answered = rows(engine, "SELECT count(*) FROM followups f JOIN survey_assignments a ON a.id = f.assignment_id "
                            f"WHERE f.{in_study} AND a.status = 'completed'", **study)[0][0]
    assert counts["followups_answered"] == answered > 0
    assert counts["followups_answered"] + counts["followups_missed"] <= counts["followups_opened"]
    waves = {key for key, in rows(engine, "SELECT DISTINCT f.followup_key FROM followups f JOIN survey_assignments a "
                                           f"ON a.id = f.assignment_id WHERE f.{in_study} AND a.status = 'completed'",
                                   **study)}
    assert waves == {"perma-week-1", "perma-week-4", "regret-day-3", "regret-day-14"}
