"""One validator per kind of input, used by the API's schemas and the participant pages alike.

Each check raises ``ValueError`` with a message a person can act on; pydantic turns that into a
422 naming the field, and the pages show it beside the form. Nothing here knows about HTTP.

Text: every string a participant or staff member sends (request bodies, their keys included, page
forms, and the address's strings that are echoed or stored) passes ``text``, per kind of character:

- refused: lone UTF-16 surrogates (not characters: no database or encoder can store them, and the
  missing half cannot be guessed; browsers' forms never send one), NUL (PostgreSQL cannot store it)
  and the other C0/C1 control characters and DEL (invisible, no meaning in typed text, and they can
  drive the terminal a CLI or log is read in). Tab and line breaks are allowed except in one-line
  fields (``Line``).
- normalized: line breaks to ``\\n`` (browsers send a textarea's as ``\\r\\n``); the bidirectional
  embedding, override and isolate controls (U+202A-U+202E, U+2066-U+2069) are removed, because they
  reorder how the text around them is shown (staff would read a message in another order than it was
  written) while carrying no letter, and RTL keyboards and copy-paste add them unseen, so refusing
  them would reject text its writer cannot see to fix; then Unicode NFC, so one character has one
  form (lengths, search and lexicon matching count the same; nothing visible changes).
- kept: the marks LRM, RLM and ALM (U+200E, U+200F, U+061C): they only set the direction of
  neighbouring punctuation, cannot reorder a run of text, and RTL writers type them on purpose.

A ``Secret`` (a password) is checked but never rewritten: it is compared exactly as typed.

The OpenAPI document states the same rules (``state_text_rule``, ``Line``'s pattern), built from
the one definition of the refused characters, ``TEXT_REFUSED``: its patterns say what is accepted,
so the removed bidi controls are acceptable there (they are just not counted as visible text).
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
import unicodedata
from typing import Annotated, Any, ClassVar

from email_validator import SPECIAL_USE_DOMAIN_NAMES, EmailNotValidError, validate_email
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError

# PostgreSQL's integer and SQLite's are different widths; ids are issued from 1 and fit PostgreSQL's.
MAX_ROW_ID = 2**31 - 1
# Datetimes a study can sensibly name: not before the platform existed, not centuries ahead.
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(2200, 1, 1, tzinfo=dt.UTC)
NUL_MESSAGE = "must not contain NUL (\\0) characters"
# The same rules as the OpenAPI document states them (patterns are Python's, as the checks are; the
# escapes read the same in ECMA-262): the characters ``checked`` refuses (the inside of a regex
# character class: C0 but tab and line breaks, DEL, C1), a character ``text`` takes, one ``line``
# takes, and a moment ``aware_datetime`` takes (RFC 3339, 2000-2199). ``checked`` refuses lone
# surrogates too, which no pattern names: they are not characters, a JSON schema's strings and
# patterns are Unicode text (validators refuse a pattern naming them), and no such text holds one.
TEXT_REFUSED = "\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f"
BIDI_CONTROLS = "\\u202a-\\u202e\\u2066-\\u2069"  # removed by ``text`` (the inside of a class too)
TEXT_CHAR = f"[^{TEXT_REFUSED}]"
LINE_CHAR = f"[^{TEXT_REFUSED}\\t\\n\\r]"
SPACE = f"[^\\S{TEXT_REFUSED}]"  # whitespace that is not refused (Python's \s takes some C0 and C1)
VISIBLE = f"[^\\s{TEXT_REFUSED}{BIDI_CONTROLS}]"  # a character besides whitespace that ``text`` keeps
TEXT_PATTERN = f"^{TEXT_CHAR}*$"
LINE_PATTERN = f"^{LINE_CHAR}*(?!\\n)$"  # (Python's $ also matches before a last line break)
NOT_BLANK_PATTERN = f"^{TEXT_CHAR}*{VISIBLE}{TEXT_CHAR}*$"  # some text besides whitespace
_LEAP_YEAR = r"(20(00|0[48]|[2468][048]|[13579][26])|21(0[48]|[2468][048]|[13579][26]))"  # 2100 is not
_DAY = (r"(2[01]\d\d-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
        f"|{_LEAP_YEAR}-02-29)")  # a day of the calendar
_MINUTE = f"^{_DAY}T([01]\\d|2[0-3]):[0-5]\\d"
_SECONDS = r":[0-5]\d(\.\d{1,6})?"
_OFFSET = r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
DATETIME_PATTERN = f"{_MINUTE}{_SECONDS}{_OFFSET}$"
LOCAL_DATETIME_PATTERN = f"{_MINUTE}({_SECONDS})?{_OFFSET}?$"  # with an offset or without (a wall-clock time)
_REFUSED = re.compile(f"[{TEXT_REFUSED}\\ud800-\\udfff]")
_BIDI_CONTROLS = dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A)])  # str.translate: remove
_LINE_BREAK = re.compile("[\t\n]")


def checked(value: str) -> str:
    """``value`` unchanged, or ValueError naming the first character that is refused and where."""
    found = _REFUSED.search(value)
    if found is None:
        return value
    char, at = found.group(), found.start() + 1
    if char == "\x00":
        raise ValueError(NUL_MESSAGE)
    if "\ud800" <= char <= "\udfff":
        raise ValueError(f"has a broken character at position {at} (U+{ord(char):04X}, one half of a UTF-16 "
                         "surrogate pair): send whole characters, e.g. both halves of an emoji, as UTF-8")
    raise ValueError(f"has an invisible control character at position {at} (U+{ord(char):04X}); remove it")


def text(value: str) -> str:
    """Text as every database stores it and staff read it (see the module's docstring), or ValueError."""
    value = checked(value).replace("\r\n", "\n").replace("\r", "\n").translate(_BIDI_CONTROLS)
    return unicodedata.normalize("NFC", value)


def line(value: str) -> str:
    """``text`` on one line: no tab or line break."""
    value = text(value)
    found = _LINE_BREAK.search(value)
    if found is not None:
        raise ValueError(f"must be one line: remove the line break or tab at position {found.start() + 1}")
    return value


def email_address(value: str) -> str:
    """Exactly one deliverable-looking address, normalized; no display name, list or header."""
    value = value.strip()
    if any(c in value for c in "\r\n\x00,;<>"):
        raise ValueError("give one email address only, like name@example.org")
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(f"this email address does not look right: {exc}") from None


def aware_datetime(value: dt.datetime) -> dt.datetime:
    """A moment in time: with a time zone, between 2000 and 2200."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("give a time zone, e.g. 2026-12-31T12:00:00Z")
    if not EARLIEST <= value <= LATEST:
        raise ValueError(f"must be between {EARLIEST:%Y} and {LATEST:%Y}")
    return value.astimezone(dt.UTC)


def form_int(raw: object, *, lo: int, hi: int) -> int | None:
    """A whole number from a form field, or None when it is missing or not one in [lo, hi]."""
    value = str(raw if raw is not None else "").strip()
    if not value.isascii() or not value.lstrip("-").isdigit() or len(value) > 12:
        return None
    number = int(value)
    return number if lo <= number <= hi else None


class _Verbatim:
    """Marks a field that ``RequestBody`` checks but does not rewrite."""


class _Pattern:
    """States ``pattern`` in a string's JSON schema, beside its other rules (lengths)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core)
        schema["pattern"] = self.pattern
        return schema


def storable(value: Any, at: tuple[str | int, ...], problems: list[InitErrorDetails], *,
             verbatim: frozenset[str] = frozenset()) -> Any:
    """``value`` (parsed JSON) with every string and key through ``text``; what JSON columns cannot
    store faithfully (NaN, infinity) and refused text are added to ``problems``, located by ``at``.
    Top-level keys in ``verbatim`` are only ``checked``."""
    def problem(message: str, where: tuple[str | int, ...]) -> None:
        problems.append(InitErrorDetails(type=PydanticCustomError("invalid_text", "{problem}", {"problem": message}),
                                         loc=where, input=None))

    if isinstance(value, str):
        try:
            return checked(value) if at and at[0] in verbatim else text(value)
        except ValueError as exc:
            problem(str(exc), at)
    elif isinstance(value, float) and not math.isfinite(value):
        problem("must be a finite number (not NaN or infinity)", at)
    elif isinstance(value, dict):
        clean: dict[Any, Any] = {}
        for key, item in value.items():
            try:
                key = text(key) if isinstance(key, str) else key
            except ValueError as exc:  # the key itself is never echoed: it may not even be encodable
                problem(f"a key {exc}", at)
                continue
            clean[key] = storable(item, (*at, key), problems, verbatim=verbatim)
        return clean
    elif isinstance(value, list | tuple):
        return [storable(item, (*at, index), problems, verbatim=verbatim) for index, item in enumerate(value)]
    return value


Line = Annotated[str, AfterValidator(line), _Pattern(LINE_PATTERN)]
Secret = Annotated[str, _Verbatim()]  # stated as text (``state_text_rule``): it is checked the same
# validate_email refuses the special-use domains (name@example.test): the pattern says so, in any case.
_SPECIAL_USE = "|".join("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in name)
                        for name in SPECIAL_USE_DOMAIN_NAMES)
EmailAddress = Annotated[str, AfterValidator(email_address), WithJsonSchema(
    {"type": "string", "format": "email", "maxLength": 254, "pattern": f"^(?!.*@(.+\\.)?({_SPECIAL_USE})$)"})]
AwareDatetime = Annotated[dt.datetime, AfterValidator(aware_datetime),
                          WithJsonSchema({"type": "string", "format": "date-time", "pattern": DATETIME_PATTERN})]


def _stated(schema: dict[str, Any], model: Any) -> None:
    schema.update(copy.deepcopy(model.schema_rules))
    state_text_rule(schema)


def state_text_rule(schema: dict[str, Any]) -> None:
    """In a request's JSON schema, the rule ``RequestBody`` checks: every string (keys of free-form
    objects too) without a pattern, format or enum of its own gets ``TEXT_PATTERN``."""
    if schema.get("type") == "string" and not {"pattern", "format", "enum", "const"} & set(schema):
        schema["pattern"] = TEXT_PATTERN
    if schema.get("type") == "object" and schema.get("additionalProperties", True) is not False:
        schema.setdefault("propertyNames", {"pattern": TEXT_PATTERN})
    for value in schema.values():
        for node in value if isinstance(value, list) else [value]:
            if isinstance(node, dict):
                state_text_rule(node)


class RequestBody(BaseModel):
    """Base of every request body: unknown fields refused, every string (keys too) through ``text``
    (``Secret`` fields only checked), and no non-finite number anywhere."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema, model: _stated(schema, model))
    # A rule between fields, as its JSON schema states it (e.g. {"oneOf": [...]}); a validator checks it.
    schema_rules: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        verbatim = frozenset(name for name, field in cls.model_fields.items()
                             if any(isinstance(meta, _Verbatim) for meta in field.metadata))
        problems: list[InitErrorDetails] = []
        data = storable(data, (), problems, verbatim=verbatim)
        if problems:  # one error per refused string, each at its own field (pydantic keeps the locations)
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return data
