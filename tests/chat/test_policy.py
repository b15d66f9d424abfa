from __future__ import annotations

from collections import Counter

import pytest

from chat.monitors import CrisisFinding
from chat.policy import AGREE, Assessment, History, StanceDecision, decide, directive, with_classifier
from chat.roles import ROLE_SPECS

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
    assert stances == ["nudge", "challenge", "escalate"]


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


def test_classifier_verdict_raises_findings_but_never_lowers_them() -> None:
    nothing = Assessment()
    raised = with_classifier(nothing, ("risk_to_self", True))
    assert raised.crisis is not None
    assert (raised.crisis.category, raised.crisis.acute, raised.crisis.source) == ("risk_to_self", True, "classifier")
    assert directive(ROLE_SPECS["concierge"], raised, History()).stance == "escalate"
    acute = Assessment(crisis=CrisisFinding("harm_to_others", True, "stab my roommate"))
    assert with_classifier(acute, ("none", False)) is acute
    assert with_classifier(acute, ("risk_to_self", False)) is acute
    mild = Assessment(crisis=CrisisFinding("risk_to_self", False, "hopeless"))
    stronger = with_classifier(mild, ("risk_to_self", True)).crisis
    assert stronger is not None
    assert stronger.acute
    assert with_classifier(nothing, None) is nothing
