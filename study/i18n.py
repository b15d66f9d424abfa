"""The interface's languages: gettext catalogs read with Babel, choosing a language, dates in it.

The interface is written in English in the code and the templates, its text marked for translation
(``_("...")`` in the participant pages' templates, ``gettext(language, "...")`` in Python);
``make messages`` extracts it to ``study/locale/afterward.pot`` and updates each language's catalog,
``study/locale/<language>/LC_MESSAGES/afterward.po``, which a translator edits. A catalog is compiled in
memory the first time it is used (no build step, nothing binary in the repository); a message it lacks,
or marks fuzzy, is shown in English.

A study offers some of these languages (the protocol's ``languages``) and brings the texts that are
its own in each: the consent, and the instruments' translations (``surveys.translations``).
"""

from __future__ import annotations

import datetime as dt
import gettext as stdlib_gettext
import re
from collections.abc import Sequence
from functools import cache
from io import BytesIO
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from babel import Locale, UnknownLocaleError
from babel.dates import format_date, format_datetime, format_skeleton, format_time
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import Translations

LOCALE_DIR = Path(__file__).parent / "locale"
DOMAIN = "afterward"
SOURCE = "en"  # the language the interface is written in
LANGUAGE_TAG = r"^[a-z]{2,3}$"  # a language the interface offers is named by its ISO 639 code


@cache
def interface_languages() -> tuple[str, ...]:
    """English, then every language with a catalog, by code."""
    found = sorted(path.parent.parent.name for path in LOCALE_DIR.glob(f"*/LC_MESSAGES/{DOMAIN}.po"))
    return (SOURCE, *(code for code in found if code != SOURCE))


@cache
def translations(language: str) -> stdlib_gettext.NullTranslations:
    """The catalog of ``language``, compiled in memory; English (or a language without a catalog):
    the text as written."""
    path = LOCALE_DIR / language / "LC_MESSAGES" / f"{DOMAIN}.po"
    if language == SOURCE or not path.exists():
        return stdlib_gettext.NullTranslations()
    with path.open("rb") as source:
        catalog = read_po(source, locale=language, domain=DOMAIN)
    compiled = BytesIO()
    write_mo(compiled, catalog, use_fuzzy=False)
    compiled.seek(0)
    return Translations(fp=compiled, domain=DOMAIN)


def N_(message: str) -> str:  # noqa: N802 (gettext's name for it)
    """``message`` itself, marked for ``make messages``: text translated where it is shown."""
    return message


def gettext(language: str, message: str, **values: object) -> str:
    """``message`` in ``language``, its ``%(name)s`` placeholders filled from ``values``."""
    text = translations(language).gettext(message)
    return text % values if values else text


def ngettext(language: str, singular: str, plural: str, count: int, **values: object) -> str:
    text = translations(language).ngettext(singular, plural, count)
    return text % {"num": count, **values}


def name_of(language: str) -> str:
    """A language's name in itself ("español", "English"), as a language menu shows it."""
    try:
        name = Locale.parse(language).get_display_name(language) or language
    except (UnknownLocaleError, ValueError):
        return language
    return name[:1].upper() + name[1:]


@cache
def known(language: str) -> bool:
    """Whether Babel knows ``language`` (a protocol may only declare a language it can name and date)."""
    try:
        Locale.parse(language)
    except (UnknownLocaleError, ValueError):
        return False
    return True


_RANGE = re.compile(r"^\s*([A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8})*|\*)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*$")


def preferred(header: str | None) -> list[str]:
    """The languages of an Accept-Language header, most wanted first (RFC 9110: by weight, then in
    the order given; weight 0 means not wanted). Malformed parts are skipped."""
    ranked: list[tuple[float, int, str]] = []
    for position, part in enumerate((header or "").split(",")[:32]):
        found = _RANGE.match(part)
        if not found:
            continue
        try:
            weight = float(found.group(2)) if found.group(2) else 1.0
        except ValueError:
            continue
        if weight > 0:
            ranked.append((-weight, position, found.group(1).lower()))
    return [tag for _, _, tag in sorted(ranked)]


def primary(header: str | None) -> list[str]:
    """The languages of an Accept-Language header by their primary subtag ("es-MX" is "es"), most
    wanted first, each once."""
    return list(dict.fromkeys(tag.split("-")[0] for tag in preferred(header) if tag != "*"))


def negotiate(header: str | None, offered: Sequence[str]) -> str | None:
    """The language of ``offered`` the browser prefers most: a range matches a language by its
    primary subtag ("es-MX" matches "es"); None when none of them is wanted."""
    for tag in preferred(header):
        primary = tag.split("-")[0]
        if primary == "*":
            return offered[0] if offered else None
        if primary in offered:
            return primary
    return None


def moment_text(moment: dt.datetime, timezone: str | None, language: str = SOURCE) -> str:
    """A moment as the participant reads it, in their language and time zone, e.g. "Thursday 5 March
    2026, 18:00 CET (Europe/Berlin)", "jueves, 5 de marzo de 2026, 18:00 CET (Europe/Madrid)"."""
    try:
        zone = ZoneInfo(timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone, timezone = ZoneInfo("UTC"), "UTC"
    local = moment.astimezone(zone)
    where = "" if (timezone or "UTC") == "UTC" else f" ({timezone})"
    if language == SOURCE or not known(language):
        shown = format_datetime(local, "EEEE d MMMM y, HH:mm", locale=SOURCE)
    else:
        shown = f"{format_date(local, 'full', locale=language)}, {format_time(local, 'HH:mm', locale=language)}"
    return f"{shown} {local.tzname()}{where}"


def date_text(day: dt.date | dt.datetime, language: str = SOURCE) -> str:
    """A date as a page shows it: "5 March 2026", "5 de marzo de 2026"."""
    shown = language if known(language) else SOURCE
    return format_date(day, "d MMMM y" if shown == SOURCE else "long", locale=shown)


def day_text(moment: dt.date | dt.datetime, language: str = SOURCE) -> str:
    """A day of the month as a page names it: "5 March", "5 de marzo"."""
    if language == SOURCE or not known(language):
        return f"{moment.day} {format_date(moment, 'MMMM', locale=SOURCE)}"
    return format_skeleton("MMMMd", moment, locale=language)
