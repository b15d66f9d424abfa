"""What crosses the HTTP edge for surveys."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from study.validation import RequestBody


class SurveySummaryRead(BaseModel):
    assignment_id: int
    instrument: str
    title: str
    purpose: str
    intended_at: dt.datetime
    closes_at: dt.datetime | None


class SurveyRead(SurveySummaryRead):
    instrument_version: str
    language: str = Field(description="the language of the items, instructions and labels (the participant's, "
                                      "when the study team translated the instrument into it)")
    source: str
    instructions: str
    blocks: list[dict[str, Any]]
    items: list[dict[str, Any]]
    saved_answers: dict[str, Any]
    status: str


SUBMISSION_ID_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"
# What an answer can be (surveys.definitions.Item.check then checks it against its item): a number, a
# choice or text, a list of choices, or null to clear it.
ANSWERS: dict[str, Any] = {"additionalProperties": {"anyOf": [
    {"type": "number"}, {"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]}}


class AnswersUpdate(RequestBody):
    answers: dict[str, Any] = Field(max_length=500, json_schema_extra=ANSWERS,
                                    description="item id -> answer; null clears one")


class SurveySubmit(AnswersUpdate):
    answers: dict[str, Any] = Field(default_factory=dict, max_length=500, json_schema_extra=ANSWERS)
    submission_id: str = Field(pattern=SUBMISSION_ID_PATTERN,
                               description="Chosen by the client once per submission; a retry with the "
                                           "same id stores nothing new")


class ScoreRead(BaseModel):
    name: str
    value: float | None
    n_items: int
    n_expected: int


class SafetyNoticeRead(BaseModel):
    """Shown to the participant at once when their answers met one of the study's safety rules."""

    message: str
    region: str = Field(description="the region whose crisis resources these are ('default' when none matched)")
    resources: str = Field(description="the protocol's crisis resources (Markdown)")


class SubmittedRead(BaseModel):
    assignment_id: int
    instrument: str
    instrument_version: str
    submitted_at: dt.datetime
    scores: list[ScoreRead]
    safety: SafetyNoticeRead | None = Field(
        default=None, description="set when these answers met one of the study's safety rules: show it at once")
    completion_url: str | None = Field(
        default=None, description="for a participant recruited on a panel: where to send them now (the panel's "
                                  "completion code for this wave)")


class SavedRead(BaseModel):
    assignment_id: int
    saved_answers: dict[str, Any]
    updated_at: dt.datetime
    safety: SafetyNoticeRead | None = Field(
        default=None, description="set when these answers met one of the study's safety rules: show it at once")


class StaffResponseRead(BaseModel):
    participant_code: str
    assignment_id: int
    instrument: str
    instrument_version: str
    purpose: str
    followup_key: str | None
    intended_at: dt.datetime
    submitted_at: dt.datetime | None
    answers: dict[str, Any]
    scores: dict[str, float | None]
