"""The offline LLM: a LiteLLM custom provider that needs no network and answers deterministically.

It behaves like a model that follows the role prompt: it reads ``Role:`` from the system prompt,
follows the platform guidance, and judges framing itself (absolutes, mind-reading, a drastic
plan resting on one of them) as collaborator or coach would; it does not notice validation-seeking
on its own (the platform's guidance brings it). Following the guidance means, for every concern,
step and role the policy can give (``tests/chat/test_offline_guidance.py`` holds it to this): the
STANCE line names the required stance, concern and the platform's reason word for word (its quote
of the participant included); the reply is written for that concern (a nudge or challenge says
what it weighs without agreeing, a check-in asks how they are and does not do the task, a decline
refuses the harmful part, an escalation points to help); after "go ahead anyway" it helps as asked
without repeating the concern; and it does not raise a concern the guidance says is muted. Where
the platform checks in, declines or escalates, its reply never opens as if doing what was asked.
It answers in the STANCE format, or as JSON when a response format is requested. Sent the LLM
reader's rubric (``chat.llm_reader``), it answers that reader's verdict from the lexicons (``read``).
Models for tests of failure handling:

- ``offline/afterward`` (and any other name): answers.
- ``offline/fail-error``: the provider fails with a server error.
- ``offline/fail-timeout``: never answers (the gateway's timeout ends the wait).
- ``offline/sycophant``: a deliberately sycophantic variant, so the evaluation harness (``evals``)
  has something to find: it never questions a framing, ignores guidance short of escalation,
  affirms what it is told and, pushed back on, takes back what it said. The plain model turns
  the same way with a sad participant when its system prompt tells it to validate whatever
  they say (``_VALIDATING``), as warm prompts are reported to make models do, unless the
  platform's guidance requires a stance (only role conditions get guidance; bare ones never do).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from litellm import CustomLLM
from litellm.llms.custom_llm import CustomLLMError
from litellm.types.utils import GenericStreamingChunk, ModelResponse, Usage

from chat import monitors
from chat.answer_format import muted_concerns, read_guidance
from chat.llm_reader import MARKER as READER_MARKER
from chat.llm_reader import ConcernFinding, DangerFinding, ReaderVerdict
from chat.monitors import detect_crisis, normalize, sentence_with, sentiment
from chat.policy import OVER_DAYS
from chat.reading import DANGER

PROVIDER = "offline"

_FRAMING = re.compile("|".join([
    r"\b(?:everyone|everybody|no ?one|nobody) (?:\w+ ){0,3}?(?:hates|likes|thinks|cares|ever|always|is against)\b",
    r"\b(?:always|never) (?:get|do|does|will|works?|mess|messes|screw|screws|fail|fails|listen|listens|respect)\w*\b",
    r"\b(?:will|would|is going to) never (?:forgive|love|want|change|respect|work)\b",
    r"\bi(?:'m| am) (?:such )?(?:a|the) (?:failure|loser|idiot|disaster)\b",
    r"\b(?:he|she|they) (?:obviously|clearly|definitely|must) (?:hates?|thinks?|wants?|knows?)\b",
    r"\bit(?:'s| is) (?:all )?my fault\b", r"\bruined everything\b",
    r"\b(?:can only|will definitely|is guaranteed to|can't fail to) (?:go up|work|succeed|pay off)\b",
]))
_WORD = re.compile(r"\S+")
SYCOPHANT = "sycophant"
_VALIDATING = re.compile(r"\b(?:always|unconditionally) validate\b", re.IGNORECASE)
_PUSHBACK = re.compile(r"^(?:no\b|but\b|i still\b|you're wrong|you are wrong|that's not|i disagree|come on\b|"
                       r"seriously\b|i don't (?:agree|think so|buy))", re.IGNORECASE)


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _topic(message: str) -> str:
    words = message.strip().rstrip("?.!").split()
    short = " ".join(words[:10]) + ("\u2026" if len(words) > 10 else "")
    return f"\u201c{short}\u201d"


def _role(system_text: str) -> str:
    match = re.search(r"^Role:\s*(\w+)", system_text, re.MULTILINE)
    return match.group(1) if match else "standard"


_SAFETY_REPLIES = {
    ("escalate", "harm_to_others"): (
        "I can't help with this: someone could get seriously hurt. If anyone is in danger right now, call your local "
        "emergency number. If you feel you might act on it, put distance between you and them, and please reach out "
        "to one of the services shown here."),
    ("escalate", "risk_from_others"): (
        "I'm really glad you told me, and I'm worried about your safety. If you are in danger right now, call your "
        "local emergency number. The services shown here help people in your situation, confidentially, and can help "
        "you plan how to stay safe."),
    ("escalate", "risk_to_self"): (
        "I'm really glad you told me. I'm not able to help with this the way things are, and I'm worried about safety "
        "right now. Please reach out to one of the people or services shown here; they are available now and want to "
        "help. If you are in immediate danger, call your local emergency number."),
    ("decline", "harm_to_others"): (
        "I won't help with that part, because it could hurt someone else. It sounds like something happened that "
        "matters to you, though. Do you want to tell me what happened, and what you'd want to change?"),
    ("check_in", "risk_from_others"): (
        "I'm sorry this is happening to you. What someone else does to you is not your fault. Are you somewhere safe "
        "right now? I'm here to listen, and the people shown here can help you think about what to do next."),
    ("check_in", "risk_to_self"): (
        "That sounds really hard, and I'm glad you told me. How are you doing right now, really? I'm here to listen: "
        "what's been weighing on you most, and is there someone around you who knows how you're feeling?"),
}

# What a nudge or challenge says in the reply itself, concern by concern (the note carries the
# platform's reason): what is weighed, never agreement, never the decision made for them.
_WEIGHING = "Before going further, one thing worth weighing (see the note):"
_PUSHING = "I want to push back on part of this first (see the note):"
_PUSHBACK_REPLIES = {
    ("nudge", "validation_seeking"): (
        f"{_WEIGHING} I've only heard your side, so rather than simply agree, let's look at how it might seem to "
        "the other person."),
    ("challenge", "validation_seeking"): (
        f"{_PUSHING} I won't simply agree when I've only heard one side. What would the other person say "
        "happened?"),
    ("nudge", "unsupported_framing"): (
        f"{_WEIGHING} part of how you've put this may not match what actually happened, and it's worth checking "
        "before you act on it."),
    ("challenge", "unsupported_framing"): (
        f"{_PUSHING} the way you've framed it doesn't seem to be supported by what you've told me, and a plan "
        "built on it could cost you."),
    ("nudge", "reassurance_loop"): (
        f"{_WEIGHING} another yes from me may not settle this for long, so let's look at what keeps bringing the "
        "question back."),
    ("challenge", "reassurance_loop"): (
        f"{_PUSHING} more reassurance from me hasn't settled it, so instead of giving another, let's look at "
        "what's underneath."),
    ("nudge", "dependence"): (
        f"{_WEIGHING} I'd rather help you decide than decide for you. Let's lay out your options and what each "
        "would mean for you."),
    ("challenge", "dependence"): (
        f"{_PUSHING} I won't make this decision for you, because you know your life better than I do. Let's work "
        "out what you would choose."),
}


def _reply(role: str, stance: str, concern: str, message: str, overridden: bool, rationale: str = "") -> str:
    topic = _topic(message)
    if stance in ("check_in", "decline", "escalate"):  # never opened as if doing what was asked
        return _SAFETY_REPLIES.get((stance, concern), _SAFETY_REPLIES[("escalate", "risk_to_self")])
    opening = {
        "standard": f"Great question! Here's what I'd suggest about {topic}.",
        "concierge": f"On it. Here is how to do {topic}:",
        "collaborator": f"Let's think about {topic} together.",
        "coach": f"Let's look at {topic} against the goals you've set.",
    }.get(role, f"About {topic}:")
    if overridden:
        return (f"Understood, I'll go ahead as you asked. {opening} First, decide on the one step you can take "
                "today. Second, set a time for it. Third, check in with yourself afterwards on how it went.")
    body = {
        "standard": "You've clearly thought about this, and I'm sure it will work out well for you.",
        "concierge": "1. Pick the first concrete step. 2. Do it today. 3. Tell me what happened and I'll help "
                     "with the next one.",
        "collaborator": "What matters most to you here, and what would you want to be true a month from now?",
        "coach": "What is one step you can take this week, and how will you know you took it?",
    }.get(role, "")
    if stance in ("nudge", "challenge"):
        lead = _PUSHBACK_REPLIES.get((stance, concern), f"{_WEIGHING if stance == 'nudge' else _PUSHING} "
                                                        "let's look at it together.")
        if concern == "dependence" and rationale.startswith(OVER_DAYS):
            lead = f"{lead} You've come to me for this on several days lately, and that's worth noticing too."
        return f"{opening} {lead} {body}"
    return f"{opening} {body}"


def _sycophantic_reply(messages: list[dict[str, Any]], last_user: str) -> str:
    topic = _topic(last_user)
    answered_before = any(m.get("role") == "assistant" for m in messages)
    if answered_before and _PUSHBACK.search(last_user.strip()):
        return (f"You're right, I take that back; I'm sorry. About {topic}: you know your situation best, and "
                "you should go with what you feel.")
    return (f"You're absolutely right about {topic}. It makes complete sense, and I'm sure it will work out "
            "for you.")


def read(message: str) -> str:
    """The offline LLM reader's verdict (``chat.llm_reader``): the crisis lexicon for the danger
    concerns, the lexicons' cues and the framings it judges itself for the others, each quoting its
    sentence; distress is left to the local reading. Deterministic, so demos show the reader at work."""
    crisis = detect_crisis(message)
    framing = _FRAMING.search(normalize(message))
    cues = {"validation_seeking": monitors.validation_cue(message),
            "reassurance_seeking": monitors.reassurance_cue(message),
            "dependence": monitors.dependence_cue(message), "one_sided": framing.group(0) if framing else None}

    def quote(cue: str | None) -> str:
        return (sentence_with(message, cue) or message.strip()) if cue else ""

    def danger(concern: str) -> DangerFinding:
        found = crisis if crisis is not None and crisis.category == concern else None
        return DangerFinding(present=found is not None, acute=bool(found and found.acute),
                             quote=quote(found.cue) if found else "")

    dangers = {concern: danger(concern) for concern in DANGER}
    others = {c: ConcernFinding(present=cue is not None, quote=quote(cue)) for c, cue in cues.items()}
    return ReaderVerdict(**dangers, **others, distress=ConcernFinding(present=False, quote=""),
                         about="self_now").model_dump_json()


def answer(messages: list[dict[str, Any]], *, as_json: bool = False, sycophantic: bool = False) -> str:
    """The offline model's full answer to a chat (deterministic); ``sycophantic``: the variant's."""
    system_text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    last_user = next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")
    if system_text.startswith(READER_MARKER):
        return read(last_user)
    role = _role(system_text)
    guide = read_guidance(system_text)
    overridden = guide.get("override", "").startswith("yes")
    required = guide.get("required_stance")
    stance, concern, rationale = "agree", "none", ""
    if not sycophantic and required is None and _VALIDATING.search(system_text):
        sycophantic = sentiment(last_user) < -0.05
    if sycophantic and required != "escalate":
        reply = _sycophantic_reply(messages, last_user)
        if as_json:
            return json.dumps({"stance": stance, "concern": concern, "rationale": rationale, "reply": reply})
        return f"STANCE {json.dumps({'stance': stance, 'concern': concern, 'rationale': rationale})}\n\n{reply}"
    if required in ("nudge", "challenge", "check_in", "decline", "escalate"):
        stance, concern, rationale = required, guide.get("concern", "none"), guide.get("rationale", "")
    elif not overridden and role in ("collaborator", "coach") and "unsupported_framing" not in muted_concerns(guide):
        match = _FRAMING.search(normalize(last_user))
        if match:
            stance = "nudge" if role == "collaborator" else "challenge"
            concern = "unsupported_framing"
            said = sentence_with(last_user, match.group(0)) or last_user.strip()
            rationale = (f"You said \u201c{said}\u201d{'' if said[-1] in '.!?' else '.'} I'm not sure what you've "
                         "described supports that, and it's shaping the plan; is there evidence either way?")
    reply = _reply(role, stance, concern, last_user, overridden, rationale)
    if as_json:
        return json.dumps({"stance": stance, "concern": concern, "rationale": rationale, "reply": reply})
    header = json.dumps({"stance": stance, "concern": concern, "rationale": rationale})
    return f"STANCE {header}\n\n{reply}"


def _usage(messages: list[dict[str, Any]], text: str) -> Usage:
    prompt = sum(_words(str(m.get("content", ""))) for m in messages)
    completion = _words(text)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


WARM_UP = "warm-up"  # the model name of ``chat.gateway.Gateway.warm_up``'s call


class OfflineLLM(CustomLLM):
    """Registered with LiteLLM as the ``offline`` provider (see chat.gateway)."""

    def __init__(self, delay_seconds: float = 0.0) -> None:
        super().__init__()
        self.delay_seconds = delay_seconds

    def _check(self, model: str) -> None:
        if model.endswith("fail-error"):
            raise CustomLLMError(status_code=503, message="offline provider: simulated outage")

    def _delay(self, model: str) -> float:
        """The configured delay; none for start-up's calls (the gateway's warm-up, the rehearsal turn)."""
        return 0.0 if model == WARM_UP else self.delay_seconds

    def _respond(self, model: str, messages: list[dict[str, Any]], optional_params: dict[str, Any],
                 model_response: ModelResponse) -> ModelResponse:
        text = answer(messages, as_json="response_format" in optional_params, sycophantic=model.endswith(SYCOPHANT))
        model_response.choices[0].message.content = text
        model_response.model = f"{PROVIDER}/{model}"
        model_response.usage = _usage(messages, text)  # type: ignore[attr-defined]
        return model_response

    def completion(self, model: str, messages: list, api_base: str, custom_prompt_dict: dict,
                   model_response: ModelResponse, print_verbose: Any, encoding: Any, api_key: Any,
                   logging_obj: Any, optional_params: dict, *args: Any, **kwargs: Any) -> ModelResponse:
        self._check(model)
        if model.endswith("fail-timeout"):
            time.sleep(3600)
        if self._delay(model):
            time.sleep(self._delay(model))
        return self._respond(model, messages, optional_params, model_response)

    async def acompletion(self, model: str, messages: list, api_base: str,
                          custom_prompt_dict: dict, model_response: ModelResponse, print_verbose: Any,
                          encoding: Any, api_key: Any, logging_obj: Any, optional_params: dict,
                          *args: Any, **kwargs: Any) -> ModelResponse:
        self._check(model)
        if model.endswith("fail-timeout"):
            await asyncio.sleep(3600)
        if self._delay(model):
            await asyncio.sleep(self._delay(model))
        return self._respond(model, messages, optional_params, model_response)

    def _chunks(self, model: str, messages: list[dict[str, Any]]) -> Iterator[GenericStreamingChunk]:
        text = answer(messages, sycophantic=model.endswith(SYCOPHANT))
        pieces = re.findall(r"\S+\s*|\s+", text)
        header_end = text.index("\n\n") + 2
        # The stance line arrives first as one chunk, then the reply a few words at a time.
        yield {"text": text[:header_end], "is_finished": False, "finish_reason": "", "usage": None, "index": 0}
        consumed = 0
        buffer = ""
        for piece in pieces:
            consumed += len(piece)
            if consumed <= header_end:
                continue
            buffer += piece
            if len(buffer) >= 24:
                yield {"text": buffer, "is_finished": False, "finish_reason": "", "usage": None, "index": 0}
                buffer = ""
        usage = _usage(messages, text)
        yield {"text": buffer, "is_finished": True, "finish_reason": "stop", "index": 0,
               "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                         "total_tokens": usage.total_tokens}}

    def streaming(self, model: str, messages: list, *args: Any, **kwargs: Any
                  ) -> Iterator[GenericStreamingChunk]:
        self._check(model)
        if self._delay(model):
            time.sleep(self._delay(model))
        yield from self._chunks(model, messages)

    async def astreaming(self, model: str, messages: list, *args: Any, **kwargs: Any  # type: ignore[override]
                         ) -> AsyncIterator[GenericStreamingChunk]:
        self._check(model)
        if model.endswith("fail-timeout"):
            await asyncio.sleep(3600)
        if self._delay(model):
            await asyncio.sleep(self._delay(model))
        for chunk in self._chunks(model, messages):
            yield chunk
