"""De-identified exports (``export_study(..., shift_dates=True)``): each participant's dates moved
back by a random number of days stored nowhere, the participants renamed ``D0001``, ``D0002``, ...
in a random order, every id passed through a keyed permutation drawn for this export alone (the
same in every table, so the tables still join), and the rows written in the participants' random
order. Free text in every export is scrubbed of email addresses and phone numbers (``scrub``)."""

from __future__ import annotations

import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from sqlalchemy import select
from sqlalchemy.engine import Connection

from analysis.codebook import TableSpec
from analysis.export_formats import ParquetDataset, TableWriter
from study.models import Participant

# Scrubbing of free text (turn content, decision text, free-text answers). An email address: a
# local part, '@', and a domain with a dot. A phone number: an optional '+', then digits with
# spaces, dots, dashes, slashes or parentheses between them, 9 or more digits in all (so dates
# and times, at most 8 digits, are kept).
EMAIL_PATTERN = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
PHONE_PATTERN = re.compile(r"(?<![\w+])\+?\(?\d[\d\s().\-/]{5,}\d(?!\w)")
PHONE_MIN_DIGITS = 9


def scrub(text: Any) -> str | None:
    """Replace email addresses with [email] and phone numbers with [phone]; missing stays missing."""
    if not isinstance(text, str):
        return None
    text = EMAIL_PATTERN.sub("[email]", text)
    return PHONE_PATTERN.sub(
        lambda m: "[phone]" if sum(ch.isdigit() for ch in m.group()) >= PHONE_MIN_DIGITS else m.group(), text)


SHIFT_MAX_DAYS = 364  # dates move back by 1..364 whole days, as REDCap does


def shift_participant_dates(chunk: pd.DataFrame, spec: TableSpec, offsets: dict[str, int],
                            rng: random.Random) -> pd.DataFrame:
    """Move the chunk's dated datetime columns back by each participant's offset (drawn from ``rng``
    the first time a participant is seen, kept in ``offsets`` for this export only)."""
    if "participant_code" not in chunk.columns:
        return chunk
    for code in chunk["participant_code"].dropna().unique():
        if code not in offsets:
            offsets[code] = rng.randint(1, SHIFT_MAX_DAYS)
    days = pd.to_timedelta(chunk["participant_code"].map(offsets).astype("float64"), unit="D")
    for column in spec.columns:
        if column.type == "datetime" and column.dated:
            chunk[column.name] = chunk[column.name] - days
    return chunk


# Every id column and the table whose ids it holds (tests check that no integer *_id column is
# missing). An id keeps its table's new name wherever it appears, so the tables still join.
ID_SPACES: dict[str, str] = {
    "turn_id": "turns", "conversation_id": "conversations", "context_conversation_id": "conversations",
    "decision_conversation_id": "conversations", "decision_id": "decisions", "context_decision_id": "decisions",
    "followup_id": "followups", "response_id": "responses", "safety_event_id": "safety_events"}
ANCHOR = re.compile(r"^decision:(\d+)$")  # an anchor_key naming a decision's id
PSEUDONYM = "D"  # de-identified participant codes: D0001, D0002, ... (real codes start with P)


class _Permutation:
    """A keyed pseudorandom permutation of the ids 1 .. 2**32 - 1 (database ids are below 2**31):
    a four-round Feistel network on two 16-bit halves with AES-128 as its round function
    (Luby-Rackoff), the id space's number in every block, so each table's ids move independently;
    cycle-walking keeps 0 out. AES in ECB mode is used here as a block-by-block pseudorandom
    function, never to encrypt a message."""

    ROUNDS, HALF = 4, 16
    MASK = (1 << HALF) - 1

    def __init__(self, key: bytes) -> None:
        self.cipher = Cipher(algorithms.AES(key), modes.ECB())

    def _round(self, space: int, number: int, half: np.ndarray) -> np.ndarray:
        blocks = np.zeros((len(half), 16), dtype=np.uint8)
        blocks[:, 0], blocks[:, 1] = space, number
        blocks[:, 2], blocks[:, 3] = half >> 8, half & 0xFF
        encryptor = self.cipher.encryptor()
        out = np.frombuffer(encryptor.update(blocks.tobytes()) + encryptor.finalize(), dtype=np.uint8)
        out = out.reshape(-1, 16).astype(np.int64)
        return (out[:, 0] << 8) | out[:, 1]

    def _once(self, space: int, values: np.ndarray) -> np.ndarray:
        left, right = values >> self.HALF, values & self.MASK
        for number in range(self.ROUNDS):
            left, right = right, left ^ self._round(space, number, right)
        return (left << self.HALF) | right

    def __call__(self, space: int, values: np.ndarray) -> np.ndarray:
        out = self._once(space, values)
        while (zero := out == 0).any():
            out[zero] = self._once(space, out[zero])
        return out


class Deidentified:
    """One de-identified export's new names. The study's participants are put in a random order
    and named ``D0001``, ``D0002``, ... in it; every id goes through a keyed permutation (key
    drawn for this export, kept only in memory), the same one in every table; rows are written
    in the participants' random order (``Shuffled``)."""

    def __init__(self, connection: Connection, study_id: int, rng: random.Random) -> None:
        codes = list(connection.scalars(select(Participant.code).where(Participant.study_id == study_id)))
        rng.shuffle(codes)
        width = max(4, len(str(len(codes))))
        self.pseudonyms = {code: f"{PSEUDONYM}{i + 1:0{width}d}" for i, code in enumerate(codes)}
        self.ranks = {pseudonym: i for i, pseudonym in enumerate(self.pseudonyms.values())}
        self.permutation = _Permutation(rng.randbytes(16))
        self.spaces = {table: i for i, table in enumerate(sorted(set(ID_SPACES.values())))}
        self.rng = rng

    def ids(self, values: pd.Series, table: str) -> pd.Series:
        out = values.copy()
        present = values.notna().to_numpy()
        out[present] = self.permutation(self.spaces[table], values[present].to_numpy("int64"))
        return out

    def rename(self, frame: pd.DataFrame) -> pd.DataFrame:
        for name in frame.columns:
            if name == "participant_code":
                frame[name] = frame[name].map(self.pseudonyms, na_action="ignore").astype("string")
            elif name in ID_SPACES:
                frame[name] = self.ids(frame[name], ID_SPACES[name])
            elif name == "anchor_key":
                anchors = frame[name].str.extract(ANCHOR, expand=False)
                decisions = self.ids(pd.to_numeric(anchors).astype("Int64"), "decisions")
                frame[name] = frame[name].where(anchors.isna(), "decision:" + decisions.astype("string"))
        return frame


class Shuffled:
    """Writes a de-identified table in the participants' random order (each participant's rows in
    the order read: their own sequence, which their shifted dates keep anyway), rows without a
    participant (de-identified safety records) last, in a random order. Rows wait in temporary
    files, one per bucket of ``bucket_size`` participants, so memory holds one bucket at a time."""

    def __init__(self, writer: TableWriter | ParquetDataset, names: Deidentified, folder: Path,
                 bucket_size: int) -> None:
        self.writer, self.names, self.bucket_size = writer, names, bucket_size
        self.folder = folder / writer.path.stem
        self.folder.mkdir()
        self.read = 0

    @property
    def rows(self) -> int:
        return self.writer.rows

    def write(self, frame: pd.DataFrame) -> None:
        nobody = len(self.names.ranks)
        ranks = frame["participant_code"].map(self.names.ranks, na_action="ignore").fillna(nobody).astype("int64")
        order = np.arange(self.read, self.read + len(frame))
        self.read += len(frame)
        unknown = (ranks == nobody).to_numpy()
        order[unknown] = [self.names.rng.getrandbits(62) for _ in range(int(unknown.sum()))]
        keyed = frame.assign(_rank=ranks.to_numpy(), _order=order)
        for bucket, part in keyed.groupby(keyed["_rank"] // self.bucket_size):
            with (self.folder / f"{bucket:09d}.pickle").open("ab") as handle:
                pickle.dump(part, handle)  # our own temporary file, read back below

    def close(self) -> None:
        for path in sorted(self.folder.iterdir()):
            parts = []
            with path.open("rb") as handle:
                while handle.peek(1):
                    parts.append(pickle.load(handle))  # written by write() above
            bucket = pd.concat(parts).sort_values(["_rank", "_order"], kind="stable")
            self.writer.write(bucket.drop(columns=["_rank", "_order"]).reset_index(drop=True))
            path.unlink()
        self.writer.close()
