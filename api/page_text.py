"""Text the participant pages render from Markdown: the study's own texts (consent, descriptions)
and crisis and support resources, whose phone numbers and web addresses become links."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

_markdown = MarkdownIt("commonmark", {"html": False})


def markdown(text: str) -> str:
    return _markdown.render(text)


# Help texts: web addresses become links, phone numbers tel: links ("text HOME to 741741": sms:).
# A phone number is 3 to 15 digits in groups split by single spaces or hyphens, not touching
# letters, slashes, colons or decimals (so "24/7", "21:00" and "3.5" stay text), and not a year.
_PHONE = r"\+?\d(?:[ -]?\d){2,14}"
_LINKABLE = re.compile(rf"(?P<url>https?://[^\s<>\"]+|www\.[^\s<>\"]+)|(?<![\w/:.+-])(?P<phone>{_PHONE})"
                       r"(?![\w/:%-]|[.,]\d)")
_TEXT_TO = re.compile(r"\btext\s+\S+\s+to\s*$", re.IGNORECASE)
_NOT_A_PHONE = re.compile(r"(?:19|20)\d\d|\d{4}-\d\d-\d\d")


def _links_in(text: str) -> list[Token]:
    tokens: list[Token] = []
    at = 0
    for found in _LINKABLE.finditer(text):
        shown = found.group(0).rstrip(".,;:!?)") if found.group("url") else found.group(0)
        if found.group("url"):
            href = shown if shown.startswith("http") else f"https://{shown}"
        elif _NOT_A_PHONE.fullmatch(shown):
            continue
        else:
            number = re.sub(r"[ -]", "", shown)
            href = f"sms:{number}" if _TEXT_TO.search(text[:found.start()]) else f"tel:{number}"
        tokens.append(Token("text", "", 0, content=text[at:found.start()]))
        tokens += [Token("link_open", "a", 1, attrs={"href": href}, markup="linkify", info="auto"),
                   Token("text", "", 0, content=shown), Token("link_close", "a", -1, markup="linkify", info="auto")]
        at = found.start() + len(shown)
    tokens.append(Token("text", "", 0, content=text[at:]))
    return [token for token in tokens if token.type != "text" or token.content]


def _link_help(state: StateCore) -> None:
    """A markdown-it core rule: link addresses and numbers in text outside links the author wrote."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        in_link = 0
        for token in block.children:
            in_link += {"link_open": 1, "link_close": -1}.get(token.type, 0)
            children += _links_in(token.content) if token.type == "text" and not in_link else [token]
        block.children = children


_resources_markdown = MarkdownIt("commonmark", {"html": False})
_resources_markdown.core.ruler.push("help_links", _link_help)


def resources_html(text: str) -> str:
    """Crisis and support resources (Markdown) as HTML, every phone number and web address a link."""
    return _resources_markdown.render(text)
