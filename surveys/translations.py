"""Instrument translations: a study team's file giving every text of one instrument version in
another language.

Validated published translations are the study team's to choose (and often to license): Afterward
ships none, it checks them. A translation file names what it translates and gives every text a
participant sees, by the instrument's own ids::

    translation_of: phq-9
    version: "2001"            # the instrument version it translates: items and scoring stay that version's
    language: es
    source: "..."              # the published translation it is (citation), shown to staff
    title: ...
    instructions: ...          # when the instrument has instructions
    blocks: {often: {title: ..., anchors: [..., ...]}}   # each block's title and anchors it has
    items:
      phq9_1: {text: ..., labels: {0: ..., 1: ..., 2: ..., 3: ...}}
      phq9_difficulty: {text: ..., options: {not_difficult: ..., somewhat: ...}}

Loading it (``afterward instruments load FILE``) refuses a file that lacks any text the instrument
has, naming each missing item, label, option, anchor or title, or that names ones it does not have.
Answers keep the instrument's values, so scoring and safety rules are the same in every language;
the response records the language its items were shown in.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from study.i18n import interface_languages
from surveys.definitions import PLACEHOLDER, Instrument, InstrumentError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlockText(_Strict):
    title: str = ""
    anchors: tuple[str, str] | None = None


class ItemText(_Strict):
    text: str = Field(min_length=1)
    labels: dict[int, str] = Field(default_factory=dict)
    options: dict[str, str] = Field(default_factory=dict)


class Translation(_Strict):
    translation_of: str
    version: str = Field(min_length=1, max_length=40)
    language: str
    source: str = Field(default="", description="Citation of the published translation")
    title: str = Field(min_length=1)
    instructions: str = ""
    blocks: dict[str, BlockText] = Field(default_factory=dict)
    items: dict[str, ItemText]

    @property
    def key(self) -> str:
        return f"{self.translation_of}@{self.version} in {self.language}"

    def problems(self, instrument: Instrument) -> list[str]:
        """Every text of ``instrument`` this translation lacks, and every one it names that the
        instrument does not have."""
        found: list[str] = []
        if self.language not in interface_languages():
            found.append(f"language '{self.language}' is not a language of the interface "
                         f"({', '.join(interface_languages())})")
        if instrument.instructions and not self.instructions:
            found.append("instructions: missing")
        if self.instructions and not instrument.instructions:
            found.append("instructions: the instrument has none")
        found += _placeholders("instructions", instrument.instructions, self.instructions)
        blocks = {block.id: block for block in instrument.blocks}
        found += [f"blocks.{name}: not a block of {instrument.key}" for name in sorted(set(self.blocks) - set(blocks))]
        for block in instrument.blocks:
            given = self.blocks.get(block.id)
            if block.title and (given is None or not given.title):
                found.append(f"blocks.{block.id}.title: missing")
            if block.anchors and (given is None or not given.anchors):
                found.append(f"blocks.{block.id}.anchors: missing")
        known = {item.id for item in instrument.items}
        found += [f"items.{name}: not an item of {instrument.key}" for name in sorted(set(self.items) - known)]
        for item in instrument.items:
            text = self.items.get(item.id)
            if text is None:
                found.append(f"items.{item.id}: missing")
                continue
            found += _placeholders(f"items.{item.id}.text", item.text, text.text)
            found += [f"items.{item.id}.labels.{point}: missing"
                      for point in sorted(set(item.labels) - set(text.labels))]
            found += [f"items.{item.id}.labels.{point}: not a label of the item"
                      for point in sorted(set(text.labels) - set(item.labels))]
            values = [option.value for option in item.options]
            found += [f"items.{item.id}.options.{value}: missing" for value in values if value not in text.options]
            found += [f"items.{item.id}.options.{value}: not an option of the item"
                      for value in sorted(set(text.options) - set(values))]
        return found

    def apply(self, instrument: Instrument) -> Instrument:
        """``instrument`` with this translation's texts: the same ids, values, types and scoring."""
        document: dict[str, Any] = instrument.model_dump(mode="python")
        document["title"] = self.title
        document["instructions"] = self.instructions
        for block in document["blocks"]:
            given = self.blocks.get(block["id"])
            if given is not None:
                block["title"] = given.title or block["title"]
                block["anchors"] = given.anchors or block["anchors"]
        for item in document["items"]:
            text = self.items[item["id"]]
            item["text"] = text.text
            item["labels"] = {point: text.labels.get(point, label) for point, label in item["labels"].items()}
            item["options"] = [{**option, "label": text.options.get(option["value"], option["label"])}
                               for option in item["options"]]
        return Instrument.model_validate(document)


def _placeholders(where: str, original: str, translated: str) -> list[str]:
    """A translated text must keep the original's placeholders (``{decision}``: what the participant
    decided, piped in), and add none."""
    wanted, given = set(PLACEHOLDER.findall(original)), set(PLACEHOLDER.findall(translated))
    return ([f"{where}: keep the placeholder {{{name}}}" for name in sorted(wanted - given)]
            + [f"{where}: {{{name}}} is not a placeholder of the instrument" for name in sorted(given - wanted)])


def is_translation(source_yaml: str) -> bool:
    """Whether a file loaded with ``afterward instruments load`` is a translation (it says what it translates)."""
    try:
        document = yaml.safe_load(source_yaml)
    except yaml.YAMLError:
        return False
    return isinstance(document, dict) and "translation_of" in document


def parse_translation(source_yaml: str, instrument: Instrument) -> Translation:
    """The translation file ``source_yaml`` of ``instrument``, refused (InstrumentError) with each
    problem: a malformed file, or any text missing or unknown."""
    try:
        translation = Translation.model_validate(yaml.safe_load(source_yaml))
    except (yaml.YAMLError, ValidationError) as exc:
        if isinstance(exc, yaml.YAMLError):
            raise InstrumentError([f"not valid YAML: {exc}"]) from None
        raise InstrumentError([f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                               for e in exc.errors()]) from None
    problems = translation.problems(instrument)
    if problems:
        raise InstrumentError([f"{translation.key}: {problem}" for problem in problems])
    return translation
