"""Simulated studies through the real services, with effects known in advance.

``simulate`` enrolls synthetic participants in a simulated study through the real invite,
consent, profile (arm by the study's own randomization), chat (offline model), exit-check, survey
and withdrawal services, moving the injectable clock forward and running a dispatcher of its own,
which opens and expires the follow-ups. Every answer comes from a generative model whose
parameters (:class:`Effects`) are stored with the run in ``simulation_runs``, so a statistic
computed from the resulting database can be checked against the truth::

    from analysis.simulation.simulate import Effects, load_simulated_study, simulate
    slug = load_simulated_study(engine, Path("examples/wellbeing-pilot.yaml").read_text())
    result = simulate(engine, slug, participants=200, weeks=6, seed=1, effects=Effects(regret_coach=-15.0))
    result.summary["followups_completed"], result.true_effects["regret_coach"]

It cannot touch a live study. It writes only to a study marked simulated (``load_simulated_study``:
a protocol loaded under a slug of its own), and refuses any other, or one with participants who
did not come from a simulation (``study.studies.simulated_study``). Its dispatcher works for that
study alone and notifies nobody, and the live dispatcher touches none of its rows
(``scheduler.scope``), whatever the two clocks say.

Time moves in steps of ``tick_minutes`` (an hour): at each step the dispatcher runs once, then the
step's actions are taken, a kind at a time: enrollments, withdrawals (one transaction for the
step's), conversations (each request one unit of work, through ``analysis.simulation.driver``),
and the participants who look at the app in that step (one read for all of them, then one
transaction for the surveys they answer). Each action is stamped with its own moment within the
step, so a conversation lasts minutes and a survey is answered when its participant opened it.

It writes nothing itself except its own ``simulation_runs`` row: every other row comes from a
service, with the model called between two units of work (never inside one, never with database
work on the event loop). The same seed on the same database state (including the study's
allocation seed) gives the same data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from analysis.simulation.driver import Driver, OfflineGateway
from analysis.simulation.population import (
    CHANGED_COURSE,
    DEPENDENCE,
    DISTRESS,
    DRS_REVERSED,
    OFFLINE_MODEL,
    PERMA_NEGATIVE,
    REASSURANCE,
    TIMEZONES,
    TOPICS,
    Effects,
    Topic,
)
from analysis.tables import SimulationRun
from chat import service as chat
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, Turn
from chat.roles import roles_for_arm
from scheduler.channels import InAppChannel
from scheduler.dispatcher import Dispatcher, TickReport
from scheduler.models import FollowUp
from scheduler.service import save_profile
from study import audit, participants, studies, wiring
from study.clock import FrozenClock, now, set_clock
from study.db import session_scope
from study.models import InviteCode, Participant, ParticipantStatus, WithdrawalLevel
from study.protocol import parse_protocol
from study.safety import SafetyEvent
from study.settings import get_settings
from surveys import registry
from surveys import service as surveys
from surveys.definitions import Instrument
from surveys.models import SurveyAssignment
from surveys.registry import catalog as instrument_catalog

ACTOR = audit.Actor.system("simulate")
CONFIRM_SIGNATURE = "Simulated Participant"
# The order a step's actions are taken in, a kind at a time (each in the order of its moments).
KINDS = ("enroll", "withdraw", "converse", "check_surveys")


@dataclass
class SimulationResult:
    run_id: int
    study: str
    seed: int
    summary: dict[str, Any]  # what the run left in the database (``summarize``)
    true_effects: dict[str, Any]
    seconds: float
    # What the run itself did: its dispatcher's follow-ups opened and expired, the participants'
    # answers and misses (the progress lines' figures). The database's summary must agree with them.
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class _Person:
    """A synthetic participant: the latent truths and what the simulation needs to remember."""

    index: int
    invite: str
    timezone: str
    enroll_at: dt.datetime
    latent: float
    topic: Topic
    usual_role: str | None = None
    regret_person: float = 0.0
    participant_id: int | None = None
    arm_mode: str | None = None
    roles: tuple[str, ...] = ()
    baseline: float | None = None  # the observed covariate: baseline PERMA overall well-being
    active: bool = False
    seen: set[int] = field(default_factory=set)  # survey assignments already looked at
    decisions: dict[int, tuple[float, str]] = field(default_factory=dict)  # decision id -> latent regret, role


@dataclass(frozen=True, order=True)
class _Action:
    at: dt.datetime
    order: int  # ties keep the order they were planned in
    kind: str = field(compare=False)
    person: int = field(compare=False)
    payload: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class _Answer:
    """A survey a participant chose to answer, and when they submit it."""

    at: dt.datetime
    person: _Person
    assignment_id: int
    followup: bool


def _logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def open_surveys(session: Session, looking: Sequence[tuple[dt.datetime, int | None]]) -> list[list[tuple[int, str]]]:
    """For each (moment, participant id) of ``looking``: the surveys ``surveys.service.pending``
    shows the participant at that moment (id and purpose, oldest first), read for all of them in
    one query."""
    rows = session.execute(
        select(SurveyAssignment.participant_id, SurveyAssignment.id, SurveyAssignment.purpose,
               SurveyAssignment.intended_at, SurveyAssignment.closes_at)
        .where(SurveyAssignment.participant_id.in_({who for _, who in looking}), SurveyAssignment.status == "open")
        .order_by(SurveyAssignment.intended_at, SurveyAssignment.id)).all()
    by_participant: defaultdict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_participant[row.participant_id].append(row)
    return [[(row.id, row.purpose) for row in by_participant[who or 0]
             if row.intended_at <= at and (row.closes_at is None or row.closes_at > at)] for at, who in looking]


def load_simulated_study(engine: Engine, protocol_yaml: str, slug: str | None = None) -> str:
    """Load ``protocol_yaml`` as a simulated study (by default ``<protocol id>-simulated``; a new
    version when the file changed) and return its slug: the study ``simulate`` may write to.
    Refused (``study.errors.Conflict``) when the slug is a live study's."""
    with session_scope(engine) as session:
        if slug is None:
            slug = f"{parse_protocol(protocol_yaml).study.id}-simulated"[:63]
        return studies.load_simulated(session, protocol_yaml, ACTOR, slug,
                                      instruments=instrument_catalog(session)).study.slug


class _Simulation:
    def __init__(self, engine: Engine, study_slug: str, *, participants: int, weeks: int, seed: int,
                 effects: Effects, start: dt.datetime, tick_minutes: int,
                 progress: Callable[[str], None] | None, runner: asyncio.Runner) -> None:
        # ``runner``: one event loop for every model call, run between transactions
        self.engine, self.slug, self.n, self.weeks, self.seed = engine, study_slug, participants, weeks, seed
        self.effects, self.start, self.tick = effects, start, dt.timedelta(minutes=tick_minutes)
        self.progress = progress or (lambda _line: None)
        self.rng = np.random.default_rng(seed)
        self.clock = FrozenClock(start)
        self.settings = get_settings().model_copy(update={
            "llm_model": OFFLINE_MODEL, "llm_fallback_model": None, "llm_reader_model": None,
            "offline_llm_delay_ms": 0})
        self.driver = Driver(engine, OfflineGateway(self.settings), self.clock, runner, model=OFFLINE_MODEL)
        self.ticks = TickReport()
        self.counts: Counter[str] = Counter()
        self.actions: defaultdict[int, list[_Action]] = defaultdict(list)  # by step
        self.step = 0
        self._order = 0

    # Running

    def run(self) -> int:
        with session_scope(self.engine) as session:
            study = studies.simulated_study(session, self.slug)  # refused unless simulated, with no real participants
            self.study_id = study.id
            protocol = studies.current_protocol(session, study.id)
            self.email_required = protocol.enrollment.contact_email == "required"
            self.deletion_allowed = protocol.withdrawal.allow_data_deletion
            perma = sorted((f for f in protocol.followups if f.instrument == "perma-profiler"
                            and f.anchor == "enrollment"), key=lambda f: f.offset)
            self.perma_wave = {f.id: k for k, f in enumerate(perma, start=1)}
            run = SimulationRun(study_id=study.id, seed=self.seed, participants=self.n, weeks=self.weeks,
                                parameters=self.parameters(), true_effects=self.effects.true_effects())
            session.add(run)
            session.flush()
            self.run_id = run.id
            codes = participants.create_invites(session, study, ACTOR, count=self.n, simulation=run.id)
            audit.record(session, ACTOR, "simulation.started", study_id=study.id, run_id=run.id, seed=self.seed,
                         participants=self.n, weeks=self.weeks)
        # Its own study alone, in-app only: nothing leaves the machine and no live row is touched.
        self.dispatcher = Dispatcher(self.engine, self.settings, name=f"simulate-{self.run_id}",
                                     channels={"in_app": InAppChannel()}, simulated_study=self.study_id)
        self.people = self._people(codes)
        for person in self.people:
            self._push(person.enroll_at, "enroll", person)
        end = self.start + dt.timedelta(weeks=self.weeks)
        day = 0
        for step in range(math.ceil((end - self.start) / self.tick)):
            self.step = step
            at = self.start + step * self.tick
            while at >= self.start + dt.timedelta(days=day):
                self._plan_day(self.start + dt.timedelta(days=day))
                day += 1
                if day % 7 == 0:
                    self.progress(self._progress_line(day // 7))
            self.clock.set(at)
            self.ticks.add(self.dispatcher.tick())
            self._take(self.actions.pop(step, []))
        self.clock.set(end)
        self.ticks.add(self.dispatcher.tick())
        if day % 7:
            self.progress(self._progress_line(self.weeks))
        return self.run_id

    def parameters(self) -> dict[str, Any]:
        return {"effects": dataclasses.asdict(self.effects), "start": self.start.isoformat(),
                "tick_minutes": self.tick.total_seconds() / 60, "enrollment_days": self._enrollment_days(),
                "timezones": list(TIMEZONES), "model": OFFLINE_MODEL, "study": self.slug}

    def _enrollment_days(self) -> int:
        return max(1, min(14, self.weeks * 7 // 3))

    def _people(self, codes: list[str]) -> list[_Person]:
        e, rng = self.effects, self.rng
        people = []
        for index, code in enumerate(codes):
            offset = dt.timedelta(days=int(rng.integers(self._enrollment_days())),
                                  minutes=int(rng.integers(8 * 60, 22 * 60)))
            zone = TIMEZONES[int(rng.integers(len(TIMEZONES)))]
            people.append(_Person(
                index=index, invite=code, timezone=zone, enroll_at=self._local(self.start + offset, zone),
                latent=float(rng.normal(e.baseline_mean, e.baseline_sd)),
                topic=TOPICS[int(rng.integers(len(TOPICS)))], regret_person=float(rng.normal(0, e.regret_person_sd))))
        return people

    def _local(self, utc_day_time: dt.datetime, zone: str) -> dt.datetime:
        """The same wall-clock time in ``zone`` (so people act in their waking hours), as UTC."""
        day_start = utc_day_time.replace(hour=0, minute=0, second=0, microsecond=0)
        offset = day_start.astimezone(ZoneInfo(zone)).utcoffset() or dt.timedelta(0)
        # Kept inside the same UTC day, which is the day being planned.
        return day_start + (utc_day_time - day_start - offset) % dt.timedelta(days=1)

    def _push(self, when: dt.datetime, kind: str, person: _Person, payload: Any = None) -> None:
        """Plan an action at ``when``: taken in its step (or at the start of the current one, if its
        moment has passed: a day planned from a start that is not midnight UTC)."""
        self._order += 1
        step = max(self.step, (when - self.start) // self.tick)
        at = max(when, self.start + step * self.tick)
        self.actions[step].append(_Action(at, self._order, kind, person.index, payload))

    def _take(self, actions: list[_Action]) -> None:
        """The step's actions, a kind at a time (``KINDS``), each kind in the order of its moments."""
        by_kind: defaultdict[str, list[_Action]] = defaultdict(list)
        for action in sorted(actions):
            by_kind[action.kind].append(action)
        for kind in KINDS:
            if by_kind[kind]:
                getattr(self, f"_{kind}")(by_kind[kind])

    def _plan_day(self, day: dt.datetime) -> None:
        """Each active participant's day: maybe withdraw, chat a few times, look at the app once."""
        e, rng = self.effects, self.rng
        for person in self.people:
            if not person.active:
                continue
            assert person.baseline is not None
            weekly = _logistic(e.withdraw_weekly_logit + e.withdraw_per_baseline_point
                               * (person.baseline - e.baseline_center))
            if rng.random() < 1 - (1 - weekly) ** (1 / 7):
                deletes = rng.random() < e.delete_data_share and self.deletion_allowed
                level = WithdrawalLevel.DELETE_DATA if deletes else WithdrawalLevel.STOP_CONTACT
                self._push(self._waking(day, person), "withdraw", person, level)
                person.active = False  # nothing else planned for them
                continue
            for _ in range(int(rng.poisson(e.conversations_per_week / 7))):
                self._push(self._waking(day, person), "converse", person)
            self._push(self._local(day + dt.timedelta(hours=float(rng.uniform(17, 22))), person.timezone),
                       "check_surveys", person)

    def _waking(self, day: dt.datetime, person: _Person) -> dt.datetime:
        return self._local(day + dt.timedelta(minutes=int(self.rng.integers(8 * 60, 22 * 60))), person.timezone)

    def own_counts(self) -> dict[str, int]:
        return {"followups_opened": self.ticks.opened, "followups_expired": self.ticks.expired,
                "followups_answered": self.counts["followups_answered"],
                "followups_missed": self.counts["followups_missed"], "enrolled": self.counts["enrolled"],
                "withdrawn": self.counts["withdrawn"], "conversations": self.counts["conversations"],
                "messages": self.counts["messages"]}

    def _progress_line(self, week: int) -> str:
        c = self.counts
        return (f"week {week}: enrolled {c['enrolled']}, conversations {c['conversations']}, messages "
                f"{c['messages']}, follow-ups opened {self.ticks.opened}, answered {c['followups_answered']}, "
                f"missed {c['followups_missed']}, withdrawn {c['withdrawn']}")

    # The step's actions. Each request of a participant is one unit of work, as at the real edge,
    # but where many participants act in the same step: one unit for all of them.

    def _as(self, person: _Person, session: Session) -> Participant:
        """The participant as the API's consented-participant dependency gives it."""
        assert person.participant_id is not None
        return Driver.participant(session, person.participant_id)

    def _enroll(self, actions: list[_Action]) -> None:
        for action in actions:
            self.clock.set(action.at)
            self._enroll_one(self.people[action.person])

    def _enroll_one(self, person: _Person) -> None:
        e, rng = self.effects, self.rng
        with session_scope(self.engine) as session:  # POST /enrollment
            person.participant_id = participants.enroll(session, person.invite).participant.id
        with session_scope(self.engine) as session:  # POST /me/consent
            participant = session.get(Participant, person.participant_id)
            assert participant is not None
            current = participants.consent_status(session, participant).current
            ticked = [c["id"] for c in current.confirmations
                      if c.get("required", True) or rng.random() < e.optional_consent_prob]
            participants.sign_consent(session, participant, version=current.version, confirmations=ticked,
                                      typed_signature=CONFIRM_SIGNATURE)
        self.clock.advance(dt.timedelta(minutes=2))
        with session_scope(self.engine) as session:  # PUT /me/profile
            participant = self._as(person, session)
            email = f"participant{person.index}@example.org" if self.email_required else None
            baseline = save_profile(session, participant, timezone=person.timezone, contact_email=email)
            arm = chat.arm_of(session, participant)
            person.arm_mode = arm.mode
            person.roles = tuple(roles_for_arm(arm.mode, list(arm.roles)))
            baseline_ids = [assignment.id for assignment in baseline]
        if person.arm_mode == "wellbeing":
            weights = np.array([e.role_weights.get(role, 1.0) for role in person.roles])
            person.usual_role = person.roles[int(rng.choice(len(person.roles), p=weights / weights.sum()))]
        self.counts["enrolled"] += 1
        person.active = True
        for assignment_id in baseline_ids:
            self.clock.advance(dt.timedelta(minutes=3))
            rest = None
            if rng.random() < e.partial_save_prob:  # PUT .../answers with half of them, the rest at submit
                with session_scope(self.engine) as session:
                    rest = self._answer(session, person, assignment_id, split=True)
                self.clock.advance(dt.timedelta(minutes=5))
            with session_scope(self.engine) as session:  # POST .../submit
                self._answer(session, person, assignment_id, rest)

    def _withdraw(self, actions: list[_Action]) -> None:
        with session_scope(self.engine) as session:  # POST /me/withdrawal, for each who withdraws now
            for action in actions:
                self.clock.set(action.at)
                participant = self._as(self.people[action.person], session)
                participants.withdraw(session, participant, action.payload,
                                      audit.Actor("participant", participant.code))
                self.counts["withdrawn"] += 1

    def _check_surveys(self, actions: list[_Action]) -> None:
        """The participants who open the app now: each answers every newly open survey or leaves it
        (it expires). One read of what is open for all of them (GET /me/surveys, ``open_surveys``),
        then one unit for every answer submitted (POST .../submit), each at its own moment."""
        e, rng = self.effects, self.rng
        looking = [(action.at, self.people[action.person]) for action in actions if self.people[action.person].active]
        if not looking:
            return
        with session_scope(self.engine, read_only=True) as session:
            open_now = open_surveys(session, [(at, person.participant_id) for at, person in looking])
        answering: list[_Answer] = []
        for (at, person), pending in zip(looking, open_now, strict=True):
            for assignment_id, purpose in pending:
                if assignment_id in person.seen:
                    continue
                person.seen.add(assignment_id)
                assert person.baseline is not None
                if purpose != "followup":
                    answering.append(_Answer(at, person, assignment_id, followup=False))
                elif rng.random() < _logistic(e.answer_logit + e.answer_per_baseline_point
                                              * (person.baseline - e.baseline_center)):
                    at += dt.timedelta(minutes=int(rng.integers(1, 20)))
                    answering.append(_Answer(at, person, assignment_id, followup=True))
                else:
                    self.counts["followups_missed"] += 1
        if not answering:
            return
        with session_scope(self.engine) as session:
            for answer in answering:
                self.clock.set(answer.at)
                submitted = self._answer(session, answer.person, answer.assignment_id) is not None
                if answer.followup:  # missed: its window closed while they were answering, as it can for anyone
                    self.counts["followups_answered" if submitted else "followups_missed"] += 1

    def _answer(self, session: Session, person: _Person, assignment_id: int, answers: dict[str, Any] | None = None,
                *, split: bool = False) -> dict[str, Any] | None:
        """Answer the survey in ``session`` as the participant would: ``answers``, or the generative
        model's (POST .../submit); ``split``: save half of them (PUT .../answers) and return the rest,
        for a later submit. None, and nothing stored, when it can no longer be answered."""
        participant = self._as(person, session)
        assignment = surveys.owned_assignment(session, participant, assignment_id)
        if surveys.closed_reason(assignment) is not None:
            return None
        if answers is None:
            instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
            anchor = session.scalar(select(FollowUp.anchor_key).where(FollowUp.assignment_id == assignment_id))
            answers = self._answers(person, instrument, assignment, anchor)
            if instrument.id == "perma-profiler" and person.baseline is None:
                # The observed baseline covariate, by the instrument's own scoring rule.
                person.baseline = instrument.score(answers)["overall_wellbeing"][0]
        if split:
            half = dict(list(answers.items())[: len(answers) // 2])
            surveys.save_partial(session, participant, assignment_id, half)
            return {k: v for k, v in answers.items() if k not in half}
        surveys.submit(session, participant, assignment_id, answers, submission_id=f"sim-{self.run_id}-{assignment_id}")
        return answers

    # The generative model of answers

    def _answers(self, person: _Person, instrument: Instrument, assignment: SurveyAssignment,
                 anchor: str | None) -> dict[str, Any]:
        e, rng = self.effects, self.rng
        if instrument.id == "perma-profiler":
            level = person.latent
            wave = self.perma_wave.get(assignment.followup_key or "", 0) if assignment.purpose == "followup" else 0
            if wave:
                level += rng.normal(0, e.wave_noise_sd)
                if person.arm_mode == "wellbeing":
                    level += e.wellbeing_arm_perma_per_wave * wave
            answers: dict[str, Any] = {}
            for item in instrument.items:
                if rng.random() < e.item_skip_prob:
                    continue
                value = (10 - level if item.id in PERMA_NEGATIVE else level) + rng.normal(0, e.item_noise_sd)
                answers[item.id] = float(min(10, max(0, round(value))))
            return answers
        if instrument.id == "decision-regret":
            decision = int(anchor.split(":", 1)[1]) if anchor and anchor.startswith("decision:") else None
            base, _role = person.decisions.get(decision, (e.regret_base, "")) if decision else (e.regret_base, "")
            regret = min(100.0, max(0.0, base + rng.normal(0, e.regret_wave_sd)))
            answers = {}
            for item in instrument.items:
                agree_level = 1 + 4 * regret / 100  # 1 = strongly agree it was right ... 5 = strongly disagree
                value = 6 - agree_level if item.id in DRS_REVERSED else agree_level
                answers[item.id] = int(min(5, max(1, round(value + rng.normal(0, 0.4)))))
            return answers
        if instrument.id == "goal-progress":
            progress = e.goal_progress_base + (e.goal_progress_coach if person.usual_role == "coach" else 0.0)
            return {"progress": float(min(10, max(0, round(progress + rng.normal(0, 1.5)))))}
        return {item.id: _neutral(item) for item in instrument.items if item.required}

    # Chat (the driver takes each turn through chat.turn, as the API does)

    def _converse(self, actions: list[_Action]) -> None:
        for action in actions:
            self.clock.set(action.at)
            self._converse_one(self.people[action.person])

    def _converse_one(self, person: _Person) -> None:
        if not person.active:
            return
        assert person.participant_id is not None
        e, rng, driver, who = self.effects, self.rng, self.driver, person.participant_id
        role = None
        if person.arm_mode == "wellbeing":
            role = person.usual_role if rng.random() < 0.8 else person.roles[int(rng.integers(len(person.roles)))]
        conversation_id = driver.start(who, role)
        self.counts["conversations"] += 1
        stances: list[str] = []
        messages = 1 + int(rng.poisson(e.extra_messages_mean))
        switch_after = int(rng.integers(1, messages + 1)) if (
            person.arm_mode == "wellbeing" and len(person.roles) > 1 and rng.random() < e.role_switch_prob) else None
        next_message: str | None = None
        for number in range(messages):
            if switch_after == number:
                assert role is not None
                others = [r for r in person.roles if r != role]
                role = others[int(rng.integers(len(others)))]
                driver.switch(who, conversation_id, role)
            text = next_message or self._message(person)
            next_message = None
            self.clock.advance(dt.timedelta(seconds=int(rng.integers(30, 240))))
            reply = driver.send(who, conversation_id, text, f"sim-{conversation_id}-{number}")
            self.counts["messages"] += 1
            stances.append(reply.stance)
            if reply.stance == "escalate":
                break
            if reply.stance in ("nudge", "challenge"):
                choice = rng.random()
                if choice < e.override_prob:
                    self.clock.advance(dt.timedelta(seconds=20))
                    stances.append(driver.override(who, conversation_id, reply.turn_id).stance)
                    self.counts["messages"] += 1
                    self.counts["overrides"] += 1
                elif choice < e.override_prob + e.reconsider_prob:
                    driver.reconsider(who, conversation_id, reply.turn_id)
                    next_message = CHANGED_COURSE
                    self.counts["reconsiders"] += 1
        self._end(person, conversation_id, role, stances)

    def _message(self, person: _Person) -> str:
        e, rng = self.effects, self.rng
        draw = rng.random()
        for share, pool in ((e.framing_share, person.topic.framing), (e.reassurance_share, REASSURANCE),
                            (e.dependence_share, DEPENDENCE), (e.distress_share, DISTRESS)):
            if draw < share:
                return pool[int(rng.integers(len(pool)))]
            draw -= share
        return person.topic.plain[int(rng.integers(len(person.topic.plain)))]

    def _end(self, person: _Person, conversation_id: int, role: str | None, stances: list[str]) -> None:
        """The exit check: whether a decision was made, the rating, and the regret it will bring."""
        assert person.participant_id is not None
        e, rng = self.effects, self.rng
        agree_share = stances.count("agree") / len(stances) if stances else 1.0
        decided = rng.random() < e.decision_prob
        text = person.topic.decisions[int(rng.integers(len(person.topic.decisions)))] if decided else None
        rating = None
        if rng.random() < e.exit_rating_prob:
            rating = int(min(7, max(1, round(e.exit_rating_base + e.exit_rating_per_agree_share * agree_share
                                             + rng.normal(0, 1)))))
        regret = (e.regret_base + (e.regret_coach if role == "coach" else 0.0)
                  + e.regret_per_agree_share * agree_share + person.regret_person + rng.normal(0, e.regret_noise_sd))
        self.clock.advance(dt.timedelta(minutes=1))
        decision_id = self.driver.end(person.participant_id, conversation_id, rating=rating, decision=text)
        if decision_id is not None:
            person.decisions[decision_id] = (regret, role or "standard")


def _neutral(item: Any) -> Any:
    """An answer to an item of an instrument the model knows nothing about."""
    if item.type in ("likert", "slider", "number"):
        low, high = item.min or 0, item.max if item.max is not None else 10
        middle = (low + high) / 2
        return int(round(middle)) if item.type == "likert" else middle
    if item.type == "single_choice":
        return item.options[0].value
    if item.type == "multiple_choice":
        return [item.options[0].value]
    return "n/a"


def summarize(engine: Engine, run_id: int) -> dict[str, Any]:
    """Counts of what a run left in the database (its participants: the run's invites)."""
    with session_scope(engine, read_only=True) as session:
        people = (select(Participant.id).join(InviteCode, InviteCode.id == Participant.invite_id)
                  .where(InviteCode.label == f"{studies.SIMULATION_INVITE_LABEL}{run_id}").scalar_subquery())

        def count(model: Any, *where: Any) -> int:
            return session.scalar(select(func.count()).select_from(model)
                                  .where(model.participant_id.in_(people), *where)) or 0

        statuses = dict(session.execute(select(Participant.status, func.count()).where(Participant.id.in_(people))
                                        .group_by(Participant.status)).all())
        followups = dict(session.execute(select(FollowUp.status, func.count()).where(
            FollowUp.participant_id.in_(people)).group_by(FollowUp.status)).all())
        stances = dict(session.execute(select(Turn.stance, func.count()).where(
            Turn.participant_id.in_(people), Turn.speaker == "assistant").group_by(Turn.stance)).all())
        arms = dict(session.execute(select(Participant.arm, func.count()).where(
            Participant.id.in_(people), Participant.arm.is_not(None)).group_by(Participant.arm)).all())
        return {
            "enrolled": session.scalar(select(func.count()).where(
                Participant.id.in_(people), Participant.enrolled_at.is_not(None))) or 0,
            "arms": {str(k): v for k, v in sorted(arms.items())},
            "withdrawn": statuses.get(ParticipantStatus.WITHDRAWN, 0),
            "data_deleted": session.scalar(select(func.count()).where(
                Participant.id.in_(people), Participant.data_deleted_at.is_not(None))) or 0,
            "conversations": count(Conversation),
            "turns": count(Turn),
            "stances": {str(k): v for k, v in sorted(stances.items())},
            "overrides": count(PushbackResponse, PushbackResponse.action == "override"),
            "reconsiders": count(PushbackResponse, PushbackResponse.action == "reconsider"),
            "role_switches": count(RoleSwitch),
            "decisions": count(Decision),
            "safety_events": count(SafetyEvent),
            "followups_sent": count(FollowUp, FollowUp.sent_at.is_not(None)),
            "followups_completed": followups.get("completed", 0),
            "followups_expired": followups.get("expired", 0),
            "followups_open": followups.get("sent", 0),
            "followups_planned": followups.get("planned", 0),
            "followups_cancelled": followups.get("cancelled", 0),
            "surveys_completed": count(SurveyAssignment, SurveyAssignment.status == "completed"),
        }


def simulate(engine: Engine, study_slug: str, *, participants: int, weeks: int, seed: int,
             effects: Effects | None = None, start: dt.datetime | None = None, tick_minutes: int = 60,
             progress: Callable[[str], None] | None = None) -> SimulationResult:
    """Run a simulated study of ``participants`` people over ``weeks`` weeks in the simulated study
    ``study_slug`` (``load_simulated_study``; any other study is refused with
    ``study.errors.Conflict`` before anything is written).

    ``start`` (aware) is when the simulated study begins; by default midnight UTC ``weeks`` weeks
    ago, so it ends about now. Time moves in steps of ``tick_minutes`` of simulated time: the
    dispatcher runs once per step, then the step's actions are taken in batches. The process's
    clock is frozen for the run and put back afterwards.
    """
    if participants < 1 or weeks < 1 or tick_minutes < 1:
        raise ValueError("participants, weeks and tick_minutes must be at least 1")
    if start is None:
        today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        start = today - dt.timedelta(weeks=weeks)
    elif start.tzinfo is None:
        raise ValueError("start needs a time zone")
    wiring.wire()
    began = time.perf_counter()
    previous = None
    try:
        with asyncio.Runner() as runner:
            simulation = _Simulation(engine, study_slug, participants=participants, weeks=weeks, seed=seed,
                                     effects=effects or Effects(), start=start, tick_minutes=tick_minutes,
                                     progress=progress, runner=runner)
            previous = set_clock(simulation.clock)
            run_id = simulation.run()
        summary = summarize(engine, run_id)
        with session_scope(engine) as session:
            run = session.get(SimulationRun, run_id)
            assert run is not None
            run.summary, run.finished_at = summary, now()
            audit.record(session, ACTOR, "simulation.finished", study_id=run.study_id, run_id=run_id,
                         enrolled=summary["enrolled"], turns=summary["turns"])
    finally:
        if previous is not None:
            set_clock(previous)
    return SimulationResult(run_id, study_slug, seed, summary, simulation.effects.true_effects(),
                            time.perf_counter() - began, simulation.own_counts())
