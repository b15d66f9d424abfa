"""The semantic crisis classifier and its fusion with the lexicon.

A message is embedded with all-MiniLM-L6-v2 (``chat.encoder``) twice over: whole (its first 256
tokens) and, for a long message, as the mean of its windows of consecutive sentences (so a crisis
told in the middle of a long story is neither cut off nor averaged into the story's tone). A
message's sentences are tokenized once, and each run of them (the whole, a window, the last
sentences the reading adds, a sentence to quote) is encoded once, the runs of one step in one call
batched by length (``Message``). On these features (``features``: the whole, the mean and the maximum
of the windows, 1,152 numbers):

- a support-vector machine (RBF kernel) scores crisis vs not, and its decision value is fused with
  a logistic regression's over the message's character and word n-grams (``chat.ngrams``: how it
  is typed); ``threshold`` on the fused score flags;
- a multinomial logistic regression picks the category among risk to self, harm to others and
  risk from others, and a logistic regression whether it looks acute; the classifier calls a
  finding acute (escalation at once) only at a score few benign messages reach
  (``acute_threshold``), so its false alarms get a check-in, not an escalation.

All three are fitted by ``chat/crisis_train.py`` on ``chat/crisis_data/train/`` and shipped in
``chat/crisis_data/head.npz`` (numpy only at run time).

Fusion (``fuse``): the classifier raises a finding on its own. The lexicon's non-acute cues
(distress such as "I feel hopeless, like I'm falling apart", which gets a check-in; coercive
control; revenge, which is declined) always stand. Its acute cues ("suicide", "overdose", "kill
...") stand when the classifier's score is at least ``lexicon_threshold`` (lower than
``threshold``): on the first held-out round the lexicon flagged 19% of the benign messages, mostly
through those words in idioms, hyperbole, the news or stories about the past or someone else, and
found 14% of the crisis ones. A standing acute cue escalates only where the score also reaches
``lexicon_acute_threshold`` (or the classifier calls the message acute; for harm to others, which
is declined rather than checked in on, wherever the classifier flags it); below it the cue gets a
check-in, whose answers decide escalation (``chat.triage``): on round 10, 6 of the 9 benign
messages escalated were acute cues standing on a score below ``threshold`` (a healed scar, a vitamin
D dose, "i am going to KILL my husband" over a tap). That veto reads the whole message, so it must never silence an
explicit statement (``CrisisFinding.explicit``: "I want to kill myself", "he is choking me right
now") because other text surrounds it: a recipe, code or a story after it lowers the whole
message's score without changing what was said. An explicit statement therefore always stands and
escalates, unless its own sentence hedges it with a condition or a mark of hyperbole ("if I have to
sit through one more meeting I'll shoot myself lol", "i want to die kkkk", ``statement_stands``):
then the whole message decides, as for the other acute cues. (Judging a hedged statement on its
sentence alone was tried: without the message around it the classifier cannot tell "ugh i want to
die" about an embarrassing wave from the real thing, and the past from the present, so it flagged
3-8 more of each held-out round's 200 benign messages.) The thresholds are chosen in training on
cross-validated scores of the calibration rounds (see the head's metadata). The optional LLM reader is added
after this (``chat.llm_reader.fuse``) and can only raise findings.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from chat import ngrams
from chat.encoder import MAX_TOKENS, encoder, encoder_loaded, published
from chat.monitors import CrisisFinding, conditional, detect_crisis, normalize
from chat.reading import EMBEDDING, QUOTED, READING_PATH, Kernel, Reading, ReadingHead

HEAD_PATH = Path(__file__).parent / "crisis_data" / "head.npz"
WINDOW_TOKENS = 64  # a window is consecutive sentences up to about this many tokens
CATEGORIES = ("none", "risk_to_self", "harm_to_others", "risk_from_others")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# Where one statement ends and other text begins: a sentence's end, a line break, markup, a code
# fence, a semicolon or a colon before what follows ("... tonight, here is my code: print(1)").
_STATEMENT_END = re.compile(r"(?<=[.!?\u2026])[\"')\]\u201d\u2019]*\s+|\n+|<[^>]*>|```|;\s*|:\s+")


@dataclass(frozen=True)
class SemanticVerdict:
    """The classifier's reading of one message: its crisis score (the SVM's decision value fused
    with the n-gram model's, ``Head.fused``; the head's ``threshold`` flags), the most likely crisis
    category, whether it looks acute, whether it is flagged, and whether it is high enough to let a
    lexicon cue stand."""

    score: float
    category: str
    acute: bool
    flagged: bool
    supports_lexicon: bool  # the score lets a lexicon cue stand
    supports_acute_cue: bool = False  # the score lets a lexicon cue's acute level stand (an escalation)
    reading: Reading | None = None  # every concern's score, from the same encoding (chat.reading)


def runs(sizes: list[int], limit: int = WINDOW_TOKENS) -> list[tuple[int, int]]:
    """The windows of sentences of these token counts: runs ``(start, end)`` of consecutive
    sentences of at most ``limit`` tokens (a longer sentence is its own run)."""
    out: list[tuple[int, int]] = []
    start = size = 0
    for i, n in enumerate(sizes):
        if i > start and size + n > limit:
            out.append((start, i))
            start, size = i, 0
        size += n
    return [*out, (start, len(sizes))] if sizes else out


def windows(text: str, token_count: Any, limit: int = WINDOW_TOKENS) -> list[str]:
    """``text`` cut into runs of whole sentences of at most ``limit`` tokens (a longer sentence is
    its own window). ``token_count(s)`` counts a string's tokens."""
    parts = sentences(text)
    return [" ".join(parts[start:end]) for start, end in runs([token_count(p) for p in parts], limit)]


def pieces(text: str) -> list[str]:
    """What is embedded for ``text``: the whole message, then its windows when there are several
    (``Message`` gives the same pieces' embeddings at run time, from one tokenizing)."""
    enc = encoder()
    parts = windows(text, lambda s: len(enc.token_ids(s)) - 2)
    return [text] + parts if len(parts) > 1 else [text]


FEATURE_PARTS = 3  # the whole message, the mean of its windows, their maximum


def features(embeddings: np.ndarray) -> np.ndarray:
    """The classifier's input from a message's piece embeddings (whole first): the whole message's
    embedding, the mean of its windows' and their element-wise maximum (the whole again for both when
    it has one window). The maximum keeps what one window of a long message says strongly, which
    the mean averages into the rest (a disclosure in passing): on held-out round 6, with the head
    fitted without it, recall at 5% false positives rose from 0.867 to 0.908."""
    windows = embeddings[1:] if len(embeddings) > 1 else embeddings[:1]
    return np.concatenate([embeddings[0], windows.mean(axis=0), windows.max(axis=0)]).astype(np.float32)


def alone(vectors: np.ndarray) -> np.ndarray:
    """The reading's feature rows of pieces each read as a message of its own (every part of the
    features, and the last sentences, that piece's embedding): a window or a sentence to quote."""
    return np.hstack([vectors] * (FEATURE_PARTS + 1))


class Head:
    """The fitted head (``chat/crisis_train.py``): ``score``, ``verdict``."""

    def __init__(self, path: Path = HEAD_PATH) -> None:
        with np.load(path) as data:
            self.kernel = Kernel(data["support"], float(data["gamma"]), EMBEDDING)
            self.dual = data["dual"].astype(np.float32)
            self.intercept = float(data["intercept"])
            self.category_coef = data["category_coef"].astype(np.float32)
            self.category_intercept = data["category_intercept"].astype(np.float32)
            self.acute_coef = data["acute_coef"].astype(np.float32)
            self.acute_intercept = float(data["acute_intercept"])
            self.threshold = float(data["threshold"])
            self.lexicon_threshold = float(data["lexicon_threshold"])
            self.lexicon_acute_threshold = float(data["lexicon_acute_threshold"])
            self.acute_threshold = float(data["acute_threshold"])
            # The n-gram view (chat.ngrams), fused into the score with this weight; none in older heads.
            self.words_weight = float(data["words_weight"]) if "words_weight" in data else 0.0
            if self.words_weight:
                self.words_idf = data["words_idf"]
                self.words_coef = data["words_coef"]
                self.words_intercept = float(data["words_intercept"])
            self.metadata: dict[str, Any] = json.loads(str(data["metadata"]))

    def score(self, x: np.ndarray) -> np.ndarray:
        """The SVM's decision values for feature rows ``x`` (n, features)."""
        return self.kernel(x) @ self.dual + self.intercept

    def words(self, texts: list[str]) -> np.ndarray:
        """The n-gram logistic regression's decision values (log-odds) for ``texts``."""
        rows = ngrams.features(ngrams.counts(texts), self.words_idf)
        return np.asarray(rows @ self.words_coef).ravel() + self.words_intercept

    def fused(self, x: np.ndarray, texts: list[str]) -> np.ndarray:
        """The crisis score the thresholds apply to: the SVM's decision value on the features ``x``
        plus ``words_weight`` times the n-gram model's on the ``texts`` (the same messages)."""
        score = self.score(x)
        return score + self.words_weight * self.words(texts) if self.words_weight else score

    def verdict(self, x: np.ndarray, text: str) -> SemanticVerdict:
        """The verdict on one message's features ``x`` (features,) and its ``text`` (the n-gram view's
        input: a head fitted without one reads the features alone)."""
        row = x[None, :]
        score = float(self.fused(row, [text])[0])
        category = CATEGORIES[1 + int(np.argmax(row @ self.category_coef.T + self.category_intercept))]
        acute = bool((row @ self.acute_coef)[0] + self.acute_intercept >= 0.0) and score >= self.acute_threshold
        return SemanticVerdict(score, category, acute, score >= self.threshold, score >= self.lexicon_threshold,
                               score >= self.lexicon_acute_threshold)


_lock = threading.Lock()


@cache
def _head() -> Head:
    return Head()


def head() -> Head:
    with _lock:
        return _head()


@cache
def _reading_head() -> ReadingHead | None:
    return ReadingHead() if READING_PATH.exists() else None


def reading_head() -> ReadingHead | None:
    """The reading's heads (``chat.reading``); None before ``chat/reading_train.py`` has fitted them."""
    with _lock:
        return _reading_head()


SAME_WORRY = 0.5  # cosine similarity of two whole messages about one worry, before a head is fitted
SAME_WORRY_EARLIER = 10  # the most recent earlier messages compared


def same_worry(text: str, earlier: list[str]) -> list[bool]:
    """Whether each of the ``earlier`` messages (the last ``SAME_WORRY_EARLIER``) is about the same
    worry as ``text``, by meaning rather than words: the cosine similarity of their embeddings
    reaches the reading head's ``same_worry`` (fitted on threads of one writer's differently worded
    requests about one worry against other writers' requests; ``chat/reading_train.py``)."""
    recent = earlier[-SAME_WORRY_EARLIER:]
    if not recent:
        return []
    heads = reading_head()
    threshold = float(heads.metadata.get("same_worry", SAME_WORRY)) if heads is not None else SAME_WORRY
    vectors = np.stack(_similarity_embeddings([text, *recent]))
    return [bool(v) for v in (vectors[1:] @ vectors[0]) >= threshold]


_similar: OrderedDict[bytes, np.ndarray] = OrderedDict()


def _digest(text: str) -> bytes:
    """The key of a message in the caches of recent verdicts and embeddings (not the text)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _similarity_embeddings(texts: list[str]) -> list[np.ndarray]:
    """The published model's embeddings of whole messages (``chat.encoder.published``), recent ones
    kept by the text's digest: a participant's earlier requests are encoded once, not at every
    turn that compares with them."""
    keys = [_digest(t) for t in texts]
    with _lock:
        missing = [i for i, key in enumerate(keys) if key not in _similar]
    if missing:
        vectors = published().encode([texts[i] for i in missing])
        with _lock:
            for i, vector in zip(missing, vectors, strict=True):
                _similar[keys[i]] = vector
    with _lock:
        found = [_similar[key] for key in keys]
        for key in keys:
            _similar.move_to_end(key)
        while len(_similar) > _CACHE_SIZE:
            _similar.popitem(last=False)
    return found


def sentences(text: str) -> list[str]:
    """The sentences (and lines) of ``text``, as a quote shows them."""
    return [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]


LAST_SENTENCES = 2  # the reading also sees the message's last sentences on their own: where a request sits
Span = tuple[int, int]  # sentences start:end of a message


class Message:
    """One message for the classifier and the reading: its sentences, tokenized once, and the
    embeddings of runs of them (``Span``). The token ids of a run are its sentences' joined (the
    ids of the text they make, ``chat.encoder.Encoder.content_ids``); every run asked for at once is
    encoded in one call, batched by length, and none twice (a window that is one sentence is that
    sentence, a last window of two sentences the last sentences)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sentences = sentences(text)
        self._encoder = encoder()
        self._ids = self._encoder.content_ids(self.sentences)
        self._vectors: dict[Span, np.ndarray] = {}

    @property
    def whole(self) -> Span:
        return 0, len(self.sentences)

    def pieces(self) -> list[Span]:
        """What ``pieces`` embeds: the whole message, then its windows when there are several."""
        windows = runs([min(len(ids), MAX_TOKENS - 2) for ids in self._ids])
        return [self.whole, *windows] if len(windows) > 1 else [self.whole]

    def last(self) -> Span | None:
        """The last ``LAST_SENTENCES`` sentences, when the message has more."""
        n = len(self.sentences)
        return (n - LAST_SENTENCES, n) if n > LAST_SENTENCES else None

    def embeddings(self, spans: list[Span]) -> np.ndarray:
        """The embeddings of these runs of sentences, (len(spans), 384)."""
        missing = list(dict.fromkeys(span for span in spans if span not in self._vectors))
        if missing:
            joined = [[token for ids in self._ids[start:end] for token in ids] for start, end in missing]
            self._vectors.update(zip(missing, self._encoder.encode_ids(joined), strict=True))
        return np.stack([self._vectors[span] for span in spans])


def reading_features(x: np.ndarray, last: np.ndarray | None) -> np.ndarray:
    """The reading's input (``chat.reading``): the crisis classifier's features ``x`` and the
    embedding ``last`` of the message's last ``LAST_SENTENCES`` sentences (the whole message's when
    it has no more than that: None), where a request for agreement or reassurance usually is."""
    return np.concatenate([x, x[:EMBEDDING] if last is None else last]).astype(np.float32)


def _read_concerns(message: Message, x: np.ndarray) -> Reading | None:
    """The reading of a message from its crisis features ``x``, with the sentence that carries each
    flagged quoted concern (``_quotes``)."""
    heads = reading_head()
    if heads is None:
        return None
    last = message.last()
    reading = heads.reading(reading_features(x, None if last is None else message.embeddings([last])[0]))
    quoted = [concern for concern in QUOTED if concern in reading.flagged]
    if not quoted or not message.sentences:
        return reading
    if len(message.sentences) == 1:
        return replace(reading, quotes=dict.fromkeys(quoted, message.text))
    return replace(reading, quotes=_quotes(heads, message, quoted))


def _quotes(heads: ReadingHead, message: Message, quoted: list[str]) -> dict[str, str]:
    """The sentence of ``message`` that scores highest for each of the ``quoted`` concerns. A long
    message's windows (encoded already, as pieces) are scored first, and only the sentences of each
    concern's best window are encoded (in one call) and scored: a quote costs at most a window's
    worth of tokens (``WINDOW_TOKENS``) per concern, however long the message."""
    windows = message.pieces()[1:] or [message.whole]
    if len(windows) > 1:
        by_window = heads.probabilities(alone(message.embeddings(windows)))
        best = {c: windows[int(np.argmax(by_window[:, heads.concerns.index(c)]))] for c in quoted}
    else:
        best = dict.fromkeys(quoted, windows[0])
    spans = sorted({(i, i + 1) for start, end in best.values() for i in range(start, end)})
    by_sentence = dict(zip(spans, heads.probabilities(alone(message.embeddings(spans))), strict=True))
    column = {c: heads.concerns.index(c) for c in quoted}
    return {c: message.sentences[max(range(*best[c]), key=lambda i: by_sentence[(i, i + 1)][column[c]])]
            for c in quoted}


def load() -> None:
    """Load the encoder and the head and run them once (the first run of ONNX Runtime's session
    is slower than the rest), so the first participant message waits for neither: the API does
    this at start-up; with the published model that compares requests for reassurance."""
    _verdict("Loading the crisis classifier.")
    _similarity_embeddings(["Loading the model that compares messages."])


def loaded() -> bool:
    """Whether the encoder and the head are loaded (``load``, or a first message)."""
    return encoder_loaded() and _head.cache_info().currsize > 0


_CACHE_SIZE = 512
# One BLAS thread for the head's kernel sums: on a loaded 2-core machine OpenBLAS's own threads
# wait for a core far longer than the product takes.
_threads = ThreadpoolController()
_recent: OrderedDict[bytes, SemanticVerdict] = OrderedDict()


def classify(text: str) -> SemanticVerdict:
    """The semantic classifier's verdict on one participant message (~10-20 ms for a short one).
    Verdicts of recent messages are kept by the text's digest (not the text), so a retry or an
    override reassessing the same message, or ``chat.service`` scoring a message before it claims
    the reply, do not encode it again."""
    key = _digest(text)
    with _lock:
        found = _recent.get(key)
        if found is not None:
            _recent.move_to_end(key)
            return found
    verdict = _verdict(text)
    with _lock:
        _recent[key] = verdict
        while len(_recent) > _CACHE_SIZE:
            _recent.popitem(last=False)
    return verdict


def _verdict(text: str) -> SemanticVerdict:
    message = Message(text)
    spans = message.pieces()
    last = message.last() if reading_head() is not None else None
    vectors = message.embeddings([*spans, last] if last else spans)[: len(spans)]  # one call with the reading's
    embedded = features(vectors)
    with _threads.limit(limits=1, user_api="blas"):
        return replace(head().verdict(embedded, text), reading=_read_concerns(message, embedded))


def statement_of(text: str, cue: str) -> str | None:
    """The statement (sentence, line or text between markup) of ``text`` that carries ``cue`` (as
    ``detect_crisis`` reports it, normalized), or None when the cue spans several."""
    wanted = normalize(cue)
    parts = (p.strip() for p in _STATEMENT_END.split(text))
    return next((part for part in parts if part and wanted in normalize(part)), None)


def statement_stands(text: str, lexical: CrisisFinding) -> bool:
    """Whether an explicit statement stands whatever the rest of ``text`` says: unless its own
    sentence hedges it with a condition or a mark of hyperbole (``chat.monitors.conditional``)."""
    statement = statement_of(text, lexical.cue)
    return statement is None or not conditional(statement)


def fuse(lexical: CrisisFinding | None, semantic: SemanticVerdict, *,
         statement_stands: bool = False) -> CrisisFinding | None:
    """One finding from the lexicon's and the classifier's (see the module's docstring): the
    lexicon's category and cue win when both stand (its cues are precise about what was said).
    ``statement_stands``: the lexicon's cue is an explicit statement that the rest of the message
    cannot explain away (``statement_stands()``); it stands, acute, whatever the score. Another
    acute cue stands where the score reaches ``lexicon_threshold`` and keeps its acute level (an
    escalation) only where the score reaches ``lexicon_acute_threshold`` or the classifier calls the
    message acute; below that it is a check-in, whose answers decide escalation (``chat.triage``)."""
    if lexical is None:
        if not semantic.flagged:
            return None
        return CrisisFinding(category=semantic.category, acute=semantic.acute,  # type: ignore[arg-type]
                             cue=f"semantic classifier (score {semantic.score:.2f})", source="semantic")
    if statement_stands:
        acute = True
    elif not lexical.acute:
        acute = semantic.acute  # a distress cue always stands, as a check-in at least
    elif semantic.flagged or semantic.supports_lexicon:
        # Harm to others has no check-in to follow a lower level (it is declined), so its acute cue
        # keeps its level wherever the classifier flags the message ("I want to kill my wife").
        acute = (semantic.supports_acute_cue or semantic.acute
                 or (lexical.category == "harm_to_others" and semantic.flagged))
    else:
        return None  # an acute cue in a message the classifier scores as clearly benign
    return CrisisFinding(category=lexical.category, acute=acute, cue=lexical.cue,
                         source="lexicon+semantic" if semantic.flagged else "lexicon", explicit=lexical.explicit)


def read(text: str) -> tuple[CrisisFinding | None, SemanticVerdict]:
    """The crisis finding for a participant message (the lexicon fused with the classifier) and the
    classifier's verdict on the whole message."""
    lexical = detect_crisis(text)
    verdict = classify(text)
    explicit = lexical is not None and lexical.explicit and statement_stands(text, lexical)
    return fuse(lexical, verdict, statement_stands=explicit), verdict


def detect(text: str) -> CrisisFinding | None:
    """The crisis finding for a participant message: the lexicon fused with the classifier."""
    return read(text)[0]
