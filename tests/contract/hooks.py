"""A schemathesis check the runner loads (SCHEMATHESIS_HOOKS): a schema-valid request may be
refused with 422 only for a rule about the study's data or state that its operation's documented
422 names by code (``(code x)`` or ``(codes x, y)`` in the description: answers that do not fit the
survey's instrument, an arm the study does not have, a return code nobody holds). A 422 with any
other code, ``validation_error`` above all, is a rule the schema does not state.

The built-in positive_data_acceptance check runs too, with 422 among its expected statuses (the
runner's schemathesis.toml), so every other status it refuses still fails the run."""

from __future__ import annotations

import re
from typing import Any

import schemathesis

DOCUMENTED_CODES = re.compile(r"\(codes? ([a-z_]+(?:, [a-z_]+)*)\)")


@schemathesis.check
def refused_only_for_documented_data_rules(ctx: Any, response: Any, case: Any) -> None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return
    code = response.json().get("error", {}).get("code")
    documented = case.operation.definition.raw.get("responses", {}).get("422", {}).get("description", "")
    allowed = {name for names in DOCUMENTED_CODES.findall(documented) for name in names.split(", ")}
    allowed.discard("validation_error")
    if code not in allowed:
        raise AssertionError(
            f"A schema-valid request was refused with 422 {code}: a rule the schema does not state. "
            f"State it in the schema, or (a rule about the study's data) name the code in the operation's 422 "
            f"description; documented here: {', '.join(sorted(allowed)) or 'none'}")
