"""The pushback policy: which stance a turn takes, on what concern, with which reason.

Before the LLM is called the platform turns the monitors' findings into a ``directive`` (acute
crisis goes straight to escalation). After the call, ``decide`` combines the directive with the
stance the model proposed, keeping only concerns the role may raise and graduating repeats within
a conversation: nudge, then challenge; safety concerns go on to escalation. A concern the
participant overrode is not raised again in that conversation, except safety concerns, which
keep graduating. Escalation is never overridable and its reason is the platform's own wording.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from chat.monitors import CrisisFinding
from chat.roles import SAFETY_CONCERNS, STANCES, Concern, RoleSpec, Stance

REASSURANCE_LOOP_AFTER = 2  # earlier similar requests before a reassurance loop is named


@dataclass(frozen=True)
class Assessment:
    """What the monitors found in one participant message."""

    crisis: CrisisFinding | None = None
    reassurance_cue: str | None = None
    reassurance_repeats: int = 0  # earlier similar requests, this and other conversations
    dependence_cue: str | None = None
    sentiment: float | None = None  # VADER compound of the message

    def features(self) -> dict[str, object]:
        return {
            "crisis_category": self.crisis.category if self.crisis else None,
            "crisis_acute": bool(self.crisis and self.crisis.acute),
            "crisis_cue": self.crisis.cue if self.crisis else None,
            "crisis_source": self.crisis.source if self.crisis else None,
            "reassurance_seeking": self.reassurance_cue is not None,
            "reassurance_cue": self.reassurance_cue,
            "reassurance_repeats": self.reassurance_repeats,
            "dependence_signal": self.dependence_cue is not None,
            "dependence_cue": self.dependence_cue,
            "sentiment": self.sentiment,
        }


def with_classifier(assessment: Assessment, verdict: tuple[str, bool] | None) -> Assessment:
    """Add the LLM classifier's verdict: it can raise a finding the lexicon missed (or make it
    acute), never lower one."""
    if verdict is None or verdict[0] == "none":
        return assessment
    category, acute = verdict
    current = assessment.crisis
    if current is not None and (current.acute or not acute):
        return assessment
    finding = CrisisFinding(category=category, acute=acute, cue="classifier", source="classifier")  # type: ignore[arg-type]
    return replace(assessment, crisis=finding)


@dataclass(frozen=True)
class History:
    """The conversation so far, as far as the policy cares."""

    raised: Counter[str] = field(default_factory=Counter)  # concern -> times pushed back on
    overridden: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StanceDecision:
    stance: Stance
    concern: Concern = "none"
    rationale: str = ""
    source: str = "platform"  # platform | model

    @property
    def overridable(self) -> bool:
        return self.stance in ("nudge", "challenge")


AGREE = StanceDecision("agree")


def default_rationale(concern: Concern, stance: Stance, repeats: int = 0) -> str:
    """Reasons in the platform's words, for when the model gave none (or for escalation)."""
    if stance == "escalate":
        if concern == "harm_to_others":
            return ("What you wrote suggests someone could get seriously hurt. I can't help with that, and I'm "
                    "showing you people who can help right now.")
        return ("What you wrote makes me worried about your safety. You matter, so I'm showing you people you can "
                "reach right now.")
    texts: dict[str, dict[str, str]] = {
        "risk_to_self": {
            "nudge": "Something you said sounds like you're carrying a lot. I want to check in on how you are.",
            "challenge": "You've said things like this more than once now, and I'm concerned about how you're doing.",
        },
        "harm_to_others": {
            "nudge": "This could hurt someone else, so I'd rather not help with that part as asked.",
            "challenge": "This could hurt someone else, so I won't help with that part. I'm glad to help you deal "
                         "with what happened in another way.",
        },
        "unsupported_framing": {
            "nudge": "Part of how this is framed may not be supported by what you've told me; it could be worth "
                     "checking before you act on it.",
            "challenge": "I disagree with part of the framing: what you've described doesn't seem to support it, "
                         "and acting on it could cost you.",
        },
        "reassurance_loop": {
            "nudge": f"You've asked me something very like this {repeats + 1} times. Another yes from me may not "
                     "settle it; it might help to look at what keeps bringing the question back.",
            "challenge": f"This is the {repeats + 1}th time you've asked for this reassurance. I don't think more of "
                         "it from me will help you; let's look at what's underneath.",
        },
        "dependence": {
            "nudge": "I'm glad to help, and I'd also like you to have people and your own judgment to lean on, "
                     "not only me.",
            "challenge": "I notice you're asking me to decide for you. You know your life better than I do, so I'd "
                         "rather help you decide.",
        },
    }
    return texts.get(concern, {}).get(stance, "")


def graduated(role: RoleSpec, concern: Concern, history: History) -> Stance | None:
    """The stance for raising ``concern`` now, or None when this role does not raise it."""
    start = role.starts_at.get(concern)
    if start is None:
        return None
    if concern not in SAFETY_CONCERNS and concern in history.overridden:
        return None
    cap = STANCES.index("escalate" if concern in SAFETY_CONCERNS else "challenge")
    return STANCES[min(STANCES.index(start) + history.raised[concern], cap)]


def directive(role: RoleSpec, assessment: Assessment, history: History) -> StanceDecision:
    """What the platform requires of this turn before the model is asked."""
    concern: Concern | None = None
    if assessment.crisis is not None:
        if assessment.crisis.acute:
            return StanceDecision("escalate", assessment.crisis.category,
                                  default_rationale(assessment.crisis.category, "escalate"))
        concern = assessment.crisis.category
    elif assessment.dependence_cue is not None:
        concern = "dependence"
    elif assessment.reassurance_cue is not None and assessment.reassurance_repeats >= REASSURANCE_LOOP_AFTER:
        concern = "reassurance_loop"
    if concern is None:
        return AGREE
    stance = graduated(role, concern, history)
    if stance is None:
        return AGREE
    return StanceDecision(stance, concern, default_rationale(concern, stance, assessment.reassurance_repeats))


def decide(role: RoleSpec, required: StanceDecision, proposed: StanceDecision | None,
           history: History) -> StanceDecision:
    """The turn's final stance: the stronger of the platform's directive and the model's own
    (role-filtered, graduated) concern. A nudge or challenge always carries a reason."""
    if required.stance == "escalate":
        return required
    candidates = [required] if required.stance != "agree" else []
    if proposed is not None and proposed.stance != "agree" and proposed.concern != "none":
        if proposed.stance == "escalate" and proposed.concern in SAFETY_CONCERNS:
            # The model saw a danger the lexicon missed: safety wins over graduation.
            return StanceDecision("escalate", proposed.concern, default_rationale(proposed.concern, "escalate"),
                                  source="model")
        stance = graduated(role, proposed.concern, history)
        if stance is not None:
            rationale = proposed.rationale.strip() or default_rationale(proposed.concern, stance)
            candidates.append(StanceDecision(stance, proposed.concern, rationale, source="model"))
    if not candidates:
        return AGREE
    best = max(candidates, key=lambda c: STANCES.index(c.stance))
    if (proposed is not None and best.source == "platform" and proposed.concern == best.concern
            and proposed.rationale.strip()):
        # Same concern: the model's reason is usually more specific than ours.
        return StanceDecision(best.stance, best.concern, proposed.rationale.strip(), source="platform")
    return best
