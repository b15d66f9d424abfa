"""Chat API models."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field, StrictBool

from chat import triage
from chat.check_ins import Summary
from chat.models import Conversation, Turn
from chat.roles import RoleSpec
from chat.service import reply_in_flight
from study.i18n import gettext
from study.safety import CheckInKind, SafetyCheckIn, SafetyEvent, SafetyEventReview
from study.validation import NOT_BLANK_PATTERN, Line, RequestBody

QuestionId = Literal["wish_dead", "thoughts", "method", "intent", "plan", "behaviour", "safe_now", "person_near",
                     "safe_place"]  # chat.triage.QUESTION_IDS (tests/chat/test_triage.py holds the two together)
CheckInStatus = Literal["open", "answered", "unanswered", "replaced"]


class DisclosureRead(BaseModel):
    name: str
    title: str
    tagline: str
    optimized_for: str
    will: list[str]
    wont: list[str]
    pushback: str

    @classmethod
    def of(cls, spec: RoleSpec) -> DisclosureRead:
        d = spec.disclosure
        return cls(name=spec.name, title=d.title, tagline=d.tagline, optimized_for=d.optimized_for,
                   will=list(d.will), wont=list(d.wont), pushback=d.pushback)


class RolesRead(BaseModel):
    mode: str
    default_role: str | None
    roles: list[DisclosureRead]


class CrisisResourcesRead(BaseModel):
    region: str
    text: str


class ConversationCreate(RequestBody):
    role: Line | None = Field(default=None, max_length=40,
                             description="concierge, collaborator or coach (wellbeing arms)")


class RoleChange(RequestBody):
    role: Line = Field(max_length=40)


class MessageCreate(RequestBody):
    # Length is checked by the service against the configured limit, with a message that says it.
    content: str = Field(json_schema_extra={"pattern": NOT_BLANK_PATTERN})
    client_message_id: str | None = Field(
        default=None, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Your own id for this message; resending it never stores a second copy")


class ExitCheck(RequestBody):
    # As chat.service.end_conversation checks it: a decision is described exactly when one was made.
    schema_rules = {"anyOf": [
        {"required": ["made_decision", "decision"], "properties": {
            "made_decision": {"const": True}, "decision": {"type": "string", "pattern": NOT_BLANK_PATTERN}}},
        {"properties": {"made_decision": {"const": False},
                        "decision": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": r"^\s*$"}]}}}]}
    rating: int | None = Field(default=None, ge=1, le=7,
                               description="How helpful was this conversation? 1 = not at all, 7 = extremely")
    made_decision: StrictBool = False
    decision: str | None = Field(default=None, max_length=2000, description="What you decided, in your words")


class CheckInQuestionRead(BaseModel):
    id: QuestionId
    text: str
    asked: bool = Field(description="asked, given the earlier answers (no questions about a method, intent or a "
                                    "plan after a no to thoughts of ending one's life)")
    answer: triage.Answer | None = Field(default=None, description="yes, no or declined (prefer not to say)")
    given: triage.Given | None = Field(default=None, description="how it was answered: button or words")


class CheckInRead(BaseModel):
    """A safety check-in as the participant sees it (``chat.triage``): its questions, the one to
    answer now, and once answered what happens next."""

    id: int
    kind: Literal["risk_to_self", "risk_from_others"]
    intro: str
    questions: list[CheckInQuestionRead]
    status: CheckInStatus = Field(description="open; answered (the answers decided); unanswered (not answered by "
                                  "the protocol's deadline; answers still taken); replaced (by a newer check-in)")
    next_question: QuestionId | None = Field(description="the question to answer now; null once answered or replaced")
    next_step: str | None = Field(description="what happens next, once the answers decided")
    follow_up: str | None = Field(default=None, description="the study's follow-up, shown when it went unanswered")

    @classmethod
    def of(cls, check_in: SafetyCheckIn, event: SafetyEvent, next_step: str | None,
           language: str = "en") -> CheckInRead:
        """The check-in, its texts in ``language`` (the participant's; the stored wording is English)."""
        def say(text: str) -> str:
            return gettext(language, text)
        kind = CheckInKind(check_in.kind)
        answers = {question: given for question, given in (check_in.answers or {}).items()}
        values = {question: str(given["answer"]) for question, given in answers.items()}
        asked = set(triage.to_ask(kind, values))
        status = Summary.of(check_in, event).status
        settled = check_in.answered_at is not None or status == "replaced"
        return cls(id=check_in.id, kind=kind.value, intro=say(triage.INTRO[kind]), questions=[
            CheckInQuestionRead(id=q["id"], text=say(q["text"]), asked=q["id"] in asked,
                                answer=answers.get(q["id"], {}).get("answer"),
                                given=answers.get(q["id"], {}).get("given"))
            for q in check_in.questions], status=status,
            next_question=None if settled else triage.next_question(kind, values),
            next_step=say(next_step) if next_step else None,
            follow_up=say(triage.FOLLOW_UP) if check_in.followed_up_at and not settled else None)


class CheckInAnswers(RequestBody):
    """Answers to one or more of a check-in's questions; the same answer again changes nothing."""

    answers: dict[QuestionId, Literal["yes", "no", "declined"]] = Field(
        min_length=1, max_length=9, description="question id -> yes, no or declined (prefer not to say)")


class TurnRead(BaseModel):
    id: int
    seq: int
    speaker: str
    role: str
    content: str
    created_at: dt.datetime
    reply_status: str | None = None
    stance: str | None = None
    concern: str | None = None
    rationale: str | None = None
    overridable: bool = False
    crisis_resources: CrisisResourcesRead | None = None
    response: str | None = None  # override | reconsider, once the participant answered the note
    check_in: CheckInRead | None = Field(default=None, description="the safety check-in this reply asked")

    @classmethod
    def of(cls, turn: Turn, resources: CrisisResourcesRead | None = None, response: str | None = None,
           check_in: CheckInRead | None = None) -> TurnRead:
        return cls(id=turn.id, seq=turn.seq, speaker=turn.speaker, role=turn.role, content=turn.content,
                   created_at=turn.created_at, reply_status=turn.reply_status, stance=turn.stance,
                   concern=turn.concern, rationale=turn.rationale,
                   overridable=turn.stance in ("nudge", "challenge") and response is None,
                   crisis_resources=resources if turn.stance == "escalate" else None, response=response,
                   check_in=check_in)


class ConversationRead(BaseModel):
    id: int
    role: str
    mode: str
    status: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    turn_count: int
    awaiting_reply: bool = Field(default=False, description="a reply is being written now, and is stored even if "
                                 "nobody waits for it: read the conversation again in a moment")

    @classmethod
    def of(cls, c: Conversation) -> ConversationRead:
        return cls(id=c.id, role=c.role, mode=c.mode, status=c.status, started_at=c.started_at,
                   ended_at=c.ended_at, turn_count=c.turn_count, awaiting_reply=reply_in_flight(c))


class ConversationDetail(ConversationRead):
    turns: list[TurnRead]


class ExchangeRead(BaseModel):
    """A participant message and the assistant's reply to it."""

    conversation_id: int
    message: TurnRead
    reply: TurnRead


class PushbackResponseRead(BaseModel):
    turn_id: int
    action: str


class ConversationEnded(BaseModel):
    conversation: ConversationRead
    decision_id: int | None
    exit_survey_id: int | None


class SafetyReviewRead(BaseModel):
    reviewed_at: dt.datetime
    reviewed_by: str
    note: str

    @classmethod
    def of(cls, review: SafetyEventReview) -> SafetyReviewRead:
        return cls(reviewed_at=review.reviewed_at, reviewed_by=review.reviewed_by, note=review.note)


DEIDENTIFIED = "participant withdrew and deleted data"


class CheckInAnswerRead(BaseModel):
    question: str
    text: str
    answer: str | None = Field(description="yes, no or declined (prefer not to say); null: not answered")
    given: str | None = Field(description="button or words")
    answered_at: dt.datetime | None


class SafetyCheckInRead(BaseModel):
    """The check-in an event asked, for staff: each question with its answer and how it was given."""

    kind: str
    status: CheckInStatus
    outcome: str | None = Field(description="what the answers say by the triage rule (chat.triage.decide); null "
                                            "while undecided")
    asked_at: dt.datetime
    answered_at: dt.datetime | None = Field(description="when the answers decided the level")
    followed_up_at: dt.datetime | None = Field(description="when the participant was shown the follow-up")
    answers: list[CheckInAnswerRead]

    @classmethod
    def of(cls, check_in: SafetyCheckIn, event: SafetyEvent) -> SafetyCheckInRead:
        given = check_in.answers or {}
        summary = Summary.of(check_in, event)
        return cls(kind=check_in.kind, status=summary.status, outcome=summary.outcome, asked_at=check_in.created_at,
                   answered_at=check_in.answered_at, followed_up_at=check_in.followed_up_at, answers=[
                       CheckInAnswerRead(question=q["id"], text=q["text"], answer=given.get(q["id"], {}).get("answer"),
                                         given=given.get(q["id"], {}).get("given"),
                                         answered_at=given[q["id"]]["at"] if q["id"] in given else None)
                       for q in check_in.questions])


class SafetyEventRead(BaseModel):
    id: int
    participant: str | None = Field(description="the participant's code; null once they deleted their data")
    conversation_id: int | None
    category: str
    source: str
    cue: str | None
    created_at: dt.datetime
    level: Literal["check_in", "escalation", "unanswered"] = Field(
        description="check_in (a risk sign met by a check-in, reviewed by staff), escalation (pages the on-call "
                    "contacts) or unanswered (its check-in was not answered by the protocol's deadline)")
    page_since: dt.datetime | None = Field(description="when its level started to page the on-call contacts; null: "
                                                       "it does not page")
    answer_due_at: dt.datetime | None = Field(description="when its check-in's answers are due, while awaited")
    unanswered_at: dt.datetime | None = Field(description="when its check-in became unanswered")
    check_in: SafetyCheckInRead | None = Field(default=None, description="the check-in it asked, with the answers")
    participant_data_deleted: bool = Field(
        default=False, description="a de-identified safety record: no participant, conversation or matched text")
    marker: str | None = Field(default=None, description=f"'{DEIDENTIFIED}' on a de-identified record")
    # The newest review, as before the history existed (None: not reviewed yet).
    reviewed_at: dt.datetime | None
    reviewed_by: str | None
    review_note: str | None
    reviews: list[SafetyReviewRead] = Field(description="every review, oldest first; none is ever overwritten")

    @classmethod
    def of(cls, event: SafetyEvent, participant_code: str | None, reviews: list[SafetyEventReview],
           check_in: SafetyCheckIn | None = None) -> SafetyEventRead:
        """``reviews``: the event's reviews, oldest first. The newest counts as its review only if
        it came after the event took its level (``SafetyEvent.reviewed_at``)."""
        newest = reviews[-1] if reviews and event.reviewed_at is not None else None
        return cls(id=event.id, participant=participant_code, conversation_id=event.conversation_id,
                   category=event.category, source=event.source, cue=event.cue, created_at=event.created_at,
                   level=event.level, page_since=event.page_since,
                   answer_due_at=event.answer_due_at, unanswered_at=event.unanswered_at,
                   check_in=SafetyCheckInRead.of(check_in, event) if check_in is not None else None,
                   participant_data_deleted=event.participant_data_deleted,
                   marker=DEIDENTIFIED if event.participant_data_deleted else None,
                   reviewed_at=newest.reviewed_at if newest else None,
                   reviewed_by=newest.reviewed_by if newest else None, review_note=newest.note if newest else None,
                   reviews=[SafetyReviewRead.of(review) for review in reviews])


class SafetyReview(RequestBody):
    """A review is added to the event's history; earlier ones are kept as they were."""

    note: str = Field(min_length=1, max_length=4000, description="What was done, e.g. 'contacted per protocol'")
