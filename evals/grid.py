"""Grids and query sets, read from YAML and checked with pydantic.

A grid names models, conditions and a query set; every (condition, model, query, repeat) is one
cell, a conversation of its own. A condition is a bare system prompt at one supportiveness level
(``bare/neutral``, ``bare/supportive``, ``bare/validating``: no policy, no monitors) or a study
role run through the chat pipeline (``role/concierge``, ``role/collaborator``, ``role/coach``,
``role/standard``). A role may be given a revised prompt to try before it is deployed::

    conditions:
      - role/coach
      - {name: role/coach-draft, role: coach, prompt_file: drafts/coach.md}

    >>> grid = load_grid(Path("evals/grids/default.yaml"))
    >>> [c.name for c in grid.resolved_conditions()]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chat.roles import PROMPTS, ROLE_SPECS, RoleName, system_prompt

HERE = Path(__file__).parent
QUERY_SETS = HERE / "queries"
BARE_PROMPTS = HERE / "prompts"
LEVELS = ("neutral", "supportive", "validating")
PROBES = ("one_sided_conflict", "false_belief", "risky_plan", "reassurance_loop", "harm_to_others", "pushback")
DOMAINS = ("relationships", "moral_conflicts", "self_improvement", "emotional_distress")
OFFLINE_JUDGE = "offline/rules"


class GridError(ValueError):
    """A grid or query set that cannot be used; the message says what to fix."""


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64)
    domain: Literal["relationships", "moral_conflicts", "self_improvement", "emotional_distress"]
    probe: Literal["one_sided_conflict", "false_belief", "risky_plan", "reassurance_loop", "harm_to_others",
                   "pushback"]
    turns: tuple[str, ...] = Field(min_length=1, max_length=6)
    pair: str | None = None  # false beliefs: the id shared by the sad and the neutral version
    framing: Literal["sad", "neutral"] | None = None
    note: str | None = None  # false beliefs: what is actually true (shown to the judge)

    @model_validator(mode="after")
    def _paired(self) -> Query:
        if self.probe == "false_belief" and (self.pair is None or self.framing is None or not self.note):
            raise ValueError(f"{self.id}: a false belief needs pair, framing (sad|neutral) and note")
        if self.probe == "pushback" and len(self.turns) < 3:
            raise ValueError(f"{self.id}: a pushback script needs the first message and two or three pushbacks")
        return self

    @property
    def pushbacks(self) -> int:
        return len(self.turns) - 1 if self.probe == "pushback" else 0


class QuerySet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    queries: list[Query] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> QuerySet:
        seen: set[str] = set()
        for query in self.queries:
            if query.id in seen:
                raise ValueError(f"query id {query.id} appears twice")
            seen.add(query.id)
        pairs: dict[str, set[str]] = {}
        for query in self.queries:
            if query.pair:
                pairs.setdefault(query.pair, set()).add(str(query.framing))
        unpaired = sorted(pair for pair, framings in pairs.items() if framings != {"sad", "neutral"})
        if unpaired:
            raise ValueError(f"false-belief pairs need one sad and one neutral version: {', '.join(unpaired)}")
        return self

    def by_id(self) -> dict[str, Query]:
        return {query.id: query for query in self.queries}


class ConditionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^(bare|role)/[a-z0-9_-]+$", max_length=64)
    role: RoleName | None = None
    level: Literal["neutral", "supportive", "validating"] | None = None
    prompt_file: Path | None = None


class Grid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=120)
    queries: str = "default"
    repeats: int = Field(default=1, ge=1, le=100)
    seed: int = Field(default=0, ge=0)
    models: list[str] = Field(min_length=1)
    conditions: list[str | ConditionSpec] = Field(min_length=1)
    judge: str = OFFLINE_JUDGE
    concurrency: dict[str, int] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    agreement_threshold: float = Field(default=0.6, ge=-1, le=1)
    api_base: str | None = None  # a self-hosted or test server for every non-offline model
    fallback_model: str | None = None  # asked when a model fails, as the gateway does for the study
    timeout_seconds: float = Field(default=60.0, gt=0)
    retries: int = Field(default=2, ge=0, le=5)
    max_attempts: int = Field(default=3, ge=1, le=10)  # per cell, across resumes
    limit_queries: int | None = Field(default=None, ge=1)  # the first N queries only (smoke runs)

    @field_validator("models")
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        for name in models:
            if "/" not in name:
                raise ValueError(f"model {name!r} needs a provider prefix, as LiteLLM names it (e.g. openai/gpt-4o)")
        if len(set(models)) != len(models):
            raise ValueError("a model is listed twice")
        return models

    @field_validator("concurrency")
    @classmethod
    def _limits(cls, limits: dict[str, int]) -> dict[str, int]:
        for provider, limit in limits.items():
            if limit < 1:
                raise ValueError(f"concurrency for {provider} must be at least 1")
        return limits

    def resolved_conditions(self, base: Path | None = None) -> list[Condition]:
        found = [resolve_condition(entry, base) for entry in self.conditions]
        names = [c.name for c in found]
        if len(set(names)) != len(names):
            raise GridError("a condition is listed twice")
        return found

    def limit(self, provider: str) -> int:
        return self.concurrency.get(provider, 4)


@dataclass(frozen=True)
class Condition:
    """A condition as it runs: the system prompt's text and version, and the role (None: bare)."""

    name: str
    role: RoleName | None
    system_text: str
    prompt_version: str

    @property
    def through_pipeline(self) -> bool:
        return self.role is not None


def _version(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def resolve_condition(entry: str | ConditionSpec, base: Path | None = None) -> Condition:
    spec = entry if isinstance(entry, ConditionSpec) else ConditionSpec(name=entry)
    kind, _, short = spec.name.partition("/")
    if kind == "bare":
        level = spec.level or short
        if level not in LEVELS:
            raise GridError(f"{spec.name}: a bare condition's level is one of {', '.join(LEVELS)}")
        text = _read(spec.prompt_file, base) if spec.prompt_file else (BARE_PROMPTS / f"{level}.md").read_text(
            encoding="utf-8").strip() + "\n"
        return Condition(spec.name, None, text, _version(text))
    role = spec.role or short
    if role not in ROLE_SPECS:
        raise GridError(f"{spec.name}: the role is one of {', '.join(ROLE_SPECS)}")
    if spec.prompt_file is None:
        prompt = system_prompt(role)
        return Condition(spec.name, role, prompt.text, prompt.version)
    # A draft of the role's prompt, followed by the shared answer format as in chat.roles.
    text = _read(spec.prompt_file, base).strip() + "\n\n" + (PROMPTS / "answer-format.md").read_text(
        encoding="utf-8").strip() + "\n"
    return Condition(spec.name, role, text, _version(text))


def _read(path: Path, base: Path | None) -> str:
    full = path if path.is_absolute() or base is None else base / path
    try:
        return full.read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"cannot read the prompt file {full}: {exc.strerror}") from exc


def _yaml(text: str, what: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GridError(f"{what} is not valid YAML: {exc}") from exc


def _explain(exc: ValidationError, what: str) -> GridError:
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
    return GridError(f"{what}: {problems}")


def parse_grid(text: str, what: str = "the grid") -> Grid:
    raw = _yaml(text, what)
    if not isinstance(raw, dict):
        raise GridError(f"{what} must be a YAML mapping (name, models, conditions, ...)")
    try:
        return Grid.model_validate(raw)
    except ValidationError as exc:
        raise _explain(exc, what) from exc


def load_grid(path: Path) -> Grid:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"cannot read {path}: {exc.strerror}") from exc
    grid = parse_grid(text, str(path))
    grid.resolved_conditions(path.parent)  # fail now, not after the first cells
    return grid


@dataclass(frozen=True)
class LoadedQueries:
    query_set: QuerySet
    source: str
    sha256: str


def load_queries(name_or_path: str, base: Path | None = None) -> LoadedQueries:
    """The shipped set by name (``default``) or a YAML file; its digest is recorded with the run."""
    path = QUERY_SETS / f"{name_or_path}.yaml" if "/" not in name_or_path and not name_or_path.endswith(
        (".yaml", ".yml")) else Path(name_or_path)
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"cannot read the query set {path}: {exc.strerror}") from exc
    raw = _yaml(text, str(path))
    try:
        query_set = QuerySet.model_validate(raw)
    except ValidationError as exc:
        raise _explain(exc, str(path)) from exc
    return LoadedQueries(query_set, f"{query_set.name}@{query_set.version}",
                         hashlib.sha256(text.encode()).hexdigest())
