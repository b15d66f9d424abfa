"""The assistant's roles, what each discloses to the participant, and its versioned system prompt.

A wellbeing arm offers some of ``concierge``, ``collaborator`` and ``coach``; a default-mode arm
(the control) gets ``standard``, an ordinary helpful assistant. Each role says which concerns it
may push back on; safety concerns (risk to self, danger from someone else, harm to others) are
raised in every role, and never as something the participant can override.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from study.i18n import N_, gettext

PROMPTS = Path(__file__).parent / "prompts"

RoleName = Literal["standard", "concierge", "collaborator", "coach"]
Stance = Literal["agree", "nudge", "challenge", "check_in", "decline", "escalate"]
Concern = Literal["risk_to_self", "harm_to_others", "risk_from_others", "unsupported_framing", "validation_seeking",
                  "reassurance_loop", "dependence", "none"]

# Weakest to strongest. ``nudge`` and ``challenge`` are pushback the participant may override;
# ``check_in`` (distress, or danger from someone else, below escalation: a supportive check-in with
# resources) and ``decline`` (harm to others below escalation: the assistant won't help with it)
# never are; ``escalate`` shows crisis resources for the category and alerts staff.
STANCES: tuple[Stance, ...] = ("agree", "nudge", "challenge", "check_in", "decline", "escalate")
OVERRIDABLE_STANCES: frozenset[Stance] = frozenset({"nudge", "challenge"})
# The steps repeats graduate through (``RoleSpec.starts_at`` names one); how a step is shown
# depends on the concern (``chat.policy.fitting``).
LADDER: tuple[Stance, ...] = ("agree", "nudge", "challenge", "escalate")
CONCERNS: tuple[Concern, ...] = (
    "risk_to_self", "harm_to_others", "risk_from_others", "unsupported_framing", "validation_seeking",
    "reassurance_loop", "dependence", "none")
SAFETY_CONCERNS: frozenset[Concern] = frozenset({"risk_to_self", "harm_to_others", "risk_from_others"})


@dataclass(frozen=True)
class Disclosure:
    """The card a participant reads before choosing (about 20 seconds of reading), written in
    English with each text marked for the interface's catalogs (``translated``)."""

    title: str
    tagline: str
    optimized_for: str
    will: tuple[str, ...]
    wont: tuple[str, ...]
    pushback_sentences: tuple[str, ...]

    @property
    def pushback(self) -> str:
        return " ".join(self.pushback_sentences)

    def translated(self, language: str) -> Disclosure:
        """The card in ``language`` (``study.i18n``; English where the catalog lacks a text)."""
        def say(text: str) -> str:
            return gettext(language, text)
        return Disclosure(title=say(self.title), tagline=say(self.tagline), optimized_for=say(self.optimized_for),
                          will=tuple(map(say, self.will)), wont=tuple(map(say, self.wont)),
                          pushback_sentences=tuple(map(say, self.pushback_sentences)))


@dataclass(frozen=True)
class RoleSpec:
    name: RoleName
    disclosure: Disclosure
    # The LADDER step where raising each concern starts (repeats climb from there); a concern
    # missing here is never raised in this role.
    starts_at: dict[Concern, Stance]


_OVERRIDE = N_("If it pushes back, it says why, and you can tap \u201cGo ahead anyway\u201d to have it do what you "
              "asked.")
_SAFETY = N_("It never helps anyone get hurt and shows crisis resources when needed; that cannot be overridden.")

ROLE_SPECS: dict[RoleName, RoleSpec] = {
    "standard": RoleSpec(
        name="standard",
        disclosure=Disclosure(
            title=N_("Assistant"),
            tagline=N_("A general-purpose assistant"),
            optimized_for=N_("Being helpful and pleasant in the conversation you are having now."),
            will=(N_("Answer questions and help with tasks"), N_("Follow your lead")),
            wont=(N_("Help with harming yourself or others"),),
            pushback_sentences=(N_("It raises only safety concerns."), _SAFETY),
        ),
        starts_at={"risk_to_self": "nudge", "risk_from_others": "nudge", "harm_to_others": "challenge"},
    ),
    "concierge": RoleSpec(
        name="concierge",
        disclosure=Disclosure(
            title=N_("Concierge"),
            tagline=N_("\u201cDo it\u201d"),
            optimized_for=N_("Getting what you asked for done, quickly and well."),
            will=(N_("Carry out your request as you framed it"), N_("Keep questions to a minimum")),
            wont=(N_("Second-guess your plans or choices"), N_("Help with harming yourself or others")),
            pushback_sentences=(N_("It doesn't question your plans; it speaks up only about safety."), _SAFETY),
        ),
        starts_at={"risk_to_self": "nudge", "risk_from_others": "nudge", "harm_to_others": "challenge"},
    ),
    "collaborator": RoleSpec(
        name="collaborator",
        disclosure=Disclosure(
            title=N_("Collaborator"),
            tagline=N_("\u201cThink with me\u201d"),
            optimized_for=N_("Helping you reach a decision you will still agree with later."),
            will=(N_("Raise considerations and questions you may not have weighed"),
                  N_("Say so when a framing doesn't seem supported")),
            wont=(N_("Decide for you"), N_("Flatter you or agree just to please")),
            pushback_sentences=(N_("It may disagree, always with a reason."), _OVERRIDE, _SAFETY),
        ),
        starts_at={"risk_to_self": "nudge", "risk_from_others": "nudge", "harm_to_others": "challenge",
                   "unsupported_framing": "nudge", "validation_seeking": "nudge", "reassurance_loop": "nudge",
                   "dependence": "nudge"},
    ),
    "coach": RoleSpec(
        name="coach",
        disclosure=Disclosure(
            title=N_("Coach"),
            tagline=N_("\u201cChallenge me\u201d"),
            optimized_for=N_("Your progress on the goals you set, even when that is uncomfortable now."),
            will=(N_("Test your assumptions"), N_("Name patterns it notices"), N_("Hold you to goals you stated")),
            wont=(N_("Tell you what you want to hear"), N_("Decide for you")),
            pushback_sentences=(N_("It will challenge you directly, always with a reason."), _OVERRIDE, _SAFETY),
        ),
        starts_at={"risk_to_self": "nudge", "risk_from_others": "nudge", "harm_to_others": "challenge",
                   "unsupported_framing": "challenge", "validation_seeking": "challenge",
                   "reassurance_loop": "challenge", "dependence": "challenge"},
    ),
}


@dataclass(frozen=True)
class SystemPrompt:
    text: str
    version: str  # first 12 hex digits of the SHA-256 of the text: stored on every turn


@functools.cache
def system_prompt(role: RoleName) -> SystemPrompt:
    """The role's prompt file followed by the shared answer format. Editing either file changes
    the version, so every turn records exactly which instructions produced it."""
    text = (PROMPTS / f"{role}.md").read_text(encoding="utf-8").strip() + "\n\n" + (
        PROMPTS / "answer-format.md").read_text(encoding="utf-8").strip() + "\n"
    return SystemPrompt(text=text, version=hashlib.sha256(text.encode()).hexdigest()[:12])


def roles_for_arm(mode: str, roles: list[str]) -> list[RoleName]:
    if mode != "wellbeing":
        return ["standard"]
    return [role for role in ("concierge", "collaborator", "coach") if role in roles]
