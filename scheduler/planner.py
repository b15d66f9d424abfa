"""The planner: follow-up rows from the protocol's schedule, in each participant's local time.

``P7D`` with ``send_at_local: "10:00"`` means 10:00 on the seventh calendar day after the anchor,
on the participant's wall clock, whatever daylight saving does in between; a time inside quiet
hours moves to the end of them. A wall time that does not exist (the hour skipped in spring)
becomes the same time on the shifted clock (02:30 → 03:30); one that exists twice (autumn) is
the first.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import Anchor, FollowUp, FollowUpStatus
from study.clock import now
from study.db import bulk_insert
from study.models import Participant, ParticipantStatus, Study
from study.protocol import FollowUp as FollowUpSpec
from study.protocol import Protocol, QuietHours
from study.studies import current_protocol, current_version

UTC = dt.UTC


@functools.cache
def _clock(value: str) -> dt.time:
    hours, minutes = value.split(":")
    return dt.time(int(hours), int(minutes))


def in_quiet_hours(wall: dt.datetime, quiet: QuietHours) -> bool:
    start, end, time = _clock(quiet.start), _clock(quiet.end), wall.time()
    if start == end:
        return False
    return start <= time < end if start < end else (time >= start or time < end)


def out_of_quiet_hours(wall: dt.datetime, quiet: QuietHours) -> dt.datetime:
    """The wall time itself, or the end of the quiet hours it falls in."""
    if not in_quiet_hours(wall, quiet):
        return wall
    end = _clock(quiet.end)
    moved = wall.replace(hour=end.hour, minute=end.minute, second=0, microsecond=0)
    return moved if moved > wall else moved + dt.timedelta(days=1)


def to_utc(wall: dt.datetime, zone: ZoneInfo) -> dt.datetime:
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


@dataclass(frozen=True)
class Timing:
    intended_local: str  # the wall time the protocol asked for, before quiet hours
    due_at: dt.datetime
    closes_at: dt.datetime
    reminder_offsets: list[int] = field(default_factory=list)  # seconds after due_at
    occurrence: int = 0  # of a repeating follow-up, from 0


def timings(spec: FollowUpSpec, anchored_at: dt.datetime, timezone: str, quiet: QuietHours,
            known: dict[tuple[int, dt.datetime, str], list[Timing]] | None = None) -> list[Timing]:
    """When each occurrence of one follow-up is due for one anchor (one, unless it repeats).
    Offsets, repetitions and reminders are wall-clock arithmetic in the participant's zone, so a
    daily 20:00 stays at 20:00 across a DST change; the results are UTC. Everything after the first
    wall time depends on it, the follow-up and the zone alone: ``known`` keeps what was worked out
    for them, for a caller planning many participants with the same ``spec`` and ``quiet``."""
    zone = ZoneInfo(timezone)
    anchor_wall = anchored_at.astimezone(zone).replace(tzinfo=None)
    send = _clock(spec.send_at_local)
    wall = (anchor_wall + spec.offset).replace(hour=send.hour, minute=send.minute, second=0, microsecond=0)
    if wall <= anchor_wall:
        wall += dt.timedelta(days=1)  # never before the anchor itself
    key = (id(spec), wall, timezone)
    found = None if known is None else known.get(key)
    if found is None:
        days = [wall.date()] if spec.repeat is None else spec.repeat.dates(wall.date())
        found = [_timing(spec, dt.datetime.combine(day, wall.time()), zone, quiet, n) for n, day in enumerate(days)]
        if known is not None:
            known[key] = found
    return found


def timing(spec: FollowUpSpec, anchored_at: dt.datetime, timezone: str, quiet: QuietHours) -> Timing:
    """When a follow-up is due for one anchor: its first occurrence (a single one's only)."""
    return timings(spec, anchored_at, timezone, quiet)[0]


def _timing(spec: FollowUpSpec, wall: dt.datetime, zone: ZoneInfo, quiet: QuietHours, occurrence: int) -> Timing:
    due_wall = out_of_quiet_hours(wall, quiet)
    due_at = to_utc(due_wall, zone)
    closes_at = due_at + spec.window
    reminders = []
    for after in spec.reminders:
        reminder_at = to_utc(out_of_quiet_hours(due_wall + after, quiet), zone)
        if reminder_at < closes_at:
            reminders.append(int((reminder_at - due_at).total_seconds()))
    return Timing(wall.strftime("%Y-%m-%dT%H:%M"), due_at, closes_at, reminders, occurrence)


@dataclass(frozen=True)
class _AnchorRow:
    kind: str
    key: str
    anchored_at: dt.datetime
    context: dict[str, str]


def record_anchor(session: Session, participant: Participant, kind: str, key: str, at: dt.datetime,
                  context: dict[str, str] | None = None) -> Anchor:
    anchor = session.scalar(select(Anchor).where(Anchor.participant_id == participant.id, Anchor.key == key))
    if anchor is None:
        anchor = Anchor(participant_id=participant.id, kind=kind, key=key, anchored_at=at, context=context or {})
        session.add(anchor)
        session.flush()
    return anchor


def _timings(protocol: Protocol, anchors: Iterable[Anchor | _AnchorRow], timezone: str,
             existing: Collection[tuple[str, str, int]] = (),
             known: dict[tuple[int, dt.datetime, str], list[Timing]] | None = None,
             ) -> Iterator[tuple[FollowUpSpec, Anchor | _AnchorRow, Timing]]:
    """Each follow-up occurrence the anchors call for, with its timing: what ``plan`` writes and
    ``preview`` shows (``known``: see ``timings``)."""
    for anchor in anchors:
        for spec in protocol.followups:
            if spec.anchor == anchor.kind:
                for when in timings(spec, anchor.anchored_at, timezone, protocol.quiet_hours, known):
                    if (spec.id, anchor.key, when.occurrence) not in existing:
                        yield spec, anchor, when


def _rows(participant: Participant, anchors: Iterable[Anchor | _AnchorRow], protocol: Protocol, version: int,
          existing: set[tuple[str, str, int]], at: dt.datetime,
          known: dict[tuple[int, dt.datetime, str], list[Timing]] | None = None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    if participant.timezone is None:
        return rows
    for spec, anchor, when in _timings(protocol, anchors, participant.timezone, existing, known):
        if when.closes_at <= at:
            continue  # its whole window is already over (a follow-up added late)
        rows.append(dict(
            participant_id=participant.id, study_id=participant.study_id, followup_key=spec.id,
            anchor_key=anchor.key, occurrence=when.occurrence, instrument_id=spec.instrument, protocol_version=version,
            context=dict(anchor.context), timezone=participant.timezone, intended_local=when.intended_local,
            due_at=when.due_at, closes_at=when.closes_at, reminder_offsets=when.reminder_offsets,
            status=FollowUpStatus.PLANNED, reminders_sent=0, created_at=at, updated_at=at))
    return rows


@dataclass(frozen=True)
class PreviewMessage:
    kind: str  # invitation | reminder
    sequence: int  # 0 the invitation, then 1, 2, ... the reminders
    due_at: dt.datetime  # UTC


@dataclass(frozen=True)
class FollowUpPreview:
    followup: str
    occurrence: int  # of a repeating follow-up, from 0
    instrument: str
    anchor: str  # enrollment | decision
    anchored_at: dt.datetime
    intended_local: str  # the wall time the protocol asked for, before quiet hours
    closes_at: dt.datetime
    messages: list[PreviewMessage]


def preview(protocol: Protocol, timezone: str, enrolled_at: dt.datetime,
            decision_at: dt.datetime | None = None) -> list[FollowUpPreview]:
    """Every invitation and reminder a participant in ``timezone`` enrolled at ``enrolled_at`` (and
    deciding at ``decision_at``) would be sent, by the same timing ``plan`` writes, in time order.
    Nothing is stored. A reminder is sent while the survey is still open."""
    anchors = [_AnchorRow("enrollment", "enrollment", enrolled_at, {})]
    if decision_at is not None:
        anchors.append(_AnchorRow("decision", "decision:preview", decision_at, {}))
    previews = []
    for spec, anchor, when in _timings(protocol, anchors, timezone):
        messages = [PreviewMessage("invitation", 0, when.due_at)] + [
            PreviewMessage("reminder", n, when.due_at + dt.timedelta(seconds=after))
            for n, after in enumerate(when.reminder_offsets, start=1)]
        previews.append(FollowUpPreview(spec.id, when.occurrence, spec.instrument, anchor.kind, anchor.anchored_at,
                                        when.intended_local, when.closes_at, messages))
    return sorted(previews, key=lambda p: (p.messages[0].due_at, p.followup, p.occurrence))


def followups_stopped(session: Session, study_id: int) -> bool:
    """The researcher stopped the study's follow-ups (close --stop-followups): plan no more."""
    return session.scalar(select(Study.followups_stopped_at).where(Study.id == study_id)) is not None


def plan(session: Session, participant: Participant) -> int:
    """Write every follow-up the participant's anchors call for and that is not planned yet."""
    if participant.status != ParticipantStatus.ENROLLED or followups_stopped(session, participant.study_id):
        return 0
    version = current_version(session, participant.study_id)
    protocol = current_protocol(session, participant.study_id)
    anchors = session.scalars(select(Anchor).where(Anchor.participant_id == participant.id)).all()
    existing = {(key, anchor, occurrence) for key, anchor, occurrence in session.execute(
        select(FollowUp.followup_key, FollowUp.anchor_key, FollowUp.occurrence)
        .where(FollowUp.participant_id == participant.id))}
    rows = _rows(participant, anchors, protocol, version.version, existing, now())
    if rows:
        bulk_insert(session, FollowUp, rows)
    return len(rows)


def on_enrollment(session: Session, participant: Participant) -> int:
    assert participant.enrolled_at is not None
    record_anchor(session, participant, "enrollment", "enrollment", participant.enrolled_at)
    return plan(session, participant)


def on_decision(session: Session, participant: Participant, decision_id: int, decided_at: dt.datetime,
                decision_text: str) -> int:
    record_anchor(session, participant, "decision", f"decision:{decision_id}", decided_at,
                  {"decision": decision_text})
    return plan(session, participant)


def plan_many(session: Session, participants: list[Participant]) -> int:
    """``on_enrollment`` for many participants of one study, in one insert (studies, bench)."""
    if not participants:
        return 0
    study_id = participants[0].study_id
    version = current_version(session, study_id).version
    protocol = current_protocol(session, study_id)
    at = now()
    enrolled = [p for p in participants if p.enrolled_at is not None]
    bulk_insert(session, Anchor, [dict(participant_id=p.id, kind="enrollment", key="enrollment",
                                       anchored_at=p.enrolled_at, context={}) for p in enrolled])
    if followups_stopped(session, study_id):
        return 0
    rows: list[dict[str, object]] = []
    known: dict[tuple[int, dt.datetime, str], list[Timing]] = {}  # one protocol's specs: alive throughout
    for participant in enrolled:
        assert participant.enrolled_at is not None
        anchor = _AnchorRow("enrollment", "enrollment", participant.enrolled_at, {})
        rows += _rows(participant, [anchor], protocol, version, set(), at, known)
    bulk_insert(session, FollowUp, rows)
    return len(rows)


@dataclass
class Replan:
    updated: int = 0
    cancelled: int = 0
    added: int = 0


def replan_study(session: Session, study_id: int) -> Replan:
    """After a new protocol version: follow-ups not yet sent take the new schedule (or are
    cancelled if the protocol dropped them); new follow-ups are added. Sent ones are left alone."""
    version = current_version(session, study_id).version
    protocol = current_protocol(session, study_id)
    specs = {spec.id: spec for spec in protocol.followups}
    report = Replan()
    at = now()
    stale = session.scalars(select(FollowUp).where(
        FollowUp.study_id == study_id, FollowUp.status == FollowUpStatus.PLANNED,
        FollowUp.protocol_version != version)).all()
    anchors = {(a.participant_id, a.key): a for a in session.scalars(
        select(Anchor).join(Participant, Participant.id == Anchor.participant_id)
        .where(Participant.study_id == study_id))}
    for followup in stale:
        spec = specs.get(followup.followup_key)
        anchor = anchors.get((followup.participant_id, followup.anchor_key))
        occurrences = ([] if spec is None or anchor is None or spec.anchor != anchor.kind else
                       timings(spec, anchor.anchored_at, followup.timezone, protocol.quiet_hours))
        if followup.occurrence >= len(occurrences):  # the follow-up, or this occurrence of it, was dropped
            followup.status, followup.ended_at = FollowUpStatus.CANCELLED, at
            followup.end_reason = f"not in protocol version {version}"
            report.cancelled += 1
            continue
        assert spec is not None
        when = occurrences[followup.occurrence]
        followup.instrument_id, followup.protocol_version = spec.instrument, version
        followup.intended_local, followup.due_at, followup.closes_at = when.intended_local, when.due_at, when.closes_at
        followup.reminder_offsets, followup.updated_at = when.reminder_offsets, at
        report.updated += 1
    session.flush()
    known = set(session.scalars(select(FollowUp.followup_key).where(FollowUp.study_id == study_id).distinct()))
    if set(specs) - known or any(spec.repeat for spec in specs.values()):
        # the protocol added follow-ups (or occurrences of a repeating one): plan them for everyone enrolled
        for participant in session.scalars(select(Participant).where(
                Participant.study_id == study_id, Participant.status == ParticipantStatus.ENROLLED)):
            report.added += plan(session, participant)
    return report
