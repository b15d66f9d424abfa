"""Recruitment control: a study's status (open, paused, closed, archived) and its invites.

Only an open study takes new enrollments. Pausing stops them for a while; closing ends
recruitment for good; archiving hides a closed study (a test study, a finished one) from the
default listings and makes it read-only. Participants already enrolled go on in every state;
their follow-ups stop only when the researcher says so on close
(``scheduler.service.change_study_status``, the one entry point, cancels them as withdrawal
does). Every change is audited.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import ColumnElement, select, true, update
from sqlalchemy.orm import Session

from study import audit
from study.clock import now
from study.errors import Conflict, Forbidden, Invalid, NotFound
from study.models import InviteCode, Participant, Study, StudyStatus
from study.security import normalize_code, token_digest


class StudyAction(enum.StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CLOSE = "close"
    ARCHIVE = "archive"


# action: (the statuses it applies to, the status it leads to, its audit action)
RULES: dict[StudyAction, tuple[frozenset[StudyStatus], StudyStatus, str]] = {
    StudyAction.PAUSE: (frozenset({StudyStatus.OPEN}), StudyStatus.PAUSED, "study.paused"),
    StudyAction.RESUME: (frozenset({StudyStatus.PAUSED}), StudyStatus.OPEN, "study.resumed"),
    StudyAction.CLOSE: (frozenset({StudyStatus.OPEN, StudyStatus.PAUSED}), StudyStatus.CLOSED, "study.closed"),
    StudyAction.ARCHIVE: (frozenset({StudyStatus.CLOSED}), StudyStatus.ARCHIVED, "study.archived"),
}


@dataclass(frozen=True)
class Transition:
    action: StudyAction
    from_status: StudyStatus
    to_status: StudyStatus
    stop_followups: bool  # this change stops the study's follow-ups now

    @property
    def audit_action(self) -> str:
        return "study.followups_stopped" if self.from_status == self.to_status else RULES[self.action][2]


def _refusal(study: Study, action: StudyAction, current: StudyStatus) -> str:
    allowed, target, _ = RULES[action]
    if current == StudyStatus.ARCHIVED:
        return f"study '{study.slug}' is archived and read-only; its status cannot change any more"
    if current == target:
        hint = ""
        if action == StudyAction.CLOSE and study.followups_stopped_at is None:
            hint = "; to stop its participants' follow-ups too, close it with --stop-followups (stop_followups: true)"
        return f"study '{study.slug}' is already {current}{hint}"
    if action == StudyAction.RESUME and current == StudyStatus.CLOSED:
        return (f"study '{study.slug}' is closed, and a closed study cannot take new participants again "
                "(pause a study to stop recruitment for a while)")
    if action == StudyAction.ARCHIVE:
        return f"only a closed study can be archived, and '{study.slug}' is {current}; close it first"
    return (f"cannot {action} study '{study.slug}': it is {current}, and {action} applies to a study that is "
            + " or ".join(sorted(allowed)))


def check_transition(study: Study, action: StudyAction, *, stop_followups: bool = False) -> Transition:
    """The change ``action`` makes to ``study``, or Conflict saying why it is not allowed.

    Closing an already closed study with ``stop_followups`` stops its follow-ups (recruitment
    ended earlier; the follow-ups end now)."""
    if stop_followups and action != StudyAction.CLOSE:
        raise Invalid(f"stopping follow-ups goes with close, not {action}", code="invalid_option")
    current = StudyStatus(study.status)
    allowed, target, _ = RULES[action]
    if (action == StudyAction.CLOSE and current == StudyStatus.CLOSED and stop_followups
            and study.followups_stopped_at is None):
        return Transition(action, current, current, stop_followups=True)
    if current not in allowed:
        raise Conflict(_refusal(study, action, current), code="invalid_transition")
    return Transition(action, current, target, stop_followups and study.followups_stopped_at is None)


def apply(session: Session, study: Study, transition: Transition, actor: audit.Actor, *,
          followups_cancelled: int = 0) -> Study:
    """Make the change (atomically: a concurrent change of the same study is refused) and audit it."""
    at = now()
    values: dict[str, object] = {"status": transition.to_status}
    if transition.to_status != transition.from_status:
        values["status_changed_at"] = at
    if transition.stop_followups:
        values["followups_stopped_at"] = at
    changed = session.execute(update(Study).where(Study.id == study.id, Study.status == transition.from_status)
                              .values(**values)).rowcount  # type: ignore[attr-defined]
    if changed != 1:
        raise Conflict(f"study '{study.slug}' changed status meanwhile; look at it again and retry",
                       code="status_changed")
    session.refresh(study)
    audit.record(session, actor, transition.audit_action, study_id=study.id, from_status=str(transition.from_status),
                 to_status=str(transition.to_status), stop_followups=transition.stop_followups,
                 followups_cancelled=followups_cancelled)
    return study


def require_enrolling(study: Study) -> None:
    """Refuse a new enrollment unless the study is open (the participant sees this message)."""
    if study.status == StudyStatus.OPEN:
        return
    if study.status == StudyStatus.PAUSED:
        raise Forbidden("this study is not taking new participants at the moment; please try again later, "
                        "or ask the study team when it reopens", code="enrollment_paused")
    raise Forbidden("this study is no longer taking new participants: recruitment has ended. "
                    "Thank you for your interest.", code="enrollment_closed")


def require_writable(study: Study, what: str) -> None:
    """Refuse a change to an archived study; ``what`` names the change ("loading a protocol")."""
    if study.status == StudyStatus.ARCHIVED:
        raise Conflict(f"study '{study.slug}' is archived and read-only: {what} is not possible",
                       code="study_archived")


def require_recruiting(study: Study, what: str) -> None:
    """Refuse what only makes sense while recruitment may still go on (new invites)."""
    require_writable(study, what)
    if study.status == StudyStatus.CLOSED:
        raise Conflict(f"study '{study.slug}' is closed (recruitment has ended): {what} is not possible",
                       code="study_closed")


def visible(include_archived: bool) -> ColumnElement[bool]:
    """The default listings' filter: archived studies only when asked for."""
    return true() if include_archived else Study.status != StudyStatus.ARCHIVED


# Invites


class InviteStatus(enum.StrEnum):
    UNUSED = "unused"  # not revoked, never used
    USED = "used"  # not revoked, used at least once (a capped link may have uses left)
    REVOKED = "revoked"


@dataclass(frozen=True)
class InviteUse:
    participant_code: str
    at: dt.datetime  # when the invite was redeemed


@dataclass(frozen=True)
class InviteListing:
    """One invite and its use: who (pseudonymous codes only) and when. The code itself is not
    stored, only its hash."""

    invite: InviteCode
    uses: list[InviteUse]

    @property
    def status(self) -> InviteStatus:
        if self.invite.revoked_at is not None:
            return InviteStatus.REVOKED
        return InviteStatus.USED if self.invite.use_count > 0 else InviteStatus.UNUSED

    @property
    def expired(self) -> bool:
        return self.invite.expires_at is not None and self.invite.expires_at <= now()


_STATUS_FILTER: dict[InviteStatus, ColumnElement[bool]] = {
    InviteStatus.UNUSED: InviteCode.revoked_at.is_(None) & (InviteCode.use_count == 0),
    InviteStatus.USED: InviteCode.revoked_at.is_(None) & (InviteCode.use_count > 0),
    InviteStatus.REVOKED: InviteCode.revoked_at.is_not(None),
}


def list_invites(session: Session, study: Study, actor: audit.Actor,
                 status: InviteStatus | None = None) -> list[InviteListing]:
    """The study's invites, oldest first, with who used each and when; the read is audited (it
    names participants)."""
    query = select(InviteCode).where(InviteCode.study_id == study.id)
    if status is not None:
        query = query.where(_STATUS_FILTER[status])
    invites = session.scalars(query.order_by(InviteCode.created_at, InviteCode.id)).all()
    uses: dict[int | None, list[InviteUse]] = defaultdict(list)
    used_ids = [invite.id for invite in invites if invite.use_count > 0]
    for start in range(0, len(used_ids), 500):  # bounded IN lists
        for invite_id, code, at in session.execute(
                select(Participant.invite_id, Participant.code, Participant.created_at)
                .where(Participant.invite_id.in_(used_ids[start:start + 500]))
                .order_by(Participant.created_at, Participant.id)):
            uses[invite_id].append(InviteUse(code, at))
    audit.record(session, actor, "invites.listed", study_id=study.id, status=str(status) if status else None,
                 count=len(invites))
    return [InviteListing(invite, uses[invite.id]) for invite in invites]


def revoke_invite(session: Session, study: Study, actor: audit.Actor, *, code: str | None = None,
                  invite_id: int | None = None) -> InviteListing:
    """Revoke one invite, named by its code or by its id (from the listing). Nobody can enroll
    with it afterwards; those who already did go on."""
    if (code is None) == (invite_id is None):
        raise Invalid("name the invite by its code or by its id (one of the two)", code="invite_unnamed")
    require_writable(study, "revoking an invite")
    where = (InviteCode.code_sha256 == token_digest(normalize_code(code)) if code is not None
             else InviteCode.id == invite_id)
    invite = session.scalar(select(InviteCode).where(where, InviteCode.study_id == study.id))
    if invite is None:
        named = "this code" if code is not None else f"id {invite_id}"
        raise NotFound(f"study '{study.slug}' has no invite with {named}; see `afterward invites list {study.slug}`")
    if invite.revoked_at is not None:
        raise Conflict(f"invite {invite.id} was already revoked on {invite.revoked_at:%Y-%m-%d %H:%M} UTC",
                       code="invite_already_revoked")
    invite.revoked_at = now()
    session.flush()
    audit.record(session, actor, "invite.revoked", study_id=study.id, invite_id=invite.id, label=invite.label,
                 use_count=invite.use_count, max_uses=invite.max_uses)
    uses = [InviteUse(c, at) for c, at in session.execute(
        select(Participant.code, Participant.created_at).where(Participant.invite_id == invite.id)
        .order_by(Participant.created_at, Participant.id))]
    return InviteListing(invite, uses)
