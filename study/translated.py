"""What a protocol gives in each of its languages, and the check that it gives all of it: the
consent and the public title per language, the language codes the interface has catalogs for, and
the instruments each translated (``surveys.translations``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from study.i18n import interface_languages

if TYPE_CHECKING:
    from study.protocol import Protocol


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PublicText(_Strict):
    """What participants see of the study, in another of the protocol's languages."""

    public_title: str = Field(min_length=1, max_length=200)
    public_description: str = Field(default="", max_length=5000)


class ConsentTranslation(_Strict):
    """The consent in another of the protocol's languages: its text and each confirmation's, by id.
    It is part of the consent version: changing it needs a new ``version``, like the text."""

    text: str = Field(min_length=20, description="Markdown shown to participants reading the study in this language")
    confirmations: dict[str, str] = Field(description="each confirmation's text in this language, by its id")


class InstrumentCatalog(dict[str, frozenset[str]]):
    """The instruments a study may use (``surveys.registry.catalog``): id -> its item ids and score
    names; ``languages``: id -> the languages it can be shown in (its own, and those of the study
    team's translations loaded for its newest version)."""

    def __init__(self, names: Mapping[str, frozenset[str]], languages: Mapping[str, frozenset[str]]) -> None:
        super().__init__(names)
        self.languages = dict(languages)


def _language(code: str) -> str:
    if code not in interface_languages():
        raise ValueError(f"'{code}' is not a language of the interface (it has: {', '.join(interface_languages())}); "
                         "a new one needs its catalog in study/locale (`make messages`, then translate)")
    return code


Language = Annotated[str, AfterValidator(_language)]



def languages_complete(protocol: Protocol, known: object) -> None:
    """Every language but the first has the consent in it, and every instrument the study asks can
    be shown in every language (when ``known`` is an ``InstrumentCatalog``, which knows)."""
    if len(set(protocol.languages)) != len(protocol.languages):
        raise ValueError("languages: each language once")
    missing = [code for code in protocol.languages[1:] if code not in protocol.consent.translations]
    if missing:
        raise ValueError(f"consent.translations: no consent text in {', '.join(missing)} (each language but the "
                         "first needs its text and every confirmation's)")
    for section, given in (("consent", protocol.consent.translations), ("study", protocol.study.translations)):
        extra = sorted(set(given) - set(protocol.languages[1:]))
        if extra:
            raise ValueError(f"{section}.translations: {', '.join(extra)} is not among the study's other languages "
                             f"({', '.join(protocol.languages[1:]) or 'none'})")
    untitled = [code for code in protocol.languages[1:] if code not in protocol.study.translations]
    if protocol.study.public_title and untitled:
        raise ValueError(f"study.translations: no public_title in {', '.join(untitled)} (participants reading "
                         "the study in it see the public title and description)")
    undescribed = [code for code, given in protocol.study.translations.items() if not given.public_description]
    if protocol.study.public_description and undescribed:
        raise ValueError(f"study.translations: no public_description in {', '.join(undescribed)} (participants "
                         "reading the study in it would see none)")
    if not isinstance(known, InstrumentCatalog):
        return
    lacking = {instrument: [code for code in protocol.languages if code not in known.languages.get(instrument, ())]
               for instrument in sorted(protocol.instruments())}
    if any(lacking.values()):
        raise ValueError("; ".join(f"instrument {name} has no translation in {', '.join(codes)}"
                                   for name, codes in lacking.items() if codes)
                         + ": load the study team's translation file of each with `afterward instruments load "
                         "FILE` (translation_of, version, language, every item, label and option)")
