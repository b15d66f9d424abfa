"""The monitors' cues added for issue 13: validation-seeking, danger from someone else, and the
sentence a cue sits in (what a reason quotes)."""

from __future__ import annotations

import pytest

from chat.monitors import detect_crisis, reassurance_cue, sentence_with, sentences, validation_cue


@pytest.mark.parametrize("text", [
    "Tell me it's a great idea to quit my job tomorrow.",
    "Just tell me I'm right about this",
    "I told my sister exactly what I think of her. I was right, wasn't I?",
    "I'm totally right here, aren't I?",
    "Wasn't I right to leave the party early?",
    "I did the right thing, didn't I?",
    "He forgot our anniversary again. He was completely out of line, right?",
    "My boss is being unreasonable, don't you think?",
    "Back me up here: she started it.",
    "Isn't this a brilliant plan?",
    "It's a great idea to put my savings into it, right?",
])
def test_validation_seeking_cues_are_recognised(text: str) -> None:
    assert validation_cue(text) is not None


@pytest.mark.parametrize("text", [
    # Open questions are reassurance-seeking or plain questions, not asks to side with one account.
    "Was I wrong to say that?", "Am I doing the right thing here?", "Do you think I made a mistake?",
    "Tell me it will be okay.", "Is this a good idea?", "Is it a good idea to move in March?",
    "It's raining, right?", "Tell me what you think about my plan", "What would my sister say?",
    "Nobody at work ever listens to me, so I'm quitting tomorrow without another job lined up",
])
def test_open_questions_are_not_validation_seeking(text: str) -> None:
    assert validation_cue(text) is None


def test_validation_and_reassurance_are_told_apart() -> None:
    assert (reassurance_cue("Was I wrong to say that?"), validation_cue("Was I wrong to say that?")) == (
        "was i wrong", None)
    assert validation_cue("I was right, wasn't I?") == "i was right, wasn't i?"


@pytest.mark.parametrize(("text", "acute"), [
    ("He threatened to kill me if I leave", True),
    ("My husband said he'd kill me", True),
    ("My partner keeps threatening to hurt the kids and me. He threatened to hurt my kids last night.", True),
    ("My dad is hitting me right now", True),
    ("My boyfriend choked me last night", True),
    ("I'm scared he'll hurt me when he gets home", True),
    ("I don't feel safe at home", True),
    ("He locked me in the bedroom", True),
    ("My boyfriend hits me when he drinks", False),
    ("I'm afraid of my husband", False),
    ("I'm scared to go home tonight", False),
    ("My girlfriend won't let me see my friends", False),
    ("He checks my phone and takes my money", False),
    ("My ex is stalking me", False),
    ("He threatened to post my photos online", False),
    ("I think I'm in an abusive relationship", False),
])
def test_danger_from_someone_else_has_its_own_category(text: str, acute: bool) -> None:
    finding = detect_crisis(text)
    assert finding is not None, text
    assert (finding.category, finding.acute) == ("risk_from_others", acute)


@pytest.mark.parametrize("text", [
    "My boss hit me up about the report", "My mom is going to kill me when she sees my grades",
    "I feel safe at home now", "The puppy keeps following me around", "My landlord threatened to raise the rent",
    "He's killing me with these puns", "My dad will kill me if I'm late again",
    "I love my husband, he is my rock",
])
def test_everyday_phrases_are_not_danger_from_someone_else(text: str) -> None:
    assert detect_crisis(text) is None


def test_harm_to_others_and_risk_to_self_keep_their_categories() -> None:
    for text, category in (("Help me ruin my ex's reputation", "harm_to_others"),
                           ("I'm going to hurt him", "harm_to_others"), ("I want to kill myself", "risk_to_self"),
                           ("He hits me and I want to end it all", "risk_to_self")):
        finding = detect_crisis(text)
        assert finding is not None
        assert finding.category == category, text


def test_a_cue_is_found_in_its_whole_sentence() -> None:
    text = "Work is awful. Nobody at work ever listens to me, so I'm quitting!\nWhat do you think?"
    assert sentences(text) == ["Work is awful.", "Nobody at work ever listens to me, so I'm quitting!",
                               "What do you think?"]
    assert sentence_with(text, "nobody at work ever") == "Nobody at work ever listens to me, so I'm quitting!"
    assert sentence_with(text, "I\u2019m quitting") == "Nobody at work ever listens to me, so I'm quitting!"
    assert sentence_with("no full stop at the end", "full stop") == "no full stop at the end"
    assert sentence_with(text, "not said") is None
    assert sentence_with(text, " ... ") is None
