"""The language of the participant pages, and the menu that changes it.

A page is shown in the participant's own language once they have one (``participants.language``: set
on arrival from the browser's preference, then by their choice); before that, in the language chosen
on this browser (the menu's cookie), else the one the browser prefers (Accept-Language), among the
interface's languages, else English. The templates' text goes through the catalogs of
``study.i18n`` (``_()`` in a template reads the page's ``lang``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from jinja2 import pass_context
from jinja2.runtime import Context
from sqlalchemy.orm import Session

from study import i18n
from study.models import Participant
from study.studies import current_protocol

LANGUAGE_COOKIE = "afterward_lang"


def wanted(request: Request) -> list[str]:
    """The languages this browser asks for, most wanted first: the menu's choice, then Accept-Language."""
    chosen = request.cookies.get(LANGUAGE_COOKIE, "")
    return list(dict.fromkeys([*([chosen] if chosen else []), *i18n.primary(request.headers.get("accept-language"))]))


def remember(request: Request, session: Session, participant: Participant | None) -> None:
    """Keep the page's language and the languages its menu offers in ``request.state``: the
    participant's and their study's, or the browser's among the interface's."""
    if participant is None:
        _keep(request, list(i18n.interface_languages()))
    else:
        _keep(request, current_protocol(session, participant.study_id).languages, participant.language)


def _keep(request: Request, offered: list[str], own: str | None = None) -> None:
    request.state.languages = offered
    request.state.language = own if own in offered else next((c for c in wanted(request) if c in offered), offered[0])


def context(request: Request) -> dict[str, Any]:
    """What every page's template reads: ``lang`` and the menu's ``languages`` (code, own name); a
    page that looked up nobody is in the browser's language."""
    if not hasattr(request.state, "language"):
        _keep(request, list(i18n.interface_languages()))
    return {"lang": request.state.language,
            "languages": [(code, i18n.name_of(code)) for code in request.state.languages]}


@pass_context
def _gettext(page: Context, message: str) -> str:
    return i18n.translations(page.get("lang") or i18n.SOURCE).gettext(message)


@pass_context
def _ngettext(page: Context, singular: str, plural: str, count: int) -> str:
    return i18n.translations(page.get("lang") or i18n.SOURCE).ngettext(singular, plural, count)


@pass_context
def _day(page: Context, moment: dt.date | dt.datetime) -> str:
    return i18n.date_text(moment, page.get("lang") or i18n.SOURCE)


@pass_context
def _say(page: Context, text: str | None) -> str:
    """A text the platform wrote and stored in English (a safety note's reason, say), in the page's
    language where the catalog has it; as stored otherwise. Plain text: the page escapes it."""
    return i18n.gettext(page.get("lang") or i18n.SOURCE, text) if text else ""


def install(environment: Any) -> None:
    """The i18n extension on the pages' Jinja environment, its ``_`` reading each page's ``lang``, and
    the ``day`` filter (a date as the page's language writes it: "5 March 2026", "5 de marzo de 2026")."""
    environment.add_extension("jinja2.ext.i18n")
    environment.install_gettext_callables(_gettext, _ngettext, newstyle=True)
    environment.filters["day"] = _day
    environment.filters["say"] = _say


def chosen(response: Response, language: str) -> Response:
    response.set_cookie(LANGUAGE_COOKIE, language, max_age=365 * 24 * 3600, httponly=True, samesite="lax", path="/")
    return response


def back_to(target: str) -> str:
    """Where the menu's form returns: a path on this site, else the start page."""
    return target if target.startswith("/") and not target.startswith(("//", "/\\")) else "/"


def redirect(target: str) -> RedirectResponse:
    return RedirectResponse(back_to(target), status_code=303)
