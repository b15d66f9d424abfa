"""Instrument definitions: the YAML format shared by the built-in instruments and researchers'
custom ones, with validation of answers and scoring by the instrument's declared rules."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from study.i18n import N_

ItemType = Literal["likert", "slider", "number", "single_choice", "multiple_choice", "text"]
NUMERIC_TYPES = {"likert", "slider", "number"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")  # a value piped in, e.g. {decision}
# A placeholder with the closing quotes or brackets and the full stop after it, in a template.
_PIPED_SENTENCE = re.compile(r"\{(\w+)\}([\"'”’»)\]]*)(\.?)")
TEXT_LIMIT = 5000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Option(_Strict):
    value: str
    label: str


class Item(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")]
    type: ItemType
    text: str = Field(min_length=1)
    required: bool = True
    min: float | None = None
    max: float | None = None
    labels: dict[int, str] = Field(default_factory=dict, description="Likert point labels")
    options: list[Option] = Field(default_factory=list)
    reverse: bool = False
    block: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Item:
        if self.type in ("likert", "slider") and (self.min is None or self.max is None or self.min >= self.max):
            raise ValueError(f"item {self.id}: {self.type} items need min < max")
        if self.type in ("single_choice", "multiple_choice") and len(self.options) < 2:
            raise ValueError(f"item {self.id}: choice items need at least two options")
        if self.reverse and self.type not in NUMERIC_TYPES | {"slider"}:
            raise ValueError(f"item {self.id}: only numeric items can be reverse-scored")
        if self.reverse and (self.min is None or self.max is None):
            raise ValueError(f"item {self.id}: a reverse-scored item needs min and max")
        return self

    def check(self, value: Any) -> Any:
        """The answer in canonical form, or ValueError with a message naming the problem."""
        if self.type in NUMERIC_TYPES:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(N_("must be a number"))
            if self.type == "likert" and value != int(value):
                raise ValueError(N_("must be a whole number"))
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise ValueError(f"must be between {_num(self.min)} and {_num(self.max)}")
            return int(value) if self.type == "likert" else value
        allowed = {o.value for o in self.options}
        if self.type == "single_choice":
            if value not in allowed:
                raise ValueError(f"must be one of: {', '.join(sorted(allowed))}")
            return value
        if self.type == "multiple_choice":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("must be a list of choices")
            unknown = sorted(set(value) - allowed)
            if unknown:
                raise ValueError(f"unknown choices: {', '.join(unknown)}")
            return sorted(set(value))
        if not isinstance(value, str):
            raise ValueError("must be text")
        if len(value) > TEXT_LIMIT:
            raise ValueError(f"must be at most {TEXT_LIMIT} characters")
        return value


def _num(value: float | None) -> str:
    return "" if value is None else (str(int(value)) if value == int(value) else str(value))


class Block(_Strict):
    id: str
    title: str = ""
    anchors: tuple[str, str] | None = None


class Score(_Strict):
    name: str
    method: Literal["mean", "sum"] = "mean"
    items: list[str] = Field(min_length=1)
    rescale_to: tuple[float, float] | None = Field(
        default=None, description="Map each item from its [min, max] to this range before combining")


class Instrument(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
    version: str = Field(min_length=1, max_length=40)
    title: str
    source: str = Field(default="", description="Citation of the published instrument")
    instructions: str = Field(default="", description="Shown before the items; may use {placeholders}")
    blocks: list[Block] = Field(default_factory=list)
    items: list[Item] = Field(min_length=1)
    scores: list[Score] = Field(default_factory=list)
    context: list[str] = Field(default_factory=list, description="Placeholders that must be piped in")

    @model_validator(mode="after")
    def _consistent(self) -> Instrument:
        ids = [item.id for item in self.items]
        if len(set(ids)) != len(ids):
            raise ValueError("item ids must be unique")
        by_id = {item.id: item for item in self.items}
        for score in self.scores:
            for item_id in score.items:
                item = by_id.get(item_id)
                if item is None:
                    raise ValueError(f"score {score.name} names unknown item {item_id}")
                if item.type not in NUMERIC_TYPES:
                    raise ValueError(f"score {score.name} uses non-numeric item {item_id}")
                if score.rescale_to and (item.min is None or item.max is None):
                    raise ValueError(f"score {score.name}: item {item_id} needs min and max to rescale")
        blocks = {b.id for b in self.blocks}
        for item in self.items:
            if item.block is not None and item.block not in blocks:
                raise ValueError(f"item {item.id} names unknown block {item.block}")
        used = set(PLACEHOLDER.findall(self.instructions))
        for item in self.items:
            used |= set(PLACEHOLDER.findall(item.text))
        if used - set(self.context):
            raise ValueError(f"placeholders not declared in context: {', '.join(sorted(used - set(self.context)))}")
        return self

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    def item(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(item_id)

    def pipe(self, text: str, context: dict[str, str]) -> str:
        """``text`` with each ``{name}`` of ``context`` filled in; a value that ends a sentence of its own
        (``I'll take the job.``) takes the place of the template's full stop after it, so the line
        reads ``"I'll take the job."`` and not ``"I'll take the job.".``. Unknown names stay as they are."""
        def fill(match: re.Match[str]) -> str:
            value = context.get(match.group(1))
            if value is None:
                return match.group(0)
            value = value.strip()
            stop = "" if value.endswith((".", "!", "?", "…")) else match.group(3)
            return value + match.group(2) + stop
        return _PIPED_SENTENCE.sub(fill, text)

    def check_answers(self, answers: dict[str, Any], *, complete: bool) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Canonical answers and a list of (item id, problem). ``complete`` also demands every
        required item; ``None`` clears an answer."""
        known = {item.id: item for item in self.items}
        clean: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for item_id, value in answers.items():
            item = known.get(item_id)
            if item is None:
                problems.append((item_id, f"is not an item of {self.id}"))
                continue
            if value is None or value == "" or value == []:
                continue
            try:
                clean[item_id] = item.check(value)
            except ValueError as exc:
                problems.append((item_id, str(exc)))
        if complete:
            problems += [(i.id, N_("is required")) for i in self.items if i.required and i.id not in clean
                         and i.id not in {p[0] for p in problems}]
        return clean, problems

    def score(self, answers: dict[str, Any]) -> dict[str, tuple[float | None, int, int]]:
        """Each score as (value, items answered, items expected). Missing items are left out
        of the mean (the PERMA-Profiler manual's rule); a score with no answered item is None."""
        results: dict[str, tuple[float | None, int, int]] = {}
        for score in self.scores:
            values = []
            for item_id in score.items:
                if item_id not in answers:
                    continue
                item = self.item(item_id)
                value = float(answers[item_id])
                if item.reverse:
                    assert item.min is not None
                    assert item.max is not None
                    value = item.min + item.max - value
                if score.rescale_to:
                    assert item.min is not None
                    assert item.max is not None
                    low, high = score.rescale_to
                    value = low + (value - item.min) * (high - low) / (item.max - item.min)
                values.append(value)
            total = None if not values else sum(values) / len(values) if score.method == "mean" else sum(values)
            results[score.name] = (total, len(values), len(score.items))
        return results


class InstrumentError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid instrument:\n  " + "\n  ".join(problems))


def parse_instrument(text: str) -> Instrument:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InstrumentError([f"not valid YAML: {exc}"]) from None
    try:
        return Instrument.model_validate(document)
    except ValidationError as exc:
        raise InstrumentError([
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()]) from None
