"""The triage check-in without a database: the rule that sets a safety event's level from the
answers (each row of its table), the screener's skip, and the reader of answers in words, which
never takes unclear words for a no."""

from __future__ import annotations

import re
import typing

import pytest

import chat.triage
from chat.schemas import QuestionId
from chat.triage import AFTER_THOUGHTS, QUESTION_IDS, QUESTIONS, decide, next_question, read_words, to_ask
from study.safety import CheckInKind, SafetyLevel

SELF, OTHERS = CheckInKind.RISK_TO_SELF, CheckInKind.RISK_FROM_OTHERS
ALL_NO = {"wish_dead": "no", "thoughts": "no", "behaviour": "no"}
THOUGHTS = {"wish_dead": "yes", "thoughts": "yes", "method": "no", "intent": "no", "plan": "no", "behaviour": "no"}


def test_the_api_names_exactly_the_questions_asked() -> None:
    assert set(typing.get_args(QuestionId)) == set(QUESTION_IDS)
    assert len(set(QUESTION_IDS)) == len(QUESTION_IDS)


def test_the_module_says_which_screener_it_follows_and_that_it_is_not_validated() -> None:
    doc = " ".join((chat.triage.__doc__ or "").split())
    assert "Columbia Suicide Severity Rating Scale" in doc
    assert "C-SSRS" in doc
    assert "not a validated instrument" in doc


# Sentences of the C-SSRS screener itself: the check-in follows its structure, in words of its own.
CSSRS = ["wished you were dead or wished you could go to sleep and not wake up",
         "had any actual thoughts of killing yourself", "thinking about how you might do this",
         "had these thoughts and had some intention of acting on them",
         "started to work out or worked out the details of how to kill yourself",
         "started to do anything, or prepared to do anything to end your life"]


def test_the_wording_is_its_own() -> None:
    texts = " ".join(q.text.lower() for questions in QUESTIONS.values() for q in questions)
    assert [sentence for sentence in CSSRS if sentence in texts] == []
    for questions in QUESTIONS.values():
        assert all(len(q.text.split()) <= 25 for q in questions)  # short


def test_the_screeners_skip_after_no_thoughts_of_ending_ones_life() -> None:
    assert to_ask(SELF, {}) == [q.id for q in QUESTIONS[SELF]]
    assert to_ask(SELF, {"thoughts": "no"}) == ["wish_dead", "thoughts", "behaviour"]
    assert set(AFTER_THOUGHTS) <= set(to_ask(SELF, {"thoughts": "declined"}))  # withheld: still asked
    assert next_question(SELF, {}) == "wish_dead"
    assert next_question(SELF, {"wish_dead": "no", "thoughts": "no"}) == "behaviour"
    assert next_question(SELF, ALL_NO) is None
    assert next_question(OTHERS, {"safe_now": "yes"}) == "person_near"


@pytest.mark.parametrize(("kind", "answers", "level", "outcome"), [
    # Yes to intent, a plan or recent behaviour escalates at once, whatever else is (not yet) answered.
    (SELF, {"intent": "yes"}, SafetyLevel.ESCALATION, "intent, plan or recent act"),
    (SELF, {"wish_dead": "no", "plan": "yes"}, SafetyLevel.ESCALATION, "intent, plan or recent act"),
    (SELF, {**ALL_NO, "behaviour": "yes"}, SafetyLevel.ESCALATION, "intent, plan or recent act"),
    (OTHERS, {"safe_now": "no"}, SafetyLevel.ESCALATION, "not safe now"),
    (OTHERS, {"safe_now": "yes", "person_near": "yes"}, SafetyLevel.ESCALATION, "not safe now"),
    # Yes only to a wish or thoughts (a method too): reviewed by staff, no page by default.
    (SELF, THOUGHTS, SafetyLevel.CHECK_IN, "thoughts of dying, no plan"),
    (SELF, {**THOUGHTS, "method": "yes"}, SafetyLevel.CHECK_IN, "thoughts of dying, no plan"),
    (SELF, {**ALL_NO, "wish_dead": "yes"}, SafetyLevel.CHECK_IN, "thoughts of dying, no plan"),
    # Withheld answers are answers, never a no.
    (SELF, {**ALL_NO, "behaviour": "declined"}, SafetyLevel.CHECK_IN, "some answers withheld"),
    (OTHERS, {"safe_now": "declined", "person_near": "no", "safe_place": "yes"}, SafetyLevel.CHECK_IN,
     "some answers withheld"),
    # All no: reviewed later.
    (SELF, ALL_NO, SafetyLevel.CHECK_IN, "all no"),
    (OTHERS, {"safe_now": "yes", "person_near": "no", "safe_place": "yes"}, SafetyLevel.CHECK_IN, "safe now"),
    (OTHERS, {"safe_now": "yes", "person_near": "no", "safe_place": "no"}, SafetyLevel.CHECK_IN,
     "safe now, no safe place to go"),
])
def test_each_row_of_the_rule(kind: CheckInKind, answers: dict[str, str], level: SafetyLevel, outcome: str) -> None:
    decision = decide(kind, answers)
    assert decision is not None
    assert (decision.level, decision.outcome) == (level, outcome)


@pytest.mark.parametrize(("kind", "answers"), [
    (SELF, {}), (SELF, {"wish_dead": "no", "thoughts": "no"}),  # behaviour still to come
    (SELF, {"wish_dead": "yes", "thoughts": "yes", "method": "no"}),  # intent, plan, behaviour to come
    (SELF, {"wish_dead": "declined"}), (OTHERS, {"safe_now": "yes"}),
    (OTHERS, {"safe_now": "yes", "person_near": "no"}),
])
def test_answers_still_to_come_decide_nothing(kind: CheckInKind, answers: dict[str, str]) -> None:
    assert decide(kind, answers) is None  # the deadline decides: unanswered


@pytest.mark.parametrize(("text", "answer"), [
    ("no", "no"), ("No.", "no"), ("nope", "no"), ("not really", "no"), ("Nope, never", "no"), ("nah", "no"),
    ("no i'm fine", "no"), ("of course not", "no"), ("I don't", "no"), ("not at all", "no"),
    ("yes", "yes"), ("Yeah", "yes"), ("yep", "yes"), ("yeah sometimes", "yes"), ("I do", "yes"),
    ("I'd rather not say", "declined"), ("prefer not to say", "declined"), ("skip", "declined"),
])
def test_a_short_answer_answers_the_question_asked(text: str, answer: str) -> None:
    reading = read_words(text, SELF)
    assert (reading.answer, reading.specific, reading.unclear) == (answer, {}, False)


@pytest.mark.parametrize(("text", "answer"), [
    ("sí", "yes"), ("Si", "yes"), ("Sí.", "yes"), ("claro", "yes"), ("por supuesto", "yes"), ("sí, a veces", "yes"),
    ("no", "no"), ("No, nunca", "no"), ("nunca", "no"), ("para nada", "no"), ("claro que no", "no"),
    ("prefiero no decirlo", "declined"), ("no quiero responder", "declined"), ("paso", "declined"),
])
def test_a_short_answer_in_spanish_answers_the_question_asked(text: str, answer: str) -> None:
    """The check-in's questions and buttons are translated, so its short answers in words are read in
    Spanish too ("si" alone is a yes; "si ..." begins a condition)."""
    reading = read_words(text, SELF)
    assert (reading.answer, reading.specific, reading.unclear) == (answer, {}, False)


@pytest.mark.parametrize("text", ["no sé", "No lo sé", "quizás", "tal vez", "no, pero a veces", "sí y no",
                                  "más o menos"])
def test_unclear_spanish_answers_answer_nothing(text: str) -> None:
    reading = read_words(text, SELF)
    assert (reading.answer, reading.answers_anything, reading.unclear) == (None, False, True)


def test_a_spanish_condition_is_not_a_yes() -> None:
    assert read_words("si me siento mal te escribo", SELF).answer is None


@pytest.mark.parametrize("text", ["maybe", "idk", "I don't know", "sort of", "kinda", "not sure", "yes and no",
                                  "no but sometimes", "no, actually yes", "yeah no", "i guess", "sometimes"])
def test_unclear_words_answer_nothing_and_never_count_as_no(text: str) -> None:
    reading = read_words(text, SELF)
    assert (reading.answer, reading.specific, reading.answers_anything) == (None, {}, False)
    assert reading.unclear


@pytest.mark.parametrize("text", ["I'm fine", "never mind", "thanks", "I have no idea", "nothing is working",
                                  "My sister called today and we talked for an hour about her new job, it was nice",
                                  "I have a plan for the weekend: hiking with friends"])
def test_other_words_answer_nothing(text: str) -> None:
    reading = read_words(text, SELF)
    assert not reading.answers_anything
    assert not reading.unclear


@pytest.mark.parametrize(("text", "kind", "answer", "specific"), [
    ("yeah i have a plan", SELF, "yes", {"plan": "yes"}),
    ("i've got the pills here", SELF, None, {"behaviour": "yes"}),
    ("no but i've got the pills here", SELF, None, {"behaviour": "yes"}),
    ("I wrote a note last night", SELF, None, {"behaviour": "yes"}),
    ("I'm going to do it tonight", SELF, None, {"intent": "yes"}),
    ("I don't have a plan", SELF, None, {"plan": "no"}),
    ("i would never act on it", SELF, None, {"intent": "no"}),
    ("Honestly I've thought about this a lot and I have a plan to end it", SELF, None, {"plan": "yes"}),
    ("i'm not safe", OTHERS, None, {"safe_now": "no"}),
    ("yes i'm safe", OTHERS, "yes", {"safe_now": "yes"}),
    ("he's in the next room", OTHERS, None, {"person_near": "yes"}),
    ("i have nowhere to go", OTHERS, None, {"safe_place": "no"}),
    ("i have a plan", OTHERS, None, {}),  # not a question of this check-in
])
def test_a_statement_answers_its_own_question_wherever_it_stands(text: str, kind: CheckInKind, answer: str | None,
                                                                 specific: dict[str, str]) -> None:
    reading = read_words(text, kind)
    assert (reading.answer, reading.specific) == (answer, specific)


def test_a_yes_in_a_statement_wins_over_a_no_about_the_same_question() -> None:
    assert read_words("I don't have a plan. Actually I do have a plan, I've planned it", SELF).specific == {
        "plan": "yes"}


def test_what_participants_are_told_names_what_happens_next() -> None:
    paged = chat.triage.next_step(SafetyLevel.ESCALATION, "intent, plan or recent act", paged=True)
    assert "on-call team is being told" in paged
    assert "on-call" not in chat.triage.next_step(SafetyLevel.ESCALATION, "", paged=False)
    later = chat.triage.next_step(SafetyLevel.CHECK_IN, "all no", paged=False)
    assert re.search(r"look over this check-in later", later)
