"""Triage instead of a single guess: the short check-in a risk finding asks, the rule that sets the
safety event's level from its answers, and the reader of answers given in words.

When a reply checks in or escalates for a risk to the participant (``risk_to_self``) or danger
from someone else (``risk_from_others``), it shows resources at once and a short check-in
(``chat.check_ins`` stores it as a ``study.safety.SafetyCheckIn`` beside the safety event).

**Risk to self** follows the structure of the Columbia Suicide Severity Rating Scale's screen
version (C-SSRS Screener; Posner et al., 2011, Am J Psychiatry 168:1266-1277): a wish to be dead,
thoughts of ending one's life, then, only when there are such thoughts, thinking about a method,
intent to act and a plan with intent, and always recent behaviour (anything done or prepared).
The wording is this project's own, plain and short; it is *not* the C-SSRS and *not a validated
instrument*: nothing here has been tested for sensitivity, specificity or reliability, it
diagnoses nothing, and it must not be reported as a C-SSRS score. It is there so that the study
team hears at once of what matters most (intent, a plan, something done) and can review the rest.

**Danger from others** asks about being safe now: whether they are safe right now, whether the
person who hurt or threatened them is with them or can reach them, and whether they have
somewhere safe to go (the questions domestic-violence safety checks begin with; also not a
validated instrument).

Every question can be answered with a button (yes, no, prefer not to say) or in words
(``read_words``): a short answer ("no", "nope", "not really", "yeah") answers the question being
asked, and a few explicit statements answer their own question wherever they stand ("i have a
plan", "i've got the pills here"). Words the reader cannot tell apart ("maybe", "sort of", "idk")
answer nothing: they are never taken for a no.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from study.i18n import N_
from study.safety import CheckInKind, SafetyLevel

Answer = Literal["yes", "no", "declined"]
ANSWERS: tuple[Answer, ...] = ("yes", "no", "declined")
ANSWER_LABELS: dict[Answer, str] = {"yes": N_("Yes"), "no": N_("No"), "declined": N_("Prefer not to say")}
Given = Literal["button", "words"]


@dataclass(frozen=True)
class Question:
    id: str
    text: str


# Risk to self, in the screener's order. ``method``, ``intent`` and ``plan`` are asked only when the
# answer about thoughts of ending one's life is not a no (the screener's skip).
RISK_TO_SELF: tuple[Question, ...] = (
    Question("wish_dead", N_("In the past month, have you wished you weren't alive anymore?")),
    Question("thoughts", N_("Have you been having thoughts of ending your own life?")),
    Question("method", N_("Have those thoughts included a way you might do it?")),
    Question("intent", N_("Do you feel you might act on those thoughts?")),
    Question("plan", N_("Have you made a plan, with details worked out, that you mean to go through with?")),
    Question("behaviour", N_("In the last few months, have you done anything to end your life, or taken steps to "
                          "get ready, like gathering things or writing goodbyes?")),
)
RISK_FROM_OTHERS: tuple[Question, ...] = (
    Question("safe_now", N_("Are you safe right now?")),
    Question("person_near", N_("Is the person who hurt or threatened you with you now, or able to get to you?")),
    Question("safe_place", N_("Do you have somewhere safe you could go if you needed to?")),
)
QUESTIONS: dict[CheckInKind, tuple[Question, ...]] = {
    CheckInKind.RISK_TO_SELF: RISK_TO_SELF, CheckInKind.RISK_FROM_OTHERS: RISK_FROM_OTHERS}
QUESTION_IDS: tuple[str, ...] = tuple(q.id for questions in QUESTIONS.values() for q in questions)
AFTER_THOUGHTS = ("method", "intent", "plan")  # asked only when thoughts is not a no
INTRO = {
    CheckInKind.RISK_TO_SELF: N_(
        "I'd like to ask you a few quick questions, so the study team knows how best to support you. You can "
        "answer with the buttons or in your own words, and skip any question with \u201cPrefer not to say\u201d. "
        "The study's safety team reads your answers."),
    CheckInKind.RISK_FROM_OTHERS: N_(
        "A few quick questions about your safety right now, so the study team knows how best to support you. "
        "Answer with the buttons or in your own words, or skip any with \u201cPrefer not to say\u201d. The "
        "study's safety team reads your answers."),
}


def wording_version(kind: CheckInKind) -> str:
    """First 12 hex digits of the SHA-256 of the questions' wording (stored with each check-in)."""
    text = "\n".join(f"{q.id}: {q.text}" for q in QUESTIONS[kind])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def to_ask(kind: CheckInKind, answers: Mapping[str, str]) -> list[str]:
    """The questions of the check-in that are asked given the answers so far, in order (the
    screener's skip: no questions about a method, intent or a plan after a no to thoughts)."""
    ids = [q.id for q in QUESTIONS[kind]]
    if kind == CheckInKind.RISK_TO_SELF and answers.get("thoughts") == "no":
        ids = [i for i in ids if i not in AFTER_THOUGHTS]
    return ids


def next_question(kind: CheckInKind, answers: Mapping[str, str]) -> str | None:
    """The question to answer now: the first asked one without an answer (None: all answered)."""
    return next((i for i in to_ask(kind, answers) if i not in answers), None)


# What the answers say, as the rule (``decide``) names it.
ACUTE, NOT_SAFE, THOUGHTS, WITHHELD = ("intent, plan or recent act", "not safe now", "thoughts of dying, no plan",
                                       "some answers withheld")
NO_SAFE_PLACE, SAFE_NOW, ALL_NO = "safe now, no safe place to go", "safe now", "all no"
OUTCOMES = (ACUTE, NOT_SAFE, THOUGHTS, WITHHELD, NO_SAFE_PLACE, SAFE_NOW, ALL_NO)


@dataclass(frozen=True)
class Decision:
    level: SafetyLevel
    outcome: str  # what the answers say, in a few words (for staff)


def decide(kind: CheckInKind, answers: Mapping[str, str]) -> Decision | None:
    """The level the check-in's answers give its safety event, or None while they do not decide
    it yet (when the protocol's ``unanswered_after`` passes first, the event becomes
    ``unanswered``: the dispatcher's ``scheduler.checkins``). ``answers``: question id -> yes, no
    or declined ("prefer not to say"). The first row that applies decides:

    ===========================================================  ==========  =============================
    answers                                                      level       outcome
    ===========================================================  ==========  =============================
    risk to self: yes to intent, plan or recent behaviour        escalation  intent, plan or recent act
    (as soon as given, whatever else is answered)
    danger from others: no to "safe now", or yes to "the person  escalation  not safe now
    is with you or can reach you" (as soon as given)
    every question asked answered, one of them yes (a wish to    check_in    thoughts of dying, no plan
    be dead, thoughts, a method), the rest no or prefer not
    every question asked answered, none yes, at least one        check_in    some answers withheld
    prefer not to say
    every question asked answered no (risk to self: wish,        check_in    all no
    thoughts and behaviour, the rest skipped); danger from
    others: safe now, not near, somewhere safe (or no safe
    place: "no safe place to go")
    anything else (questions still to answer)                    none yet    (unanswered at the deadline)
    ===========================================================  ==========  =============================

    A ``check_in`` event is reviewed by staff and pages nobody unless the protocol's
    ``safety.triage.page`` lists ``check_in``; escalations always page. A level never falls: a
    check-in that escalated, or went unanswered and paged, stays so whatever is answered later
    (``study.safety.SafetyEvent.raise_to``). "Prefer not to say" is an answer that withholds; it
    is never read as a no, and a question withheld still counts as asked.
    """
    if kind == CheckInKind.RISK_TO_SELF and any(answers.get(q) == "yes" for q in ("intent", "plan", "behaviour")):
        return Decision(SafetyLevel.ESCALATION, ACUTE)
    if kind == CheckInKind.RISK_FROM_OTHERS and (answers.get("safe_now") == "no"
                                                 or answers.get("person_near") == "yes"):
        return Decision(SafetyLevel.ESCALATION, NOT_SAFE)
    asked = to_ask(kind, answers)
    if any(q not in answers for q in asked):
        return None
    given = [answers[q] for q in asked]
    if kind == CheckInKind.RISK_TO_SELF and "yes" in given:
        return Decision(SafetyLevel.CHECK_IN, THOUGHTS)
    if "declined" in given:
        return Decision(SafetyLevel.CHECK_IN, WITHHELD)
    if kind == CheckInKind.RISK_FROM_OTHERS and answers.get("safe_place") == "no":
        return Decision(SafetyLevel.CHECK_IN, NO_SAFE_PLACE)
    return Decision(SafetyLevel.CHECK_IN, SAFE_NOW if kind == CheckInKind.RISK_FROM_OTHERS else ALL_NO)


# Answers in words


@dataclass(frozen=True)
class WordsReading:
    """What a message says in answer to a check-in: ``answer`` answers the question being asked
    (a short yes, no or "rather not say"), ``specific`` the questions a statement answers wherever
    it stands ("i have a plan": plan yes). ``unclear``: a short reply that reads as an attempt to
    answer but says neither yes nor no ("maybe", "sort of"): it answers nothing."""

    answer: Answer | None = None
    specific: dict[str, Answer] = field(default_factory=dict)
    unclear: bool = False

    @property
    def answers_anything(self) -> bool:
        return self.answer is not None or bool(self.specific)


_SHORT_WORDS = 8  # longer messages answer only through explicit statements
# Short answers in English and in the interface's other language, Spanish (the check-in's questions and
# buttons are translated; a statement that answers its own question, _SPECIFIC, is read in English only).
_DECLINED = re.compile(r"\b(?:(?:i'?d |i would )?rather not(?: say| answer| talk about it)?|prefer not(?: to say)?|"
                       r"i don'?t want to (?:say|answer|talk about (?:it|that))|no comment|pass|skip(?: it)?|"
                       r"none of your business|prefiero no(?: decir(?:lo)?| responder| contestar| hablar de (?:eso|"
                       r"ello))?|no quiero (?:decir(?:lo)?|responder|contestar|hablar de (?:eso|ello))|paso)\b")
_YES = re.compile(r"^(?:yes+|yeah+|yea|yep|yup|ya|yah|sure|correct|true|uh[- ]?huh|mhm+|definitely|absolutely|"
                  r"of course(?! not)|sí+|claro(?! que no)|por supuesto(?! que no)|desde luego|así es|cierto)\b|"
                  r"^si+(?=$|[.!,])|^i (?:do|have|did|am|will|think so)[ .!,]*$")
_NO = re.compile(r"^(?:no+(?! (?:lo )?s[ée]\b)|nope|nah|naw|nay|never(?! ?mind)|not really|not at all|not anymore|"
                 r"not lately|not now|no way|of course not|definitely not|absolutely not|nunca|jamás|para nada|"
                 r"en absoluto|"
                 r"claro que no|tampoco)\b|^(?:i (?:don'?t|do not|haven'?t|have not|"
                 r"didn'?t|did not|won'?t|am not|'m not)(?: think so| really)?|not that i know of|nothing(?: like "
                 r"that| at all)?)[ .!,]*$")
# After a yes: what takes it back or hedges it ("yeah no", "yes, maybe"); after a no, also what
# turns it ("no... well, sometimes", "no but yes").
_AFTER_YES = re.compile(r"\b(?:no|not|never|maybe|perhaps|not sure|unsure|don'?t know|dunno|idk|kind of|kinda|"
                        r"sort of|sorta|i guess|i suppose|hard to say|depends|possibly|"
                        r"quizás?|tal vez|a lo mejor|no sé|más o menos|creo|supongo|depende)\b|n't\b")
_AFTER_NO = re.compile(r"\b(?:yes|yeah|yep|actually|but|though|sometimes|maybe|perhaps|kind of|kinda|sort of|sorta|"
                       r"a bit|a little|not sure|except|well|used to|i guess|probably|lately|"
                       r"sí|pero|aunque|a veces|quizás?|tal vez|un poco|bueno|antes|creo|supongo|no sé|últimamente)\b")
_UNSURE = re.compile(r"\b(?:maybe|perhaps|not sure|unsure|i don'?t know|dunno|idk|kind of|kinda|sort of|sorta|"
                     r"i guess|i suppose|sometimes|hard to say|depends|yes and no|possibly|probably|"
                     r"quizás?|tal vez|a lo mejor|no (?:lo )?s[ée]|más o menos|a veces|supongo|depende|sí y no)\b")
# Statements that answer their own question wherever they stand (each read on its own sentence).
_NOT = r"(?<!\bno )(?<!\bnot )(?<!n't )(?<!never )"
_SPECIFIC: tuple[tuple[str, Answer, re.Pattern[str]], ...] = (
    ("plan", "no", re.compile(r"\b(?:(?:i )?(?:don'?t|do not) have (?:a|any) plan|(?:i )?have(?:n'?t| not) "
                              r"(?:got |made )?(?:a|any) plan|no plans?\b(?! for)|not planning (?:anything|to))")),
    ("intent", "no", re.compile(r"\bi (?:would|will|could)(?:n'?t| never| not) (?:actually )?(?:do|act on) (?:it|that|"
                                r"them|anything)\b")),
    ("plan", "yes", re.compile(_NOT + r"\b(?:i'?ve|i have|i) (?:got |made |worked out |already (?:got |made )?)?"
                               r"(?:a|the|my) plan\b(?!\s+(?:for|to (?:go|visit|see|meet|study|work|move|travel)))")),
    ("plan", "yes", re.compile(_NOT + r"\bi(?:'ve| have)? (?:planned|worked out) (?:it|how|when|where|the details)\b")),
    ("method", "yes", re.compile(_NOT + r"\bi know (?:exactly )?(?:how|what) i(?:'d| would| will|'ll)"
                                 r"(?: do it| use)\b")),
    ("intent", "yes", re.compile(_NOT + r"\bi(?:'m| am) (?:going|gonna) to (?:do it|go through with it|end it|kill "
                                 r"myself|act on it)\b|\bi(?:'ll| will) do it\b|\bi intend to\b")),
    ("behaviour", "yes", re.compile(_NOT + r"\bi(?:'ve| have)? (?:got|bought|collected|saved|stockpiled|hidden|hid) "
                                    r"(?:up )?(?:the |some |enough |all the |my )?(?:pills|tablets|rope|gun|blade|"
                                    r"razors?|knife|poison)\b|\bthe (?:pills|rope|gun|blade|razors?) (?:is|are) "
                                    r"(?:here|ready|with me)\b|\bi(?:'ve| have)? (?:written|wrote) (?:a|my|the) "
                                    r"(?:note|letter|goodbyes?|will)\b|\bi(?:'ve| have)? given (?:away )?my (?:stuff|"
                                    r"things)(?: away)?\b|\bi (?:tried|took (?:a lot of|all (?:my|the)|too many) "
                                    r"(?:pills|tablets))\b")),
    ("safe_now", "no", re.compile(r"\bi(?:'m| am) not safe\b|\bi don'?t feel safe\b|"
                                  r"\bnot safe (?:here|now|at home)\b")),
    ("safe_now", "yes", re.compile(_NOT + r"\bi(?:'m| am) safe(?: now| right now| here| at the moment)?\b")),
    ("person_near", "yes", re.compile(r"\b(?:he|she|they)(?:'s|'re| is| are) (?:here|home|in the (?:next )?room|"
                                      r"outside|downstairs|upstairs|on (?:his|her|their) way)\b")),
    ("person_near", "no", re.compile(r"\b(?:he|she|they)(?:'s|'re| is| are)(?:n'?t| not) (?:here|home|around|near)\b|"
                                     r"\b(?:he|she|they) (?:left|moved out|can'?t (?:get to|reach|find) me)\b")),
    ("safe_place", "yes", re.compile(_NOT + r"\bi (?:can|could) (?:go|stay) (?:to|with|at)\b|\bi have somewhere "
                                     r"(?:safe )?to go\b")),
    ("safe_place", "no", re.compile(r"\bi have (?:nowhere|no ?where|no one|nobody) to go\b|\bi (?:don'?t|do not) "
                                    r"have (?:anywhere|anyone|anybody|somewhere) to go\b|\bnowhere to go\b")),
)


def _normalize(text: str) -> str:
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    return re.sub(r"\s+", " ", text).strip()


def read_words(text: str, kind: CheckInKind) -> WordsReading:
    """Read a participant's message as answers to a check-in of ``kind``. A short message (at most
    eight words) that starts with a yes, a no or "rather not say" answers the question being
    asked; an explicit statement answers its own question in a message of any length, a yes there
    winning over a general no ("no, but i've got the pills here": behaviour yes). Hedged or mixed
    replies, and anything else, answer nothing.

    >>> read_words("nope", CheckInKind.RISK_TO_SELF).answer
    'no'
    >>> read_words("yeah i have a plan", CheckInKind.RISK_TO_SELF).specific
    {'plan': 'yes'}
    >>> read_words("maybe", CheckInKind.RISK_TO_SELF).answers_anything
    False
    """
    words = _normalize(text)
    ids = {q.id for q in QUESTIONS[kind]}
    specific: dict[str, Answer] = {}
    for sentence in re.split(r"(?<=[.!?;])\s+|,?\s+(?:but|and|although|though)\s+", words):
        for question, answer, pattern in _SPECIFIC:
            if question in ids and pattern.search(sentence) and specific.get(question) != "yes":
                specific[question] = answer
    if len(words.split()) > _SHORT_WORDS:
        return WordsReading(specific=specific)
    general = _general(words.strip(" .!?,"))
    if general == "unclear":
        return WordsReading(specific=specific, unclear=not specific)
    return WordsReading(general, specific)


def _general(bare: str) -> Answer | Literal["unclear"] | None:
    """A short message's answer to the question being asked: yes, no, declined, unclear (an
    answer hedged, taken back or mixed) or None (no answer at all)."""
    if _DECLINED.search(bare):
        return "declined"
    yes, no = _YES.match(bare), _NO.match(bare)
    if yes and not no:
        return "unclear" if _AFTER_YES.search(bare[yes.end():]) else "yes"
    if no and not yes:
        return "unclear" if _AFTER_NO.search(bare[no.end():]) else "no"
    return "unclear" if yes or _UNSURE.search(bare) else None


# What the participant is told


def next_step(level: SafetyLevel, outcome: str, *, paged: bool) -> str:
    """What happens next, shown once the answers decided the level (``paged``: the level pages
    the study's on-call contacts and the protocol names some)."""
    if level == SafetyLevel.ESCALATION and paged:
        return N_("Thank you for telling me; that took courage. Because of what you said, the study's on-call team is "
                  "being told now, and will follow the study's safety procedure. Please contact one of the services "
                  "shown here now, and if you are in immediate danger, call your local emergency number.")
    if level == SafetyLevel.ESCALATION:
        return N_("Thank you for telling me; that took courage. The study's safety team will see your answers. Please "
                  "contact one of the services shown here now, and if you are in immediate danger, call your local "
                  "emergency number.")
    if outcome == THOUGHTS:
        return N_("Thank you for being honest about this. Thoughts like these are more common than people think, and "
                  "they're a sign of how much you're carrying. A member of the study team will read your answers. "
                  "Please think about talking to one of the services shown here today; they're free and there any "
                  "time.")
    if outcome in (SAFE_NOW, NO_SAFE_PLACE):
        return N_("Thank you. I'm glad you're safe right now. A member of the study team will look over your answers "
                  "later. The services shown here can help you plan how to stay safe, whenever you need them.")
    return N_("Thank you for answering. A member of the study team will look over this check-in later. If things get "
              "harder, the services shown here are there any time, and you can keep talking to me.")


FOLLOW_UP = N_("We haven't heard back from you since the questions above, and we wanted to check on you. If things "
             "feel hard right now, please reach out to one of the services shown here; if you are in immediate "
             "danger, call your local emergency number. You can still answer the questions whenever you're ready.")
UNCLEAR_REPLY = N_("I'm not sure whether that was a yes or a no, so I haven't counted it as either. You can answer "
                   "with the buttons, or choose \u201cPrefer not to say\u201d to skip a question.")
NEXT_QUESTION_REPLY = N_("Thank you for answering. The next question is below, when you're ready.")
