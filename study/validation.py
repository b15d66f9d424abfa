"""One validator per kind of input, used by the API's schemas and the participant pages alike.

Each check raises ``ValueError`` with a message a person can act on; pydantic turns that into a
422 naming the field, and the pages show it beside the form. Nothing here knows about HTTP.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
from typing import Annotated, Any, ClassVar

from email_validator import SPECIAL_USE_DOMAIN_NAMES, EmailNotValidError, validate_email
from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema, model_validator

# PostgreSQL's integer and SQLite's are different widths; ids are issued from 1 and fit PostgreSQL's.
MAX_ROW_ID = 2**31 - 1
# Datetimes a study can sensibly name: not before the platform existed, not centuries ahead.
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(2200, 1, 1, tzinfo=dt.UTC)
NUL_MESSAGE = "must not contain NUL (\\0) characters"
# The same rules as the OpenAPI document states them (patterns are Python's, as the checks are):
# a character ``text`` takes, and a moment ``aware_datetime`` takes (RFC 3339, 2000-2199).
TEXT_REFUSED = "\\x00"  # the inside of a regex character class
TEXT_CHAR = f"[^{TEXT_REFUSED}]"
TEXT_PATTERN = f"^{TEXT_CHAR}*$"
NOT_BLANK_PATTERN = f"^{TEXT_CHAR}*[^\\s{TEXT_REFUSED}]{TEXT_CHAR}*$"  # some text besides whitespace
_MINUTE = r"^2[01]\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d"
_SECONDS = r":[0-5]\d(\.\d{1,6})?"
_OFFSET = r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
DATETIME_PATTERN = f"{_MINUTE}{_SECONDS}{_OFFSET}$"
LOCAL_DATETIME_PATTERN = f"{_MINUTE}({_SECONDS})?{_OFFSET}?$"  # with an offset or without (a wall-clock time)


def text(value: str) -> str:
    """Text that every database can store."""
    if "\x00" in value:
        raise ValueError(NUL_MESSAGE)
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


def clean_json(value: Any, where: str = "") -> Any:
    """Reject what JSON columns cannot store faithfully: NUL in text (keys too) and NaN or infinity."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where or 'text'} {NUL_MESSAGE}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'number'} must be a finite number (not NaN or infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            clean_json(key, where)
            clean_json(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            clean_json(item, f"{where}[{index}]")
    return value


Text = Annotated[str, AfterValidator(text)]
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
    """Base of every request body: unknown fields refused, and no NUL or non-finite number anywhere."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema, model: _stated(schema, model))
    # A rule between fields, as its JSON schema states it (e.g. {"oneOf": [...]}); a validator checks it.
    schema_rules: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        return clean_json(data)
