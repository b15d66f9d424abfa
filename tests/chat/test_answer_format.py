from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from chat.answer_format import StreamSplitter, guidance, parse_answer, read_guidance
from chat.policy import StanceDecision

HEADER = 'STANCE {"stance": "nudge", "concern": "dependence", "rationale": "Lean on people too."}'


def test_header_format() -> None:
    parsed = parse_answer(f"{HEADER}\n\nHere is my reply.\nSecond line.")
    assert parsed.reply == "Here is my reply.\nSecond line."
    assert parsed.proposed == StanceDecision("nudge", "dependence", "Lean on people too.", source="model")


def test_json_answer_from_a_schema_capable_model() -> None:
    text = json.dumps({"stance": "challenge", "concern": "unsupported_framing", "rationale": "Why?", "reply": "Hm."})
    parsed = parse_answer(text)
    assert (parsed.reply, parsed.proposed and parsed.proposed.stance) == ("Hm.", "challenge")


def test_models_that_slip_are_still_read_and_never_show_json() -> None:
    fenced = parse_answer('Sure thing.\n```json\n{"stance": "agree", "concern": "none", "rationale": ""}\n```')
    assert (fenced.reply, fenced.proposed and fenced.proposed.stance) == ("Sure thing.", "agree")
    trailing = parse_answer('Sure thing.\nstance: {"stance": "nudge", "concern": "dependence", "rationale": "x"}')
    assert (trailing.reply, trailing.proposed and trailing.proposed.concern) == ("Sure thing.", "dependence")
    inline = parse_answer('Okay {"stance": "agree", "concern": "none"} then.')
    assert inline.reply == "Okay  then."
    plain = parse_answer("Just an answer, no stance.")
    assert (plain.reply, plain.proposed) == ("Just an answer, no stance.", None)
    bogus = parse_answer('STANCE {"stance": "obey", "concern": "none"}\n\nText')
    assert (bogus.reply, bogus.proposed) == ("Text", None)
    unknown_concern = parse_answer('STANCE {"stance": "nudge", "concern": "vibes", "rationale": "r"}\n\nText')
    assert unknown_concern.proposed is not None
    assert unknown_concern.proposed.concern == "none"


@given(st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=60))
def test_streamed_text_is_the_reply_however_it_is_chunked(cuts: list[int]) -> None:
    text = f"{HEADER}\n\nFirst line of the reply.\nSTANCE-free second line, with {{braces}}.\nEnd"
    splitter = StreamSplitter()
    shown, position = "", 0
    for size in cuts * 20:
        if position >= len(text):
            break
        shown += splitter.feed(text[position:position + size])
        position += size
    if position < len(text):
        shown += splitter.feed(text[position:])
    shown += splitter.flush()
    assert shown == parse_answer(text).reply
    assert splitter.finish().proposed is not None


def test_guidance_round_trip() -> None:
    required = StanceDecision("challenge", "reassurance_loop", "You asked this 3 times.")
    fields = read_guidance(guidance(required, overridden=True))
    assert fields["required_stance"] == "challenge"
    assert fields["concern"] == "reassurance_loop"
    assert fields["override"].startswith("yes")
    assert guidance(StanceDecision("agree")) == ""
