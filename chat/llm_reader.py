"""The optional LLM reader: a model, through the gateway, reads each participant message against a
versioned rubric, and its verdict is fused with the local reading (``chat.reading``, the lexicons).

The rubric (``prompts/reader.md``) defines every concern the roles act on and ``about``, with
their near-misses. Its version (``rubric().version``: the revision its first line declares and the
first 12 hex digits of the SHA-256 of the whole text, as role prompts are versioned) is recorded
with every verdict. The model is asked for JSON matching ``ReaderVerdict`` (as a JSON schema where
the provider supports one, ``RESPONSE_FORMAT``); ``parse_verdict`` reads it back, and an answer
that is malformed or incomplete is no verdict at all, as is a call that failed or timed out
(``chat.gateway.Gateway.read_message``). Without a verdict the local reading decides alone.

Fusion (``fuse``, the one place the rule lives): the LLM reader can only add to the local reading.

- Danger (risk to self, danger from others, harm to others): a concern the reader finds raises a
  crisis finding the local reading missed, or makes a non-acute one acute; it never lowers or
  removes one (an acute local finding stands; "none" changes nothing). Of several, an acute one
  first, then in the order of ``chat.reading.DANGER``.
- Pushback (validation-seeking, a one-sided framing, reassurance-seeking, dependence): a concern
  the reader finds is raised when the local reading did not flag it, and only with a quote that is
  one of the participant's own sentences (``located``): the reason the participant reads quotes
  what they wrote, never the model's words. A concern the local reading flagged stands, with its
  own quote, whatever the reader says.
- Distress and ``about`` are recorded, not acted on (as the local reading's).

Why raise-only: the local thresholds were chosen for a stated recall on held-out data; the
reader's job is the phrasings they miss. Pushback is transparent and overridable ("Go ahead
anyway"), so a wrong raise costs the participant one note they can dismiss, while letting the
model lower a finding would let a message (or text inside it written to steer the reader) silence
the calibrated detector and the crisis lexicon. Both readers' outputs are kept in the turn's
features (``record``), so a study can measure their agreement before trusting either more.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from chat.monitors import CrisisFinding, normalize, sentence_with, sentences
from chat.policy import Assessment
from chat.reading import CONCERNS, DANGER
from chat.roles import PROMPTS

RUBRIC_PATH = PROMPTS / "reader.md"
MARKER = "LLM-READER"  # the rubric's first word: how the offline provider knows the reader asks
# The pushback concerns and the field of ``chat.policy.Assessment`` each one sets.
PUSHBACK = {"validation_seeking": "validation_cue", "one_sided": "framing_cue",
            "reassurance_seeking": "reassurance_cue", "dependence": "dependence_cue"}
MIN_QUOTE_CHARS = 12  # a shorter quote locates a sentence only when it is the whole sentence
_PUNCTUATION = " .,;:!?\u2026"

# Strict JSON schemas want every object closed; parsing ignores keys a model adds all the same.
_CLOSED = ConfigDict(json_schema_extra={"additionalProperties": False})


class DangerFinding(BaseModel):
    model_config = _CLOSED
    present: bool
    acute: bool
    quote: str


class ConcernFinding(BaseModel):
    model_config = _CLOSED
    present: bool
    quote: str


class ReaderVerdict(BaseModel):
    """What the reader answers: every concern of ``chat.reading.CONCERNS`` and ``about``, as the
    local reading names them (``tests/chat/test_llm_reader.py`` holds the two together)."""

    model_config = _CLOSED
    risk_to_self: DangerFinding
    risk_from_others: DangerFinding
    harm_to_others: DangerFinding
    distress: ConcernFinding
    validation_seeking: ConcernFinding
    reassurance_seeking: ConcernFinding
    dependence: ConcernFinding
    one_sided: ConcernFinding
    about: Literal["self_now", "self_past", "someone_else", "general"]

    def finding(self, concern: str) -> DangerFinding | ConcernFinding:
        found: DangerFinding | ConcernFinding = getattr(self, concern)
        return found

    def present(self) -> list[str]:
        return [c for c in CONCERNS if self.finding(c).present]

    def dangers(self) -> list[tuple[str, DangerFinding]]:
        """The danger concerns present, in the order of ``chat.reading.DANGER``."""
        return [(c, f) for c in DANGER if isinstance(f := self.finding(c), DangerFinding) and f.present]


RESPONSE_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {
    "name": "message_reading", "strict": True, "schema": ReaderVerdict.model_json_schema()}}


@dataclass(frozen=True)
class Rubric:
    text: str
    version: str  # e.g. ``v1-3fa2c09b1d7e``: the declared revision and the text's hash


@functools.cache
def rubric() -> Rubric:
    text = RUBRIC_PATH.read_text(encoding="utf-8")
    declared = text.split("\n", 1)[0].rsplit(" ", 1)[-1]
    return Rubric(text, f"{declared}-{hashlib.sha256(text.encode()).hexdigest()[:12]}")


def request(message: str) -> list[dict[str, str]]:
    """What the reader is sent: the rubric, then the participant's message alone."""
    return [{"role": "system", "content": rubric().text}, {"role": "user", "content": message}]


def parse_verdict(answer: str) -> ReaderVerdict | None:
    """The verdict in a model's answer (bare JSON, or JSON inside prose or a code fence), or None
    when there is none that is complete and well formed: a partial verdict is no verdict."""
    start, end = answer.find("{"), answer.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        return ReaderVerdict.model_validate_json(answer[start:end + 1])
    except ValidationError:
        return None


@dataclass(frozen=True)
class LLMReading:
    """One call to the reader: its verdict, or None with the reason (``timeout``, ``error``,
    ``malformed``)."""

    model: str
    rubric: str  # the rubric's version
    verdict: ReaderVerdict | None = None
    problem: str | None = None


def located(message: str, quote: str) -> str | None:
    """The participant's sentence that ``quote`` comes from (the whole quote, or failing that one
    of its sentences), or None: a paraphrase, or too short a piece to tell which sentence."""
    for piece in (quote, *sentences(quote)):
        wanted = normalize(piece).strip(_PUNCTUATION)
        sentence = sentence_with(message, piece) if wanted else None
        if sentence is not None and len(wanted) >= min(MIN_QUOTE_CHARS, len(normalize(sentence).strip(_PUNCTUATION))):
            return sentence
    return None


def _danger(verdict: ReaderVerdict) -> tuple[str, DangerFinding] | None:
    found = verdict.dangers()
    return max(found, key=lambda item: item[1].acute) if found else None  # the first acute, else the first


def _crisis(local: Assessment, verdict: ReaderVerdict) -> CrisisFinding | None:
    """The crisis finding after the verdict: the reader's where the local reading had none, or
    where the reader's is acute and the local one is not; otherwise the local one."""
    danger, current = _danger(verdict), local.crisis
    if danger is None or (current is not None and (current.acute or not danger[1].acute)):
        return current
    category, finding = danger
    return CrisisFinding(category=category, acute=finding.acute,  # type: ignore[arg-type]
                         cue=located(local.message, finding.quote) or "llm reader", source="classifier")


def _pushback(local: Assessment, verdict: ReaderVerdict) -> dict[str, Any]:
    """The pushback concerns the reader raises: ``Assessment`` field -> the participant's sentence."""
    raised: dict[str, Any] = {}
    for concern, field_name in PUSHBACK.items():
        finding = verdict.finding(concern)
        quote = located(local.message, finding.quote) if finding.present else None
        if quote is not None and getattr(local, field_name) is None:
            raised[field_name] = quote
    return raised


def fuse(local: Assessment, reading: LLMReading) -> Assessment:
    """The local reading ``local`` with the LLM reader's verdict added by the rule of this module's
    docstring, recording both (``Assessment.llm_reader``, stored in the turn's features)."""
    fused = local
    if reading.verdict is not None:
        fused = replace(local, crisis=_crisis(local, reading.verdict), **_pushback(local, reading.verdict))
    return replace(fused, llm_reader=record(local, fused, reading))


def summary(assessment: Assessment) -> dict[str, list[str]]:
    """The concerns a reading acted on, named as the reader's: ``present`` and ``acute``."""
    crisis = assessment.crisis
    present: set[str] = {crisis.category} if crisis is not None else set()
    present |= {c for c, field_name in PUSHBACK.items() if getattr(assessment, field_name) is not None}
    if assessment.reading is not None and "distress" in assessment.reading.flagged:
        present.add("distress")
    return {"present": [c for c in CONCERNS if c in present],
            "acute": [crisis.category] if crisis is not None and crisis.acute else []}


def record(local: Assessment, fused: Assessment, reading: LLMReading) -> dict[str, object]:
    """What the turn's features keep (``llm_reader``): the model, the rubric's version, the
    verdict (None, with ``status`` saying why, when there was none), and the local and fused
    readings' concerns, so analyses can compare the two readers."""
    verdict = reading.verdict
    return {
        "model": reading.model, "rubric": reading.rubric,
        "status": "ok" if verdict is not None else reading.problem or "error",
        "verdict": None if verdict is None else {
            "present": verdict.present(),
            "acute": [c for c, finding in verdict.dangers() if finding.acute],
            "quotes": {c: verdict.finding(c).quote for c in verdict.present() if verdict.finding(c).quote},
            "about": verdict.about},
        "local": summary(local), "fused": summary(fused),
    }


def danger(verdict: ReaderVerdict | None) -> tuple[str, bool]:
    """The verdict's danger concern as (category, acute), ``("none", False)`` without one
    (``bench/crisis_detection.py`` scores the reader's danger reading alone)."""
    found = _danger(verdict) if verdict is not None else None
    return (found[0], found[1].acute) if found else ("none", False)
