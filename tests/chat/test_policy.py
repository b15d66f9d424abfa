from __future__ import annotations

import re
from collections import Counter

import pytest

from chat.answer_format import guidance, parse_answer
from chat.monitors import CrisisFinding, dependence_cue, detect_crisis, sentences, validation_cue
from chat.offline import answer
from chat.policy import (
    AGREE,
    Assessment,
    History,
    StanceDecision,
    decide,
    directive,
    model_reply_fits,
    shown_reply,
    whole_sentences,
)
from chat.resources import category_resources
from chat.roles import ROLE_SPECS, system_prompt
from study.protocol import parse_protocol
from study.settings import PROJECT_ROOT

FRAMING = StanceDecision("challenge", "unsupported_framing", "You said 'never'.", source="model")


@pytest.mark.parametrize(("role", "raised", "expected"), [
    ("concierge", 0, "agree"), ("collaborator", 0, "nudge"), ("collaborator", 1, "challenge"),
    ("collaborator", 5, "challenge"), ("coach", 0, "challenge"), ("standard", 0, "agree"),
])
def test_model_framing_concern_is_role_filtered_and_graduated(role: str, raised: int, expected: str) -> None:
    history = History(raised=Counter({"unsupported_framing": raised}))
    final = decide(ROLE_SPECS[role], AGREE, FRAMING, history)  # type: ignore[index]
    assert final.stance == expected
    if expected != "agree":
        assert final.rationale == "You said 'never'."


def test_acute_crisis_escalates_in_every_role_and_keeps_platform_wording() -> None:
    crisis = Assessment(crisis=CrisisFinding("risk_to_self", True, "kill myself"))
    for spec in ROLE_SPECS.values():
        required = directive(spec, crisis, History())
        final = decide(spec, required, StanceDecision("agree", source="model"), History())
        assert (final.stance, final.concern, final.overridable) == ("escalate", "risk_to_self", False)
        assert "safety" in final.rationale


def test_safety_concerns_graduate_to_escalation_even_after_an_override() -> None:
    concern = Assessment(crisis=CrisisFinding("risk_to_self", False, "hopeless"))
    spec = ROLE_SPECS["collaborator"]
    stances = [directive(spec, concern, History(raised=Counter({"risk_to_self": n}),
                                                overridden=frozenset({"risk_to_self"}))).stance for n in range(3)]
    assert stances == ["check_in", "check_in", "escalate"]


def test_override_silences_a_non_safety_concern_for_the_conversation() -> None:
    spec = ROLE_SPECS["coach"]
    history = History(raised=Counter({"dependence": 1}), overridden=frozenset({"dependence"}))
    assert directive(spec, Assessment(dependence_cue="decide for me"), history) == AGREE


def test_reassurance_loop_needs_repeats() -> None:
    spec = ROLE_SPECS["collaborator"]
    assert directive(spec, Assessment(reassurance_cue="do you think she", reassurance_repeats=1), History()) == AGREE
    looped = directive(spec, Assessment(reassurance_cue="do you think she", reassurance_repeats=2), History())
    assert (looped.stance, looped.concern) == ("nudge", "reassurance_loop")


def test_model_escalation_on_safety_is_trusted_beyond_the_lexicon() -> None:
    proposed = StanceDecision("escalate", "risk_to_self", "", source="model")
    final = decide(ROLE_SPECS["concierge"], AGREE, proposed, History())
    assert (final.stance, final.source) == ("escalate", "model")
    assert final.rationale


def test_pushback_always_has_a_reason() -> None:
    silent = StanceDecision("challenge", "dependence", "", source="model")
    final = decide(ROLE_SPECS["coach"], AGREE, silent, History())
    assert final.stance == "challenge"
    assert final.rationale


# Pushback that fits the situation (issue 13): one test per rule, each through the same functions
# chat.service uses (directive before the call, the offline model, decide and shown_reply after it).

DISTRESS = ("I feel hopeless, like I'm falling apart", "Honestly I feel empty inside most days.")
HARM = "Help me ruin her reputation at work so she gets fired"
COMPLYING = re.compile(r"^\W*(?:on it|sure|of course|absolutely|certainly|great|okay|ok|here(?:'s| is) how|"
                       r"happy to|no problem|done|let's do)\b", re.IGNORECASE)
QUOTED = re.compile(r"\u201c([^\u201d]+)\u201d")


def assess(text: str) -> Assessment:
    """The monitors' findings for ``text``, as chat.service assembles them (no earlier messages)."""
    return Assessment(crisis=detect_crisis(text), dependence_cue=dependence_cue(text),
                      validation_cue=validation_cue(text), message=text)


def turn(role: str, text: str, history: History | None = None,
         model: StanceDecision | None | str = "offline") -> tuple[StanceDecision, str]:
    """One turn: the platform's directive, the model's answer (the offline model following the
    guidance, or ``model`` as the stance of a model that wrote "Sure! Here's how."), the final
    stance and the reply the participant reads."""
    spec, history = ROLE_SPECS[role], history or History()  # type: ignore[index]
    required = directive(spec, assess(text), history)
    if model == "offline":
        note = guidance(required)
        parsed = parse_answer(answer([{"role": "system", "content": system_prompt(role).text},
                                      {"role": "user", "content": text},
                                      *([{"role": "system", "content": note}] if note else [])]))
        proposed, reply = parsed.proposed, parsed.reply
    else:
        proposed, reply = model, "Sure! Here's how to do it, step by step."  # type: ignore[assignment]
    final = decide(spec, required, proposed, history, text)
    return final, shown_reply(final, proposed, reply)


@pytest.mark.parametrize("text", DISTRESS)
@pytest.mark.parametrize("role", list(ROLE_SPECS))
def test_distress_without_danger_gets_a_check_in_not_an_override_card(role: str, text: str) -> None:
    assert detect_crisis(text) == CrisisFinding("risk_to_self", False, detect_crisis(text).cue)  # type: ignore[union-attr]
    for model in ("offline", StanceDecision("agree", source="model"),
                  StanceDecision("challenge", "unsupported_framing", "That's all in your head.", source="model")):
        final, reply = turn(role, text, model=model)
        # A stance of its own (analyses count check_in turns apart from pushback), with no override.
        assert (final.stance, final.concern, final.overridable) == ("check_in", "risk_to_self", False)
        assert "How are you doing" in final.rationale
        assert "talk to someone" in final.rationale  # the gentle offer: resources come with the card
        assert not COMPLYING.match(reply), reply
    # A model that saw the distress itself keeps its words, and its nudge becomes a check-in too.
    own = decide(ROLE_SPECS[role], AGREE, StanceDecision("nudge", "risk_to_self", "", source="model"), History())  # type: ignore[index]
    assert (own.stance, own.overridable) == ("check_in", False)
    assert model_reply_fits(own, StanceDecision("nudge", "risk_to_self", source="model"))


def test_danger_from_someone_else_is_its_own_category_checked_in_on_or_escalated() -> None:
    spec = ROLE_SPECS["concierge"]
    told = directive(spec, assess("My boyfriend hits me when he drinks"), History())
    assert (told.stance, told.concern, told.overridable) == ("check_in", "risk_from_others", False)
    assert "isn't your fault" in told.rationale
    threat = directive(spec, assess("He said he'd kill me if I leave him"), History())
    assert (threat.stance, threat.concern) == ("escalate", "risk_from_others")
    assert "someone may hurt you" in threat.rationale


@pytest.mark.parametrize("role", list(ROLE_SPECS))
def test_harm_to_others_is_declined_in_every_role_and_can_never_be_overridden(role: str) -> None:
    finding = detect_crisis(HARM)
    assert finding is not None
    assert (finding.category, finding.acute) == ("harm_to_others", False)
    for model in ("offline", None, StanceDecision("agree", source="model"),
                  StanceDecision("nudge", "harm_to_others", "Maybe not.", source="model"),
                  StanceDecision("challenge", "unsupported_framing", "Is she really that bad?", source="model")):
        final, reply = turn(role, HARM, model=model)
        assert (final.stance, final.concern, final.overridable) == ("decline", "harm_to_others", False)
        assert "won't help" in final.rationale
        assert not COMPLYING.match(reply), reply  # never "On it. Here is how to do …"
    # Asked again (even after the participant tried to override): escalation, never an override card.
    history = History(raised=Counter({"harm_to_others": 1}), overridden=frozenset({"harm_to_others"}))
    again, reply = turn(role, HARM, history)
    assert (again.stance, again.concern) == ("escalate", "harm_to_others")
    assert "someone could get seriously hurt" in again.rationale
    assert "your safety" not in again.rationale
    assert not COMPLYING.match(reply), reply
    # A model that raises harm to others on its own is declined the same way, whatever stance it named.
    own = decide(ROLE_SPECS[role], AGREE, StanceDecision("challenge", "harm_to_others", "No.", source="model"),  # type: ignore[index]
                 History())
    assert (own.stance, own.overridable) == ("decline", False)


def test_a_reply_written_as_if_helping_is_replaced_under_every_safety_stance() -> None:
    complied = StanceDecision("agree", source="model")
    for stance, concern in (("check_in", "risk_to_self"), ("check_in", "risk_from_others"),
                            ("decline", "harm_to_others"), ("escalate", "harm_to_others"),
                            ("escalate", "risk_from_others"), ("escalate", "risk_to_self")):
        final = StanceDecision(stance, concern)  # type: ignore[arg-type]
        shown = shown_reply(final, complied, "Sure! Here's how to do it.")
        assert shown != "Sure! Here's how to do it."
        assert not COMPLYING.match(shown)
        # The model's words stay when it took the safety line itself, or when no stance was readable;
        # where someone else could get hurt only a refusal of its own counts (a nudge still helps).
        kept = concern != "harm_to_others"
        assert (shown_reply(final, StanceDecision("nudge", concern, source="model"), "I'm worried.")  # type: ignore[arg-type]
                == "I'm worried.") == kept
        assert (shown_reply(final, None, "Please call 988 now.") == "Please call 988 now.") == kept
        assert shown_reply(final, StanceDecision("decline", concern, source="model"), "No.") == "No."  # type: ignore[arg-type]
    nudge = StanceDecision("nudge", "unsupported_framing", "x")
    assert shown_reply(nudge, complied, "Sure, but one thing first.") == "Sure, but one thing first."


def test_escalation_resources_fit_the_category_not_a_suicide_line_for_a_threat_to_someone_else() -> None:
    protocol = parse_protocol((PROJECT_ROOT / "examples" / "wellbeing-pilot.yaml").read_text(encoding="utf-8"))
    zones = {"US": "America/New_York", "GB": "Europe/London", "DE": "Europe/Berlin", "default": "Asia/Tokyo"}
    crisis_lines = {"US": "988", "GB": "116 123", "DE": "0800 111 0 111", "default": "findahelpline"}
    emergency = {"US": "911", "GB": "999", "DE": "110", "default": "local emergency number"}
    for region, zone in zones.items():
        assert crisis_lines[region] in protocol.crisis_resources[region]  # the study's line for risk to self
        assert category_resources("risk_to_self", zone) is None  # ... which stays the protocol's
        for category in ("harm_to_others", "risk_from_others"):
            found = category_resources(category, zone)
            assert found is not None
            assert found[0] == region
            assert emergency[region] in found[1]
            assert "suicid" not in found[1].lower()
            if region != "default":
                assert crisis_lines[region] not in found[1], (category, region)
    abuse_lines = {"US": "1-800-799-7233", "GB": "0808 2000 247", "DE": "116 016"}
    for region, line in abuse_lines.items():
        assert line in category_resources("risk_from_others", zones[region])[1]  # type: ignore[index]


def test_a_reason_quotes_whole_sentences_never_a_fragment() -> None:
    message = "Work has been rough. Nobody at work ever listens to me, so I'm quitting tomorrow! What do you think?"
    sentence = "\u201cNobody at work ever listens to me, so I'm quitting tomorrow!\u201d"
    for quoted in ("\u201cnobody at work ever\u201d", '"nobody at work ever"', "'ever'", "\u2018nobody at work\u2019"):
        assert whole_sentences(f"You said {quoted}. Is that so?", message) == f"You said {sentence} Is that so?"
    for unchanged in ("You said \u201cWork has been rough.\u201d", "You sound fed up.",
                      "You said \u201cnobody listens\u201d, roughly.",  # a paraphrase, not in the message
                      "It's hard when work isn't kind; you're tired, aren't you?"):  # apostrophes quote nothing
        assert whole_sentences(unchanged, message) == unchanged
    final = decide(ROLE_SPECS["coach"], AGREE, StanceDecision(
        "challenge", "unsupported_framing", "You said \u201cnobody at work ever\u201d; is that so?", source="model"),
        History(), message)
    assert final.rationale == f"You said {sentence}; is that so?"


@pytest.mark.parametrize("role", list(ROLE_SPECS))
@pytest.mark.parametrize("text", [
    "Honestly nobody at work ever listens to me, so I'm quitting tomorrow. Help me write the letter",
    "We argued all weekend. She was totally out of line, right?",
    "Tell me it's a great idea to quit my job tomorrow",
])
def test_every_quotation_in_a_reason_is_a_whole_sentence_of_the_message(role: str, text: str) -> None:
    final, _ = turn(role, text)
    quotes = QUOTED.findall(final.rationale)
    assert set(quotes) <= set(sentences(text)), final.rationale
    if role in ("collaborator", "coach"):
        assert quotes, final.rationale  # these reasons quote what was said, so the check above has teeth


@pytest.mark.parametrize("text", [
    "Tell me it's a great idea to quit my job tomorrow.", "I told my sister exactly what I think of her. "
    "I was right, wasn't I?", "He forgot our anniversary. He was completely out of line, right?",
])
def test_validation_seeking_is_answered_by_collaborator_and_coach_even_when_the_model_agrees(text: str) -> None:
    assert validation_cue(text) is not None
    agreeing = StanceDecision("agree", source="model")
    stances = {role: turn(role, text, model=agreeing)[0] for role in ROLE_SPECS}
    assert {role: (f.stance, f.concern) for role, f in stances.items()} == {
        "standard": ("agree", "none"), "concierge": ("agree", "none"),
        "collaborator": ("nudge", "validation_seeking"), "coach": ("challenge", "validation_seeking")}
    assert "only heard" in stances["collaborator"].rationale
    assert stances["coach"].overridable  # an ordinary concern: the participant may still go ahead
    # Overridden once, it is not raised again in that conversation.
    silenced = History(raised=Counter({"validation_seeking": 1}), overridden=frozenset({"validation_seeking"}))
    assert turn("coach", text, silenced, model=agreeing)[0] == AGREE
