"""The study protocol: a YAML file validated by pydantic.

``parse_protocol(text)`` returns a ``Protocol`` or raises ``ProtocolError`` whose messages name
the field path and the line in the file, e.g. ``arms[1].mode (line 14): Input should be ...``.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from study.durations import Duration, Repeat
from study.i18n import N_, gettext
from study.translated import ConsentTranslation, Language, PublicText, languages_complete
from study.validation import email_address

ROLES = ("concierge", "collaborator", "coach")
Role = Literal["concierge", "collaborator", "coach"]
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"  # a study's id (its slug), an arm's, a follow-up's
Slug = Field(pattern=SLUG_PATTERN)
_CLOCK_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PUBLIC_TITLE_FALLBACK = N_("Research study")


class StudyInfo(_Strict):
    """``title`` and ``description`` are for staff and may name the hypothesis; participants see
    only ``public_title`` and ``public_description`` (a neutral fallback when no public title is set),
    in their language (``translations``)."""

    id: str = Slug
    title: str = Field(min_length=1, max_length=300)
    description: str = ""
    public_title: str | None = Field(default=None, min_length=1, max_length=200)
    public_description: str = Field(default="", max_length=5000, description="Markdown shown to participants")
    translations: dict[str, PublicText] = Field(
        default_factory=dict,
        description="public_title and public_description in each of the protocol's other languages")

    @property
    def participant_title(self) -> str:
        return self.public_title or PUBLIC_TITLE_FALLBACK

    def title_in(self, language: str | None) -> str:
        """The public title as a participant reading ``language`` sees it."""
        translated = self.translations.get(language or "")
        if translated is not None:
            return translated.public_title
        return self.public_title or gettext(language or "en", PUBLIC_TITLE_FALLBACK)

    def description_in(self, language: str | None) -> str:
        translated = self.translations.get(language or "")
        return translated.public_description if translated is not None else self.public_description


class Arm(_Strict):
    name: str = Slug
    mode: Literal["wellbeing", "default"]
    roles: list[Role] = Field(default_factory=list)
    default_role: Role | None = None
    weight: int = Field(default=1, ge=1, le=100)
    model: str | None = Field(default=None, description="LiteLLM model for this arm; the platform's llm_model if unset")

    @model_validator(mode="after")
    def _roles_fit_mode(self) -> Arm:
        if self.mode == "wellbeing":
            if not self.roles:
                raise ValueError("a wellbeing arm must allow at least one role")
            if len(set(self.roles)) != len(self.roles):
                raise ValueError("roles are listed more than once")
            if self.default_role is None or self.default_role not in self.roles:
                raise ValueError("default_role must be one of the arm's roles")
        elif self.roles or self.default_role:
            raise ValueError("a default-mode arm has no roles (it is the control assistant)")
        return self


class Confirmation(_Strict):
    """A statement the participant ticks when signing. An optional one (``required: false``, e.g.
    agreeing to share conversation text) may be left unticked; the signature records which were
    ticked."""

    id: str = Slug
    text: str = Field(min_length=1)
    required: bool = True


class Consent(_Strict):
    """The consent text and who stands behind it: the principal investigator, the ethics board
    (IRB) contact and the approved protocol number are shown with the text and in the signed copy."""

    version: str = Field(min_length=1, max_length=40)
    text: str = Field(min_length=20, description="Markdown shown to the participant")
    confirmations: list[Confirmation] = Field(min_length=1)
    principal_investigator: str | None = Field(default=None, min_length=1, max_length=300)
    irb_contact: str | None = Field(default=None, min_length=1, max_length=500)
    protocol_number: str | None = Field(default=None, min_length=1, max_length=100)
    translations: dict[str, ConsentTranslation] = Field(
        default_factory=dict, description="the text and confirmations in each of the protocol's other languages")

    @model_validator(mode="after")
    def _unique_confirmations(self) -> Consent:
        ids = [c.id for c in self.confirmations]
        if len(set(ids)) != len(ids):
            raise ValueError("confirmation ids must be unique")
        for language, translation in self.translations.items():
            missing = [i for i in ids if i not in translation.confirmations]
            unknown = sorted(set(translation.confirmations) - set(ids))
            if missing:
                raise ValueError(f"translations.{language}.confirmations: no text for {', '.join(missing)}")
            if unknown:
                raise ValueError(f"translations.{language}.confirmations: {', '.join(unknown)} is not a confirmation "
                                 f"(they are: {', '.join(ids)})")
        return self


def unknown_instrument(name: str, known: Collection[str]) -> str:
    """What a person is told about an instrument id not among ``known``: the nearest known id, if one
    is near, and all of them."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return (f"unknown instrument '{name}'" + (f"; did you mean '{close[0]}'?" if close else "")
            + f" (known: {', '.join(sorted(known))}; a custom one is loaded with `afterward instruments load FILE`)")


def known_instrument(name: str, info: ValidationInfo) -> str:
    """``name`` when the validation context's ``instruments`` (the ids a study may use: the built-in
    ones and those loaded with ``afterward instruments load``) has it; without that context, any name."""
    known: Mapping[str, Collection[str]] | None = (info.context or {}).get("instruments")
    if known is None or name in known:
        return name
    raise ValueError(unknown_instrument(name, known))


InstrumentId = Annotated[str, AfterValidator(known_instrument)]


class FollowUp(_Strict):
    id: str = Slug
    instrument: InstrumentId
    anchor: Literal["enrollment", "decision"]
    offset: Duration
    window: Duration = dt.timedelta(days=3)
    reminders: list[Duration] = Field(default_factory=list)
    send_at_local: str = "10:00"
    repeat: Repeat | None = None

    @field_validator("send_at_local")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        if not _CLOCK_TIME.match(value):
            raise ValueError("use a 24-hour local time like 09:30")
        return value

    @model_validator(mode="after")
    def _reminders_inside_window(self) -> FollowUp:
        if self.offset < dt.timedelta(0) or self.window <= dt.timedelta(0):
            raise ValueError("offset must not be negative and window must be positive")
        for reminder in self.reminders:
            if not dt.timedelta(0) < reminder < self.window:
                raise ValueError("each reminder must fall inside the response window")
        if self.repeat is not None and self.window > self.repeat.shortest:
            raise ValueError(f"the window ({self.window}) is longer than the time between two occurrences "
                             f"({self.repeat.shortest}): each occurrence must close before the next opens")
        return self


class QuietHours(_Strict):
    start: str = "21:00"
    end: str = "08:00"

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        if not _CLOCK_TIME.match(value):
            raise ValueError("use a 24-hour local time like 21:00")
        return value


class Enrollment(_Strict):
    contact_email: Literal["required", "optional"] = "optional"
    default_timezone: str | None = None

    @field_validator("default_timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            validate_timezone(value)
        return value


PANEL_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


def _redirect_url(value: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme != "https" or not parts.hostname or any(c.isspace() for c in value.strip()):
        raise ValueError(f"'{value}': give the panel's redirect as a full https:// address")
    return value.strip()


RedirectUrl = Annotated[str, AfterValidator(_redirect_url)]


class Panel(_Strict):
    """Recruitment on an online panel (Prolific, SONA, MTurk): participants arrive by the study link
    with the panel's id for them (``?code=STUDY-LINK&panel_id=...``: ``id_placeholder`` is what the
    panel replaces with it, e.g. Prolific's ``{{%PROLIFIC_PID%}}``), kept as a pseudonymous external
    id (one arrival per id; never in a research export). After each wave named in ``completion``
    (``baseline`` or a follow-up id) they are sent to its completion URL; someone who declines the
    consent goes to ``screen_out``. ``payments`` (amount per wave, in ``currency``) feed
    ``afterward payments export``."""

    name: str = Field(min_length=1, max_length=60, description="the panel, e.g. Prolific")
    id_placeholder: str = Field(default="{{%PROLIFIC_PID%}}", min_length=1, max_length=100)
    completion: dict[str, RedirectUrl] = Field(default_factory=dict)
    screen_out: RedirectUrl | None = None
    payments: dict[str, Annotated[float, Field(gt=0, le=10_000)]] = Field(default_factory=dict)
    currency: str = Field(default="GBP", pattern=r"^[A-Z]{3}$")


class Withdrawal(_Strict):
    allow_data_deletion: bool = True


class Pushback(_Strict):
    """What "go ahead anyway" means for the rest of a conversation. An override answers the concern
    it was given for; a new instance of that concern (a new plan, a new account) is raised again once
    ``raise_again_after`` participant messages have been written since the override (1: already the
    next one). ``never`` mutes an overridden concern for the rest of the conversation: a choice the
    ethics board should approve explicitly, since the participant then meets no pushback on it.
    Safety concerns are never muted, whatever is set here."""

    raise_again_after: int | Literal["never"] = Field(
        default=3,
        description="participant messages after an override before its concern may be raised again, or 'never'")

    @field_validator("raise_again_after")
    @classmethod
    def _sensible(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 100:
            raise ValueError("raise_again_after must be a number of messages from 1 to 100, or 'never'")
        return value


class SafetyContact(_Strict):
    """Who is told when a participant is escalated: an email address, a webhook URL, or both.
    Notices say only the category, the time and where staff read the event, never what was written."""

    name: str = Field(default="", max_length=200, description="who this is, e.g. 'On-call study clinician'")
    email: str | None = None
    webhook: str | None = Field(default=None, max_length=2000)

    @field_validator("email")
    @classmethod
    def _one_address(cls, value: str | None) -> str | None:
        return email_address(value) if value is not None else None

    @field_validator("webhook")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("https", "http") or not parts.hostname or any(c.isspace() for c in value.strip()):
            raise ValueError("give the webhook as a full URL, like https://alerts.example.org/afterward")
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise ValueError("a webhook outside this machine must use https://")
        return value.strip()

    @model_validator(mode="after")
    def _reachable(self) -> SafetyContact:
        if self.email is None and self.webhook is None:
            raise ValueError("a safety contact needs an email, a webhook, or both")
        return self


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


TriageLevel = Literal["check_in", "escalation", "unanswered"]  # study.safety.SafetyLevel's values
UnansweredAction = Literal["page", "follow_up"]
UNANSWERED_AFTER_BOUNDS = (dt.timedelta(minutes=5), dt.timedelta(hours=24))
DEFAULT_PAGE: tuple[TriageLevel, ...] = ("escalation", "unanswered")
DEFAULT_ON_UNANSWERED: tuple[UnansweredAction, ...] = ("page",)


class Triage(_Strict):
    """What the answers to a safety check-in (``chat.triage``) set off. ``page``: the levels of
    safety event that page the on-call contacts (escalations always do); ``unanswered_after``: how
    long a check-in waits for its answers before it is unanswered; ``on_unanswered``: what happens
    then, ``page`` (the on-call contacts are paged: the same as listing ``unanswered`` in ``page``)
    and/or ``follow_up`` (the participant is shown a follow-up message in the conversation).

    Given only one of ``page`` and ``on_unanswered``, the other follows from it; given both, they
    must agree about paging unanswered check-ins."""

    page: list[TriageLevel] = Field(default_factory=lambda: list(DEFAULT_PAGE))
    unanswered_after: Duration = dt.timedelta(minutes=30)
    on_unanswered: list[UnansweredAction] = Field(default_factory=lambda: list(DEFAULT_ON_UNANSWERED))

    @model_validator(mode="before")
    @classmethod
    def _one_answer_about_paging(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        page, actions = data.get("page"), data.get("on_unanswered")
        if isinstance(actions, list) and page is None:
            data = {**data, "page": ["escalation", *(["unanswered"] if "page" in actions else [])]}
        elif isinstance(page, list) and actions is None:
            data = {**data, "on_unanswered": ["page"] if "unanswered" in page else []}
        return data

    @field_validator("unanswered_after")
    @classmethod
    def _sensible_wait(cls, value: dt.timedelta) -> dt.timedelta:
        low, high = UNANSWERED_AFTER_BOUNDS
        if not low <= value <= high:
            raise ValueError("unanswered_after must be between PT5M (5 minutes) and PT24H (24 hours): long enough "
                             "to answer a few questions, short enough that nobody waits a day to hear of a "
                             "check-in left unanswered")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Triage:
        for name, values in (("page", self.page), ("on_unanswered", self.on_unanswered)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value more than once")
        if "escalation" not in self.page:
            raise ValueError("page must list escalation: an escalation always pages the on-call contacts")
        if ("unanswered" in self.page) != ("page" in self.on_unanswered):
            raise ValueError("page and on_unanswered disagree: list 'unanswered' in page exactly when on_unanswered "
                             "includes 'page' (or give only one of them)")
        return self

    def pages(self, level: str) -> bool:
        """Whether a safety event at ``level`` pages the on-call contacts."""
        return level in self.page


class AnswerRule(_Strict):
    """A safety rule on survey answers: when a participant's answer to ``item`` of ``instrument``
    (or its score ``score``) is at least ``at_least``, a safety event of ``level`` and ``category``
    is raised at once (``surveys.safety_rules``): the participant is shown the crisis resources, and
    the on-call contacts are paged as for a chat escalation when ``triage.page`` lists the level. The
    common case is the PHQ-9's ninth item: ``{id: phq9-item9, instrument: phq-9, item: phq9_9, at_least: 1}``."""

    id: str = Slug
    instrument: InstrumentId
    item: str | None = None
    score: str | None = None
    at_least: float
    level: Literal["check_in", "escalation"] = "escalation"
    category: Literal["risk_to_self", "risk_from_others", "harm_to_others"] = "risk_to_self"

    @model_validator(mode="after")
    def _one_condition(self, info: ValidationInfo) -> AnswerRule:
        if (self.item is None) == (self.score is None):
            raise ValueError(f"answer rule {self.id}: give either item or score (the condition is on one of them)")
        known: Mapping[str, Collection[str]] | None = (info.context or {}).get("instruments")
        names = known.get(self.instrument) if isinstance(known, Mapping) else None
        name = self.item if self.item is not None else self.score
        if names is not None and name not in names:
            kind = "an item" if self.item is not None else "a score"
            close = difflib.get_close_matches(str(name), sorted(names), n=1, cutoff=0.6)
            raise ValueError(f"answer rule {self.id}: '{name}' is not {kind} of {self.instrument}"
                             + (f"; did you mean '{close[0]}'?" if close else "")
                             + f" ({self.instrument} has: {', '.join(sorted(names))})")
        return self


class Safety(_Strict):
    """The on-call side of safety events: every one whose level pages (``triage``) notifies
    ``contacts`` within a minute, and an event nobody has reviewed is notified again every
    ``renotify_after`` (a duration). ``answer_rules`` raise safety events from survey answers."""

    contacts: list[SafetyContact] = Field(default_factory=list)
    renotify_after: Duration = dt.timedelta(hours=4)
    triage: Triage = Triage()
    answer_rules: list[AnswerRule] = Field(default_factory=list)

    @field_validator("renotify_after")
    @classmethod
    def _sensible_interval(cls, value: dt.timedelta) -> dt.timedelta:
        if not dt.timedelta(minutes=15) <= value <= dt.timedelta(days=7):
            raise ValueError("renotify_after must be between PT15M (15 minutes) and P7D (7 days)")
        return value

    @model_validator(mode="after")
    def _no_repeats(self) -> Safety:
        seen = [address for c in self.contacts for address in (c.email, c.webhook) if address is not None]
        if len(set(seen)) != len(seen):
            raise ValueError("a safety contact's email or webhook is listed more than once")
        rules = [rule.id for rule in self.answer_rules]
        if len(set(rules)) != len(rules):
            raise ValueError("answer rule ids must be unique")
        return self


class Blinding(_Strict):
    """Keeping staff blind to arm. With ``outcomes_until_plan_frozen``, until the study's analysis
    plan is frozen (``afterward plan freeze``) no staff view shows outcomes by arm: the aggregate
    outcome tables are pooled over the arms, and the row-level exports, the analysis report and the
    dashboard's model pages are refused unless an admin unblinds one read, with a reason, audited
    (``analysis.plan.outcome_access`` decides, for every view). Enrollment, follow-up completion and
    safety stay visible, arms and all. Once any protocol version of the study asks for it, a later
    version cannot drop it: only freezing the plan ends it."""

    outcomes_until_plan_frozen: bool = Field(
        default=False, description="hide the arm in staff views of outcomes until the analysis plan is frozen")


class Protocol(_Strict):
    study: StudyInfo
    arms: list[Arm] = Field(min_length=1)
    languages: list[Language] = Field(
        default=["en"], min_length=1,
        description="the languages participants may read the study in (each with its consent text and "
                    "instrument translations); the first is the consent text's own and the default")
    consent: Consent
    baseline: list[InstrumentId] = Field(default_factory=list)
    followups: list[FollowUp] = Field(default_factory=list)
    quiet_hours: QuietHours = QuietHours()
    channels: list[Literal["email", "webhook", "in_app"]] = Field(default=["in_app"], min_length=1)
    crisis_resources: dict[str, str | dict[str, str]] = Field(
        description="Crisis resources text per region code ('default' is shown when no region matches), or a "
                    "region's text per language; a study in several languages gives 'default' in each")
    enrollment: Enrollment = Enrollment()
    withdrawal: Withdrawal = Withdrawal()
    pushback: Pushback = Pushback()
    safety: Safety = Safety()
    blinding: Blinding = Blinding()
    recruitment: Panel | None = None

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Protocol:
        languages_complete(self, (info.context or {}).get("instruments"))
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        ids = [f.id for f in self.followups]
        if len(set(ids)) != len(ids):
            raise ValueError("follow-up ids must be unique")
        if "default" not in self.crisis_resources:
            raise ValueError("crisis_resources needs a 'default' entry")
        default = self.crisis_resources["default"]
        lacking = [code for code in self.languages if not isinstance(default, dict) or code not in default]
        if len(self.languages) > 1 and lacking:
            raise ValueError(f"crisis_resources.default: no text in {', '.join(lacking)} (a study in several languages "
                             "gives its default crisis resources in each: default: {en: ..., es: ...})")
        if self.recruitment is not None:
            waves = {"baseline", *ids}
            for field in ("completion", "payments"):
                unknown = sorted(set(getattr(self.recruitment, field)) - waves)
                if unknown:
                    raise ValueError(f"recruitment.{field}: {', '.join(unknown)} is not a wave of the study (baseline "
                                     f"or a follow-up id: {', '.join(sorted(waves))})")
        asked = self.instruments()
        for rule in self.safety.answer_rules:
            if rule.instrument not in asked:
                raise ValueError(f"safety.answer_rules: rule {rule.id} is on {rule.instrument}, which the study does "
                                 f"not ask (baseline or followups: {', '.join(sorted(asked))})")
        return self

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)

    def crisis_resources_for(self, timezone: str | None, language: str | None = None) -> tuple[str, str]:
        """The crisis resources to show someone in this time zone: (region code, text), falling
        back to the 'default' entry when the zone's country has none; in ``language`` where the
        entry is given per language (else in its first)."""
        region = country_of_timezone(timezone) if timezone else None
        found = region if region and region in self.crisis_resources else "default"
        return found, self.crisis_resources_in(found, language)

    def crisis_resources_in(self, region: str, language: str | None) -> str:
        entry = self.crisis_resources[region]
        if isinstance(entry, str):
            return entry
        return entry.get(language or "") or entry.get(self.languages[0]) or next(iter(entry.values()))

    def instruments(self) -> set[str]:
        return set(self.baseline) | {f.instrument for f in self.followups}


class ProtocolError(ValueError):
    """An invalid protocol file; ``problems`` lists one readable message per error."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid protocol:\n  " + "\n  ".join(problems))


@functools.cache
def _zone_countries() -> dict[str, str]:
    """IANA zone -> ISO country code from the system's zone.tab (empty when tzdata lacks it)."""
    countries: dict[str, str] = {}
    for path in ("/usr/share/zoneinfo/zone.tab", "/usr/share/zoneinfo/zone1970.tab"):
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            if line and not line.startswith("#"):
                codes, _, zone = line.split("\t")[:3]
                countries.setdefault(zone, codes.split(",")[0])
    return countries


def country_of_timezone(name: str) -> str | None:
    return _zone_countries().get(name)


# The names ``validate_timezone`` takes, as the OpenAPI document lists them.
TIME_ZONES = sorted(available_timezones())
TIME_ZONE_SCHEMA: dict[str, Any] = {"enum": TIME_ZONES}


def validate_timezone(name: str) -> ZoneInfo:
    """Return the IANA zone or raise ValueError with a message a person can act on."""
    try:
        if not name or name != name.strip() or name.startswith("/"):
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"'{name}' is not an IANA time zone; use a name like 'Europe/Berlin' or 'America/New_York'"
        ) from None


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the deepest YAML node the error location reaches."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


_PATH = re.compile(r"^(?P<path>[a-z_]+(?:\[\d+\])?(?:\.[a-z_]+)?)(?::| \()")


def _loc(path: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", path) if p)


Validated = TypeVar("Validated", bound=BaseModel)


def validated_yaml(text: str, model: type[Validated], problems: Callable[[list[str]], Exception],
                   shape: str, context: dict[str, Any] | None = None) -> Validated:
    """``text`` (a YAML file a person wrote) as ``model``, or ``problems(messages)`` raised with one
    message per error, each naming the field and its line (``arms[1].mode (line 17): ...``): invalid
    YAML, a document that is not a mapping (``shape`` says what it should hold), or a field the model
    refuses. A model-level validator's message names its fields at the start of each line
    (``primary.outcome: ...``), which get their lines too. The protocol and the analysis plan
    (``analysis.plan``) are read by it. ``context`` goes to the model's validators."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise problems([f"not valid YAML{where}: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(document, dict):
        raise problems([shape])
    try:
        return model.model_validate(document, context=context)
    except ValidationError as exc:
        found = []
        for error in exc.errors():
            # pydantic appends the tag of a failing union member; it is noise to a researcher.
            loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            message = str(error["msg"]).removeprefix("Value error, ")
            if loc:
                found.append(f"{_format_loc(loc)} (line {_line_of(root, loc)}): {message}")
                continue
            for line in message.splitlines():
                named = _PATH.match(line)
                if named is None:
                    found.append(line)
                    continue
                path = named["path"]
                found.append(f"{path} (line {_line_of(root, _loc(path))}){line[len(path):]}")
        raise problems(found) from None


def parse_protocol(text: str, instruments: Mapping[str, Collection[str]] | None = None) -> Protocol:
    """The protocol file ``text``, refused (ProtocolError) with each problem's field and line; with
    ``instruments`` (id -> its item ids and score names: ``surveys.registry.catalog``), an instrument
    not among them, or an answer rule's item or score its instrument lacks, too (with the nearest
    known name as a suggestion)."""
    return validated_yaml(text, Protocol, ProtocolError,
                          "the file must be a YAML mapping with study, arms, consent, ...",
                          None if instruments is None else {"instruments": instruments})
