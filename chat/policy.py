"""The pushback policy: which stance a turn takes, on what concern, with which reason.

Before the LLM is called the platform turns the monitors' findings into a ``directive`` (acute
crisis goes straight to escalation). After the call, ``decide`` combines the directive with the
stance the model proposed, keeping only concerns the role may raise and graduating repeats within
a conversation along ``LADDER``: nudge, then challenge; safety concerns go on to escalation.

How a step is shown fits the situation (``fitting``). An ordinary concern is a nudge or challenge
the participant may override ("Go ahead anyway"); a concern they overrode is muted (``History.overridden``)
until the protocol's ``pushback.raise_again_after`` messages have passed. Safety is never overridable
and its reasons are the platform's own words: distress, or danger from someone else, below escalation
gets a supportive ``check_in`` with resources; harm to others is ``decline``d; escalation shows
resources for its category. A reason that quotes the participant quotes whole sentences
(``whole_sentences``), never a matched fragment. Dependence, once reliance has grown over days
(``chat.drift``), is raised with a reason naming those days.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from chat.drift import reliance_growing
from chat.monitors import CrisisFinding, normalize, sentence_with
from chat.reading import Reading
from chat.roles import LADDER, OVERRIDABLE_STANCES, SAFETY_CONCERNS, STANCES, Concern, RoleSpec, Stance
from study.i18n import N_

# How a dependence reason that names reliance over days opens (the offline model knows it by this).
OVER_DAYS = "Over the past week"
REASSURANCE_LOOP_AFTER = 2  # earlier similar requests before a reassurance loop is named
DISTRESS_CONCERNS: frozenset[Concern] = frozenset({"risk_to_self", "risk_from_others"})


@dataclass(frozen=True)
class Assessment:
    """What the monitors found in one participant message."""

    crisis: CrisisFinding | None = None
    crisis_score: float | None = None  # the semantic classifier's (chat.semantic; flags at its threshold)
    reassurance_cue: str | None = None
    reassurance_repeats: int = 0  # earlier similar requests, this and other conversations
    dependence_cue: str | None = None
    # Days of the last week with a dependence-flagged message, this one included (chat.drift).
    reliance_days: int = 0
    validation_cue: str | None = None
    framing_cue: str | None = None  # the sentence of a one-sided or unsupported framing (chat.reading)
    sentiment: float | None = None  # VADER compound of the message
    message: str = ""  # the message itself, for reasons that quote it (not stored as a feature)
    reading: Reading | None = None  # every concern's calibrated score (chat.reading)
    llm_reader: dict[str, object] | None = None  # the LLM reader's record, when one ran (chat.llm_reader.record)

    def features(self) -> dict[str, object]:
        return {
            "crisis_category": self.crisis.category if self.crisis else None,
            "crisis_acute": bool(self.crisis and self.crisis.acute),
            "crisis_cue": self.crisis.cue if self.crisis else None,
            "crisis_source": self.crisis.source if self.crisis else None,
            "crisis_score": None if self.crisis_score is None else round(self.crisis_score, 4),
            "reassurance_seeking": self.reassurance_cue is not None,
            "reassurance_cue": self.reassurance_cue,
            "reassurance_repeats": self.reassurance_repeats,
            "dependence_signal": self.dependence_cue is not None,
            "dependence_cue": self.dependence_cue,
            "reliance_days": self.reliance_days,
            "reliance_drift": reliance_growing(self.reliance_days),
            "validation_seeking": self.validation_cue is not None,
            "validation_cue": self.validation_cue,
            "unsupported_framing": self.framing_cue is not None,
            "sentiment": self.sentiment,
            **(self.reading.features() if self.reading is not None else {}),
            **({"llm_reader": self.llm_reader} if self.llm_reader is not None else {}),
        }


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
    # The reason says what only the platform saw (reliance over days, chat.drift): a model's own
    # reason for the same concern does not replace it.
    keeps_reason: bool = False

    @property
    def overridable(self) -> bool:
        return self.stance in OVERRIDABLE_STANCES


AGREE = StanceDecision("agree")


def default_rationale(concern: Concern, stance: Stance, *, repeats: int = 0, raised: int = 0,
                      quote: str | None = None, reliance_days: int = 0) -> str:
    """Reasons in the platform's words: for safety stances always, otherwise when the model gave
    none. ``repeats``: earlier similar reassurance requests; ``raised``: times the concern was
    already raised in the conversation; ``quote``: the participant's sentence the concern is about;
    ``reliance_days``: days of the last week with a dependence-flagged message (``chat.drift``),
    which, once reliance is growing, the dependence reason names instead of this one message."""
    if stance == "escalate":
        return {
            "harm_to_others": N_("What you wrote suggests someone could get seriously hurt. I can't help with that, "
                                 "and I'm showing you people who can help right now."),
            "risk_from_others": N_("What you wrote makes me worried that someone may hurt you. Your safety matters, "
                                   "so I'm showing you people who help with exactly this, right now."),
        }.get(concern, N_("What you wrote makes me worried about your safety. You matter, so I'm showing you people "
                          "you can reach right now."))
    if stance == "check_in":
        if concern == "risk_from_others":
            return N_("What you describe sounds frightening, and it isn't your fault. How safe are you right now? If "
                      "you'd like to talk it through with people who help with this, confidentially, they're below.")
        if raised:
            return N_("You've said something like this more than once now, and I'm thinking of you. You don't have "
                      "to carry it alone: the people below are free to talk to, any time.")
        return N_("It sounds like you're carrying a lot right now, and I'm glad you said so. How are you doing, "
                  "really? If it would help to talk to someone, the people below are there any time.")
    if stance == "decline":
        return N_("This could hurt someone else, so I won't help with that part. I'm glad to help you deal with what "
                  "happened in another way.")
    if quote:
        said = f"\u201c{quote}\u201d{'' if quote[-1] in _END else '.'}"
        asked, backing, wrote = f"You asked me to agree: {said}", f"You're asking me to back you up: {said}", \
            f"You wrote: {said} "
    else:
        asked, backing = "You asked me to agree with your side of this.", "You're asking me to back you up."
        wrote = ""
    if concern == "dependence" and reliance_growing(reliance_days):
        days = (f"{OVER_DAYS} you've asked me to decide for you, or leaned on me, on {reliance_days} "
                "different days.")
        return {
            "nudge": f"{days} I'm glad to help, and I'd like you to have people and your own judgment to lean on "
                     "too: who else could you talk this through with?",
            "challenge": f"{days} You know your life better than I do, so rather than decide for you I'd like to "
                         "help you decide: what would you choose if I weren't here?",
        }.get(stance, "")
    texts: dict[str, dict[str, str]] = {
        "unsupported_framing": {
            "nudge": f"{wrote}Part of how this is framed may not be supported by what you've told me; it could be "
                     "worth checking before you act on it.",
            "challenge": f"{wrote}I disagree with part of the framing: what you've described doesn't seem to "
                         "support it, and acting on it could cost you.",
        },
        "validation_seeking": {
            "nudge": f"{asked} I've only heard your side of it, so a yes from me wouldn't tell you much. How might "
                     "someone who sees it differently describe it?",
            "challenge": f"{backing} I'd be doing you no favours by just agreeing: I've only heard one side. What is "
                         "the strongest case against it?",
        },
        "reassurance_loop": {
            "nudge": f"You've asked me something very like this {repeats + 1} times. Another yes from me may not "
                     "settle it; it might help to look at what keeps bringing the question back.",
            "challenge": f"You've asked me for this reassurance {repeats + 1} times now. I don't think more of it "
                         "from me will help you; let's look at what's underneath.",
        },
        "dependence": {
            "nudge": "I'm glad to help, and I'd also like you to have people and your own judgment to lean on, "
                     "not only me.",
            "challenge": "I notice you're asking me to decide for you. You know your life better than I do, so I'd "
                         "rather help you decide.",
        },
    }
    return texts.get(concern, {}).get(stance, "")


def platform_reply(decision: StanceDecision) -> str:
    """The platform's own reply for a safety stance, used when the model's reply does not fit it
    (``model_reply_fits``) or the model did not answer; empty for other stances."""
    if decision.stance == "escalate":
        return {
            "harm_to_others": "I can't help with anything that could hurt someone. If anyone is in danger right now, "
                              "call your local emergency number. If you feel you might act on this, put some "
                              "distance between you and them and reach out to one of the services shown here.",
            "risk_from_others": "I'm worried about your safety. If you are in danger right now, call your local "
                                "emergency number. The services shown here help people in your situation, "
                                "confidentially, and can help you plan how to stay safe.",
        }.get(decision.concern, "I'm concerned about your safety, and I want to make sure you can reach someone "
                                "right now. Please contact one of the services shown here. If you are in immediate "
                                "danger, call your local emergency number.")
    if decision.stance == "check_in":
        if decision.concern == "risk_from_others":
            return ("I'm sorry this is happening to you; what someone else does to you is not your fault. I'm here "
                    "to listen. What would help you feel safer right now?")
        return ("That sounds really hard, and I'm glad you told me. I'm here to listen: what has been weighing on "
                "you most?")
    if decision.stance == "decline":
        return ("I won't help with that, because it could hurt someone else. If something happened that is hurting "
                "you, I'm glad to help you think about what you need and how to get it without harming anyone.")
    return ""


def model_reply_fits(final: StanceDecision, proposed: StanceDecision | None) -> bool:
    """Whether the model's reply can be shown under the turn's final stance. A model that answered
    a turn the platform checks in on, declines or escalates with a stance of its own that is not a
    safety one (``agree``, or an ordinary concern) wrote its reply as if helping; that reply does
    not fit, and ``platform_reply`` is shown instead. Where someone else could get hurt, the model
    must have refused itself (a nudge or challenge still helps, with a caveat), and a reply without
    a readable stance is not shown; elsewhere such a reply is kept."""
    if final.stance not in ("check_in", "decline", "escalate"):
        return True
    if final.concern == "harm_to_others":
        return proposed is not None and proposed.stance in ("decline", "escalate")
    if proposed is None:
        return True
    return proposed.stance != "agree" and proposed.concern in SAFETY_CONCERNS


def shown_reply(final: StanceDecision, proposed: StanceDecision | None, reply: str) -> str:
    """The reply the participant reads: the model's, unless it does not fit the turn's safety stance
    (then the platform's own); empty when there is neither."""
    return (reply if model_reply_fits(final, proposed) else "") or platform_reply(final)


def fitting(concern: Concern, step: Stance) -> Stance:
    """How a step of the ladder is shown for ``concern``: distress and danger from someone else
    below escalation get a check-in, harm to others below escalation is declined (neither can be
    overridden); other concerns are nudged or challenged."""
    if step in ("nudge", "challenge"):
        if concern in DISTRESS_CONCERNS:
            return "check_in"
        if concern == "harm_to_others":
            return "decline"
    return step


def graduated(role: RoleSpec, concern: Concern, history: History) -> Stance | None:
    """The stance for raising ``concern`` now, or None when this role does not raise it."""
    start = role.starts_at.get(concern)
    if start is None:
        return None
    if concern not in SAFETY_CONCERNS and concern in history.overridden:
        return None
    cap = LADDER.index("escalate" if concern in SAFETY_CONCERNS else "challenge")
    return fitting(concern, LADDER[min(LADDER.index(start) + history.raised[concern], cap)])


def directive(role: RoleSpec, assessment: Assessment, history: History) -> StanceDecision:
    """What the platform requires of this turn before the model is asked: the first of the
    monitors' concerns (crisis, dependence, validation-seeking, a reassurance loop) the role raises.
    Dependence, once reliance has grown over days (``chat.drift``), is raised with a reason that
    says what was seen over those days, which a model's own reason does not replace."""
    crisis = assessment.crisis
    if crisis is not None and crisis.acute:
        return StanceDecision("escalate", crisis.category, default_rationale(crisis.category, "escalate"))
    found: list[tuple[Concern, str | None]] = []
    if crisis is not None:
        found.append((crisis.category, None))
    if assessment.dependence_cue is not None:
        found.append(("dependence", None))
    if assessment.validation_cue is not None:
        found.append(("validation_seeking", sentence_with(assessment.message, assessment.validation_cue)))
    if assessment.framing_cue is not None:
        found.append(("unsupported_framing", sentence_with(assessment.message, assessment.framing_cue)))
    if assessment.reassurance_cue is not None and assessment.reassurance_repeats >= REASSURANCE_LOOP_AFTER:
        found.append(("reassurance_loop", None))
    for concern, quote in found:
        stance = graduated(role, concern, history)
        if stance is not None:
            over_days = concern == "dependence" and reliance_growing(assessment.reliance_days)
            return StanceDecision(stance, concern, default_rationale(
                concern, stance, repeats=assessment.reassurance_repeats, raised=history.raised[concern], quote=quote,
                reliance_days=assessment.reliance_days), keeps_reason=over_days)
    return AGREE


def decide(role: RoleSpec, required: StanceDecision, proposed: StanceDecision | None,
           history: History, message: str = "") -> StanceDecision:
    """The turn's final stance: the stronger of the platform's directive and the model's own
    (role-filtered, graduated) concern. A nudge or challenge always carries a reason, and a reason
    quoting ``message`` (the participant's) quotes whole sentences."""
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
            given = whole_sentences(proposed.rationale.strip(), message)
            rationale = (given if stance in OVERRIDABLE_STANCES and given else
                         default_rationale(proposed.concern, stance, raised=history.raised[proposed.concern]))
            candidates.append(StanceDecision(stance, proposed.concern, rationale, source="model"))
    if not candidates:
        return AGREE
    best = max(candidates, key=lambda c: STANCES.index(c.stance))
    if (proposed is not None and best.source == "platform" and best.overridable and proposed.concern == best.concern
            and proposed.rationale.strip() and not best.keeps_reason):
        # Same concern: the model's reason is usually more specific than ours.
        return StanceDecision(best.stance, best.concern, whole_sentences(proposed.rationale.strip(), message),
                              source="platform")
    return best


# Quoted passages: “…”, "…", ‘…’ and '…' (an apostrophe inside a word does not end a quote).
_QUOTED = re.compile(r"\u201c([^\u201d]+)\u201d|\"([^\"]+)\"|(?<!\w)\u2018(.+?)\u2019(?!\w)|(?<!\w)'(.+?)'(?!\w)")
_END = ".!?\u2026"


def whole_sentences(rationale: str, message: str) -> str:
    """``rationale`` with every quotation of part of a sentence of ``message`` widened to the whole
    sentence, so the participant sees what they said in context rather than the words a pattern
    (or a model) picked out. Quotations not found in the message (paraphrases) are left alone."""
    if not message or not rationale:
        return rationale
    out: list[str] = []
    at = 0
    for quoted in _QUOTED.finditer(rationale):
        inner = next(group for group in quoted.groups() if group is not None)
        sentence = sentence_with(message, inner)
        if sentence is None or normalize(sentence).strip(_END) == normalize(inner).strip(_END):
            continue
        out.append(rationale[at:quoted.start()])
        out.append(f"\u201c{sentence}\u201d")
        at = quoted.end()
        if sentence[-1] in _END and rationale[at:at + 1] == ".":
            at += 1  # “… tomorrow.”. reads as a typo
    out.append(rationale[at:])
    return "".join(out)
