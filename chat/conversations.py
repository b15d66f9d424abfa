"""Conversations: the roles a participant's arm offers, starting one, switching its role, and
reading conversations and their turns. The turn itself is ``chat.service``'s (which re-exports
these for its callers) and ``chat.turn``'s."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from chat.models import Conversation, RoleSwitch, Turn
from chat.roles import ROLE_SPECS, RoleName, RoleSpec, roles_for_arm
from study.clock import now
from study.errors import Conflict, Invalid, NotFound
from study.models import Participant, ParticipantStatus
from study.protocol import Arm
from study.studies import current_protocol


def arm_of(session: Session, participant: Participant) -> Arm:
    if participant.arm is None or participant.status != ParticipantStatus.ENROLLED:
        raise Conflict("finish enrollment (consent, then your profile) before chatting", code="not_enrolled")
    return current_protocol(session, participant.study_id).arm(participant.arm)


def roles_offered(session: Session, participant: Participant) -> tuple[Arm, list[RoleSpec]]:
    arm = arm_of(session, participant)
    return arm, [ROLE_SPECS[name] for name in roles_for_arm(arm.mode, list(arm.roles))]


def _check_role(arm: Arm, offered: list[RoleSpec], role: str | None) -> RoleName:
    names = [spec.name for spec in offered]
    if arm.mode != "wellbeing":
        if role not in (None, "standard"):
            raise Invalid("your study group uses the standard assistant, which has no roles to choose from",
                          code="roles_not_offered")
        return "standard"
    if role is None:
        raise Invalid(f"choose how the assistant should work with you first: {', '.join(names)}",
                      code="role_required")
    if role not in names:
        raise Invalid(f"'{role}' is not a role you can choose; choose one of: {', '.join(names)}",
                      code="unknown_role")
    return role


def start_conversation(session: Session, participant: Participant, role: str | None) -> Conversation:
    arm, offered = roles_offered(session, participant)
    conversation = Conversation(
        participant_id=participant.id, arm=arm.name, mode=arm.mode, role=_check_role(arm, offered, role),
        status="active", turn_count=0, concern_counts={}, overridden_concerns=[], started_at=now())
    session.add(conversation)
    session.flush()
    return conversation


def get_conversation(session: Session, participant: Participant, conversation_id: int,
                     *, for_update: bool = False) -> Conversation:
    query = select(Conversation).where(Conversation.id == conversation_id,
                                       Conversation.participant_id == participant.id)
    conversation = session.scalar(query.with_for_update() if for_update else query)
    if conversation is None:
        raise NotFound(f"you have no conversation {conversation_id}")
    return conversation


def _require_active(conversation: Conversation) -> None:
    if conversation.status != "active":
        raise Conflict("this conversation has ended; start a new one to keep talking", code="conversation_ended")


def switch_role(session: Session, participant: Participant, conversation_id: int, role: str) -> RoleSwitch:
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)
    arm, offered = roles_offered(session, participant)
    new_role = _check_role(arm, offered, role)
    switch = RoleSwitch(conversation_id=conversation.id, participant_id=participant.id,
                        from_role=conversation.role, to_role=new_role, after_seq=conversation.turn_count,
                        created_at=now())
    conversation.role = new_role
    session.add(switch)
    session.flush()
    return switch


def turns(session: Session, conversation: Conversation) -> list[Turn]:
    return list(session.scalars(select(Turn).where(Turn.conversation_id == conversation.id).order_by(Turn.seq)))


def role_switches(session: Session, conversation: Conversation) -> list[RoleSwitch]:
    """The conversation's role changes in order (``after_seq``: the number of turns before each)."""
    return list(session.scalars(select(RoleSwitch).where(RoleSwitch.conversation_id == conversation.id)
                                .order_by(RoleSwitch.id)))


def list_conversations(session: Session, participant: Participant) -> list[Conversation]:
    return list(session.scalars(select(Conversation).where(Conversation.participant_id == participant.id)
                                .order_by(Conversation.started_at.desc(), Conversation.id.desc())))
