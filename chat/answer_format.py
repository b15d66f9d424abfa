"""What the platform tells the model each turn, and how the model's answer is read back.

The model is asked (prompts/answer-format.md) to begin with ``STANCE {json}`` and then the reply;
where the provider supports JSON schemas the whole answer is a JSON object instead. Models slip,
so ``parse_answer`` also accepts a fenced JSON block, a stance line at the end, or no stance at
all, and always strips stance JSON from what the participant sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from chat.policy import StanceDecision
from chat.roles import CONCERNS, SAFETY_CONCERNS, STANCES

STANCE_SCHEMA: dict[str, Any] = {
    "name": "assistant_turn",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "stance": {"type": "string", "enum": list(STANCES)},
            "concern": {"type": "string", "enum": list(CONCERNS)},
            "rationale": {"type": "string"},
            "reply": {"type": "string"},
        },
        "required": ["stance", "concern", "rationale", "reply"],
        "additionalProperties": False,
    },
}

GUIDANCE_HEADING = "Platform guidance for this turn"


def guidance(required: StanceDecision, *, overridden: bool = False, muted: Collection[str] = ()) -> str:
    """A system message with the platform's directive; empty-handed turns get none. ``muted``: the
    ordinary concerns the participant overrode and the platform does not raise yet
    (``chat.service.muted_concerns``), so a model raising one itself would be overruled and its
    reply would point at a note nobody sees."""
    lines = [f"{GUIDANCE_HEADING}:"]
    if overridden:
        lines.append("override: yes. The participant heard your concern and chose to go ahead. Help them as "
                     "they asked, without repeating the concern.")
    quiet = sorted(set(muted) - SAFETY_CONCERNS)
    if quiet:
        lines.append(f"muted: {', '.join(quiet)}. The participant chose to go ahead despite these concerns; do "
                     "not raise them again for now.")
    if required.stance != "agree":
        lines += [f"required_stance: {required.stance}", f"concern: {required.concern}",
                  f"rationale: {' '.join(required.rationale.splitlines())}"]  # one line
    return "\n".join(lines) if len(lines) > 1 else ""


def read_guidance(text: str) -> dict[str, str]:
    """The guidance fields from a system message (used by the offline provider)."""
    if GUIDANCE_HEADING not in text:
        return {}
    fields = {}
    for line in text.split(GUIDANCE_HEADING, 1)[1].splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("override", "muted", "required_stance", "concern", "rationale"):
            fields[key.strip()] = value.strip()
    return fields


def muted_concerns(fields: dict[str, str]) -> frozenset[str]:
    """The concerns a guidance's ``muted`` line names (``read_guidance``'s fields)."""
    names = fields.get("muted", "").split(".", 1)[0]
    return frozenset(name.strip() for name in names.split(",") if name.strip() in CONCERNS)


@dataclass(frozen=True)
class ParsedAnswer:
    reply: str
    proposed: StanceDecision | None  # None when the model gave no readable stance


_STANCE_LINE = re.compile(r"^\s*\**STANCE\**\s*:?\s*(\{.*?\})\s*$", re.MULTILINE | re.IGNORECASE)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_BARE = re.compile(r"\{[^{}]*\"stance\"[^{}]*\}", re.DOTALL)


def _stance_from(obj: Any) -> StanceDecision | None:
    if not isinstance(obj, dict):
        return None
    stance = str(obj.get("stance", "")).strip().lower()
    concern = str(obj.get("concern", "none")).strip().lower() or "none"
    if stance not in STANCES:
        return None
    if concern not in CONCERNS:
        concern = "none"
    rationale = obj.get("rationale")
    return StanceDecision(stance, concern, rationale.strip() if isinstance(rationale, str) else "",  # type: ignore[arg-type]
                          source="model")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_answer(text: str) -> ParsedAnswer:
    stripped = text.strip()
    whole = _loads(stripped) if stripped.startswith("{") else None
    if isinstance(whole, dict) and isinstance(whole.get("reply"), str):
        return ParsedAnswer(whole["reply"].strip(), _stance_from(whole))
    for pattern in (_STANCE_LINE, _FENCED, _BARE):
        match = pattern.search(text)
        if match:
            proposed = _stance_from(_loads(match.group(1) if pattern is not _BARE else match.group(0)))
            reply = (text[:match.start()] + text[match.end():]).strip()
            if proposed is not None or pattern is not _BARE:
                return ParsedAnswer(reply, proposed)
    return ParsedAnswer(stripped, None)


class StreamSplitter:
    """Separates a streamed answer into the stance header (held back) and reply text (passed on).

    Text is released line by line only while a line could still turn out to be a stance line;
    anything else flows through as it arrives.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._raw: list[str] = []
        self._at_line_start = True
        self._emitted = False

    def feed(self, chunk: str) -> str:
        self._raw.append(chunk)
        self._pending += chunk
        out: list[str] = []
        while self._pending:
            if self._at_line_start:
                head = self._pending.lstrip(" *").upper()
                if len(head) < 6 and "STANCE".startswith(head):
                    break  # too short to tell yet
                blank_lead = not self._emitted and not self._pending.split("\n", 1)[0].strip()
                if head.startswith("STANCE") or blank_lead:
                    newline = self._pending.find("\n")
                    if newline < 0:
                        break  # hold a possible stance line (or leading blank) until it is complete
                    line = self._pending[:newline + 1]
                    if blank_lead or _STANCE_LINE.match(line):
                        self._pending = self._pending[newline + 1:]
                        continue
                self._at_line_start = False
            newline = self._pending.find("\n")
            piece, self._pending = ((self._pending, "") if newline < 0
                                    else (self._pending[:newline + 1], self._pending[newline + 1:]))
            self._at_line_start = newline >= 0
            out.append(piece)
            self._emitted = True
        return "".join(out)

    def flush(self) -> str:
        """Whatever is still held back once the stream ends (a short last line that is not a stance)."""
        rest, self._pending = self._pending, ""
        return "" if _STANCE_LINE.match(rest) else rest

    def finish(self) -> ParsedAnswer:
        """The full answer, parsed; the reply is the same text the stream showed."""
        return parse_answer("".join(self._raw))
