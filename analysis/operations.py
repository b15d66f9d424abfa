"""How a study runs, in grouped SQL (read-only): the counts of the staff API's summary for
researchers and admins, and what the dashboard shows besides the research figures: recruitment
and withdrawals over time, the enrollment funnel, follow-up timing and deliveries, escalations,
overrides and model versions over time, and scores resting on few items. Each is one grouped query
for the whole study (never a table read into memory); researchers and admins only (none goes
through disclosure control: viewers see ``analysis.aggregates``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
from sqlalchemy import and_, case, distinct, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, aliased

from analysis.reading import read_frame
from chat.models import Conversation, PushbackResponse, Turn
from scheduler.models import ChannelAlert, Delivery, FollowUp
from study.models import ConsentSignature, Participant
from study.safety import SafetyEvent, SafetyLevel
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore

# Lateness of the actual against the intended send time, in buckets (upper bounds in seconds).
LATENESS_BUCKETS = [(60, "under 1 min"), (300, "1-5 min"), (3600, "5-60 min"), (6 * 3600, "1-6 h"),
                    (None, "over 6 h")]


def _day(connection: Connection, column: Any) -> Any:
    """The UTC calendar day of a stored time, as text or a date."""
    if connection.dialect.name == "postgresql":
        return func.date(func.timezone("UTC", column))
    return func.date(column)


def _weekly(frame: pd.DataFrame, day: str = "day") -> pd.DataFrame:
    """Days (text or dates) to the Monday of their week, summing the counts."""
    if frame.empty:
        return frame.rename(columns={day: "week"})
    out = frame.copy()
    days = pd.to_datetime(out.pop(day).astype(str))
    out.insert(0, "week", (days - pd.to_timedelta(days.dt.weekday, unit="D")).dt.date.astype(str))
    keys = [c for c in out.columns if out[c].dtype == object]
    return out.groupby(keys, as_index=False, dropna=False).sum()


def recruitment(connection: Connection, study_id: int) -> pd.DataFrame:
    """Participants enrolled (assigned an arm) per week and arm."""
    day = _day(connection, Participant.enrolled_at)
    frame = read_frame(connection, select(day.label("day"), Participant.arm, func.count().label("enrolled"))
                       .where(Participant.study_id == study_id, Participant.arm.is_not(None),
                              Participant.enrolled_at.is_not(None))
                       .group_by(day, Participant.arm))
    return _weekly(frame).sort_values(["week", "arm"]).reset_index(drop=True)


def funnel(connection: Connection, study_id: int) -> pd.DataFrame:
    """Invited (redeemed an invite) -> consented -> randomized -> baseline answered."""
    in_study = Participant.study_id == study_id
    invited = connection.scalar(select(func.count()).where(in_study)) or 0
    consented = connection.scalar(select(func.count(distinct(ConsentSignature.participant_id)))
                                  .join(Participant, Participant.id == ConsentSignature.participant_id)
                                  .where(in_study)) or 0
    randomized = connection.scalar(select(func.count()).where(in_study, Participant.arm.is_not(None))) or 0
    baseline = connection.scalar(select(func.count(distinct(SurveyAssignment.participant_id)))
                                 .join(Participant, Participant.id == SurveyAssignment.participant_id)
                                 .where(in_study, SurveyAssignment.purpose == "baseline",
                                        SurveyAssignment.status == "completed")) or 0
    return pd.DataFrame({"stage": ["invited", "consented", "randomized", "baseline"],
                         "participants": [invited, consented, randomized, baseline]})


def withdrawals(connection: Connection, study_id: int) -> pd.DataFrame:
    """Withdrawals per week and level (``keep`` data or ``delete`` it)."""
    day = _day(connection, Participant.withdrawn_at)
    level = func.coalesce(Participant.withdrawal_level, "unknown")
    frame = read_frame(connection, select(day.label("day"), level.label("level"), func.count().label("withdrawn"))
                       .where(Participant.study_id == study_id, Participant.withdrawn_at.is_not(None))
                       .group_by(day, level))
    return _weekly(frame).sort_values(["week", "level"]).reset_index(drop=True)


def followup_status(connection: Connection, study_id: int) -> pd.DataFrame:
    """Follow-ups per wave and status (planned, sent, completed, expired, cancelled)."""
    return read_frame(connection, select(FollowUp.followup_key.label("wave"), FollowUp.status,
                                         func.count().label("followups"))
                      .where(FollowUp.study_id == study_id)
                      .group_by(FollowUp.followup_key, FollowUp.status)
                      .order_by(FollowUp.followup_key, FollowUp.status))


# A repeating follow-up's occurrence was sent once its survey opened (an invitation went out, or the
# in-app survey was shown), and answered once completed.
_SENT = FollowUp.sent_at.is_not(None)
_ANSWERED = FollowUp.status == "completed"
_OTHER = aliased(FollowUp)  # the follow-ups that repeat, read apart from the row being counted


def _repeating(study_id: int) -> Any:
    return (select(_OTHER.followup_key).where(_OTHER.study_id == study_id, _OTHER.occurrence > 0)
            .distinct().scalar_subquery())


def adherence_by_occurrence(connection: Connection, study_id: int) -> pd.DataFrame:
    """For each repeating follow-up (a diary) and occurrence: occurrences sent, answered, and the
    share answered of those sent (adherence)."""
    frame = read_frame(connection, select(
        FollowUp.followup_key.label("wave"), FollowUp.occurrence, func.count(case((_SENT, 1))).label("sent"),
        func.count(case((_ANSWERED, 1))).label("answered"))
        .where(FollowUp.study_id == study_id, FollowUp.followup_key.in_(_repeating(study_id)))
        .group_by(FollowUp.followup_key, FollowUp.occurrence).order_by(FollowUp.followup_key, FollowUp.occurrence))
    return _with_adherence(frame)


def adherence_by_participant(connection: Connection, study_id: int) -> pd.DataFrame:
    """For each participant and repeating follow-up: occurrences planned, sent and answered, and the
    share answered of those sent (adherence). Participant-level: researchers and admins."""
    frame = read_frame(connection, select(
        Participant.code.label("participant_code"), FollowUp.followup_key.label("wave"),
        func.count().label("planned"), func.count(case((_SENT, 1))).label("sent"),
        func.count(case((_ANSWERED, 1))).label("answered"))
        .join(Participant, Participant.id == FollowUp.participant_id)
        .where(FollowUp.study_id == study_id, FollowUp.followup_key.in_(_repeating(study_id)))
        .group_by(Participant.code, FollowUp.followup_key).order_by(Participant.code, FollowUp.followup_key))
    return _with_adherence(frame)


def _with_adherence(frame: pd.DataFrame) -> pd.DataFrame:
    sent = pd.to_numeric(frame["sent"]).astype(float)
    frame["adherence"] = (pd.to_numeric(frame["answered"]) / sent.where(sent > 0)).round(3)
    return frame


def lateness(connection: Connection, study_id: int) -> pd.DataFrame:
    """Sent follow-ups per wave by how late they went out against the intended time, with the
    mean and the largest lateness in minutes."""
    seconds = FollowUp.lateness_seconds
    bucket = case(*((seconds < bound, label) for bound, label in LATENESS_BUCKETS if bound is not None),
                  else_=LATENESS_BUCKETS[-1][1])
    frame = read_frame(connection, select(FollowUp.followup_key.label("wave"), bucket.label("lateness"),
                                          func.count().label("followups"),
                                          (func.avg(seconds) / 60).label("mean_minutes"),
                                          (func.max(seconds) / 60).label("max_minutes"))
                       .where(FollowUp.study_id == study_id, FollowUp.sent_at.is_not(None), seconds.is_not(None))
                       .group_by(FollowUp.followup_key, bucket))
    order = {label: i for i, (_, label) in enumerate(LATENESS_BUCKETS)}
    if frame.empty:
        return frame
    return (frame.assign(_order=frame["lateness"].map(order)).sort_values(["wave", "_order"])
            .drop(columns="_order").reset_index(drop=True))


def deliveries(connection: Connection, study_id: int) -> pd.DataFrame:
    """Deliveries (invitations and reminders) per channel and status, with attempts."""
    return read_frame(connection, select(Delivery.channel, Delivery.status, func.count().label("deliveries"),
                                         func.sum(Delivery.attempts).label("attempts"))
                      .join(FollowUp, FollowUp.id == Delivery.followup_id)
                      .where(FollowUp.study_id == study_id)
                      .group_by(Delivery.channel, Delivery.status).order_by(Delivery.channel, Delivery.status))


def open_alerts(connection: Connection) -> pd.DataFrame:
    """Delivery-channel alerts raised to staff and not yet resolved (channels serve every study)."""
    return read_frame(connection, select(ChannelAlert.channel, ChannelAlert.problem, ChannelAlert.failures,
                                         ChannelAlert.first_at, ChannelAlert.last_at, ChannelAlert.message)
                      .where(ChannelAlert.raised_at.is_not(None), ChannelAlert.resolved_at.is_(None))
                      .order_by(ChannelAlert.last_at.desc()))


def unreviewed_events(connection: Connection, study_id: int) -> int:
    return connection.scalar(select(func.count()).select_from(SafetyEvent).where(
        SafetyEvent.study_id == study_id, SafetyEvent.reviewed_at.is_(None))) or 0


def escalations_and_overrides(connection: Connection, study_id: int) -> pd.DataFrame:
    """Per week: escalations (safety events at level escalation, by when they were raised; check-ins
    and unanswered check-ins are not escalations) and pushbacks overridden."""
    event_day = _day(connection, SafetyEvent.created_at)
    events = read_frame(connection, select(event_day.label("day"), func.count().label("escalations"))
                        .where(SafetyEvent.study_id == study_id, SafetyEvent.level == SafetyLevel.ESCALATION)
                        .group_by(event_day))
    override_day = _day(connection, PushbackResponse.created_at)
    overrides = read_frame(connection, select(override_day.label("day"), func.count().label("overrides"))
                           .join(Participant, Participant.id == PushbackResponse.participant_id)
                           .where(Participant.study_id == study_id, PushbackResponse.action == "override")
                           .group_by(override_day))
    frame = pd.concat([_weekly(events).set_index("week"), _weekly(overrides).set_index("week")], axis=1)
    frame = frame.astype("float64").fillna(0).astype("int64").sort_index()  # an empty side is object-typed
    frame.index.name = "week"
    return frame.reset_index().reindex(columns=["week", "escalations", "overrides"], fill_value=0)


def model_versions(connection: Connection, study_id: int) -> pd.DataFrame:
    """Assistant replies per week, model and prompt version."""
    day = _day(connection, Turn.created_at)
    model = func.coalesce(Turn.model, "unknown")
    prompt = func.coalesce(Turn.prompt_version, "unknown")
    frame = read_frame(connection, select(day.label("day"), model.label("model"), prompt.label("prompt_version"),
                                          func.count().label("replies"))
                       .join(Conversation, Conversation.id == Turn.conversation_id)
                       .join(Participant, Participant.id == Conversation.participant_id)
                       .where(Participant.study_id == study_id, Turn.speaker == "assistant")
                       .group_by(day, model, prompt))
    return _weekly(frame).sort_values(["week", "model", "prompt_version"]).reset_index(drop=True)


def few_items(connection: Connection, study_id: int) -> pd.DataFrame:
    """Per instrument and score: scores computed, those resting on fewer items than expected, and
    those resting on fewer than half."""
    short = SurveyScore.n_items < SurveyScore.n_expected
    half = SurveyScore.n_items * 2 < SurveyScore.n_expected
    return read_frame(connection, select(
        SurveyResponse.instrument_id.label("instrument"), SurveyScore.name.label("score"),
        func.count().label("scores"), func.count(case((short, 1))).label("fewer_items"),
        func.count(case((half, 1))).label("under_half_items"))
        .join(SurveyResponse, SurveyResponse.id == SurveyScore.response_id)
        .join(Participant, Participant.id == SurveyScore.participant_id)
        .where(and_(Participant.study_id == study_id))
        .group_by(SurveyResponse.instrument_id, SurveyScore.name)
        .order_by(SurveyResponse.instrument_id, SurveyScore.name))


def open_alert_count(session: Session) -> int:
    """Delivery-channel alerts raised and not yet resolved (channels serve every study)."""
    return session.scalar(select(func.count()).select_from(ChannelAlert).where(
        ChannelAlert.raised_at.is_not(None), ChannelAlert.resolved_at.is_(None))) or 0


@dataclass(frozen=True)
class StudyCounts:
    participants_by_status: dict[str, int]
    enrolled_by_arm: dict[str, int]
    followups_by_status: dict[str, int]
    safety_events_total: int
    safety_events_unreviewed: int
    safety_events_participant_deleted: int
    safety_events_unreviewed_participant_deleted: int


def study_counts(session: Session, study_id: int) -> StudyCounts:
    """Participants by status and arm, follow-ups by status and the safety events, unreviewed and
    de-identified (the participant withdrew and deleted data: such records count like any other)."""
    by_status = dict(session.execute(
        select(Participant.status, func.count()).where(Participant.study_id == study_id)
        .group_by(Participant.status)).all())
    by_arm = {str(arm): n for arm, n in session.execute(
        select(Participant.arm, func.count()).where(Participant.study_id == study_id, Participant.arm.is_not(None))
        .group_by(Participant.arm))}
    followups = dict(session.execute(select(FollowUp.status, func.count()).where(FollowUp.study_id == study_id)
                                     .group_by(FollowUp.status)).all())
    unreviewed = SafetyEvent.reviewed_at.is_(None)
    deidentified = SafetyEvent.participant_data_deleted.is_(True)
    events = session.execute(select(
        func.count(), func.count(case((unreviewed, 1))), func.count(case((deidentified, 1))),
        func.count(case((and_(unreviewed, deidentified), 1)))).where(SafetyEvent.study_id == study_id)).one()
    return StudyCounts(by_status, by_arm, followups, events[0], events[1], events[2], events[3])


# Every query by name (``dashboard.data.counts`` reads and caches each on its own).
QUERIES: dict[str, Callable[[Connection, int], pd.DataFrame]] = {
    "recruitment": recruitment, "funnel": funnel, "withdrawals": withdrawals, "followup_status": followup_status,
    "lateness": lateness, "deliveries": deliveries, "alerts": lambda connection, _: open_alerts(connection),
    "escalations": escalations_and_overrides, "model_versions": model_versions, "few_items": few_items,
    "adherence_by_occurrence": adherence_by_occurrence, "adherence_by_participant": adherence_by_participant,
}
