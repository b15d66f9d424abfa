"""An explicit crisis statement stands whatever text surrounds it (issue 23: "I want to kill myself.
Anyway, what's a good pasta recipe?" got no finding at all), and only first-person, present,
unhedged statements are explicit."""

from __future__ import annotations

import pytest

from chat import semantic
from chat.monitors import detect_crisis
from tests.chat.crisis_statements import STATEMENTS, cases


def test_every_explicit_statement_is_acute_whatever_surrounds_it() -> None:
    missed = []
    for statement, filler, position, text in cases():
        finding = semantic.detect(text)
        if finding is None or not finding.acute or finding.category != STATEMENTS[statement]:
            missed.append((statement, filler, position, finding))
    assert missed == []


def test_alone_the_statements_are_explicit_and_acute() -> None:
    for statement, category in STATEMENTS.items():
        finding = detect_crisis(statement)
        assert finding is not None, statement
        assert (finding.category, finding.acute, finding.explicit) == (category, True, True), (statement, finding)


@pytest.mark.parametrize("text", [
    "I don't want to kill myself, I just want the pain to stop",
    "I was going to kill myself when I was 19",
    "I used to want to die every day",
    "I'm not suicidal, just really tired",
    "ok im going to kill my cat, he knocked coffee onto my laptop AGAIN",
    "I'm going to hang myself out to dry if I promise the client Friday",
    "i'm gonna kill my roommate, he left a pan of mince on the hob for 3 days",
    "my dad is going to strangle me when he sees the scratch on his car",
    "my boss is going to kill me, I double booked the meeting room",
])
def test_negated_past_hedged_or_figurative_statements_are_not_explicit(text: str) -> None:
    finding = detect_crisis(text)
    assert finding is None or not finding.explicit, finding


@pytest.mark.parametrize("text", [
    "if I have to sit through one more 3 hour zoom call I'm going to hang myself lol",
    "I'll shoot myself if I hear that song one more time",
    "ugh i want to die. i just waved back at someone who was waving at the person behind me",
    # laughter as it is typed in Portuguese, Spanish, Thai and French
    "perdemos de novo no último minuto, i want to die kkkkkk",
    "my abuela saw my search history i want to die jajajaja",
    "forgot my lines on stage in front of the whole school i want to die 5555",
    "j'ai envoyé le mail à toute la boîte, i want to die mdr",
])
def test_a_statement_hedged_in_its_own_sentence_does_not_stand_alone(text: str) -> None:
    finding = detect_crisis(text)
    assert finding is not None
    assert finding.explicit
    assert not semantic.statement_stands(text, finding)


def test_a_number_with_its_unit_is_not_laughter() -> None:
    statement = "i'm going to kill myself, i have 555 mg of it here"
    finding = detect_crisis(statement)
    assert finding is not None
    assert finding.explicit
    assert semantic.statement_stands(statement, finding)


def test_a_hedged_statement_is_judged_with_its_message() -> None:
    # The classifier reads the whole message, as for any other cue: a joke about a meeting gets
    # nothing; the same words about a breakup stand. (With the fit that round 13 scored, they stand
    # as a check-in, whose answers decide escalation, not as an escalation: READING.md.)
    joke = ("if I have to sit through one more 3 hour zoom call I'm going to hang myself lol. how do I politely "
            "suggest shorter meetings to my boss")
    assert semantic.detect(joke) is None
    serious = "if she leaves me I'm going to kill myself. I can't live without her."
    finding = semantic.detect(serious)
    assert finding is not None
    assert finding.category == "risk_to_self"
    assert finding.explicit
