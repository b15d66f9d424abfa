"""Which help to show for which danger.

The protocol's ``crisis_resources`` (per region) are the study's crisis lines, shown when a
participant may be at risk of harming themselves. Someone in danger from another person needs
abuse and domestic-violence services, and someone who may hurt another person needs the emergency
number rather than a suicide line; those are listed here, per region (the country of the
participant's time zone) with a ``default`` for everywhere else; the English ones are in the
interface's catalogs, shown in the participant's language where translated. Texts are Markdown; the pages
turn phone numbers and web addresses into links (``api.pages.resources_html``).
"""

from __future__ import annotations

from study.i18n import N_
from study.protocol import country_of_timezone

CATEGORY_RESOURCES: dict[str, dict[str, str]] = {
    "risk_from_others": {
        "default": N_(
            "If you are in danger right now, call your local emergency number. Free, confidential services "
            "for people who are hurt or threatened by a partner, a relative or anyone else are listed for your "
            "country at https://findahelpline.com."),
        "US": N_(
            "If you are in danger right now, call **911**. National Domestic Violence Hotline: call "
            "**1-800-799-7233** or text START to 88788 (free, confidential, 24/7), https://www.thehotline.org. "
            "After a sexual assault: RAINN, **1-800-656-4673**, https://www.rainn.org."),
        "GB": N_(
            "If you are in danger right now, call **999** (if you can't speak, stay on the line and press 55 "
            "when asked). National Domestic Abuse Helpline: **0808 2000 247** (free, 24/7), "
            "https://www.nationaldahelpline.org.uk. Men's Advice Line: 0808 801 0327."),
        "DE": (
            "Wenn Sie jetzt in Gefahr sind: Polizei **110**, Notruf 112. Hilfetelefon Gewalt gegen Frauen: "
            "**116 016** (kostenlos, anonym, rund um die Uhr), https://www.hilfetelefon.de. Hilfetelefon Gewalt "
            "an Männern: 0800 1239900, https://www.maennerhilfetelefon.de."),
    },
    "harm_to_others": {
        "default": N_(
            "If anyone is in danger right now, call your local emergency number. If you feel you might hurt "
            "someone, put distance between you and them now and talk to someone you trust or a doctor; free, "
            "confidential helplines for your country are listed at https://findahelpline.com."),
        "US": N_(
            "If anyone is in danger right now, call **911**. If you feel you might hurt someone, put distance "
            "between you and them now and talk to someone you trust or a doctor; free, confidential helplines "
            "are listed at https://findahelpline.com."),
        "GB": N_(
            "If anyone is in danger right now, call **999**. If you're worried you might hurt a partner or "
            "someone in your family, the Respect Phoneline is free and confidential: **0808 802 4040**, "
            "https://respectphoneline.org.uk."),
        "DE": (
            "Wenn jemand jetzt in Gefahr ist: Polizei **110**, Notruf 112. Wenn Sie fürchten, jemandem etwas "
            "anzutun, gehen Sie auf Abstand und sprechen Sie mit jemandem, dem Sie vertrauen, oder mit einer "
            "Ärztin oder einem Arzt; Hilfsangebote finden Sie unter https://findahelpline.com."),
    },
}


def category_resources(category: str, timezone: str | None) -> tuple[str, str] | None:
    """(region code, text) of the help that fits ``category`` for someone in ``timezone``; None
    for a risk to self (and anything else), whose help is the protocol's ``crisis_resources``."""
    by_region = CATEGORY_RESOURCES.get(category)
    if by_region is None:
        return None
    region = country_of_timezone(timezone) if timezone else None
    if region and region in by_region:
        return region, by_region[region]
    return "default", by_region["default"]
