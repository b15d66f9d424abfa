"""The participant x wave panel and the survival (attrition) table, read set-based: a few SQL
queries for the whole study (participants, survey assignments with their responses and scores,
follow-ups with their deliveries and decisions), shaped with pandas. No ORM objects.

A wave is ``baseline`` or one of the protocol's follow-up keys. Enrollment-anchored follow-ups give
one row per participant and key; a decision-anchored follow-up (e.g. ``regret-day-3``) gives one
row per decision it asks about, with ``anchor_key`` ``decision:<id>``, ``decision_id`` and
``decision_conversation_id`` filled; a repeating follow-up (a daily diary) one row per occurrence,
numbered by ``occurrence``; so (participant_code, wave, anchor_key, occurrence) is the row's key.

    >>> from analysis.panel import panel, survival, PANEL_COLUMNS
    >>> frame = panel(engine, "wellbeing-pilot")
    >>> frame[frame.wave == "perma-week-1"].groupby("arm").perma_overall_wellbeing.mean()
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from sqlalchemy import String, and_, case, cast, func, literal, or_, select, union_all
from sqlalchemy.engine import Connection

from analysis.features import (
    WAVE_FEATURES,
    Scope,
    _conversation_features,
    _conversation_roles,
    _wave_features,
    participant_chunks,
    participant_roles,
    starting_role,
)
from analysis.reading import Source, connect, read_frame, resolve_study_id
from chat.models import Conversation, Decision
from scheduler.models import Delivery, FollowUp
from study.clock import now
from study.models import Participant, ProtocolVersion
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore

PERMA = "perma-profiler"
REGRET = "decision-regret"
PERMA_SCORES = ("positive_emotion", "engagement", "relationships", "meaning", "accomplishment",
                "negative_emotion", "health", "loneliness", "happiness", "overall_wellbeing")
STATUSES = ("completed", "open", "expired", "withdrawn", "not_yet_due", "overdue", "cancelled", "not_assigned")
WITHDREW = "participant withdrew"  # the end_reason the scheduler's withdrawal hook writes
DAY_SECONDS = 86_400.0
# Wave features that are keys or times of the wave itself, not conversation features.
_WAVE_KEYS = ("participant_code", "followup_key", "anchor_key", "occurrence", "intended_at", "window_start")


@dataclass(frozen=True)
class Column:
    """One panel or survival column for the codebook: meaning, Frictionless type, unit."""

    definition: str
    type: Literal["integer", "number", "string", "boolean", "datetime"]
    unit: str | None = None


PANEL_COLUMNS: dict[str, Column] = {
    "participant_code": Column("Pseudonymous participant code.", "string"),
    "arm": Column("Study arm the participant was assigned to.", "string"),
    "mode": Column("Assistant mode of the arm (the protocol in force): wellbeing or default.", "string"),
    "roles_used": Column("Roles used in any of the participant's conversations, ';'-separated, alphabetical; "
                         "empty without conversations.", "string"),
    "first_role": Column("Starting role of the participant's first conversation; empty without conversations.",
                         "string"),
    "participant_status": Column("Participant status when the data were read: enrolled or withdrawn.", "string"),
    "enrolled_at": Column("When enrollment completed (UTC); the origin of enrollment-anchored waves.", "datetime"),
    "withdrawn_at": Column("When the participant withdrew (UTC); empty if not withdrawn.", "datetime"),
    "timezone": Column("Baseline covariate: the participant's IANA time zone.", "string"),
    "timezone_region": Column("Baseline covariate: the time zone's region (its part before the first '/', "
                              "e.g. Europe, America).", "string"),
    **{f"baseline_perma_{name}": Column(f"Baseline PERMA-Profiler score '{name}' (mean of its answered items); "
                                        "empty if the baseline was not submitted.", "number", "points (0-10)")
       for name in PERMA_SCORES},
    "wave": Column("The wave: 'baseline' or the protocol's follow-up key.", "string"),
    "anchor_key": Column("What the wave is counted from: 'enrollment' or 'decision:<id>' (one row per decision "
                         "for decision-anchored follow-ups).", "string"),
    "occurrence": Column("Which occurrence of a repeating follow-up (a daily diary, say), from 0; 0 for a single "
                         "follow-up and for baseline. (participant_code, wave, anchor_key, occurrence) is the row's "
                         "key.", "integer"),
    "decision_id": Column("For a decision-anchored wave: the decision it asks about; else empty.", "integer"),
    "decision_conversation_id": Column("For a decision-anchored wave: the conversation the decision was "
                                       "reported in; else empty.", "integer"),
    "instrument_id": Column("The wave's instrument.", "string"),
    "instrument_version": Column("Version of the instrument the participant was given; empty if the survey "
                                 "was never opened.", "string"),
    "intended_at": Column("Intended survey time (UTC): the follow-up's due time, moved out of quiet hours; for "
                          "baseline, when it was assigned.", "datetime"),
    "intended_local": Column("Intended time on the participant's wall clock, as the protocol asked for it "
                             "(before quiet hours); empty for baseline.", "string"),
    "days_since_enrollment": Column("intended_at - enrolled_at.", "number", "days"),
    "closes_at": Column("When the survey window closes (UTC); empty for a baseline without a window.",
                        "datetime"),
    "opened_at": Column("When the dispatcher opened the survey (UTC); for baseline, when it was assigned; "
                        "empty if never opened.", "datetime"),
    "invitation_sent_at": Column("Earliest invitation delivered on any channel (UTC; in-app counts as "
                                 "delivered when opened); empty if none.", "datetime"),
    "response_started_at": Column("When the participant first saved an answer (UTC); empty if never.",
                                  "datetime"),
    "submitted_at": Column("When the response was submitted (UTC); empty if not submitted.", "datetime"),
    "response_status": Column("completed; open (sent, window open, not answered); expired (window closed "
                              "unanswered); withdrawn (cancelled because the participant withdrew); not_yet_due "
                              "(planned, due later); overdue (planned, due time passed, not opened yet); "
                              "cancelled (for another reason); not_assigned (baseline never assigned).", "string"),
    **{f"perma_{name}": Column(f"This wave's PERMA-Profiler score '{name}'; empty unless a PERMA wave was "
                               "submitted.", "number", "points (0-10)") for name in PERMA_SCORES},
    "regret": Column("This wave's Decision Regret Scale score for the decision it refers to; empty unless a "
                     "regret wave was submitted.", "number", "points (0-100, 100 = high regret)"),
    **{f"conv_{name}": Column("Conversations started before the wave's intended time (cumulative; empty for "
                              f"baseline): {feature.definition}", feature.type, feature.unit)
       for name, feature in WAVE_FEATURES.items() if name not in _WAVE_KEYS},
}

SURVIVAL_COLUMNS: dict[str, Column] = {
    "participant_code": PANEL_COLUMNS["participant_code"],
    "arm": PANEL_COLUMNS["arm"],
    "mode": PANEL_COLUMNS["mode"],
    "roles_used": PANEL_COLUMNS["roles_used"],
    "first_role": PANEL_COLUMNS["first_role"],
    "enrolled_at": PANEL_COLUMNS["enrolled_at"],
    "duration_days": Column("The analysis time, from enrollment: for stopped_answering and end_of_follow_up rows "
                            "the scheduled close of event_wave (the median over the study's participants of that "
                            "window's close in days since enrollment, the same for everyone); for data_cut rows "
                            "event_at - enrolled_at or, if earlier, one second before the scheduled close of the "
                            "first window whose outcome is not known yet; for withdrew rows event_at - enrolled_at.",
                            "number", "days"),
    "event": Column("1 = the participant stopped answering (event_type stopped_answering); 0 = not seen to stop: "
                    "withdrew first (the competing event), reached the end of follow-up, or still in follow-up when "
                    "the data were read (censored_because says which).", "integer"),
    "event_type": Column("stopped_answering: missed an enrollment-anchored follow-up and answered none after it, "
                         "with none left to answer; withdrew: withdrew before stopping answering, cancelling a "
                         "follow-up still to be answered (a competing event); censored: neither.", "string"),
    "event_at": Column("When (UTC): for stopped_answering the close of the first missed window after the last "
                       "answered one; for withdrew the withdrawal; for censored rows the end of follow-up (the last "
                       "window's close) or, while a window's outcome is still to come, the time the data were "
                       "read.",
                       "datetime"),
    "event_wave": Column("The follow-up at whose close the row ends: the missed one (stopped_answering) or the "
                         "last one (end_of_follow_up); empty otherwise.", "string"),
    "censored_because": Column("Why event is 0: withdrew (the competing event), end_of_follow_up (every window "
                               "closed with no miss after the last answer) or data_cut (a window's outcome still to "
                               "come when the data were read: a window open or due, or a missed one with a later "
                               "one to come); empty when event is 1.", "string"),
}


def _protocol_modes(connection: Connection, study_id: int) -> dict[str, str]:
    """Arm name -> mode, from the protocol version in force."""
    document = connection.scalar(select(ProtocolVersion.protocol).where(ProtocolVersion.study_id == study_id)
                                 .order_by(ProtocolVersion.version.desc()).limit(1))
    return {arm["name"]: arm["mode"] for arm in (document or {}).get("arms", [])}


def _people(connection: Connection, scope: Scope) -> pd.DataFrame:
    """Enrolled participants whose data were not deleted."""
    people = read_frame(connection, select(
        Participant.id.label("participant_id"), Participant.code.label("participant_code"), Participant.arm,
        Participant.status.label("participant_status"), Participant.enrolled_at, Participant.withdrawn_at,
        Participant.timezone,
    ).where(*_enrolled(scope)).order_by(Participant.code))
    people["enrolled_at"] = pd.to_datetime(people["enrolled_at"], utc=True)
    people["withdrawn_at"] = pd.to_datetime(people["withdrawn_at"], utc=True)
    return people


def _scores(connection: Connection, scope: Scope) -> pd.DataFrame:
    """PERMA and regret scores, one row per assignment, columns perma_<name> and regret."""
    rows = read_frame(connection, scope.apply(select(
        SurveyResponse.assignment_id, SurveyResponse.instrument_id, SurveyScore.name, SurveyScore.value,
    ).join(SurveyScore, SurveyScore.response_id == SurveyResponse.id), SurveyResponse.participant_id)
        .where(SurveyResponse.instrument_id.in_((PERMA, REGRET)), SurveyResponse.submitted_at.is_not(None)))
    columns = [f"perma_{name}" for name in PERMA_SCORES] + ["regret"]
    if rows.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="assignment_id"), dtype=float)
    rows["column"] = np.where(rows["instrument_id"] == PERMA, "perma_" + rows["name"], rows["name"])
    wide = rows.pivot_table(index="assignment_id", columns="column", values="value", aggfunc="first")
    return wide.reindex(columns=columns).astype(float)


def _baseline(connection: Connection, scope: Scope) -> pd.DataFrame:
    return read_frame(connection, scope.apply(select(
        SurveyAssignment.participant_id, SurveyAssignment.id.label("assignment_id"),
        SurveyAssignment.instrument_id, SurveyAssignment.instrument_version,
        SurveyAssignment.intended_at, SurveyAssignment.closes_at, SurveyAssignment.created_at.label("opened_at"),
        baseline_status().label("response_status"),
        SurveyResponse.started_at.label("response_started_at"), SurveyResponse.submitted_at,
    ).outerjoin(SurveyResponse, SurveyResponse.assignment_id == SurveyAssignment.id),
        SurveyAssignment.participant_id).where(SurveyAssignment.purpose == "baseline",
                                               SurveyAssignment.instrument_id == PERMA))


def _followups(connection: Connection, scope: Scope, at: dt.datetime) -> pd.DataFrame:
    invitation = (select(Delivery.followup_id, func.min(Delivery.sent_at).label("invitation_sent_at"))
                  .where(Delivery.sequence == 0, Delivery.status == "sent").group_by(Delivery.followup_id)
                  .subquery())
    decision_key = "decision:" + cast(Decision.id, String)
    return read_frame(connection, scope.apply(select(
        FollowUp.participant_id, FollowUp.followup_key.label("wave"), FollowUp.anchor_key, FollowUp.occurrence,
        Decision.id.label("decision_id"), Decision.conversation_id.label("decision_conversation_id"),
        FollowUp.instrument_id, SurveyAssignment.instrument_version, FollowUp.due_at.label("intended_at"),
        FollowUp.intended_local, FollowUp.closes_at, FollowUp.sent_at.label("opened_at"),
        invitation.c.invitation_sent_at, SurveyResponse.started_at.label("response_started_at"),
        SurveyResponse.submitted_at, followup_status(at).label("response_status"), FollowUp.assignment_id,
    ).outerjoin(SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id)
        .outerjoin(SurveyResponse, SurveyResponse.assignment_id == FollowUp.assignment_id)
        .outerjoin(invitation, invitation.c.followup_id == FollowUp.id)
        .outerjoin(Decision, and_(Decision.participant_id == FollowUp.participant_id,
                                  FollowUp.anchor_key == decision_key)), FollowUp.participant_id))


def followup_status(at: dt.datetime) -> Any:
    """A follow-up's ``response_status`` at time ``at``, as SQL (the query joins its survey
    assignment, outer): the one definition the panel, the aggregate tables and the summaries use."""
    status = FollowUp.status
    return case(
        (or_(SurveyAssignment.status == "completed", status == "completed"), "completed"),
        (status == "expired", "expired"),
        (and_(status == "cancelled", FollowUp.end_reason == WITHDREW), "withdrawn"),
        (status == "cancelled", "cancelled"),
        (status == "sent", "open"),
        (and_(status == "planned", FollowUp.due_at > at), "not_yet_due"),
        (status == "planned", "overdue"),
        else_="cancelled")


def baseline_status() -> Any:
    """A baseline assignment's ``response_status``, as SQL (the query joins its participant); a
    participant with no baseline assignment at all is ``not_assigned``."""
    status = SurveyAssignment.status
    return case(
        (status == "cancelled", case((Participant.status == "withdrawn", "withdrawn"), else_="cancelled")),
        (status == "open", "open"),
        (status == "expired", "expired"),
        else_="completed")


def _ids(frame: pd.DataFrame, column: str) -> str:
    """Make an id column joinable when every value is missing (it then reads as object dtype)."""
    frame[column] = frame[column].astype("Int64")
    return column


def _times(frame: pd.DataFrame, columns: list[str]) -> None:
    for column in columns:
        frame[column] = pd.to_datetime(frame[column], utc=True)


DUE = ("completed", "expired", "open", "overdue")  # surveys whose time has come
PENDING = ("open", "overdue")  # due, not answered yet
PENDING_STATUSES = ("open", "not_yet_due", "overdue")  # due or to come: the follow-up may still be answered
HEADLINE = {PERMA: "overall_wellbeing", REGRET: "regret"}  # the score summaries count, per instrument


def _survey_rows(scope: Scope, at: dt.datetime) -> Any:
    """A query of the panel's surveys, a row each: participant_id, arm, wave, instrument_id,
    response_status (the panel's rule at ``at``), score (the instrument's ``HEADLINE`` score of a
    submitted response) and starting_role (of the conversation a decision-anchored wave asks about)."""
    people = _enrolled(scope)
    scores = and_(SurveyScore.response_id == SurveyResponse.id, SurveyResponse.submitted_at.is_not(None),
                  SurveyScore.name.in_(list(HEADLINE.values())))  # an IN the (response, name) index serves
    score = case(*((and_(SurveyResponse.instrument_id == instrument, SurveyScore.name == name), SurveyScore.value)
                   for instrument, name in HEADLINE.items())).label("score")
    baseline = select(
        Participant.id.label("participant_id"), Participant.arm, literal("baseline").label("wave"),
        literal(PERMA).label("instrument_id"),
        case((SurveyAssignment.id.is_(None), "not_assigned"), else_=baseline_status()).label("response_status"),
        score, literal(None, String).label("starting_role"),
    ).outerjoin(SurveyAssignment, and_(SurveyAssignment.participant_id == Participant.id,
                                       SurveyAssignment.purpose == "baseline",
                                       SurveyAssignment.instrument_id == PERMA)) \
        .outerjoin(SurveyResponse, SurveyResponse.assignment_id == SurveyAssignment.id) \
        .outerjoin(SurveyScore, scores).where(*people)
    followups = select(
        Participant.id, Participant.arm, FollowUp.followup_key, FollowUp.instrument_id, followup_status(at),
        score, starting_role(),
    ).join(Participant, Participant.id == FollowUp.participant_id) \
        .outerjoin(SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id) \
        .outerjoin(SurveyResponse, SurveyResponse.assignment_id == FollowUp.assignment_id) \
        .outerjoin(SurveyScore, scores) \
        .outerjoin(Decision, and_(Decision.participant_id == FollowUp.participant_id,
                                  FollowUp.anchor_key == "decision:" + cast(Decision.id, String))) \
        .outerjoin(Conversation, Conversation.id == Decision.conversation_id).where(*people)
    return union_all(baseline, followups)


def regret_scores(source: Source, study: int | str) -> pd.DataFrame:
    """Each completed regret survey's score with its wave and the starting role of the conversation
    its decision was made in (the regret values of the panel, three columns): wave, starting_role,
    regret."""
    with connect(source) as connection:
        rows = _survey_rows(Scope(resolve_study_id(connection, study)), now()).subquery()
        frame = read_frame(connection, select(rows.c.wave, rows.c.starting_role, rows.c.score.label("regret"))
                           .where(rows.c.instrument_id == REGRET, rows.c.response_status == "completed",
                                  rows.c.score.is_not(None)))
    frame["regret"] = pd.to_numeric(frame["regret"]).astype(float)
    return frame


def survey_cells(source: Source, study: int | str) -> pd.DataFrame:
    """The panel's surveys (a baseline for every participant in it, and each follow-up) counted in
    one SQL statement, never a row per survey, by the panel's own status rule and scores. Columns
    kind, wave, arm, instrument_id, response_status, starting_role, surveys, participants,
    score_sum, score_sumsq; one row per ``kind`` and group:

    - ``status``: per wave, arm and response status;
    - ``pending`` and ``due``: per wave and arm, the surveys in ``PENDING`` (``DUE``) and their
      participants (a decision-anchored wave has one survey per decision, so participants are not
      sums of the status rows);
    - ``scored``: per wave and arm, the completed surveys with the instrument's headline score
      (``HEADLINE``: PERMA overall well-being, regret), their participants, and the score's sum and
      sum of squares;
    - ``scored_role``: the same per starting role of the conversation a decision-anchored wave asks
      about (``starting_role``)."""
    with connect(source) as connection:
        rows = _survey_rows(Scope(resolve_study_id(connection, study)), now()).cte("survey_rows") \
            .prefix_with("MATERIALIZED")  # read once for the five groupings
        scored = and_(rows.c.response_status == "completed", rows.c.score.is_not(None))
        nothing = literal(None, String)

        def group(kind: str, where: Any, *keys: Any) -> Any:
            labelled = {"response_status": nothing, "starting_role": nothing, **{key.name: key for key in keys}}
            return select(
                literal(kind).label("kind"), rows.c.wave, rows.c.arm,
                func.min(rows.c.instrument_id).label("instrument_id"),
                *(column.label(name) for name, column in labelled.items()),
                func.count().label("surveys"), func.count(rows.c.participant_id.distinct()).label("participants"),
                func.sum(rows.c.score).label("score_sum"), func.sum(rows.c.score * rows.c.score).label("score_sumsq"),
            ).where(where).group_by(rows.c.wave, rows.c.arm, *keys)

        frame = read_frame(connection, union_all(
            group("status", literal(True), rows.c.response_status),
            group("pending", rows.c.response_status.in_(PENDING)),
            group("due", rows.c.response_status.in_(DUE)),
            group("scored", scored),
            group("scored_role", and_(scored, rows.c.starting_role.is_not(None)), rows.c.starting_role),
        ))
    for column in ("surveys", "participants"):
        frame[column] = pd.to_numeric(frame[column]).fillna(0).astype("int64")
    for column in ("score_sum", "score_sumsq"):
        frame[column] = pd.to_numeric(frame[column]).astype(float)
    return frame


def _enrolled(scope: Scope) -> list[Any]:
    """The participants the panel holds: enrolled, research data not deleted."""
    return [*scope.conditions(Participant.id), Participant.enrolled_at.is_not(None),
            Participant.data_deleted_at.is_(None)]


def participant_states(source: Source, study: int | str, *,
                       still_to_come: Sequence[str] = ("open", "not_yet_due", "overdue")) -> pd.DataFrame:
    """Per arm, the panel's participants by state, in SQL: ``withdrawn``; ``active`` (not withdrawn,
    a survey in ``still_to_come`` by the panel's status rule); ``completed`` (the others). Columns
    arm, active, completed, withdrawn."""
    at = now()
    with connect(source) as connection:
        scope = Scope(resolve_study_id(connection, study))
        followup_pending = (select(FollowUp.id)
                            .outerjoin(SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id)
                            .where(FollowUp.participant_id == Participant.id,
                                   followup_status(at).in_(list(still_to_come))).exists())
        baseline_pending = (select(SurveyAssignment.id).where(
            SurveyAssignment.participant_id == Participant.id, SurveyAssignment.purpose == "baseline",
            SurveyAssignment.instrument_id == PERMA, baseline_status().in_(list(still_to_come))).exists())
        state = case((Participant.status == "withdrawn", "withdrawn"),
                     (or_(followup_pending, baseline_pending), "active"), else_="completed")
        frame = read_frame(connection, select(Participant.arm, state.label("state"), func.count().label("n"))
                           .where(*_enrolled(scope)).group_by(Participant.arm, state))
    wide = frame.pivot_table(index="arm", columns="state", values="n", aggfunc="sum", fill_value=0) \
        if not frame.empty else pd.DataFrame(index=pd.Index([], name="arm"))
    wide = wide.reindex(columns=["active", "completed", "withdrawn"], fill_value=0).astype("int64")
    wide.columns.name = None
    return wide.reset_index()


def attrition(source: Source, study: int | str) -> pd.DataFrame:
    """Per arm, the panel's participants by the ``event_type`` of ``survival`` (stopped_answering,
    withdrew, censored), counted in SQL by the same rule (:data:`STOP_RULE`) at the time of reading.
    Columns arm, event_type, participants."""
    at = now()
    with connect(source) as connection:
        scope = Scope(resolve_study_id(connection, study))

        def closes(aggregate: Any, *where: Any) -> Any:
            """``aggregate`` of the closes of the participant's enrollment-anchored follow-ups ``where``."""
            return (select(aggregate(FollowUp.closes_at))
                    .outerjoin(SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id)
                    .where(FollowUp.participant_id == Participant.id, FollowUp.anchor_key == "enrollment", *where)
                    .correlate(Participant).scalar_subquery())

        last_answer = closes(func.max, followup_status(at) == "completed")
        stopped = closes(func.min, followup_status(at) == "expired",
                         or_(last_answer.is_(None), FollowUp.closes_at > last_answer))
        cancelled = closes(func.count, followup_status(at) == "withdrawn")  # by the withdrawal
        waiting = closes(func.count, followup_status(at).in_(PENDING_STATUSES))
        withdrawn = Participant.withdrawn_at
        candidate = and_(stopped.is_not(None), or_(withdrawn.is_(None), stopped <= withdrawn))
        event = case((and_(candidate, waiting == 0), "stopped_answering"),
                     (and_(~candidate, withdrawn.is_not(None), cancelled > 0), "withdrew"), else_="censored")
        frame = read_frame(connection, select(Participant.arm, event.label("event_type"),
                                              func.count().label("participants"))
                           .where(*_enrolled(scope)).group_by(Participant.arm, event)
                           .order_by(Participant.arm, event))
    frame["participants"] = pd.to_numeric(frame["participants"]).astype("int64")
    return frame


def panel(source: Source, study: int | str, *, conversations: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per participant x wave, columns as documented in ``PANEL_COLUMNS``: the participant's
    arm, roles and baseline, then the wave's times, status and scores, and the conversations
    before it. Withdrawn participants keep their rows (waves cancelled by the withdrawal have
    status ``withdrawn``); participants whose data were deleted are absent. Pass ``conversations``
    (``conversation_features`` of the same study) when you have it, so it is not computed again."""
    with connect(source) as connection:
        study_id = resolve_study_id(connection, study)
        return _panel(connection, Scope(study_id), _protocol_modes(connection, study_id), pd.Timestamp(now()),
                      conversations)


def iter_panel(source: Source, study: int | str, *, chunk_participants: int = 5_000) -> Iterator[pd.DataFrame]:
    """``panel`` in chunks of at most ``chunk_participants`` participants, so memory stays flat
    however large the study (rows sorted as in ``panel`` within a chunk)."""
    for _, chunk in iter_conversations_and_panel(source, study, chunk_participants=chunk_participants):
        yield chunk


def iter_conversations_and_panel(source: Source, study: int | str, *, chunk_participants: int = 5_000
                                 ) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    """Per chunk of participants, their conversation features and their panel rows, the features
    computed once for both (an export writes the two tables side by side)."""
    at = pd.Timestamp(now())
    with connect(source) as connection:
        study_id = resolve_study_id(connection, study)
        modes = _protocol_modes(connection, study_id)
        for id_range in participant_chunks(connection, study_id, chunk_participants):
            scope = Scope(study_id, id_range=id_range)
            conversations = _conversation_features(connection, scope)
            yield conversations, _panel(connection, scope, modes, at, conversations)


def _panel(connection: Connection, scope: Scope, modes: dict[str, str], at: pd.Timestamp,
           conversations: pd.DataFrame | None = None) -> pd.DataFrame:
    people = _people(connection, scope)
    scores = _scores(connection, scope)
    baseline = _baseline(connection, scope)
    followups = _followups(connection, scope, at.to_pydatetime())
    if conversations is None:
        conversations = _conversation_features(connection, scope)
    roles = participant_roles(conversations)
    wave_conversations = _wave_features(connection, scope, conversations)

    people["mode"] = people["arm"].map(modes)
    people["timezone_region"] = people["timezone"].str.split("/").str[0]
    people = people.join(roles, on="participant_code")
    people["roles_used"] = people["roles_used"].fillna("")
    times = ["intended_at", "closes_at", "opened_at", "response_started_at", "submitted_at"]

    baseline = people[["participant_id", "participant_status"]].merge(baseline, on="participant_id", how="left")
    _times(baseline, times)
    baseline["wave"], baseline["anchor_key"], baseline["occurrence"] = "baseline", "enrollment", 0
    baseline["instrument_id"] = PERMA
    baseline["response_status"] = baseline["response_status"].fillna("not_assigned")
    baseline = baseline.join(scores, on=_ids(baseline, "assignment_id"))
    covariates = baseline.set_index("participant_id")[[f"perma_{name}" for name in PERMA_SCORES]]
    people = people.join(covariates.add_prefix("baseline_"), on="participant_id")

    followups = followups[followups["participant_id"].isin(people["participant_id"])]
    _times(followups, [*times, "invitation_sent_at"])
    followups = followups.join(scores, on=_ids(followups, "assignment_id"))

    rows = pd.concat([baseline, followups], ignore_index=True)
    rows["wave_order"] = rows["wave"] != "baseline"
    out = people.merge(rows.drop(columns=["participant_status"]), on="participant_id", how="inner")
    out["days_since_enrollment"] = (out["intended_at"] - out["enrolled_at"]).dt.total_seconds() / DAY_SECONDS

    features = wave_conversations.drop(columns=["intended_at", "window_start"]).rename(
        columns={"followup_key": "wave"})
    features = features.rename(columns={c: f"conv_{c}" for c in features.columns
                                        if c not in ("participant_code", "wave", "anchor_key", "occurrence")})
    out = out.merge(features, on=["participant_code", "wave", "anchor_key", "occurrence"], how="left")
    followup = out["wave"] != "baseline"
    for name, column in PANEL_COLUMNS.items():
        if name.startswith("conv_") and column.type == "integer":
            counts = pd.to_numeric(out[name]).astype("Int64")
            out[name] = counts.where(~followup, counts.fillna(0))
    for name in ("decision_id", "decision_conversation_id"):
        out[name] = out[name].astype("Int64")
    out = out.sort_values(["participant_code", "wave_order", "intended_at", "wave", "anchor_key", "occurrence"],
                          kind="stable")
    return _typed(out[list(PANEL_COLUMNS)].reset_index(drop=True), PANEL_COLUMNS)


_DTYPES: dict[str, Any] = {"integer": "Int64", "number": "float64", "string": "string", "boolean": "boolean",
                           "datetime": "datetime64[us, UTC]"}


def _typed(frame: pd.DataFrame, columns: dict[str, Column]) -> pd.DataFrame:
    """Each column in the dtype of its documented type, whatever the rows (a chunk where every value is
    missing would otherwise read as object)."""
    for name, column in columns.items():
        values = frame[name]
        if column.type in ("integer", "number"):
            values = pd.to_numeric(values)
        frame[name] = values.astype(_DTYPES[column.type])
    return frame


STOP_RULE = """\
Time to dropout is the time a participant stops answering the enrollment-anchored follow-ups (the
schedule everyone shares; decision-anchored ones are left out, as only people who reported a
decision have them). Counted from enrollment, it ends at the first of:

- stopped_answering (event 1): the close of the first follow-up window the participant missed
  (expired unanswered) after the last one they answered (windows in order of closing), i.e. a
  missed window with no answer to any later one, once no later window can still be answered
  (all closed, or cancelled by a withdrawal). A missed window followed by an answer is not
  dropout.
- withdrew (event 0, censored for stopping; a competing event): the withdrawal, when it came
  before stopping answering and cancelled a follow-up still to be answered (a withdrawal after
  the last window was answered or missed ends nothing).
- otherwise censored (event 0): at the end of follow-up, the close of the participant's last
  window (end_of_follow_up); or, while a window's outcome is still to come, at the data cut
  (data_cut): the time the data were read or, if earlier, one second before the close of the
  first window whose outcome is not known yet (a missed window with a later one still to come,
  or a window not yet closed), so that nobody counts as still answering past a close whose
  outcome is unknown.

A window cancelled for a reason other than withdrawal counts for nothing. The time of a window's
close is the wave's scheduled close (duration_days): the median over the study's participants of
that window's close in days since enrollment, the same for everyone. Each participant's own close
differs from it by hours (time zone, send time, quiet hours); on those times the Kaplan-Meier
product would split one wave's dropouts over hundreds of steps whose risk sets hold people whose
window had not closed yet, and fall far below the share still answering."""

JUST_BEFORE = 1 / DAY_SECONDS  # one second, in days: a data-cut censoring before an unknown close


def stopping_answering(people: pd.DataFrame, waves: pd.DataFrame, at: dt.datetime | pd.Timestamp, *,
                       key: str = "participant_id") -> pd.DataFrame:
    """``people`` (one row per participant: ``key``, enrolled_at, withdrawn_at, and any columns to
    carry) with event, event_type, event_at, event_wave, censored_because and duration_days by
    :data:`STOP_RULE`, the one rule of the survival table. ``waves``: the participants'
    enrollment-anchored follow-ups, a row each: ``key``, wave, closes_at and response_status in the
    panel's vocabulary (``followup_status``) at ``at``, when the data were read."""
    at = pd.Timestamp(at)
    waves = waves[waves[key].isin(people[key])].sort_values(["closes_at", "wave"], kind="stable")
    status = waves["response_status"].astype(str)
    close_days = (waves["closes_at"] - waves[key].map(people.set_index(key)["enrolled_at"])).dt.total_seconds()
    scheduled = (close_days / DAY_SECONDS).groupby(waves["wave"]).median()
    last = waves[status != "cancelled"].groupby(key).last()
    live = waves[~status.isin(("cancelled", "withdrawn"))]
    unsettled = live[live["response_status"].astype(str).isin(PENDING_STATUSES) | (live["closes_at"] > at)]
    last_answer = waves[status == "completed"].groupby(key)["closes_at"].max()
    pending = waves.loc[status.isin(PENDING_STATUSES), key].unique()
    cancelled = waves.loc[status == "withdrawn", key].unique()  # by the withdrawal
    missed = waves[status == "expired"]
    after = missed[key].map(last_answer)
    stop = missed[after.isna() | (missed["closes_at"] > after)].groupby(key).first()
    out = people.copy()
    stopped_at, withdrawn, ends = out[key].map(stop["closes_at"]), out["withdrawn_at"], out[key].map(last["closes_at"])
    candidate = stopped_at.notna() & (withdrawn.isna() | (stopped_at <= withdrawn))
    waiting = out[key].isin(pending)  # a later window may still be answered: a missed one is not dropout yet
    stops = candidate & ~waiting
    withdrew = ~candidate & withdrawn.notna() & out[key].isin(cancelled)
    cut = ~stops & ~withdrew & (waiting | ends.isna() | (ends > at))
    ended = ~stops & ~withdrew & ~cut
    out["event_type"] = np.select([stops, withdrew], ["stopped_answering", "withdrew"], default="censored")
    out["event"] = stops.astype("int64")
    out["event_at"] = pd.to_datetime(pd.Series(at, index=out.index).where(~ended, ends).where(~withdrew, withdrawn)
                                     .where(~stops, stopped_at), utc=True)
    out["event_wave"] = out[key].map(stop["wave"]).where(stops, out[key].map(last["wave"]).where(ended))
    out["censored_because"] = pd.Series("data_cut", index=out.index, dtype=object).where(
        ~ended, "end_of_follow_up").where(~withdrew, "withdrew").where(~stops)
    actual = (out["event_at"] - out["enrolled_at"]).dt.total_seconds() / DAY_SECONDS
    unknown = out[key].map(stop["wave"]).where(candidate, out[key].map(unsettled.groupby(key)["wave"].first()))
    before_unknown = unknown.map(scheduled).astype(float) - JUST_BEFORE
    out["duration_days"] = actual.where(~(stops | ended), out["event_wave"].map(scheduled)).where(
        ~cut, np.fmin(actual, before_unknown)).astype(float)
    return out


def survival(source: Source, study: int | str) -> pd.DataFrame:
    """One row per enrolled participant (data not deleted): time from enrollment to stopping
    answering the follow-ups (``event`` 1), to withdrawal (``event_type`` withdrew, the competing
    event) or to censoring, by :data:`STOP_RULE` (``stopping_answering``) at the time the data are
    read. Columns in ``SURVIVAL_COLUMNS``."""
    at = now()
    with connect(source) as connection:
        scope = Scope(resolve_study_id(connection, study))
        modes = _protocol_modes(connection, scope.study_id)
        people = _people(connection, scope)
        waves = read_frame(connection, scope.apply(select(
            FollowUp.participant_id, FollowUp.followup_key.label("wave"), FollowUp.closes_at,
            followup_status(at).label("response_status"),
        ).outerjoin(SurveyAssignment, SurveyAssignment.id == FollowUp.assignment_id), FollowUp.participant_id)
            .where(FollowUp.anchor_key == "enrollment"))
        roles = participant_roles(_conversation_roles(connection, scope))
    _times(waves, ["closes_at"])
    people["mode"] = people["arm"].map(modes)
    people = people.join(roles, on="participant_code")
    people["roles_used"] = people["roles_used"].fillna("")
    out = stopping_answering(people, waves, at)
    return out[list(SURVIVAL_COLUMNS)].reset_index(drop=True)
