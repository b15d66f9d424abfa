"""The outcome-labelled trajectories export on a hand-built study run through the real services
and the dispatcher with a frozen clock: only participants whose latest consent signature includes
the optional ``share-conversation-text`` confirmation appear; every label equals a value worked
out by hand below; every preference pair agrees with the labels. Also: optional consent
confirmations, the CLI, the API download and the audit entry."""

from __future__ import annotations

import datetime as dt
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from analysis.exports import ExportRefused
from analysis.trajectories import (
    SENTIMENT_TOLERANCE,
    SHARE_CONFIRMATION,
    TrajectoryExport,
    export_trajectories,
    preference_pairs,
)
from api.cli import app
from chat.models import Conversation
from scheduler.service import save_profile
from study import audit, clock, participants, studies
from study.db import session_scope
from study.errors import Invalid
from study.models import AuditEntry, ConsentSignature, ConsentVersion, Participant, StaffRole, WithdrawalLevel
from study.settings import get_settings
from tests.analysis.panel_builders import PanelBuilder, perma_answers
from tests.builders import CONFIRMATIONS, TEST_ACTOR, load_study, make_invites, make_staff

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment: a Monday, 10:00 in Berlin (CET)
MINUTE = dt.timedelta(minutes=1)
NOW = dt.datetime(2026, 3, 12, 10, 0, tzinfo=dt.UTC)
ACTOR = audit.Actor.system("tests")
SHARING = [*CONFIRMATIONS, SHARE_CONFIRMATION]
# Words only the participants who did not agree wrote: none may appear in an export.
PRIVATE = ("CAROLMARK", "HANKMARK", "DAVEMARK", "carol.private@example.org")


def utc(text_: str) -> str:
    """A whole-second UTC time written as the API writes times (``2026-03-02T09:20:00Z``)."""
    return pd.Timestamp(text_, tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


class Builder(PanelBuilder):
    def member(self, arm: str, *, shares: bool) -> str:
        """Enrolled in ``arm`` in Berlin, consent signed with or without the sharing confirmation."""
        with session_scope(self.engine) as session:
            [invite] = participants.create_invites(session, studies.get_study(session, self.slug), TEST_ACTOR)
            who = participants.enroll(session, invite).participant
            participants.sign_consent(session, who, version="1.2", typed_signature="A",
                                      confirmations=SHARING if shares else CONFIRMATIONS)
            save_profile(session, who, timezone="Europe/Berlin", contact_email=None)
            who.arm = arm
            return who.code

    def regret(self, code: str, answers: tuple[int, int, int, int, int]) -> None:
        self.answer(code, purpose="followup", instrument="decision-regret",
                    answers={f"drs{i}": value for i, value in enumerate(answers, start=1)})


@dataclass
class Study:
    slug: str
    codes: dict[str, str]  # name -> participant code
    conversations: dict[str, int]  # name -> conversation id
    sharing: set[str]  # codes of those exported


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Study:
    build = Builder(engine, example_protocol)
    names = {"alice": True, "bob": True, "gina": True, "frank": True, "erin": True, "carol": False,
             "dave": True, "hank": True}
    codes = {name: build.member("wellbeing", shares=shares) for name, shares in names.items()}
    conversations: dict[str, int] = {}

    frozen_clock.set(T0 + 10 * MINUTE)
    build.answer(codes["alice"], purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        {"P": 6, "E": 5, "R": 7, "M": 8, "A": 4, "N": 3, "H": 6}, loneliness=2, happiness=7))
    build.answer(codes["bob"], purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        dict.fromkeys("PERMANH", 5), loneliness=5, happiness=5))

    # 09:20 UTC: every conversation starts; decisions at 09:30 (regret-day-3: 5 March 18:00 CET).
    frozen_clock.set(T0 + 20 * MINUTE)
    a1 = conversations["a1"] = build.start(codes["alice"], "coach")
    first = build.say(codes["alice"], a1, "I am deciding whether to change teams at work", "Is that wise?",
                      proposes="challenge/unsupported_framing")
    assert (first.stance, first.concern) == ("challenge", "unsupported_framing")
    build.override(codes["alice"], a1, first.id, "Then here is the plan.")
    build.switch(codes["alice"], a1, "collaborator")
    # (With the fit round 13 scored, "Write to alice.private@example.org for me" alone is declined as harm to
    # others: READING.md, "What it misses".)
    build.say(codes["alice"], a1, "Write to alice.private@example.org about the meeting for me", "Noted.")
    for name, role, opening in (("bob", "coach", "Should I move to another city next spring"),
                                ("gina", "coach", "Should I want to move"),
                                ("frank", "coach", "This is a terrible, awful, horrible situation"),
                                ("erin", "collaborator", "Should I sell my car"),
                                ("carol", "coach", "CAROLMARK wonders about moving house, carol.private@example.org"),
                                ("dave", "coach", "DAVEMARK asks about a loan"),
                                ("hank", "coach", "HANKMARK asks about a new phone")):
        conversation = conversations[name] = build.start(codes[name], role)
        build.say(codes[name], conversation, opening, "Let us think it through.")
    frozen_clock.set(T0 + 30 * MINUTE)
    build.end(codes["alice"], a1, rating=6, decision="Stay, and mail alice.private@example.org")
    for name in ("bob", "gina", "frank", "erin", "carol", "dave", "hank"):
        build.end(codes[name], conversations[name], rating=None,
                  decision="HANKMARK decides" if name == "hank" else f"Decision of {name}")

    frozen_clock.set(T0 + dt.timedelta(hours=1))
    build.withdraw(codes["dave"], WithdrawalLevel.DELETE_DATA)

    frozen_clock.set(dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC))
    build.tick()  # opens every regret-day-3
    frozen_clock.set(dt.datetime(2026, 3, 5, 20, 0, tzinfo=dt.UTC))
    # Items 2 and 4 are reversed, each item becomes (x - 1) * 25, the score is their mean:
    build.regret(codes["alice"], (2, 4, 2, 5, 1))  # 1,2,1,1,... -> 25,25,25,0,0 -> 15
    build.regret(codes["bob"], (3, 3, 3, 3, 3))  # every item 3 -> 50
    build.regret(codes["gina"], (2, 4, 2, 5, 1))  # 15, as alice: a tie
    build.regret(codes["frank"], (5, 1, 5, 1, 5))  # every item 5 -> 100
    build.regret(codes["erin"], (1, 5, 1, 5, 1))  # every item 1 -> 0
    build.regret(codes["carol"], (1, 5, 1, 5, 1))
    build.regret(codes["hank"], (1, 5, 1, 5, 1))

    frozen_clock.set(dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC))
    build.tick()  # opens perma-week-1 (10:00 CET)
    frozen_clock.set(dt.datetime(2026, 3, 9, 12, 0, tzinfo=dt.UTC))
    build.answer(codes["alice"], purpose="followup", instrument="perma-profiler", answers=perma_answers(
        {"P": 8, "E": 6, "R": 7, "M": 9, "A": 5, "N": 2, "H": 7}, loneliness=1, happiness=8))

    frozen_clock.set(dt.datetime(2026, 3, 10, 10, 0, tzinfo=dt.UTC))
    a2 = conversations["a2"] = build.start(codes["alice"], "coach")
    build.say(codes["alice"], a2, "Thanks, call me on +49 170 1234567", "Will do.")
    frozen_clock.set(NOW)
    build.tick()  # the others' perma-week-1 expires (window closed 12 March 09:00 UTC)

    # Hank re-consents to a revised version without the sharing confirmation: his latest
    # signature decides, so he is left out although he agreed at first.
    load_study(engine, example_protocol.replace('version: "1.2"', 'version: "2.0"').replace(
        "answer a few short questionnaires", "answer a few short questionnaires and one interview"))
    with session_scope(engine) as session:
        hank = session.scalars(select(Participant).where(Participant.code == codes["hank"])).one()
        participants.sign_consent(session, hank, version="2.0", confirmations=CONFIRMATIONS, typed_signature="H")
    sharing = {codes[name] for name in ("alice", "bob", "gina", "frank", "erin")}
    return Study(build.slug, codes, conversations, sharing)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def exported(engine: Engine, study: Study, out: Path, **kw: Any) -> tuple[TrajectoryExport, dict[int, Any],
                                                                          list[dict[str, Any]]]:
    result = export_trajectories(engine, study.slug, out, actor=ACTOR, **kw)
    trajectories = {t["conversation_id"]: t for t in read_jsonl(out / "trajectories.jsonl")}
    return result, trajectories, read_jsonl(out / "preference_pairs.jsonl")


def test_only_participants_who_agreed_to_share_are_exported(engine: Engine, study: Study, tmp_path: Path) -> None:
    result, trajectories, pairs = exported(engine, study, tmp_path / "out")
    with engine.connect() as connection:
        expected = set(connection.scalars(select(Conversation.id).join(
            Participant, Participant.id == Conversation.participant_id).where(Participant.code.in_(study.sharing))))
    assert set(trajectories) == expected  # every conversation of those who agreed, once
    assert len(read_jsonl(tmp_path / "out" / "trajectories.jsonl")) == len(expected) == 6
    assert {t["participant_code"] for t in trajectories.values()} == study.sharing
    for pair in pairs:
        assert {pair["chosen_participant_code"], pair["rejected_participant_code"]} <= study.sharing
    # Nothing of those who did not agree (carol), re-consented without it (hank) or had their data
    # deleted (dave), and no contact detail or phone number, in any file.
    left_out = {study.codes[name] for name in ("carol", "hank", "dave")}
    for path in (tmp_path / "out").iterdir():
        content = path.read_text(encoding="utf-8")
        for word in (*PRIVATE, *left_out, "alice.private@example.org", "1234567"):
            assert word not in content, (path.name, word)
    assert (result.participants_sharing, result.participants_not_sharing) == (5, 2)  # dave's data are gone
    assert result.row_counts == {"trajectories": 6, "preference_pairs": 2}


def test_messages_and_labels_equal_the_values_worked_out_by_hand(engine: Engine, study: Study,
                                                                 tmp_path: Path) -> None:
    _, trajectories, _ = exported(engine, study, tmp_path / "out")
    a1 = trajectories[study.conversations["a1"]]
    assert (a1["participant_code"], a1["arm"], a1["mode"]) == (study.codes["alice"], "wellbeing", "wellbeing")
    assert (a1["starting_role"], a1["final_role"], a1["status"]) == ("coach", "collaborator", "ended")
    assert (a1["started_at"], a1["ended_at"]) == (utc("2026-03-02 09:20"), utc("2026-03-02 09:30"))
    assert a1["first_message_sentiment"] == 0.0
    assert [(s["from_role"], s["to_role"], s["after_seq"]) for s in a1["role_switches"]] == [
        ("coach", "collaborator", 3)]
    messages = a1["messages"]
    assert [(m["seq"], m["speaker"], m["role"]) for m in messages] == [
        (1, "participant", "coach"), (2, "assistant", "coach"), (3, "assistant", "coach"),
        (4, "participant", "collaborator"), (5, "assistant", "collaborator")]
    assert [m["text"] for m in messages] == [
        "I am deciding whether to change teams at work", "Is that wise?", "Then here is the plan.",
        "Write to [email] about the meeting for me", "Noted."]
    assert (messages[1]["stance"], messages[1]["concern"]) == ("challenge", "unsupported_framing")
    assert messages[1]["rationale"] == "The test's model thinks so."
    assert messages[1]["response"]["action"] == "override"
    assert [m["after_override"] for m in messages] == [False, False, True, False, False]
    assert [m["response"] is None for m in messages] == [True, False, True, True, True]
    assert messages[0]["stance"] is None  # participants have no stance

    labels = a1["labels"]
    assert labels["exit_rating"] == 6.0
    assert labels["decision"]["text"] == "Stay, and mail [email]"
    assert labels["decision"]["decided_at"] == utc("2026-03-02 09:30")
    assert [(r["followup_key"], r["score"], r["intended_at"], r["submitted_at"], r["response_status"])
            for r in labels["regret"]] == [
        ("regret-day-3", 15.0, utc("2026-03-05 17:00"), utc("2026-03-05 20:00"), "completed"),
        ("regret-day-14", None, utc("2026-03-16 17:00"), None, "not_yet_due")]
    # Overall well-being = (3 x (P + E + R + M + A) + happiness) / 16.
    assert labels["perma"] == {
        "before": {"wave": "baseline", "submitted_at": utc("2026-03-02 09:10"),
                   "overall_wellbeing": (3 * (6 + 5 + 7 + 8 + 4) + 7) / 16},
        "after": {"wave": "perma-week-1", "intended_at": utc("2026-03-09 09:00"),
                  "submitted_at": utc("2026-03-09 12:00"), "response_status": "completed",
                  "overall_wellbeing": (3 * (8 + 6 + 7 + 9 + 5) + 8) / 16},
        "overall_wellbeing_change": 1.0,  # 113/16 - 97/16
    }

    # Alice's second conversation: after week 1, so week 1 is "before" and week 4 (not yet due,
    # 30 March 10:00 CEST = 08:00 UTC) "after"; no decision, no rating, the phone number scrubbed.
    a2 = trajectories[study.conversations["a2"]]
    assert [m["text"] for m in a2["messages"]] == ["Thanks, call me on [phone]", "Will do."]
    assert (a2["status"], a2["ended_at"]) == ("active", None)
    assert (a2["labels"]["decision"], a2["labels"]["regret"]) == (None, [])
    assert a2["labels"]["exit_rating"] is None
    assert a2["labels"]["perma"] == {
        "before": {"wave": "perma-week-1", "submitted_at": utc("2026-03-09 12:00"), "overall_wellbeing": 113 / 16},
        "after": {"wave": "perma-week-4", "intended_at": utc("2026-03-30 08:00"), "submitted_at": None,
                  "response_status": "not_yet_due", "overall_wellbeing": None},
        "overall_wellbeing_change": None}

    bob = trajectories[study.conversations["bob"]]["labels"]
    assert bob["regret"][0]["score"] == 50.0
    assert bob["perma"]["before"] == {"wave": "baseline", "submitted_at": utc("2026-03-02 09:10"),
                                      "overall_wellbeing": 5.0}
    assert bob["perma"]["after"]["response_status"] == "expired"
    assert bob["perma"]["overall_wellbeing_change"] is None
    gina = trajectories[study.conversations["gina"]]
    assert gina["labels"]["perma"]["before"] is None  # no baseline answered
    assert gina["first_message_sentiment"] == 0.0772
    assert trajectories[study.conversations["frank"]]["labels"]["regret"][0]["score"] == 100.0
    assert trajectories[study.conversations["erin"]]["labels"]["regret"][0]["score"] == 0.0


def test_preference_pairs_agree_with_the_labels(engine: Engine, study: Study, tmp_path: Path) -> None:
    _, trajectories, pairs = exported(engine, study, tmp_path / "out")
    ids = study.conversations
    # Coach, regret-day-3, by (sentiment, id): frank -0.8625 (too far from the rest), alice 0 (15),
    # bob 0 (50), gina 0.0772 (15). Alice-gina tie: no pair. Erin is the only collaborator.
    assert [(p["pair_id"], p["followup_key"], p["starting_role"], p["chosen_conversation_id"],
             p["rejected_conversation_id"]) for p in pairs] == [
        (1, "regret-day-3", "coach", ids["a1"], ids["bob"]), (2, "regret-day-3", "coach", ids["gina"], ids["bob"])]
    for pair in pairs:
        chosen, rejected = trajectories[pair["chosen_conversation_id"]], trajectories[pair["rejected_conversation_id"]]
        score = {c: next(r["score"] for r in t["labels"]["regret"] if r["followup_key"] == pair["followup_key"])
                 for c, t in (("chosen", chosen), ("rejected", rejected))}
        assert score["chosen"] < score["rejected"]
        assert (pair["chosen_regret"], pair["rejected_regret"]) == (score["chosen"], score["rejected"])
        assert chosen["starting_role"] == rejected["starting_role"] == pair["starting_role"]
        gap = abs(chosen["first_message_sentiment"] - rejected["first_message_sentiment"])
        assert gap <= SENTIMENT_TOLERANCE
        assert pair["sentiment_gap"] == pytest.approx(gap)
        assert pair["same_participant"] is False
    # A wider tolerance lets frank in: he regrets most, so every other coach conversation is chosen over his.
    _, _, wide = exported(engine, study, tmp_path / "wide", sentiment_tolerance=1.0)
    assert [(p["chosen_conversation_id"], p["rejected_conversation_id"]) for p in wide] == [
        (ids["a1"], ids["frank"]), (ids["bob"], ids["frank"]), (ids["gina"], ids["frank"]),
        (ids["a1"], ids["bob"]), (ids["gina"], ids["bob"])]


def test_preference_pairs_are_capped_deterministic_and_skip_ties() -> None:
    conversations = pd.DataFrame({
        "conversation_id": [10, 11, 12, 13, 14, 15], "participant_code": ["P1", "P2", "P3", "P4", "P5", "P1"],
        "starting_role": ["coach"] * 5 + ["concierge"], "first_message_sentiment": [0.0, 0.1, 0.2, 0.3, 0.5, 0.1]})
    regret = pd.DataFrame({"conversation_id": [10, 11, 12, 13, 14, 15, 10],
                           "followup_key": ["d3"] * 6 + ["d14"],
                           "regret": [40.0, 20.0, 20.0, 60.0, 0.0, 10.0, 5.0]})
    pairs = preference_pairs(conversations, regret, tolerance=0.25, max_partners=2)
    # d3 coach sorted: 10 (0.0), 11 (0.1), 12 (0.2), 13 (0.3), 14 (0.5). Each looks at its next two
    # within 0.25: 10-11, 10-12; 11-12 tie; 11-13; 12-13; 13-14. 15 is alone as concierge; d14 has one.
    assert [(p["chosen_conversation_id"], p["rejected_conversation_id"]) for p in pairs] == [
        (11, 10), (12, 10), (11, 13), (12, 13), (14, 13)]
    assert [p["pair_id"] for p in pairs] == [1, 2, 3, 4, 5]
    assert preference_pairs(conversations, regret, tolerance=0.25, max_partners=2) == pairs
    assert [(p["chosen_conversation_id"], p["rejected_conversation_id"])
            for p in preference_pairs(conversations, regret, tolerance=0.25, max_partners=1)] == [
        (11, 10), (12, 13), (14, 13)]  # 11-12 is a tie


def test_the_data_card_documents_the_export(engine: Engine, study: Study, tmp_path: Path) -> None:
    exported(engine, study, tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert study.slug in card
    assert "| `trajectories.jsonl` | 6 conversations |" in card
    assert "- packages: numpy " in card
    assert "statsmodels " in card
    assert "| `preference_pairs.jsonl` | 2 preference pairs |" in card
    assert "participants who agreed: 5 (5 with conversations)" in card
    assert "signed without agreeing (left out): 2" in card
    assert f"`{SHARE_CONFIRMATION}`" in card
    for field in ("labels.regret", "labels.perma", "messages", "chosen_regret, rejected_regret"):
        assert f"| `{field}` |" in card


def test_audited_and_refused_to_viewers(engine: Engine, study: Study, tmp_path: Path) -> None:
    make_staff(engine, study.slug, StaffRole.RESEARCHER, "res@example.org")
    make_staff(engine, study.slug, StaffRole.VIEWER, "viewer@example.org")
    result = export_trajectories(engine, study.slug, tmp_path / "a", actor=audit.Actor("staff", "res@example.org"))
    with engine.connect() as connection:
        entry = connection.execute(select(AuditEntry).where(AuditEntry.action == "study.export")).one()
    assert (entry.actor_type, entry.actor) == ("staff", "res@example.org")
    assert entry.detail["format"] == "trajectories"
    assert entry.detail["row_counts"] == result.row_counts == {"trajectories": 6, "preference_pairs": 2}
    assert entry.detail["options"]["confirmation"] == SHARE_CONFIRMATION
    assert (entry.detail["participants_sharing"], entry.detail["participants_not_sharing"]) == (5, 2)
    with pytest.raises(ExportRefused):
        export_trajectories(engine, study.slug, tmp_path / "b", actor=audit.Actor("staff", "viewer@example.org"))
    assert not (tmp_path / "b").exists()  # refused before anything was written
    with engine.connect() as connection:
        assert connection.scalar(select(AuditEntry.seq).where(AuditEntry.action == "study.export")
                                 .order_by(AuditEntry.seq.desc()).limit(1)) == entry.seq


def test_a_study_whose_consent_never_offered_sharing_is_refused(engine: Engine, example_protocol: str,
                                                               tmp_path: Path) -> None:
    without = example_protocol.replace("id: wellbeing-pilot", "id: no-sharing").replace(
        "    - id: share-conversation-text\n      required: false\n", "    - id: spare\n      required: false\n")
    slug = load_study(engine, without)
    with pytest.raises(Invalid, match="never offered the confirmation 'share-conversation-text'"):
        export_trajectories(engine, slug, tmp_path, actor=ACTOR)
    with pytest.raises(LookupError):
        export_trajectories(engine, "nope", tmp_path, actor=ACTOR)


def test_nobody_agreed_gives_empty_files(engine: Engine, example_protocol: str, tmp_path: Path) -> None:
    build = Builder(engine, example_protocol)
    code = build.member("wellbeing", shares=False)
    build.say(code, build.start(code, "coach"), "Should I sell my car", "Maybe.")
    result = export_trajectories(engine, build.slug, tmp_path / "out", actor=ACTOR)
    assert (result.conversations, result.pairs, result.participants_sharing, result.participants_not_sharing) == (
        0, 0, 0, 1)
    assert (tmp_path / "out" / "trajectories.jsonl").read_text() == ""
    assert (tmp_path / "out" / "preference_pairs.jsonl").read_text() == ""
    assert "participants who agreed: 0 (0 with conversations)" in (tmp_path / "out" / "README.md").read_text()


# The command line and the API


@pytest.fixture
def cli_database(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    return engine


def test_the_cli_exports_trajectories(cli_database: Engine, study: Study, tmp_path: Path) -> None:
    make_staff(cli_database, study.slug, StaffRole.VIEWER, "viewer@example.org")
    runner = CliRunner()
    result = runner.invoke(app, ["export", study.slug, "--format", "trajectories", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "trajectories: 6 conversations" in result.output
    assert "preference pairs: 2" in result.output
    assert len(read_jsonl(tmp_path / "out" / "trajectories.jsonl")) == 6
    refused = runner.invoke(app, ["export", study.slug, "--format", "trajectories", "--out", str(tmp_path / "v"),
                                  "--as", "viewer@example.org"])
    assert refused.exit_code == 1
    assert "may not export row-level data" in refused.output
    mixed = runner.invoke(app, ["export", study.slug, "--format", "trajectories", "--out", str(tmp_path / "m"),
                                "--turns"])
    assert mixed.exit_code == 1
    assert "do not apply to --format trajectories" in mixed.output


def test_staff_download_trajectories_as_a_zip(engine: Engine, app_client: TestClient, study: Study) -> None:
    token = make_staff(engine, study.slug, StaffRole.RESEARCHER, "dl@uni.example")
    viewer = make_staff(engine, study.slug, StaffRole.VIEWER, "view@uni.example")
    url = f"/api/v1/staff/studies/{study.slug}/exports"
    response = app_client.get(url, params={"format": "trajectories"}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    lines = bundle.read(f"{study.slug}/trajectories.jsonl").decode().splitlines()
    assert {json.loads(line)["participant_code"] for line in lines} == study.sharing
    assert f"{study.slug}/preference_pairs.jsonl" in bundle.namelist()
    refused = app_client.get(url, params={"format": "trajectories"}, headers={"Authorization": f"Bearer {viewer}"})
    assert refused.status_code == 403
    mixed = app_client.get(url, params={"format": "trajectories", "turns": "true"},
                           headers={"Authorization": f"Bearer {token}"})
    assert mixed.status_code == 422
    with engine.connect() as connection:
        rows = connection.execute(select(AuditEntry.actor, AuditEntry.detail)
                                  .where(AuditEntry.action == "study.export")).all()
    assert [(actor, detail["format"]) for actor, detail in rows] == [("dl@uni.example", "trajectories")]


# Optional consent confirmations


def _invited(engine: Engine, slug: str) -> str:
    [invite] = make_invites(engine, slug)
    with session_scope(engine) as session:
        return participants.enroll(session, invite).participant.code


def _sign(engine: Engine, code: str, confirmations: list[str]) -> list[str]:
    with session_scope(engine) as session:
        who = session.scalars(select(Participant).where(Participant.code == code)).one()
        return list(participants.sign_consent(session, who, version="1.2", confirmations=confirmations,
                                              typed_signature="A").confirmations)


def test_optional_confirmations_may_be_left_unticked(engine: Engine, slug: str) -> None:
    assert _sign(engine, _invited(engine, slug), CONFIRMATIONS) == sorted(CONFIRMATIONS)
    assert _sign(engine, _invited(engine, slug), SHARING) == sorted(SHARING)
    code = _invited(engine, slug)
    with pytest.raises(Invalid, match="please confirm: adult"):
        _sign(engine, code, ["read-and-understood", "voluntary", SHARE_CONFIRMATION])
    with pytest.raises(Invalid, match="unknown confirmations: share-everything"):
        _sign(engine, code, [*CONFIRMATIONS, "share-everything"])
    with engine.connect() as connection:
        ticked = connection.execute(select(ConsentSignature.confirmations).order_by(ConsentSignature.id)).scalars()
        assert [SHARE_CONFIRMATION in c for c in ticked] == [False, True]
        audited = connection.execute(select(AuditEntry.detail).where(AuditEntry.action == "consent.signed")
                                     .order_by(AuditEntry.seq)).scalars().all()
    assert [d["optional_confirmations"] for d in audited] == [[], [SHARE_CONFIRMATION]]


def test_consent_rows_store_required_confirmations_as_before(engine: Engine, example_protocol: str) -> None:
    """A required confirmation is stored as {id, text}, as it was before optional ones existed, so
    reloading an unchanged consent (here: the file changed elsewhere) keeps its version."""
    slug = load_study(engine, example_protocol)
    load_study(engine, example_protocol + "\n# a comment changes the file, not the consent\n")
    with engine.connect() as connection:
        [stored] = connection.execute(select(ConsentVersion.confirmations)).scalars().all()
    assert [sorted(c) for c in stored] == [["id", "text"]] * 3 + [["id", "required", "text"]]
    assert (stored[-1]["id"], stored[-1]["required"]) == (SHARE_CONFIRMATION, False)
    assert slug == "wellbeing-pilot"
