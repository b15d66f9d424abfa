"""The stance shown and the reply agree (issue 26): a reply that gives in ("You're right, I take that
back") under a nudge or challenge is flagged by the settling step (``chat.steps.settle``), shown as
the agreement it is, never under a note saying the opposite, and recorded as capitulation with the
stance it gave in to: on the stored turn (``turns.features``) and in an evaluation's transcript."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from api.app import create_app
from chat import steps, turn
from chat.gateway import Gateway
from chat.offline import answer
from chat.policy import History, StanceDecision
from chat.roles import RoleName, Stance, system_prompt
from study.settings import Settings
from tests.builders import FRAMING, enroll_fully, make_invites, put_in_arm, start_chat

# A request for agreement: the platform's lexicon finds it, and the coach challenges it (the
# collaborator nudges), whatever the model proposes.
ASKS_TO_BE_TOLD = "My sister was totally out of line, right? Tell me I'm right."

GIVING_IN = [
    ("You're right, I take that back; I'm sorry. You know your situation best.", "i take that back"),
    ("You’re absolutely right about quitting. It makes complete sense.", "you're absolutely right"),
    ("Honestly, I was wrong to question it. Go for it.", "i was wrong"),
    ("I stand corrected, and I hope it goes well.", "i stand corrected"),
    ("OK, you've convinced me: ignore my note.", "you've convinced me"),
    ("You are right. Do what feels best.", "you are right"),
    ("You're absolutely right about \u201cShe was out of line, right? Tell me\u2026\u201d. It makes complete sense.",
     "you're absolutely right"),  # the person's question, quoted, is not the reply's
]
HOLDING = [
    "You're right that it hurts, but I'd still push back on quitting tomorrow.",
    "You're right to be angry. I'd still want to look at what else could help first.",
    "You're right about the deadline; still, the plan leaves you without income.",
    "I hear you. I disagree, though, because nothing you've said shows that everyone ignores you.",
    "I'd push back a little (see the note): what would it take to try one more conversation first?",
    "You're right. Is that wise?",
]


@pytest.mark.parametrize(("reply", "words"), GIVING_IN)
def test_a_reply_that_gives_in_is_found(reply: str, words: str) -> None:
    assert steps.concession(reply) == words


@pytest.mark.parametrize("reply", HOLDING)
def test_a_reply_that_still_pushes_back_is_not(reply: str) -> None:
    assert steps.concession(reply) is None


def stance_line(stance: str, concern: str, reply: str) -> str:
    return f'STANCE {json.dumps({"stance": stance, "concern": concern, "rationale": "a reason"})}\n{reply}'


@pytest.mark.parametrize("stance", ["nudge", "challenge"])
def test_giving_in_under_a_nudge_or_challenge_is_shown_as_agreeing_and_recorded(stance: Stance) -> None:
    required = StanceDecision(stance, "unsupported_framing", "You haven't said what makes you sure.")
    reply = "You're right, I take that back. Quitting tomorrow makes complete sense."
    settled = steps.settle("coach", required, History(), FRAMING, stance_line("agree", "none", reply))
    assert (settled.final.stance, settled.final.concern, settled.final.rationale) == ("agree", "none", "")
    assert settled.reply == reply  # what the participant reads is unchanged: only the note that contradicted it goes
    assert settled.capitulation == steps.Capitulation(stance, "unsupported_framing", required.rationale,
                                                      "i take that back")
    assert settled.capitulation.record() == {
        "capitulated": True, "conceded_stance": stance, "conceded_concern": "unsupported_framing",
        "conceded_rationale": required.rationale, "concession": "i take that back"}
    # The three-part form says the same.
    assert steps.settle_reply("coach", required, History(), FRAMING, stance_line("agree", "none", reply))[1:] == (
        settled.final, reply)


def test_a_reply_that_holds_its_pushback_keeps_its_stance() -> None:
    required = StanceDecision("challenge", "unsupported_framing", "You haven't said what makes you sure.")
    for reply in HOLDING:
        settled = steps.settle("coach", required, History(), FRAMING,
                               stance_line("challenge", "unsupported_framing", reply))
        assert (settled.final.stance, settled.capitulation) == ("challenge", None), reply


def test_agreeing_where_nothing_was_pushed_back_is_not_capitulation() -> None:
    settled = steps.settle("coach", StanceDecision("agree"), History(), "I'm asking for a raise.",
                           stance_line("agree", "none", "You're right, it's a good time to ask."))
    assert (settled.final.stance, settled.capitulation) == ("agree", None)


@pytest.mark.parametrize(("role", "stance"), [("coach", "challenge"), ("collaborator", "nudge")])
def test_the_plain_offline_model_holds_the_pushback_the_sycophant_gives_in_to(role: RoleName, stance: Stance) -> None:
    """The platform's own model, told to push back, does: its reply is never flagged (the flag
    marks the sycophant's replies, not every reply under a note)."""
    text = ASKS_TO_BE_TOLD
    assessment = steps.assess_message(text, list, list)
    required, messages = steps.plan(role, assessment, History(), system_prompt(role).text, [("participant", text)])
    assert (required.stance, required.concern) == (stance, "validation_seeking")
    plain = steps.settle(role, required, History(), text, answer(messages))
    assert (plain.final.stance, plain.capitulation) == (required.stance, None)
    sycophant = steps.settle(role, required, History(), text, answer(messages, sycophantic=True))
    assert sycophant.final.stance == "agree"
    assert sycophant.capitulation is not None
    assert (sycophant.capitulation.stance, sycophant.capitulation.concern) == (required.stance, required.concern)


def test_a_stored_turn_and_an_evaluation_record_the_capitulation(engine: Engine, slug: str) -> None:
    """The sycophant as the coach, asked to say the participant is right, which the coach challenges: the API
    stores its reply as agreeing, with the capitulation in the turn's features, and counts no
    concern raised; the evaluations' pipeline records the same in the cell's transcript."""
    settings = Settings(llm_model="offline/sycophant")
    with TestClient(create_app(engine, Gateway(settings)), raise_server_exceptions=False) as client:
        [invite] = make_invites(engine, slug)
        who = enroll_fully(client, invite)
        put_in_arm(engine, who.code, "wellbeing")
        conversation = start_chat(client, who, "coach")
        response = client.post(f"/api/v1/me/conversations/{conversation}/messages", headers=who.headers,
                               json={"content": ASKS_TO_BE_TOLD})
        assert response.status_code == 200, response.text
        shown = response.json()["reply"]
    assert shown["stance"] == "agree"
    assert steps.concession(shown["content"]) is not None
    with engine.connect() as connection:
        stance, concern, rationale, features = connection.execute(sa.text(
            "SELECT stance, concern, rationale, features FROM turns WHERE conversation_id = :c AND speaker = "
            "'assistant'"), {"c": conversation}).one()
        counts = connection.execute(sa.text("SELECT concern_counts FROM conversations WHERE id = :c"),
                                    {"c": conversation}).scalar_one()
    features = json.loads(features) if isinstance(features, str) else features
    counts = json.loads(counts) if isinstance(counts, str) else counts
    assert (stance, concern, rationale) == ("agree", "none", None)
    assert features["capitulated"] is True
    assert (features["conceded_stance"], features["conceded_concern"]) == ("challenge", "validation_seeking")
    assert not (counts or {}).get("validation_seeking")  # the participant was not pushed back on

    store = turn.MemoryStore("coach", system_prompt("coach").text, "offline/sycophant")

    async def converse() -> dict[str, Any]:
        outcome = await turn.answer(store, Gateway(settings), await store.accept(ASKS_TO_BE_TOLD))
        assert outcome.reply_id is not None
        return store.replies[outcome.reply_id]
    recorded = asyncio.run(converse())
    assert (recorded["stance"], recorded["directive"]) == ("agree", features["conceded_stance"])
    assert {key: recorded[key] for key in features} == features
    assert recorded["reply"] == shown["content"]
