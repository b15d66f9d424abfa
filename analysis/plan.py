"""The pre-registered analysis plan: a YAML file beside the study protocol that names the primary and
secondary analyses (each an outcome, an estimand and its covariates), the arms compared, alpha and
the multiplicity rule; frozen in the database before any outcome is read, and run first by the
report (``analysis.plan_report``).

    >>> plan = parse_plan(Path("examples/wellbeing-pilot.plan.yaml").read_text())
    >>> with session_scope() as session:
    ...     freeze_plan(session, "wellbeing-pilot", text, "examples/wellbeing-pilot.plan.yaml", actor)

Every outcome and estimand a plan may name is one the report fits (``ESTIMANDS``), so the report can
run the plan: ``arm_x_time`` and ``arm_difference_at_wave`` are the PERMA mixed model's arm x time
term and its contrast at a wave (``analysis.estimates.perma``), ``focal_role_effect`` is the regret
model's role term (``analysis.estimates.regret``). A plan that names anything else is refused with
the field, the line and what to write instead (``PlanError``), never a traceback.

Freezing (``freeze_plan``) records the file's text, its SHA-256 and the validated plan, who froze it
and how many reads of the study's outcomes the audit log held by then (``OUTCOME_READS``), audited
as ``analysis_plan.frozen``. Freezing the same file again changes nothing; a changed file is refused
(``PlanChanged``, with what changed): a frozen plan is never replaced, and the report lists a later
change of the file as a deviation.

Blinding: whether a study's staff views hide the arm in outcomes now is decided here alone
(``blinding``): when any protocol version asks for it (``blinding.outcomes_until_plan_frozen``) and
no plan is frozen. Every outcome view asks ``outcome_access`` (or ``outcome_view``) and masks (the
aggregate outcome tables pooled over the arms) or refuses (``Blinded``, 409); an admin may lift it for
one read with a reason, audited as ``blinding.unblinded_read`` (``UNBLINDED_READ``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from analysis.estimates.common import REGRET_FEATURES, pick_reference_arm
from analysis.panel import PERMA_SCORES
from analysis.reading import resolve_study_id
from analysis.tables import AnalysisPlanRecord
from study import audit, staff, studies
from study.db import session_scope
from study.errors import Conflict, Forbidden, Invalid
from study.models import AuditEntry, ProtocolVersion, StaffRole, Study
from study.protocol import ROLES, SLUG_PATTERN, Protocol, Role, validated_yaml

ACTION = "analysis_plan.frozen"  # the audit log's action for a freeze
# The audit log's actions that read a study's outcomes: a plan frozen after one of them is reported so.
OUTCOME_READS = ("study.analyze", "study.export", "analysis.models_fitted", "responses.read")
# An admin's read of outcomes by arm while the study is blinded: recorded before the read, which is one of
# OUTCOME_READS itself (a report, an export; a dashboard page shows model fits, each counted when fitted).
UNBLINDED_READ = "blinding.unblinded_read"
REGRET = "regret"
OUTCOMES = (*PERMA_SCORES, REGRET)
PERMA_COVARIATES = ("baseline",)  # what the PERMA mixed model adjusts for (time and arm are the estimand's)
REGRET_COVARIATES = tuple(name for name in REGRET_FEATURES if name != "role")
Estimand = Literal["arm_x_time", "arm_difference_at_wave", "focal_role_effect"]
ESTIMANDS: dict[str, str] = {
    "arm_x_time": "how much the difference between the arm and the reference arm, at a given baseline score, "
                  "changes per day since enrollment (the PERMA mixed model's '<arm> vs <reference> x day' term)",
    "arm_difference_at_wave": "the difference between the arm and the reference arm at one follow-up wave, at the "
                              "mean baseline score (the PERMA mixed model's contrast at that wave)",
    "focal_role_effect": "the difference in Decision Regret (0-100) after a conversation that ended in the focal "
                         "role against any other role, adjusted for the covariates (the regret model's role term)",
}
Multiplicity = Literal["none", "bonferroni", "holm"]
MULTIPLICITY: dict[str, str] = {
    "none": "no adjustment: each secondary analysis is tested at alpha on its own",
    "bonferroni": "Bonferroni over the secondary analyses (each p-value times their number)",
    "holm": "Holm's step-down rule over the secondary analyses (family-wise error at alpha)",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlannedAnalysis(_Strict):
    """One analysis: an ``outcome`` (a PERMA score or ``regret``), its ``estimand``, the ``wave`` (a
    follow-up id) for ``arm_difference_at_wave``, and the ``covariates`` it is adjusted for (by
    default the model's own: ``baseline`` for PERMA, the other conversation features for regret)."""

    outcome: str
    estimand: Estimand
    wave: str | None = Field(default=None, pattern=SLUG_PATTERN)
    covariates: list[str] | None = None

    @property
    def model(self) -> Literal["perma", "regret"]:
        return "regret" if self.outcome == REGRET else "perma"

    @property
    def adjusted_for(self) -> list[str]:
        if self.covariates is not None:
            return list(self.covariates)
        return list(PERMA_COVARIATES if self.model == "perma" else REGRET_COVARIATES)

    @property
    def label(self) -> str:
        wave = f" at {self.wave}" if self.wave else ""
        return f"{self.estimand.replace('_', ' ')} on {self.outcome.replace('_', ' ')}{wave}"

    def problems(self, where: str) -> list[str]:
        """What in this analysis the report cannot run, each as ``path: what to write instead``."""
        if self.outcome not in OUTCOMES:
            return [f"{where}.outcome: '{self.outcome}' is not an outcome the report fits; write one of "
                    f"{', '.join(OUTCOMES)}"]
        found: list[str] = []
        if self.model == "regret" and self.estimand != "focal_role_effect":
            found.append(f"{where}.estimand: the report estimates '{self.estimand}' for PERMA scores only; for "
                         "regret write estimand: focal_role_effect")
        if self.model == "perma" and self.estimand == "focal_role_effect":
            found.append(f"{where}.estimand: focal_role_effect is an estimand of regret (write outcome: regret), "
                         f"for {self.outcome} write arm_x_time or arm_difference_at_wave")
        if (self.estimand == "arm_difference_at_wave") != (self.wave is not None):
            found.append(f"{where}.wave: " + ("name the follow-up the difference is taken at, e.g. wave: "
                                              "perma-week-4" if self.wave is None else
                                              f"only arm_difference_at_wave takes a wave, not {self.estimand}"))
        allowed = PERMA_COVARIATES if self.model == "perma" else REGRET_COVARIATES
        covariates = self.covariates or []
        if self.model == "perma" and self.covariates is not None and list(self.covariates) != ["baseline"]:
            found.append(f"{where}.covariates: the PERMA mixed model adjusts for the baseline score and nothing "
                         "else; write covariates: [baseline] (or leave covariates out)")
        elif self.model == "regret":
            unknown = [name for name in covariates if name not in allowed]
            if unknown:
                found.append(f"{where}.covariates: {', '.join(repr(n) for n in unknown)} not among the regret "
                             f"model's covariates; choose from {', '.join(allowed)}")
            if len(set(covariates)) != len(covariates):
                found.append(f"{where}.covariates: a covariate is listed more than once")
        return found


class AnalysisPlan(_Strict):
    """The plan: the ``study`` it is for, the ``arm`` compared with the ``reference_arm``, the
    ``focal_role`` of the regret estimand, ``alpha``, the ``multiplicity`` rule over the secondary
    analyses (the primary is tested alone at alpha), the ``primary`` analysis and the ``secondary``
    ones."""

    study: str = Field(pattern=SLUG_PATTERN)
    title: str = Field(default="", max_length=300)
    arm: str = Field(pattern=SLUG_PATTERN)
    reference_arm: str = Field(pattern=SLUG_PATTERN)
    focal_role: Role = "coach"
    alpha: float = Field(gt=0, lt=0.5)
    multiplicity: Multiplicity
    primary: PlannedAnalysis
    secondary: list[PlannedAnalysis] = Field(default_factory=list)

    def analyses(self) -> list[tuple[str, PlannedAnalysis]]:
        """(where, analysis): ``primary``, then ``secondary[i]``."""
        return [("primary", self.primary), *((f"secondary[{i}]", a) for i, a in enumerate(self.secondary))]

    @model_validator(mode="after")
    def _runs_in_the_report(self) -> AnalysisPlan:
        problems = [problem for where, analysis in self.analyses() for problem in analysis.problems(where)]
        if self.arm == self.reference_arm:
            problems.append("arm: the arm and the reference arm must differ")
        seen: dict[tuple[str, str, str | None], str] = {}
        for where, analysis in self.analyses():
            key = (analysis.outcome, analysis.estimand, analysis.wave)
            if key in seen:
                problems.append(f"{where}: the same analysis as {seen[key]} ({analysis.label}); name it once")
            seen.setdefault(key, where)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def perma_outcomes(self) -> list[str]:
        return list(dict.fromkeys(a.outcome for _, a in self.analyses() if a.model == "perma"))


class PlanError(ValueError):
    """An invalid plan file; ``problems`` lists one readable message per error, with its line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid analysis plan:\n  " + "\n  ".join(problems))


def parse_plan(text: str) -> AnalysisPlan:
    """The plan in ``text``, or PlanError whose messages name the field and its line, e.g.
    ``primary.outcome (line 9): 'wellbeing' is not an outcome the report fits; write one of ...``."""
    return validated_yaml(text, AnalysisPlan, PlanError, "the plan must be a YAML mapping with study, arm, "
                          "reference_arm, alpha, multiplicity, primary and secondary")


def plan_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def protocol_problems(plan: AnalysisPlan, protocol: Protocol) -> list[str]:
    """What in the plan the study's protocol cannot give: arms it does not have, a reference arm the
    report does not compare with, waves that are not enrollment-anchored PERMA follow-ups, outcomes
    no follow-up measures, a focal role no arm offers."""
    arms = {arm.name: arm for arm in protocol.arms}
    problems = [f"{field}: the protocol has no arm '{name}' (arms: {', '.join(arms)})"
                for field, name in (("arm", plan.arm), ("reference_arm", plan.reference_arm)) if name not in arms]
    if not problems:
        # The report's own rule for its reference arm, on the protocol's arms.
        picked = pick_reference_arm(pd.DataFrame({"arm": list(arms), "mode": [a.mode for a in arms.values()]}), None)
        if picked != plan.reference_arm:
            problems.append(f"reference_arm: the report compares every arm with '{picked}' (the first default-mode "
                            f"arm); write reference_arm: {picked}")
    perma_waves = [f.id for f in protocol.followups if f.instrument == "perma-profiler" and f.anchor == "enrollment"]
    regret_waves = [f.id for f in protocol.followups if f.instrument == "decision-regret"]
    for where, analysis in plan.analyses():
        if analysis.model == "perma" and not perma_waves:
            problems.append(f"{where}.outcome: the protocol has no enrollment-anchored perma-profiler follow-up")
        if analysis.model == "regret" and not regret_waves:
            problems.append(f"{where}.outcome: the protocol has no decision-regret follow-up")
        if analysis.wave is not None and analysis.wave not in perma_waves:
            problems.append(f"{where}.wave: '{analysis.wave}' is not an enrollment-anchored perma-profiler "
                            f"follow-up of the protocol; write one of {', '.join(perma_waves) or '(none)'}")
    if any(a.model == "regret" for _, a in plan.analyses()):
        offered = sorted({role for arm in protocol.arms for role in arm.roles}, key=ROLES.index)
        if plan.focal_role not in offered:
            problems.append(f"focal_role: no arm offers the role '{plan.focal_role}'; write one of "
                            f"{', '.join(offered) or '(no arm offers a role)'}")
    return problems


def changes(frozen: AnalysisPlan, current: AnalysisPlan) -> list[str]:
    """What differs between two plans, field by field: ``alpha: 0.05 -> 0.01``, an analysis added or
    removed; an empty list when only comments or layout changed."""
    before, after = _flat(frozen.model_dump(mode="json")), _flat(current.model_dump(mode="json"))
    found: list[str] = []
    for key in dict.fromkeys([*before, *after]):
        if before.get(key) == after.get(key):
            continue
        if key not in before:
            found.append(f"{key}: added ({after[key]})")
        elif key not in after:
            found.append(f"{key}: removed (was {before[key]})")
        else:
            found.append(f"{key}: {before[key]} -> {after[key]}")
    return found


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """A plan as ``path: value`` lines; an analysis as its label and its covariates."""
    if isinstance(value, dict) and {"outcome", "estimand"} <= set(value):
        analysis = PlannedAnalysis.model_validate(value)
        return {prefix: analysis.label, f"{prefix}.covariates": ", ".join(analysis.adjusted_for)}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}" if prefix else key)
                .items()}
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}[{i}]").items()}
    return {prefix: str(value)}


# Freezing and reading the frozen plan


@dataclass(frozen=True)
class FrozenPlan:
    """A study's frozen plan as recorded (``analysis.tables.AnalysisPlanRecord``), with its parsed form."""

    study_id: int
    sha256: str
    source_text: str
    plan: AnalysisPlan
    source_path: str
    frozen_by: str
    frozen_at: dt.datetime
    outcome_reads_before: int


@dataclass(frozen=True)
class FreezeResult:
    frozen: FrozenPlan
    new: bool  # False: the same file was frozen before, nothing was written


class PlanChanged(Conflict):
    """The study's plan is frozen and this file differs from it; ``changes`` says how."""

    def __init__(self, message: str, changes: list[str]) -> None:
        super().__init__(message, code="plan_frozen")
        self.changes = changes


def frozen_plan(source: Session | Connection, study_id: int) -> FrozenPlan | None:
    """The study's frozen plan, or None when no plan was frozen."""
    row = source.execute(select(AnalysisPlanRecord.__table__).where(AnalysisPlanRecord.study_id == study_id)).first()
    if row is None:
        return None
    frozen_at = row.frozen_at if row.frozen_at.tzinfo else row.frozen_at.replace(tzinfo=dt.UTC)
    return FrozenPlan(row.study_id, row.sha256, row.source_text, AnalysisPlan.model_validate(row.plan),
                      row.source_path, row.frozen_by, frozen_at, row.outcome_reads_before)


def outcome_reads(session: Session, study_id: int) -> int:
    """How many reads of the study's outcomes (``OUTCOME_READS``) the audit log holds."""
    return session.scalar(select(func.count()).select_from(AuditEntry).where(
        AuditEntry.study_id == study_id, AuditEntry.action.in_(OUTCOME_READS))) or 0


def freeze_plan(session: Session, study_slug: str, text: str, source_path: str, actor: audit.Actor) -> FreezeResult:
    """Freeze ``text`` as the analysis plan of the study (in the caller's transaction). Raises
    NotFound for an unknown study, Forbidden unless ``actor`` is a system actor or a researcher or
    admin of the study, PlanError for an invalid plan or one the study's protocol cannot give, and
    PlanChanged when another plan is already frozen. The same file again: nothing is written."""
    study = studies.get_study(session, study_slug)
    if actor.type != "system":
        role = staff.staff_access(session, actor, study.id).role
        if role not in (StaffRole.RESEARCHER, StaffRole.ADMIN):
            raise Forbidden(f"your role in '{study.slug}' ({role}) may not freeze its analysis plan: researchers "
                            "and admins do", code="plan_forbidden")
    plan = parse_plan(text)
    if plan.study != study.slug:
        raise PlanError([f"study: the plan is for '{plan.study}', not '{study.slug}'; freeze it for its own study "
                         f"(or write study: {study.slug})"])
    problems = protocol_problems(plan, studies.current_protocol(session, study.id))
    if problems:
        raise PlanError(problems)
    digest = plan_sha256(text)
    existing = frozen_plan(session, study.id)
    if existing is not None:
        if existing.sha256 == digest:
            return FreezeResult(existing, new=False)
        differences = changes(existing.plan, plan) or ["comments or layout only (the plan itself is the same)"]
        raise PlanChanged(
            f"the analysis plan of '{study.slug}' was frozen at {existing.frozen_at.isoformat(timespec='seconds')} "
            f"(SHA-256 {existing.sha256[:12]}) and is never replaced; this file differs (SHA-256 {digest[:12]}): "
            f"{'; '.join(differences)}. Put the frozen plan back (`afterward plan show {study.slug}` prints it); "
            "`afterward analyze` reports a changed file as a deviation", differences)
    reads = outcome_reads(session, study.id)
    record = AnalysisPlanRecord(study_id=study.id, sha256=digest, source_text=text, plan=plan.model_dump(mode="json"),
                                source_path=source_path, frozen_by=f"{actor.type}:{actor.name}",
                                outcome_reads_before=reads)
    session.add(record)
    session.flush()
    audit.record(session, actor, ACTION, study_id=study.id, sha256=digest, file=source_path,
                 primary=plan.primary.label, secondary=len(plan.secondary), outcome_reads_before=reads)
    frozen = frozen_plan(session, study.id)
    assert frozen is not None
    return FreezeResult(frozen, new=True)


@dataclass(frozen=True)
class FileCheck:
    """Whether a plan file still matches the frozen plan: ``matches``, ``changed`` (``changes`` says
    how; ``problems`` when it no longer validates) or ``unreadable`` (``problems`` says why)."""

    path: str
    status: Literal["matches", "changed", "unreadable"]
    sha256: str | None = None
    changes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.status == "matches":
            return f"the plan file {self.path} matches the frozen plan"
        if self.status == "unreadable":
            return f"the plan file {self.path} could not be read ({'; '.join(self.problems)})"
        what = ("it no longer validates: " + "; ".join(self.problems) if self.problems
                else "; ".join(self.changes) or "comments or layout only (the plan itself is the same)")
        return f"the plan file {self.path} changed after freezing (SHA-256 now {str(self.sha256)[:12]}): {what}"


def check_file(frozen: FrozenPlan, path: str, read: Any) -> FileCheck:
    """Compare the file at ``path`` (its text from ``read()``, which may raise OSError) with the frozen plan."""
    try:
        text = read()
    except (OSError, UnicodeDecodeError) as exc:
        return FileCheck(path, "unreadable", problems=(exc.strerror or str(exc),) if isinstance(exc, OSError)
                         else (str(exc),))
    digest = plan_sha256(text)
    if digest == frozen.sha256:
        return FileCheck(path, "matches", digest)
    try:
        current = parse_plan(text)
    except PlanError as exc:
        return FileCheck(path, "changed", digest, problems=tuple(exc.problems))
    return FileCheck(path, "changed", digest, changes=tuple(changes(frozen.plan, current)))


# Blinding: whether staff views of outcomes show the arm


BLINDED = "blinded_until_plan_frozen"  # the code of a refusal while blinded
UNBLIND_ROLES = (StaffRole.ADMIN,)  # who may lift blinding for one audited read (and the system actor)


class Blinded(Conflict):
    """An outcome view refused while the study is blinded: 409, code ``blinded_until_plan_frozen``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=BLINDED)


@dataclass(frozen=True)
class OutcomeBlinding:
    """A study's blinding as one view reads it: ``required`` when a protocol version asks for it,
    ``plan_frozen`` once the analysis plan is frozen; ``unblinded_by`` (and ``reason``) when an admin
    lifted it for this read. ``blinded``: the view must hide the arm in outcomes now."""

    study_id: int
    slug: str
    required: bool
    plan_frozen: bool
    unblinded_by: str | None = None
    reason: str | None = None

    @property
    def blinded(self) -> bool:
        return self.required and not self.plan_frozen and self.unblinded_by is None

    def message(self, view: str) -> str:
        return (f"'{self.slug}' is blinded until its analysis plan is frozen (protocol: blinding."
                f"outcomes_until_plan_frozen), so {view} cannot show outcomes by arm yet. Freeze the plan first: "
                f"`afterward plan freeze {self.slug} PLAN.yaml` (researchers and admins). An admin of the study "
                "may unblind one read, giving the reason (recorded in the audit log): --unblind REASON on the "
                "command line, unblind_reason in the staff API, the unblind form in the dashboard. Enrollment, "
                "follow-up completion and safety events stay visible meanwhile.")


def blinding(source: Session | Connection, study_id: int) -> OutcomeBlinding:
    """The one decision: are the study's outcome views blinded now? Yes when any of its protocol
    versions asks for it (a later version cannot drop it before the freeze) and no plan is frozen."""
    slug = source.execute(select(Study.slug).where(Study.id == study_id)).scalar_one()
    documents = source.execute(select(ProtocolVersion.protocol).where(ProtocolVersion.study_id == study_id)).scalars()
    required = any(((document or {}).get("blinding") or {}).get("outcomes_until_plan_frozen") is True
                   for document in documents)
    frozen = source.execute(select(AnalysisPlanRecord.id).where(AnalysisPlanRecord.study_id == study_id)).first()
    return OutcomeBlinding(study_id, slug, required, frozen is not None)


def outcome_access(session: Session, actor: audit.Actor, study_id: int, view: str, *,
                   unblind: str | None = None) -> OutcomeBlinding:
    """The study's blinding for ``view`` read by ``actor`` (the caller masks or refuses while
    ``blinded``). ``unblind``, a reason, lifts it for this read when the actor may: an admin of the
    study, or the system actor (the command line without --as, which holds the database anyway);
    audited as ``UNBLINDED_READ`` with the view and the reason, in the caller's transaction. Anyone
    else asking is refused (Forbidden, ``unblind_forbidden``). Not blinded: ``unblind`` is ignored."""
    found = blinding(session, study_id)
    if not found.blinded or unblind is None:
        return found
    reason = unblind.strip()
    if not reason:
        raise Invalid("say why this read must be unblinded (the reason is recorded in the audit log)",
                      code="unblind_reason_missing")
    role = staff.staff_access(session, actor, study_id).role if actor.type == "staff" else None
    if actor.type != "system" and role not in UNBLIND_ROLES:
        raise Forbidden(f"only an admin of '{found.slug}' may unblind outcomes before its analysis plan is frozen "
                        f"(your role: {role or actor.type}); freeze the plan, or ask an admin",
                        code="unblind_forbidden")
    audit.record(session, actor, UNBLINDED_READ, study_id=study_id, view=view, reason=reason)
    return replace(found, unblinded_by=f"{actor.type}:{actor.name}", reason=reason)


def outcome_view(engine: Engine, study: int | str, actor: audit.Actor, view: str, *, unblind: str | None = None,
                 refuse: bool = True) -> OutcomeBlinding:
    """``outcome_access`` in a unit of work of its own, before the view reads (a read-only one unless
    unblinding). ``refuse``: raise ``Blinded`` while blinded, after the actor's own access (a viewer or
    staff of another study is refused for that first, as without blinding). LookupError: no study."""
    with session_scope(engine, read_only=unblind is None) as session:
        study_id = resolve_study_id(session.connection(), study)
        found = outcome_access(session, actor, study_id, view, unblind=unblind)
        if refuse and found.blinded and actor.type == "staff":
            staff.reader_access(session, actor, study_id)
    if refuse and found.blinded:
        raise Blinded(found.message(view))
    return found
