"""Outcome-labelled trajectories: each conversation of a participant who agreed to share
conversation text, as its messages (speaker, role, stance, concern, rationale, the participant's
overrides), labelled with the outcomes measured later (the Decision Regret Scale score of the
decision made in it, the change in PERMA overall well-being over the following wave), plus
preference pairs between comparable conversations where the one followed by lower regret is
preferred: the "prefer trajectories that end in lower regret" training signal.

Only participants whose latest consent signature includes the optional confirmation
``share-conversation-text`` are exported; participants whose data were deleted never are.
The conversations' features and the outcomes come from ``analysis.features`` and
``analysis.panel``, so a label means what the same number means in the panel. Turns are
streamed in chunks; audited like every export; viewers are refused.

    >>> from analysis.trajectories import export_trajectories
    >>> export_trajectories(engine, "wellbeing-pilot", Path("out"), actor=Actor.system("cli"))
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import pandas as pd
from pydantic_core import to_jsonable_python
from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from analysis.exports import (
    EMAIL_PATTERN,
    PHONE_MIN_DIGITS,
    PHONE_PATTERN,
    StudyRef,
    open_study,
    record_export,
    scrub,
)
from analysis.features import conversation_features
from analysis.panel import PERMA, panel
from analysis.software import packages_line
from chat.models import Decision, PushbackResponse, RoleSwitch, Turn
from study import audit
from study.db import READ_ONLY
from study.errors import Invalid
from study.models import ConsentSignature, ConsentVersion, Participant, ProtocolVersion

SHARE_CONFIRMATION = "share-conversation-text"
SENTIMENT_TOLERANCE = 0.25  # VADER compound points (-1..1) two starting messages may differ by
MAX_PARTNERS = 5  # each conversation is compared with at most this many next ones in sentiment order
TURN_CHUNK_ROWS = 5_000
TRAJECTORIES_FILE = "trajectories.jsonl"
PAIRS_FILE = "preference_pairs.jsonl"


@dataclass
class TrajectoryExport:
    out_dir: Path
    exported_at: dt.datetime
    participants_sharing: int  # latest signature includes the confirmation (data not deleted)
    participants_not_sharing: int  # signed consent without it (data not deleted): left out
    conversations: int
    pairs: int
    options: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    @property
    def row_counts(self) -> dict[str, int]:
        return {"trajectories": self.conversations, "preference_pairs": self.pairs}


# Who may be exported


def sharing_participants(connection: Connection, study_id: int,
                         confirmation: str = SHARE_CONFIRMATION) -> tuple[dict[int, str], int]:
    """({participant id: code} of those whose latest consent signature includes ``confirmation``,
    number of other signers), over participants whose data were not deleted. One query; the
    signatures are few (one per consent signed) and their confirmations a JSON list, read here."""
    rows = connection.execute(
        select(ConsentSignature.participant_id, Participant.code, ConsentSignature.confirmations)
        .join(Participant, Participant.id == ConsentSignature.participant_id)
        .where(Participant.study_id == study_id, Participant.data_deleted_at.is_(None))
        .order_by(ConsentSignature.participant_id, ConsentSignature.signed_at, ConsentSignature.id)).all()
    latest = {participant_id: (code, confirmations or []) for participant_id, code, confirmations in rows}
    sharing = {pid: code for pid, (code, ticked) in latest.items() if confirmation in ticked}
    return sharing, len(latest) - len(sharing)


def _offered(connection: Connection, study_id: int, confirmation: str) -> bool:
    """Whether any consent version of the study offered the confirmation."""
    versions = connection.scalars(select(ConsentVersion.confirmations).where(ConsentVersion.study_id == study_id))
    return any(c.get("id") == confirmation for confirmations in versions for c in confirmations or [])


# Labels


def _utc(values: pd.Series) -> pd.Series:
    return pd.to_datetime(values, utc=True)


def regret_labels(panel_frame: pd.DataFrame) -> pd.DataFrame:
    """One row per decision-anchored follow-up: the conversation the decision was made in, the
    follow-up key, its Decision Regret Scale score (missing unless submitted), times and status."""
    rows = panel_frame[panel_frame["decision_conversation_id"].notna()]
    out = pd.DataFrame({
        "conversation_id": rows["decision_conversation_id"].astype("int64"),
        "followup_key": rows["wave"].astype(str), "regret": rows["regret"].astype(float),
        "intended_at": _utc(rows["intended_at"]), "submitted_at": _utc(rows["submitted_at"]),
        "response_status": rows["response_status"].astype(str)})
    return out.sort_values(["conversation_id", "intended_at", "followup_key"], kind="stable").reset_index(drop=True)


def perma_change(conversations: pd.DataFrame, panel_frame: pd.DataFrame) -> pd.DataFrame:
    """Per conversation (index conversation_id), the change in PERMA overall well-being over the
    wave that follows it.

    ``after``: the participant's first PERMA follow-up whose intended time is after the
    conversation started (the wave the panel counts the conversation toward), answered or not.
    ``before``: the participant's last PERMA score (baseline included) submitted before the
    conversation started. The change is after - before, missing when either score is missing.
    Every conversation before the same wave shares its change."""
    columns = ["before_wave", "before_submitted_at", "before_score", "after_wave", "after_intended_at",
               "after_submitted_at", "after_status", "after_score", "change"]
    perma = panel_frame[panel_frame["instrument_id"] == PERMA]
    left = conversations[["conversation_id", "participant_code", "started_at"]].assign(
        started_at=lambda f: _utc(f["started_at"]))
    if left.empty or perma.empty:
        return pd.DataFrame(columns=columns, index=pd.Index(left["conversation_id"], name="conversation_id"))
    scores = pd.DataFrame({
        "participant_code": perma["participant_code"], "wave": perma["wave"],
        "intended_at": _utc(perma["intended_at"]), "submitted_at": _utc(perma["submitted_at"]),
        "status": perma["response_status"], "score": perma["perma_overall_wellbeing"].astype(float)})
    paired = left.merge(scores, on="participant_code", how="inner")

    # Whole rows are kept (groupby's first/last would mix rows, skipping missing values).
    before = paired[paired["score"].notna() & (paired["submitted_at"] < paired["started_at"])]
    before = before.sort_values(["conversation_id", "submitted_at", "wave"]) \
        .drop_duplicates("conversation_id", keep="last").set_index("conversation_id")
    after = paired[(paired["wave"] != "baseline") & (paired["intended_at"] > paired["started_at"])]
    after = after.sort_values(["conversation_id", "intended_at", "wave"]) \
        .drop_duplicates("conversation_id", keep="first").set_index("conversation_id")

    out = pd.DataFrame(index=pd.Index(left["conversation_id"], name="conversation_id"))
    out["before_wave"] = before["wave"]
    out["before_submitted_at"] = before["submitted_at"]
    out["before_score"] = before["score"]
    out["after_wave"] = after["wave"]
    out["after_intended_at"] = after["intended_at"]
    out["after_submitted_at"] = after["submitted_at"]
    out["after_status"] = after["status"]
    out["after_score"] = after["score"]
    out["change"] = out["after_score"].astype(float) - out["before_score"].astype(float)
    return out[columns]


def preference_pairs(conversations: pd.DataFrame, regret: pd.DataFrame, *,
                     tolerance: float = SENTIMENT_TOLERANCE, max_partners: int = MAX_PARTNERS) -> list[dict[str, Any]]:
    """Pairs of comparable conversations where the one followed by lower regret is ``chosen``.

    Comparable: the same follow-up (the same delay after the decision), the same starting role,
    and starting sentiments (VADER compound of the participant's first message) at most
    ``tolerance`` apart. Within each (follow-up, role) group the conversations with a submitted
    regret score are sorted by (sentiment, conversation id); each is compared with at most
    ``max_partners`` of the next ones that are within the tolerance, so a group of n gives at
    most ``max_partners`` x n pairs. Equal regret scores are no preference and give no pair.
    Deterministic: groups in (follow-up, role) order, then by the sorted positions."""
    if conversations.empty or regret.empty:
        return []
    labelled = regret[regret["regret"].notna()].merge(
        conversations[["conversation_id", "participant_code", "starting_role", "first_message_sentiment"]],
        on="conversation_id", how="inner")
    labelled = labelled[labelled["starting_role"].notna() & labelled["first_message_sentiment"].notna()]
    pairs: list[dict[str, Any]] = []
    for (key, role), group in labelled.groupby(["followup_key", "starting_role"], sort=True):
        ordered = group.sort_values(["first_message_sentiment", "conversation_id"]).to_dict("records")
        for i, first in enumerate(ordered):
            for second in ordered[i + 1:i + 1 + max_partners]:
                gap = round(second["first_message_sentiment"] - first["first_message_sentiment"], 9)
                if gap > tolerance:
                    break
                if first["regret"] == second["regret"]:
                    continue
                chosen, rejected = (first, second) if first["regret"] < second["regret"] else (second, first)
                pairs.append({
                    "pair_id": len(pairs) + 1, "followup_key": key, "starting_role": role,
                    "chosen_conversation_id": int(chosen["conversation_id"]),
                    "rejected_conversation_id": int(rejected["conversation_id"]),
                    "chosen_regret": float(chosen["regret"]), "rejected_regret": float(rejected["regret"]),
                    "chosen_sentiment": float(chosen["first_message_sentiment"]),
                    "rejected_sentiment": float(rejected["first_message_sentiment"]),
                    "sentiment_gap": gap,
                    "chosen_participant_code": chosen["participant_code"],
                    "rejected_participant_code": rejected["participant_code"],
                    "same_participant": chosen["participant_code"] == rejected["participant_code"],
                })
    return pairs


# Writing


def _iso(value: Any) -> str | None:
    """A time in UTC, written as the API writes it (``2026-03-02T09:00:00Z``)."""
    if value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    moment = pd.Timestamp(value).tz_convert("UTC").to_pydatetime() if isinstance(value, pd.Timestamp) \
        else value.astimezone(dt.UTC)
    written: str = to_jsonable_python(moment)
    return written


def _number(value: Any) -> float | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _text(value: Any) -> str | None:
    return None if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) \
        else str(value)


def _message(row: Any) -> dict[str, Any]:
    return {"seq": row.seq, "speaker": row.speaker, "role": row.role, "text": scrub(row.content),
            "created_at": _iso(row.created_at), "stance": row.stance, "concern": row.concern,
            "rationale": scrub(row.rationale), "after_override": bool(row.after_override),
            "response": {"action": row.action, "at": _iso(row.response_at)} if row.action else None,
            "model": row.model, "prompt_version": row.prompt_version}


def _messages(connection: Connection, study_id: int, wanted: set[int],
              chunk_rows: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(conversation id, its messages in order) for the wanted conversations, in id order, from
    one streamed query over the study's turns with their pushback responses."""
    query = (select(Turn.conversation_id, Turn.seq, Turn.speaker, Turn.role, Turn.content, Turn.created_at,
                    Turn.stance, Turn.concern, Turn.rationale, Turn.after_override, Turn.model, Turn.prompt_version,
                    PushbackResponse.action, PushbackResponse.created_at.label("response_at"))
             .outerjoin(PushbackResponse, PushbackResponse.turn_id == Turn.id)
             .join(Participant, Participant.id == Turn.participant_id)
             .where(Participant.study_id == study_id, Participant.data_deleted_at.is_(None))
             .order_by(Turn.conversation_id, Turn.seq))
    result = connection.execution_options(stream_results=True, yield_per=chunk_rows).execute(query)
    current: int | None = None
    messages: list[dict[str, Any]] = []
    for rows in result.partitions():
        for row in rows:
            if row.conversation_id not in wanted:
                continue
            if row.conversation_id != current:
                if current is not None:
                    yield current, messages
                current, messages = row.conversation_id, []
            messages.append(_message(row))
    if current is not None:
        yield current, messages


def _trajectory(conversation: Mapping[Any, Any], messages: list[dict[str, Any]], switches: list[dict[str, Any]],
                decision: dict[str, Any] | None, regret: list[dict[str, Any]],
                change: Mapping[Any, Any]) -> dict[str, Any]:
    before = {"wave": change["before_wave"], "submitted_at": _iso(change["before_submitted_at"]),
              "overall_wellbeing": _number(change["before_score"])} if _text(change["before_wave"]) else None
    after = {"wave": change["after_wave"], "intended_at": _iso(change["after_intended_at"]),
             "submitted_at": _iso(change["after_submitted_at"]), "response_status": change["after_status"],
             "overall_wellbeing": _number(change["after_score"])} if _text(change["after_wave"]) else None
    return {
        "conversation_id": int(conversation["conversation_id"]),
        "participant_code": conversation["participant_code"],
        "arm": conversation["arm"], "mode": conversation["mode"],
        "starting_role": conversation["starting_role"], "final_role": conversation["final_role"],
        "status": conversation["status"],
        "started_at": _iso(conversation["started_at"]), "ended_at": _iso(conversation["ended_at"]),
        "first_message_sentiment": _number(conversation["first_message_sentiment"]),
        "role_switches": switches,
        "messages": messages,
        "labels": {
            "exit_rating": _number(conversation["exit_rating"]),
            "decision": decision,
            "regret": regret,
            "perma": {"before": before, "after": after,
                      "overall_wellbeing_change": _number(change["change"])},
        },
    }


def _write_jsonl(handle: TextIO, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")


def export_trajectories(engine: Engine, study_slug: str, out_dir: Path, *, actor: audit.Actor,
                        confirmation: str = SHARE_CONFIRMATION, sentiment_tolerance: float = SENTIMENT_TOLERANCE,
                        max_partners: int = MAX_PARTNERS, chunk_rows: int = TURN_CHUNK_ROWS,
                        audit_in: Session | None = None) -> TrajectoryExport:
    """Write ``trajectories.jsonl``, ``preference_pairs.jsonl`` and a ``README.md`` data card to
    ``out_dir`` for the participants who agreed to share conversation text, and audit it.
    Raises LookupError for an unknown study, ExportRefused for a viewer, and Invalid when the
    study's consent never offered ``confirmation``. ``audit_in``: record the audit entry in this
    session instead of a transaction of its own."""
    if not 0 <= sentiment_tolerance <= 2 or max_partners < 1:
        raise Invalid("sentiment_tolerance must be within 0..2 and max_partners at least 1")
    exported_at = dt.datetime.now(dt.UTC)
    options = {"confirmation": confirmation, "sentiment_tolerance": sentiment_tolerance,
               "max_partners": max_partners}
    # One read-only transaction: on SQLite no write lock is held while a large study is read.
    with engine.execution_options(**{READ_ONLY: True}).connect() as connection:
        study = open_study(connection, study_slug, actor)
        if not _offered(connection, study.id, confirmation):
            raise Invalid(f"the consent of '{study.slug}' never offered the confirmation '{confirmation}', so no "
                          "participant agreed to share conversation text; add it to the protocol's consent "
                          "confirmations (required: false) under a new consent version",
                          code="sharing_not_offered")
        sharing, not_sharing = sharing_participants(connection, study.id, confirmation)
        features = conversation_features(connection, study.id)
        conversations = features[features["participant_code"].isin(set(sharing.values()))]
        conversations = conversations.sort_values("conversation_id").reset_index(drop=True)
        panel_frame = panel(connection, study.id, conversations=features)
        regret = regret_labels(panel_frame)
        regret = regret[regret["conversation_id"].isin(set(conversations["conversation_id"]))]
        changes = perma_change(conversations, panel_frame)
        wanted = {int(c) for c in conversations["conversation_id"]}
        decisions = {row.conversation_id: {"id": row.id, "text": scrub(row.text), "decided_at": _iso(row.decided_at)}
                     for row in connection.execute(
                         select(Decision.id, Decision.conversation_id, Decision.text, Decision.decided_at)
                         .join(Participant, Participant.id == Decision.participant_id)
                         .where(Participant.study_id == study.id)) if row.conversation_id in wanted}
        switches: dict[int, list[dict[str, Any]]] = {}
        for row in connection.execute(
                select(RoleSwitch.conversation_id, RoleSwitch.from_role, RoleSwitch.to_role, RoleSwitch.after_seq,
                       RoleSwitch.created_at).join(Participant, Participant.id == RoleSwitch.participant_id)
                .where(Participant.study_id == study.id)
                .order_by(RoleSwitch.conversation_id, RoleSwitch.after_seq, RoleSwitch.id)):
            if row.conversation_id in wanted:
                switches.setdefault(row.conversation_id, []).append(
                    {"from_role": row.from_role, "to_role": row.to_role, "after_seq": row.after_seq,
                     "at": _iso(row.created_at)})
        regret_of: dict[int, list[dict[str, Any]]] = {}
        for item in regret.to_dict("records"):
            regret_of.setdefault(int(item["conversation_id"]), []).append(
                {"followup_key": item["followup_key"], "score": _number(item["regret"]),
                 "intended_at": _iso(item["intended_at"]), "submitted_at": _iso(item["submitted_at"]),
                 "response_status": item["response_status"]})

        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / TRAJECTORIES_FILE).open("w", encoding="utf-8") as handle:
            streamed = _messages(connection, study.id, wanted, chunk_rows)
            pending = next(streamed, None)
            for conversation in conversations.to_dict("records"):
                conversation_id = int(conversation["conversation_id"])
                while pending is not None and pending[0] < conversation_id:  # started after features were read
                    pending = next(streamed, None)
                messages: list[dict[str, Any]] = []
                if pending is not None and pending[0] == conversation_id:
                    messages, pending = pending[1], next(streamed, None)
                _write_jsonl(handle, _trajectory(conversation, messages, switches.get(conversation_id, []),
                                                 decisions.get(conversation_id), regret_of.get(conversation_id, []),
                                                 changes.loc[conversation_id].to_dict()))
        pairs = preference_pairs(conversations, regret, tolerance=sentiment_tolerance, max_partners=max_partners)
        with (out_dir / PAIRS_FILE).open("w", encoding="utf-8") as handle:
            for pair in pairs:
                _write_jsonl(handle, pair)
        protocols = connection.execute(select(ProtocolVersion.version, ProtocolVersion.loaded_at)
                                       .where(ProtocolVersion.study_id == study.id)
                                       .order_by(ProtocolVersion.version)).all()

    result = TrajectoryExport(out_dir, exported_at, len(sharing), not_sharing, len(conversations), len(pairs),
                              options, [out_dir / TRAJECTORIES_FILE, out_dir / PAIRS_FILE, out_dir / "README.md"])
    with_conversations = conversations["participant_code"].nunique()
    _write_readme(out_dir / "README.md", study, protocols, result, with_conversations)

    record_export(engine, actor, study.id, audit_in, format="trajectories", options=options,
                  row_counts=result.row_counts, tables=list(result.row_counts),
                  participants_sharing=result.participants_sharing,
                  participants_not_sharing=result.participants_not_sharing)
    return result


# The data card

TRAJECTORY_FIELDS: dict[str, str] = {
    "conversation_id": "Conversation id (the study's conversations table; pairs refer to it).",
    "participant_code": "Pseudonymous participant code (the same in the study's other exports).",
    "arm": "Study arm the conversation ran in.",
    "mode": "Assistant mode: wellbeing (roles, pushback) or default (the control's standard assistant).",
    "starting_role": "Role the conversation started in (concierge, collaborator, coach; standard in default mode).",
    "final_role": "Role in force at the end (or when exported, if still active).",
    "status": "active or ended.",
    "started_at, ended_at": "When the conversation started and ended (ISO 8601, UTC; ended_at null while active).",
    "first_message_sentiment": "VADER compound sentiment (-1..1) of the participant's first message.",
    "role_switches": "Role switches in order: from_role, to_role, after_seq (after this many turns), at.",
    "messages": "Every turn in order: seq, speaker (participant or assistant), role, text, created_at; for "
                "assistant turns the stance (agree, nudge, challenge, escalate), concern, rationale (the reason "
                "shown to the participant), after_override (the reply followed an override), model, "
                "prompt_version, and response: the participant's answer to a pushback (action override = 'go "
                "ahead anyway' or reconsider, and when), else null.",
    "labels.exit_rating": "The exit check's rating, 'How helpful was this conversation?' (1-7); null if not rated.",
    "labels.decision": "The decision reported at the end of the conversation (id, text, decided_at); null if none.",
    "labels.regret": "Every decision-anchored follow-up of that decision, in time order: followup_key, score "
                     "(Decision Regret Scale, 0-100, 100 = high regret; null unless submitted), intended_at, "
                     "submitted_at, response_status (as in the panel).",
    "labels.perma": "before (wave, submitted_at, overall_wellbeing), after (wave, intended_at, submitted_at, "
                    "response_status, overall_wellbeing) and overall_wellbeing_change; see the definition below.",
}

PAIR_FIELDS: dict[str, str] = {
    "pair_id": "1, 2, ... in the order described below.",
    "followup_key": "The regret follow-up both scores come from (the same delay after the decision).",
    "starting_role": "The starting role both conversations share.",
    "chosen_conversation_id, rejected_conversation_id": "The conversation followed by lower regret (chosen) "
                                                        "and the other (rejected); join to trajectories.jsonl.",
    "chosen_regret, rejected_regret": "Their regret scores at followup_key (chosen_regret < rejected_regret).",
    "chosen_sentiment, rejected_sentiment, sentiment_gap": "Their starting sentiments and the absolute difference.",
    "chosen_participant_code, rejected_participant_code, same_participant": "Whose conversations they are; "
                                                                            "both may be one participant's.",
}


def _software_version() -> str:
    try:
        return metadata.version("afterward")
    except metadata.PackageNotFoundError:
        return "unknown"


def _write_readme(path: Path, study: StudyRef, protocols: Any, result: TrajectoryExport,
                  with_conversations: int) -> None:
    options = result.options
    lines = [
        f"# Outcome-labelled trajectories: {study.title} ({study.slug})", "",
        f"- exported at: {result.exported_at.isoformat()}",
        f"- software: afterward {_software_version()}",
        f"- packages: {packages_line()}",
        "- protocol versions: " + "; ".join(f"v{v} loaded {at.isoformat()}" for v, at in protocols),
        f"- options: sentiment tolerance {options['sentiment_tolerance']}, at most {options['max_partners']} "
        "partners per conversation", "",
        "| file | rows |", "|---|---|",
        f"| `{TRAJECTORIES_FILE}` | {result.conversations} conversations |",
        f"| `{PAIRS_FILE}` | {result.pairs} preference pairs |", "",
        "Each line of a `.jsonl` file is one JSON object. Times are ISO 8601 in UTC; a missing value is null.", "",
        "## Who is in it (the consent filter)", "",
        f"Only participants whose latest consent signature includes the optional confirmation "
        f"`{options['confirmation']}` (they agreed that their conversation text may be shared with other "
        "researchers) are exported, with all their conversations. Participants who withdrew and had their "
        "research data deleted are never exported; those who only stopped contact keep the consent they gave "
        "and their data, and are exported if they agreed.", "",
        f"- participants who agreed: {result.participants_sharing} ({with_conversations} with conversations)",
        f"- participants who signed without agreeing (left out): {result.participants_not_sharing}", "",
        "## De-identification", "",
        f"Message text, rationales and decision text are scrubbed: email addresses (`{EMAIL_PATTERN.pattern}`) "
        f"become `[email]`, phone numbers (`{PHONE_PATTERN.pattern}` with at least {PHONE_MIN_DIGITS} digits) "
        "become `[phone]`. Nothing else is removed: names, places and events participants wrote about stay, as "
        "the consent told them. Contact details are never read. Times are not shifted. Participant codes are "
        "the study's pseudonyms; keep them from anyone who holds a key to identities.", "",
        f"## `{TRAJECTORIES_FILE}`: one object per conversation", "",
        "| field | meaning |", "|---|---|",
        *(f"| `{name}` | {meaning} |" for name, meaning in TRAJECTORY_FIELDS.items()), "",
        "### Label definitions", "",
        "- **Regret**: the Decision Regret Scale score (Brehaut et al., 2003) of the decision the participant "
        "reported at the end of this conversation, one entry per decision-anchored follow-up (e.g. 3 and 14 "
        "days later), from the participant x wave panel (`analysis.panel`). Conversations without a decision "
        "have none.",
        "- **PERMA change over the following wave**: `after` is the participant's first PERMA-Profiler "
        "follow-up whose intended time is after the conversation started (the wave the panel counts the "
        "conversation toward), whether answered or not; `before` is the participant's last PERMA-Profiler "
        "score submitted before the conversation started (the baseline counts). `overall_wellbeing_change` = "
        "after - before of overall well-being (0-10, mean of the 15 PERMA items and happiness); null when "
        "either is missing. Every conversation before the same wave shares the change: it is the change over "
        "the wave, not an effect of one conversation.",
        "- **Exit rating**: the immediate rating at the end of the conversation (1-7).", "",
        f"## `{PAIRS_FILE}`: which of two comparable conversations to prefer", "",
        "| field | meaning |", "|---|---|",
        *(f"| `{name}` | {meaning} |" for name, meaning in PAIR_FIELDS.items()), "",
        "How pairs are formed: conversations with a submitted regret score are grouped by regret follow-up and "
        "starting role, and sorted within a group by (starting sentiment, conversation id). Each is compared "
        f"with at most the next {options['max_partners']} conversations of its group whose starting sentiment "
        f"is at most {options['sentiment_tolerance']} higher (VADER compound points); a conversation without a "
        "participant message has no sentiment and is not paired. The one followed by lower regret is `chosen`; "
        "equal scores give no pair. Pairs are numbered by group (follow-up, then role, alphabetically), then by "
        "the sorted positions, so the same data always give the same file. A group of n conversations gives at "
        f"most {options['max_partners']} x n pairs; a conversation is in at most {2 * options['max_partners']}.",
        "", "## Caveats", "",
        "Observational data: lower regret after a conversation is not proof the conversation caused it. "
        "Regret exists only for conversations that ended with a decision whose follow-up was answered; the "
        "people who answer may differ from those who do not.",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
