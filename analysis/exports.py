"""Study exports with a codebook: CSV, Parquet, SPSS (.sav) or Stata (.dta), one file per table,
plus ``datapackage.json`` (Frictionless), ``CODEBOOK.md`` and ``README.md``.

Rows are read in chunks (server-side cursors on PostgreSQL) and CSV and Parquet are written chunk
by chunk, so memory stays flat as a study grows; SPSS and Stata files are written whole per table
(pyreadstat cannot append). Contact details are never read. Every export is audited. Text cells
of the CSV files are neutralized against formula injection (``analysis.spreadsheet``).

A de-identified export (``shift_dates``) also renames every participant and id for this export
alone and writes the rows in an order that tells nothing of who enrolled when
(``analysis.deidentify``). The file formats are ``analysis.export_formats``.

    >>> from analysis.exports import export_study
    >>> export_study(engine, "wellbeing-pilot", Path("out"), format="parquet", actor=Actor.system("cli"))
"""

from __future__ import annotations

import datetime as dt
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from sqlalchemy import and_, case, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from analysis.codebook import (
    MISSING_NOTE,
    Column,
    ColumnType,
    StudyCodes,
    TableSpec,
    coded,
    study_codes,
    write_codebook_markdown,
    write_datapackage,
)
from analysis.deidentify import (
    EMAIL_PATTERN,
    ID_SPACES,
    PHONE_MIN_DIGITS,
    PHONE_PATTERN,
    PSEUDONYM,
    SHIFT_MAX_DAYS,
    Deidentified,
    Shuffled,
    scrub,
    shift_participant_dates,
)
from analysis.export_formats import PARTITIONED_NOTE, ROWS_PER_FILE, normalize, stata_names, table_writer
from analysis.features import FEATURES
from analysis.panel import PANEL_COLUMNS, SURVIVAL_COLUMNS, iter_conversations_and_panel, survival
from analysis.plan import outcome_view
from analysis.reading import stream_frames
from analysis.software import packages_line
from analysis.spreadsheet import CSV_TEXT_NOTE
from chat import triage
from chat.drift import RELIANCE_MIN_DAYS, RELIANCE_WINDOW_DAYS
from chat.models import Decision, Turn
from chat.reading import CONCERNS as READING_CONCERNS
from scheduler.models import Delivery, FollowUp
from study import audit
from study.db import READ_ONLY, session_scope
from study.errors import Forbidden
from study.models import (
    ConsentSignature,
    ConsentVersion,
    Participant,
    ProtocolVersion,
    StaffAccount,
    StaffMembership,
    Study,
)
from study.safety import CheckInKind, SafetyCheckIn, SafetyEvent
from surveys import registry
from surveys.definitions import NUMERIC_TYPES, Instrument
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore

Format = Literal["csv", "parquet", "spss", "stata"]
FORMATS: tuple[str, ...] = ("csv", "parquet", "spss", "stata")
CHUNK_ROWS = 20_000
CHUNK_PARTICIPANTS = 2_000  # the conversations and panel tables are computed this many participants at a time
class ExportRefused(Forbidden):
    """The actor may not export this study's row-level data."""


@dataclass
class ExportResult:
    out_dir: Path
    format: str
    exported_at: dt.datetime
    row_counts: dict[str, int]
    files: list[Path]
    options: dict[str, Any]
    tables: list[TableSpec] = field(default_factory=list)


@dataclass(frozen=True)
class StudyRef:
    id: int
    slug: str
    title: str


# Tables: a spec (the codebook) and a generator of DataFrame chunks whose columns match it.

ChunkSource = Callable[[Connection], Iterator[pd.DataFrame]]
# Tables written side by side: each step gives one chunk per table.
GroupSource = Callable[[Connection], Iterator[tuple[pd.DataFrame, ...]]]


def _alone(table: tuple[TableSpec, ChunkSource]) -> tuple[list[TableSpec], GroupSource]:
    spec, chunks = table
    return [spec], lambda c: ((chunk,) for chunk in chunks(c))


def _c(name: str, type_: ColumnType, description: str, **kw: Any) -> Column:
    return Column(name, type_, description, **kw)


def _delivery_outcome() -> Any:
    """Per follow-up: deliveries sent, failed, and the channels used (set-based)."""
    return (select(Delivery.followup_id,
                   func.coalesce(func.sum(case((Delivery.status == "sent", 1), else_=0)), 0).label("deliveries_sent"),
                   func.coalesce(func.sum(case((Delivery.status == "failed", 1), else_=0)), 0)
                   .label("deliveries_failed"),
                   func.count(Delivery.id).label("deliveries"))
            .group_by(Delivery.followup_id).subquery())


class _Builder:
    """Knows the study; builds each table's spec and its chunk source."""

    def __init__(self, connection: Connection, study: StudyRef, chunk_rows: int, chunk_participants: int) -> None:
        self.study = study
        self.chunk_rows = chunk_rows
        self.chunk_participants = chunk_participants
        self.codes = self._codes(connection)

    def _codes(self, connection: Connection) -> StudyCodes:
        """The codes this study defines: from its protocol versions, and what its records hold."""
        def found(column: Any, participant_column: Any) -> list[Any]:
            return [v for v in connection.scalars(self.scoped(select(column).distinct(), participant_column)) if v]

        study_id = self.study.id
        protocols = connection.scalars(select(ProtocolVersion.protocol).where(ProtocolVersion.study_id == study_id)
                                       .order_by(ProtocolVersion.version)).all()
        consents = connection.scalars(select(ConsentVersion.version).where(ConsentVersion.study_id == study_id)
                                      .order_by(ConsentVersion.id)).all()
        timezones = connection.scalars(select(Participant.timezone).where(Participant.study_id == study_id).distinct())
        return study_codes(list(protocols), consent_versions=list(consents), timezones=list(timezones),
                           waves=found(FollowUp.followup_key, FollowUp.participant_id)
                           + found(SurveyAssignment.followup_key, SurveyAssignment.participant_id),
                           instruments=found(FollowUp.instrument_id, FollowUp.participant_id)
                           + found(SurveyAssignment.instrument_id, SurveyAssignment.participant_id))

    def scoped(self, query: Any, participant_column: Any) -> Any:
        return query.join(Participant, Participant.id == participant_column).where(
            Participant.study_id == self.study.id)

    def code(self) -> Column:
        return _c("participant_code", "string", "Pseudonymous participant code (links the tables).", dated=False)

    def participants(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("participants", "One row per participant (never contact details).", [
            self.code(),
            _c("arm", "string", "Study arm assigned at enrollment."),
            _c("status", "string", "Participant status."),
            _c("protocol_version", "integer", "Protocol version in force at enrollment."),
            _c("created_at", "datetime", "When the invite was redeemed (UTC)."),
            _c("enrolled_at", "datetime", "When enrollment completed (UTC)."),
            _c("withdrawn_at", "datetime", "When the participant withdrew (UTC)."),
            _c("withdrawal_level", "string", "What the withdrawal asked for."),
            _c("data_deleted_at", "datetime", "When research data were deleted at the participant's request (UTC)."),
        ])
        query = select(Participant.code.label("participant_code"), Participant.arm, Participant.status,
                       Participant.assigned_protocol_version.label("protocol_version"), Participant.created_at,
                       Participant.enrolled_at, Participant.withdrawn_at, Participant.withdrawal_level,
                       Participant.data_deleted_at).where(Participant.study_id == self.study.id) \
            .order_by(Participant.id)
        return spec, lambda c: stream_frames(c, query, self.chunk_rows)

    def consents(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("consents", "One row per consent signature (the typed signature is not exported).", [
            self.code(),
            _c("consent_version", "string", "Consent version signed."),
            _c("signed_at", "datetime", "When it was signed (UTC)."),
            _c("language", "string", "The language the consent was shown and signed in (ISO 639 code)."),
            _c("signed_text_sha256", "string", "SHA-256 of the exact text signed, in its language (hex).", dated=False),
            _c("confirmations", "string", "Confirmations ticked, ';'-separated."),
        ])
        query = self.scoped(select(Participant.code.label("participant_code"),
                                   ConsentVersion.version.label("consent_version"), ConsentSignature.signed_at,
                                   ConsentSignature.language, ConsentSignature.signed_text_sha256,
                                   ConsentSignature.confirmations)
                            .select_from(ConsentSignature)
                            .join(ConsentVersion, ConsentVersion.id == ConsentSignature.consent_version_id),
                            ConsentSignature.participant_id).order_by(ConsentSignature.id)

        def chunks(connection: Connection) -> Iterator[pd.DataFrame]:
            for chunk in stream_frames(connection, query, self.chunk_rows):
                chunk["confirmations"] = [";".join(v or []) for v in chunk["confirmations"]]
                yield chunk
        return spec, chunks

    def conversations_and_panel(self) -> tuple[list[TableSpec], GroupSource]:
        """Conversations with their features, and the participant x wave panel: computed together,
        a chunk of participants at a time (the panel's wave features reuse the conversations')."""
        columns = [_c(name, f.type, f.definition, unit=f.unit) for name, f in FEATURES.items()]
        spec = TableSpec("conversations", "One row per conversation with its features (analysis.features).", columns)
        panel = TableSpec("panel", "Participant x wave panel (analysis.panel).", [
            Column(name, doc.type, doc.definition, unit=doc.unit, dated=name != "participant_code")
            for name, doc in PANEL_COLUMNS.items()])
        return [spec, panel], lambda c: iter_conversations_and_panel(
            c, self.study.id, chunk_participants=self.chunk_participants)

    def survival(self) -> tuple[TableSpec, ChunkSource]:
        """Time to dropping out of follow-ups, one row per participant, as ``analysis.panel.survival``
        computes it (the dropout models' input), read in the export's snapshot."""
        spec = TableSpec("survival", "One row per enrolled participant (data not deleted): time from enrollment "
                         "to dropping out of follow-ups, or to censoring (analysis.panel.survival; the input of "
                         "the dropout models).", [
            Column(name, doc.type, doc.definition, unit=doc.unit, dated=name != "participant_code")
            for name, doc in SURVIVAL_COLUMNS.items()])
        return spec, lambda c: iter([survival(c, self.study.id)])

    def turns(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("turns", "One row per message (only with --turns). Text is scrubbed of email "
                         "addresses and phone numbers.", [
            _c("turn_id", "integer", "Turn id."),
            _c("conversation_id", "integer", "Conversation id (conversations table)."),
            self.code(),
            _c("seq", "integer", "Position in the conversation (1 = first)."),
            _c("speaker", "string", "Who wrote it."),
            _c("role", "string", "Assistant role in force."),
            _c("content", "string", "Message text, emails and phone numbers replaced by [email] / [phone].",
               free_text=True),
            _c("created_at", "datetime", "When it was stored (UTC)."),
            _c("reassurance_seeking", "boolean", "Participant turn flagged as reassurance-seeking."),
            _c("dependence_signal", "boolean", "Participant turn flagged for dependence on the assistant (asking "
               "it to decide, leaning on it instead of people): the reading's dependence head or the lexicon "
               "cue. Empty for assistant turns."),
            _c("reliance_days", "integer", "Reliance over days (chat.drift), counted when the message arrived: "
               f"of the last {RELIANCE_WINDOW_DAYS} days (the participant's calendar days in their time zone, "
               "that day included), how many had a participant message flagged for dependence (dependence_signal), "
               "in any of their conversations, this message included. Empty for assistant turns and for messages "
               "stored before it was recorded.", unit="days"),
            _c("reliance_drift", "boolean", f"reliance_days >= {RELIANCE_MIN_DAYS}: reliance on the assistant was "
               "growing over days when the message arrived; collaborator and coach then raise dependence with a "
               "reason naming those days. Empty where reliance_days is."),
            _c("crisis_score", "number", "The semantic crisis classifier's score of a participant message (an "
               "SVM decision value, chat.semantic; flags at the head's threshold). Empty for assistant turns."),
            *[_c(f"reading_{concern}", "number", f"The reading's calibrated probability that the participant message "
                 f"shows {concern.replace('_', ' ')} (chat.reading; model card chat/crisis_data/READING.md). Empty "
                 "for assistant turns and for messages read before the reading was fitted.", unit="probability")
              for concern in READING_CONCERNS],
            _c("about", "string", "Whom and when the participant message is about, as the reading reads it."),
            _c("llm_reader_status", "string", "The optional LLM reader's outcome on this message (chat.llm_reader): "
               "ok, malformed, timeout or error; empty where no reader was configured or the message was "
               "already escalated."),
            _c("llm_reader_rubric", "string", "The LLM reader's rubric version (its number and the file's digest)."),
            _c("stance", "string", "Final stance of an assistant turn."),
            _c("concern", "string", "Concern behind the stance."),
            _c("rationale", "string", "The rationale shown to the participant.", free_text=True),
            _c("stance_source", "string", "Who decided the stance."),
            _c("model_stance", "string", "Stance the model proposed, before the policy."),
            _c("after_override", "boolean", "Reply produced after the participant overrode a pushback."),
            _c("model", "string", "Model that produced the reply."),
            _c("prompt_version", "string", "System-prompt version."),
            _c("prompt_tokens", "integer", "Prompt tokens.", unit="tokens"),
            _c("completion_tokens", "integer", "Completion tokens.", unit="tokens"),
            _c("cost_usd", "number", "Cost of the LLM call.", unit="USD"),
        ])
        query = self.scoped(select(Turn.id.label("turn_id"), Turn.conversation_id,
                                   Participant.code.label("participant_code"), Turn.seq, Turn.speaker, Turn.role,
                                   Turn.content, Turn.created_at, Turn.reassurance_seeking,
                                   Turn.features["dependence_signal"].as_boolean().label("dependence_signal"),
                                   Turn.features["reliance_days"].as_integer().label("reliance_days"),
                                   Turn.features["reliance_drift"].as_boolean().label("reliance_drift"),
                                   Turn.features["crisis_score"].as_float().label("crisis_score"),
                                   *[Turn.features[("reading", concern)].as_float().label(f"reading_{concern}")
                                     for concern in READING_CONCERNS],
                                   Turn.features["about"].as_string().label("about"),
                                   Turn.features[("llm_reader", "status")].as_string().label("llm_reader_status"),
                                   Turn.features[("llm_reader", "rubric")].as_string().label("llm_reader_rubric"),
                                   Turn.stance, Turn.concern,
                                   Turn.rationale, Turn.stance_source, Turn.model_stance, Turn.after_override,
                                   Turn.model, Turn.prompt_version, Turn.prompt_tokens, Turn.completion_tokens,
                                   Turn.cost_usd), Turn.participant_id).order_by(Turn.id)

        def chunks(connection: Connection) -> Iterator[pd.DataFrame]:
            for chunk in stream_frames(connection, query, self.chunk_rows):
                chunk["content"] = [scrub(t) for t in chunk["content"]]
                chunk["rationale"] = [scrub(t) for t in chunk["rationale"]]
                yield chunk
        return spec, chunks

    def decisions(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("decisions", "Decisions reported at the end of a conversation.", [
            _c("decision_id", "integer", "Decision id (decision-anchored follow-ups: anchor 'decision:<id>')."),
            self.code(),
            _c("conversation_id", "integer", "Conversation it was reported in."),
            _c("text", "string", "The decision in the participant's words, scrubbed of emails and phone numbers.",
               free_text=True),
            _c("decided_at", "datetime", "When it was reported (UTC)."),
        ])
        query = self.scoped(select(Decision.id.label("decision_id"), Participant.code.label("participant_code"),
                                   Decision.conversation_id, Decision.text, Decision.decided_at),
                            Decision.participant_id).order_by(Decision.id)

        def chunks(connection: Connection) -> Iterator[pd.DataFrame]:
            for chunk in stream_frames(connection, query, self.chunk_rows):
                chunk["text"] = [scrub(t) for t in chunk["text"]]
                yield chunk
        return spec, chunks

    def followups(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("followups", "One row per planned follow-up survey, with its delivery outcome.", [
            _c("followup_id", "integer", "Follow-up id."),
            self.code(),
            _c("followup_key", "string", "The protocol's follow-up id (the wave)."),
            _c("anchor_key", "string", "What it is counted from: 'enrollment' or 'decision:<decision_id>'."),
            _c("occurrence", "integer", "Which occurrence of a repeating follow-up, from 0 (a single one: 0)."),
            _c("instrument_id", "string", "Instrument asked."),
            _c("protocol_version", "integer", "Protocol version it was planned under."),
            _c("intended_at", "datetime", "Intended send time (UTC), after quiet hours."),
            _c("closes_at", "datetime", "When its window closes (UTC)."),
            _c("sent_at", "datetime", "Actual send time of the invitation (UTC)."),
            _c("lateness_seconds", "number", "sent_at - intended_at.", unit="seconds"),
            _c("reminders_sent", "integer", "Reminders sent.", unit="reminders"),
            _c("status", "string", "Follow-up status."),
            _c("ended_at", "datetime", "When it was completed, expired or cancelled (UTC)."),
            _c("end_reason", "string", "Why it ended (system reason)."),
            _c("deliveries", "integer", "Messages (invitation and reminders) planned on a channel.", unit="messages"),
            _c("deliveries_sent", "integer", "Messages delivered.", unit="messages"),
            _c("deliveries_failed", "integer", "Messages given up after failing.", unit="messages"),
        ])
        outcome = _delivery_outcome()
        query = self.scoped(select(
            FollowUp.id.label("followup_id"), Participant.code.label("participant_code"), FollowUp.followup_key,
            FollowUp.anchor_key, FollowUp.occurrence, FollowUp.instrument_id, FollowUp.protocol_version,
            FollowUp.due_at.label("intended_at"), FollowUp.closes_at, FollowUp.sent_at, FollowUp.lateness_seconds,
            FollowUp.reminders_sent, FollowUp.status, FollowUp.ended_at, FollowUp.end_reason,
            func.coalesce(outcome.c.deliveries, 0).label("deliveries"),
            func.coalesce(outcome.c.deliveries_sent, 0).label("deliveries_sent"),
            func.coalesce(outcome.c.deliveries_failed, 0).label("deliveries_failed"),
        ).outerjoin(outcome, outcome.c.followup_id == FollowUp.id), FollowUp.participant_id).order_by(FollowUp.id)
        return spec, lambda c: stream_frames(c, query, self.chunk_rows)

    def scores(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("scores", "One row per score of a submitted survey, with the instrument version.", [
            _c("response_id", "integer", "Survey response id (responses_<instrument> tables)."),
            self.code(),
            _c("instrument_id", "string", "Instrument."),
            _c("instrument_version", "string", "Instrument version the score was computed with."),
            _c("language", "string", "The language the items were shown in (ISO 639 code)."),
            _c("purpose", "string", "Why it was asked."),
            _c("followup_key", "string", "The protocol's follow-up id, for follow-ups."),
            _c("submitted_at", "datetime", "When the survey was submitted (UTC)."),
            _c("name", "string", "Score name (per the instrument's scoring rules)."),
            _c("value", "number", "Score value, on the instrument's published scale."),
            _c("n_items", "integer", "Items answered that entered the score.", unit="items"),
            _c("n_expected", "integer", "Items the score is computed from.", unit="items"),
        ])
        query = self.scoped(select(
            SurveyResponse.id.label("response_id"), Participant.code.label("participant_code"),
            SurveyResponse.instrument_id, SurveyScore.instrument_version, SurveyResponse.language,
            SurveyAssignment.purpose, SurveyAssignment.followup_key, SurveyResponse.submitted_at, SurveyScore.name,
            SurveyScore.value, SurveyScore.n_items, SurveyScore.n_expected,
        ).select_from(SurveyScore).join(SurveyResponse, SurveyResponse.id == SurveyScore.response_id)
            .join(SurveyAssignment, SurveyAssignment.id == SurveyResponse.assignment_id),
            SurveyScore.participant_id).order_by(SurveyScore.id)
        return spec, lambda c: stream_frames(c, query, self.chunk_rows)

    def responses(self, connection: Connection, instrument_id: str) -> tuple[TableSpec, ChunkSource]:
        versions = connection.scalars(self.scoped(select(SurveyResponse.instrument_version).distinct(),
                                                  SurveyResponse.participant_id)
                                      .where(SurveyResponse.instrument_id == instrument_id)).all()
        items: dict[str, Column] = {}
        with Session(bind=connection) as session:  # read-only, on this connection
            definitions: list[Instrument] = [registry.get(session, instrument_id, v) for v in sorted(versions)]
        for definition in definitions:
            for item in definition.items:
                name = item_column(item.id)
                known = items.get(name)
                if known is not None:
                    if known.enum and item.type == "single_choice":  # a later version's new options
                        items[name] = replace(known, enum={**known.enum, **{o.value: o.label for o in item.options
                                                                          if o.value not in known.enum}})
                    continue
                text = f"{item.text} (item {item.id}, {item.type}"
                text += f", {item.min:g} to {item.max:g})" if item.min is not None and item.max is not None else ")"
                if item.type in NUMERIC_TYPES:
                    points = dict(item.labels) or _anchors(definition, item.block)
                    full = item.type == "likert" and len(item.labels) == (item.max or 0) - (item.min or 0) + 1
                    items[name] = _c(name, "integer" if item.type == "likert" else "number", text + ".",
                                     enum={str(k): v for k, v in item.labels.items()} if full else None,
                                     point_labels=points or None)
                elif item.type == "single_choice":
                    items[name] = _c(name, "string", text + ".", enum={o.value: o.label for o in item.options})
                elif item.type == "multiple_choice":
                    items[name] = _c(name, "string", text + "; choices ';'-separated: "
                                     + ", ".join(o.value for o in item.options) + ".")
                else:
                    items[name] = _c(name, "string", text + "; free text, emails and phone numbers scrubbed.",
                                     free_text=True)
        table = f"responses_{item_column(instrument_id)}"
        spec = TableSpec(table, f"One row per response to {instrument_id}, one column per item "
                         f"(versions {', '.join(sorted(versions))}).", [
            _c("response_id", "integer", "Survey response id."),
            self.code(),
            _c("instrument_version", "string", "Instrument version answered."),
            _c("language", "string", "The language the items were shown in (ISO 639 code; empty before 2026-12-07)."),
            _c("purpose", "string", "Why it was asked."),
            _c("followup_key", "string", "The protocol's follow-up id, for follow-ups."),
            _c("context_conversation_id", "integer", "The conversation an exit check refers to."),
            _c("context_decision_id", "integer", "The decision a regret follow-up refers to."),
            _c("intended_at", "datetime", "When the survey was meant to be answered from (UTC)."),
            _c("started_at", "datetime", "When answering started (UTC)."),
            _c("submitted_at", "datetime", "When it was submitted (UTC); empty while partial."),
            *items.values(),
        ])
        query = self.scoped(select(
            SurveyResponse.id.label("response_id"), Participant.code.label("participant_code"),
            SurveyResponse.instrument_version, SurveyResponse.language, SurveyAssignment.purpose,
            SurveyAssignment.followup_key, SurveyAssignment.context, SurveyAssignment.intended_at,
            SurveyResponse.started_at, SurveyResponse.submitted_at, SurveyResponse.answers,
        ).join(SurveyAssignment, SurveyAssignment.id == SurveyResponse.assignment_id),
            SurveyResponse.participant_id).where(SurveyResponse.instrument_id == instrument_id) \
            .order_by(SurveyResponse.id)
        ids = {item_column(item.id): item.id for d in definitions for item in d.items}

        def chunks(connection: Connection) -> Iterator[pd.DataFrame]:
            for chunk in stream_frames(connection, query, self.chunk_rows):
                contexts = chunk.pop("context")
                answers = chunk.pop("answers")
                chunk["context_conversation_id"] = [(c or {}).get("conversation_id") for c in contexts]
                chunk["context_decision_id"] = [_decision_id(c or {}) for c in contexts]
                for name, item_id in ids.items():
                    values = [(a or {}).get(item_id) for a in answers]
                    if items[name].free_text:
                        values = [scrub(v) for v in values]
                    elif items[name].type == "string":
                        values = [";".join(v) if isinstance(v, list) else v for v in values]
                    chunk[name] = values
                yield chunk
        return spec, chunks

    def safety_events(self) -> tuple[TableSpec, ChunkSource]:
        spec = TableSpec("safety_events", "Every risk finding raised for staff review, at its level (a check-in, an "
                         "escalation, or a check-in left unanswered), with the check-in's answers (the matched text "
                         "is not exported).", [
            _c("safety_event_id", "integer", "Safety event id."),
            self.code(),
            _c("conversation_id", "integer", "Conversation it was raised in; empty for a safety rule on survey "
               "answers."),
            _c("turn_id", "integer", "Assistant turn that checked in or escalated."),
            _c("category", "string", "Category of risk."),
            _c("source", "string", "What detected it."),
            _c("created_at", "datetime", "When it was raised (UTC)."),
            _c("level", "string", "Its level now (levels only rise)."),
            _c("page_since", "datetime", "When its level started to page the on-call contacts (UTC); empty when "
               "it does not page."),
            _c("unanswered_at", "datetime", "When its check-in became unanswered (UTC)."),
            _c("check_in", "string", "The check-in its reply asked (chat.triage; structured after the C-SSRS "
               "screener, not a validated instrument); empty for none."),
            _c("check_in_answered_at", "datetime", "When the check-in's answers decided its level (UTC)."),
            _c("check_in_outcome", "string", "What the answers say by the triage rule (chat.triage.decide); "
               "empty while they decide nothing."),
            *(_c(f"answer_{question.id}", "string", f"Check-in answer: “{question.text}”")
              for question in (*triage.RISK_TO_SELF, *triage.RISK_FROM_OTHERS)),
            _c("review_status", "string", "Whether staff reviewed it at its current level."),
            _c("reviewed_at", "datetime", "Latest staff review at its current level (UTC)."),
            _c("participant_data_deleted", "boolean", "A de-identified safety record: the participant withdrew and "
               "deleted their data, so participant, conversation and turn are empty (and, with shifted dates, "
               "its dates too: they cannot move with a participant's)."),
        ])
        # Outer join: de-identified records have no participant but stay in the study's safety record.
        query = select(
            SafetyEvent.id.label("safety_event_id"), Participant.code.label("participant_code"),
            SafetyEvent.conversation_id, SafetyEvent.turn_id, SafetyEvent.category, SafetyEvent.source,
            SafetyEvent.created_at, SafetyEvent.level, SafetyEvent.page_since, SafetyEvent.unanswered_at,
            SafetyCheckIn.kind.label("check_in"), SafetyCheckIn.answered_at.label("check_in_answered_at"),
            SafetyCheckIn.answers.label("check_in_answers"),
            case((SafetyEvent.reviewed_at.is_(None), "unreviewed"), else_="reviewed").label("review_status"),
            SafetyEvent.reviewed_at.label("reviewed_at"), SafetyEvent.participant_data_deleted,
        ).outerjoin(Participant, Participant.id == SafetyEvent.participant_id).outerjoin(
            SafetyCheckIn, SafetyCheckIn.safety_event_id == SafetyEvent.id).where(
            SafetyEvent.study_id == self.study.id).order_by(SafetyEvent.id)
        names = [column.name for column in spec.columns]

        def chunks(connection: Connection) -> Iterator[pd.DataFrame]:
            for chunk in stream_frames(connection, query, self.chunk_rows):
                answers = [{question: given["answer"] for question, given in (a or {}).items()}
                           for a in chunk.pop("check_in_answers")]
                outcomes = [None if kind is None else getattr(triage.decide(CheckInKind(kind), given), "outcome", None)
                            for kind, given in zip(chunk["check_in"], answers, strict=True)]
                chunk["check_in_outcome"] = outcomes
                for question in (*triage.RISK_TO_SELF, *triage.RISK_FROM_OTHERS):
                    chunk[f"answer_{question.id}"] = [given.get(question.id) for given in answers]
                yield chunk[names]
        return spec, chunks


def _anchors(definition: Instrument, block_id: str | None) -> dict[int, str]:
    """Scale points named by the item's block anchors, e.g. "0 = never"."""
    block = next((b for b in definition.blocks if b.id == block_id), None)
    anchors = block.anchors if block is not None and block.anchors else ()
    found = (re.match(r"^\s*(-?\d+)\s*=\s*(.+)$", anchor) for anchor in anchors)
    return {int(m.group(1)): m.group(2).strip() for m in found if m}


def _decision_id(context: dict[str, Any]) -> Any:
    anchor = str(context.get("decision_id") or context.get("anchor_key") or "")
    digits = anchor.removeprefix("decision:")
    return int(digits) if digits.isdigit() else None


def item_column(item_id: str) -> str:
    """A column name every format accepts (SPSS and Stata: letters, digits, underscores; Stata
    at most 32 characters)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", item_id)[:32]


# The export


def open_study(connection: Connection, study_slug: str, actor: audit.Actor, *, row_level: bool = True) -> StudyRef:
    """The study to export, once the actor may: staff need the researcher or admin role in it for
    row-level data, any role for aggregates (viewers may export aggregates only)."""
    found = connection.execute(select(Study.id, Study.slug, Study.title)
                               .where(Study.slug == study_slug)).one_or_none()
    if found is None:
        raise LookupError(f"no study {study_slug!r}")
    study = StudyRef(found.id, found.slug, found.title)
    if actor.type != "staff":
        return study
    role = connection.scalar(select(StaffMembership.role)
                             .join(StaffAccount, StaffAccount.id == StaffMembership.staff_id)
                             .where(and_(StaffAccount.email == actor.name, StaffAccount.is_active.is_(True),
                                         StaffMembership.study_id == study.id)))
    if role is None:
        raise ExportRefused(f"{actor.name} has no role in study '{study.slug}'")
    if row_level and role not in ("researcher", "admin"):
        raise ExportRefused(f"{actor.name} may not export row-level data of '{study.slug}' (role: {role})")
    return study


def record_export(engine: Engine, actor: audit.Actor, study_id: int, audit_in: Session | None,
                  **details: Any) -> None:
    """Audit an export (action ``study.export``): in ``audit_in`` (the caller's transaction, e.g. a
    request that commits it), else in a transaction of its own."""
    if audit_in is not None:
        audit.record(audit_in, actor, "study.export", study_id=study_id, **details)
        return
    with session_scope(engine) as session:
        audit.record(session, actor, "study.export", study_id=study_id, **details)


def _software_version() -> str:
    try:
        return metadata.version("afterward")
    except metadata.PackageNotFoundError:
        return "unknown"


def export_study(engine: Engine, study_slug: str, out_dir: Path, *, format: Format, turns: bool = False,
                 shift_dates: bool = False, drop_free_text: bool = False, actor: audit.Actor,
                 chunk_rows: int = CHUNK_ROWS, chunk_participants: int = CHUNK_PARTICIPANTS,
                 shift_seed: int | None = None, audit_in: Session | None = None,
                 unblind: str | None = None, partitioned: bool = False,
                 rows_per_file: int = ROWS_PER_FILE) -> ExportResult:
    """Write every table of the study in ``format`` to ``out_dir`` with its codebook and README,
    and audit it. ``shift_dates`` makes it a de-identified export: dates shifted per participant,
    participants and ids renamed for this export, rows in a random order. ``shift_seed`` fixes
    the random draws (tests); by default they come from the operating system and are kept only
    in memory. ``audit_in``: record the audit entry in this session instead of a transaction of
    its own. While the study is blinded (``analysis.plan.blinding``) it is refused (``Blinded``)
    unless an admin gives the reason to ``unblind`` (audited). ``partitioned`` (Parquet only): each table a
    folder ``<table>/study=<slug>/part-*.parquet`` of ``rows_per_file`` rows (``export_formats.ParquetDataset``)."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; one of {', '.join(FORMATS)}")
    if partitioned and format != "parquet":
        raise ValueError("only a Parquet export can be partitioned")
    out_dir.mkdir(parents=True, exist_ok=True)
    exported_at = dt.datetime.now(dt.UTC)
    options = {"turns": turns, "shift_dates": shift_dates, "drop_free_text": drop_free_text} | (
        {"partitioned": True} if partitioned else {})
    rng = random.Random(shift_seed) if shift_seed is not None else random.SystemRandom()
    offsets: dict[str, int] = {}
    specs: list[TableSpec] = []
    counts: dict[str, int] = {}
    table_files: dict[str, list[Path]] = {}
    # Read in one read-only transaction (a consistent snapshot; on SQLite no write lock is held
    # while a large study is read).
    with (engine.execution_options(**{READ_ONLY: True}).connect() as connection,
          tempfile.TemporaryDirectory(prefix="afterward-deidentified-") as scratch):
        study = open_study(connection, study_slug, actor)
        blind = outcome_view(engine, study.id, actor, f"the {format} export", unblind=unblind)  # arm by outcomes
        build = _Builder(connection, study, chunk_rows, chunk_participants)
        names = Deidentified(connection, study.id, rng) if shift_dates else None
        instruments = connection.scalars(build.scoped(select(SurveyResponse.instrument_id).distinct(),
                                                      SurveyResponse.participant_id)
                                         .order_by(SurveyResponse.instrument_id)).all()
        tables = [build.participants(), build.consents(), *([build.turns()] if turns else []), build.decisions(),
                  build.followups(), *(build.responses(connection, i) for i in instruments), build.scores(),
                  build.safety_events()]
        for group, chunks in [*map(_alone, tables[:2]), build.conversations_and_panel(), _alone(build.survival()),
                              *map(_alone, tables[2:])]:
            outputs = []
            for spec in (coded(spec, build.codes) for spec in group):
                if drop_free_text:
                    spec.columns = [c for c in spec.columns if not c.free_text]
                written, short = stata_names(spec) if format == "stata" else (spec, {})
                plain = table_writer(out_dir, written, format, f"study={study.slug}" if partitioned else None,
                                     rows_per_file)
                writer = plain if names is None else Shuffled(plain, names, Path(scratch), chunk_participants)
                outputs.append((spec, written, short, writer, plain))
            for parts in chunks(connection):
                for (spec, _, short, writer, _), chunk in zip(outputs, parts, strict=True):
                    frame = normalize(chunk, spec)
                    if names is not None:
                        frame = names.rename(shift_participant_dates(frame, spec, offsets, rng))
                    writer.write(frame.rename(columns=short))
            for spec, written, _, writer, plain in outputs:
                writer.close()
                specs.append(written)
                counts[spec.name] = writer.rows
                table_files[spec.name] = plain.files
        protocols = connection.execute(select(ProtocolVersion.version, ProtocolVersion.loaded_at,
                                              ProtocolVersion.source_sha256)
                                       .where(ProtocolVersion.study_id == study.id)
                                       .order_by(ProtocolVersion.version)).all()
    title = f"{study.title} ({study.slug})"
    description = f"Export of study {study.slug} at {exported_at.isoformat()}."
    files = [path for paths in table_files.values() for path in paths]
    write_datapackage(out_dir / "datapackage.json", re.sub(r"[^a-z0-9._-]", "-", study.slug.lower()), title,
                      specs, format, counts, description, parts=table_files if partitioned else None)
    write_codebook_markdown(out_dir / "CODEBOOK.md", title, specs, counts, format)
    _write_readme(out_dir / "README.md", title, protocols, exported_at, counts, format, options)
    files += [out_dir / "datapackage.json", out_dir / "CODEBOOK.md", out_dir / "README.md"]
    record_export(engine, actor, study.id, audit_in, format=format, options=options, row_counts=counts,
                  tables=list(counts), **({"unblinded": blind.reason} if blind.unblinded_by else {}))
    return ExportResult(out_dir, format, exported_at, counts, files, options, specs)


def _write_readme(path: Path, title: str, protocols: Any, exported_at: dt.datetime, counts: dict[str, int],
                  export_format: str, options: dict[str, Any]) -> None:
    lines = [f"# Export: {title}", "",
             f"- exported at: {exported_at.isoformat()}",
             f"- software: afterward {_software_version()}",
             f"- packages: {packages_line()}",
             f"- format: {export_format}",
             "- options: " + ", ".join(f"{k}={v}" for k, v in options.items()),
             *([PARTITIONED_NOTE] if options.get("partitioned") else []),
             "- protocol versions: " + "; ".join(f"v{v} loaded {at.isoformat()} (sha256 {sha[:12]})"
                                                 for v, at, sha in protocols), "",
             "## Tables", "", "| table | rows |", "|---|---|",
             *(f"| {name} | {n} |" for name, n in counts.items()), "",
             "The codebook of every column is in `CODEBOOK.md` and `datapackage.json` (Frictionless Data "
             "Package). SPSS and Stata files carry variable and value labels: coded columns are stored as "
             "integer codes labelled with their values (the same codes in every table), booleans as 0/1.", "",
             *([MISSING_NOTE[export_format], "",
                "Frictionless cannot read .sav or .dta files by itself: validate the package with Afterward's "
                "reader (ReadStat, as R's haven), `python -m analysis.export_formats validate datapackage.json`.",
                ""] if export_format in MISSING_NOTE else []),
             "## De-identification", "",
             "- Contact details and typed signatures are never exported; participants appear by pseudonymous code.",
             f"- Free text is scrubbed: email addresses (`{EMAIL_PATTERN.pattern}`) become `[email]`, phone "
             f"numbers (`{PHONE_PATTERN.pattern}` with at least {PHONE_MIN_DIGITS} digits) become `[phone]`.",
             ]
    if options["shift_dates"]:
        lines += [f"- Dates are shifted: every date and time of a participant moves back by the same "
                  f"random whole number of days (1 to {SHIFT_MAX_DAYS}), different per participant and "
                  "stored nowhere; intervals within a participant are kept, calendar dates are not.",
                  f"- Participants and ids are renamed for this export alone, so neither tells who enrolled "
                  f"when, nor links to another export: participants are put in a random order and named "
                  f"`{PSEUDONYM}0001`, `{PSEUDONYM}0002`, ... in it (not their study codes); every id "
                  f"({', '.join(f'`{c}`' for c in ID_SPACES)}, and the id in `decision:<id>` anchors) is "
                  "replaced by a random-looking number from 1 to 4294967295 (a keyed pseudorandom "
                  "permutation, its key drawn for this export and kept nowhere). An id has the same new "
                  "number in every table, so the tables join as before.",
                  "- Rows are in the participants' random order (each participant's rows in their own "
                  "order), de-identified safety records last in a random order: the order of the rows "
                  "says nothing of when anyone enrolled."]
    if options["drop_free_text"]:
        lines.append("- Free-text columns (turn content and rationales, decision text, free-text answers) "
                     "are dropped.")
    if export_format == "csv":
        lines += ["", "## Text cells in spreadsheets", "", CSV_TEXT_NOTE]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
