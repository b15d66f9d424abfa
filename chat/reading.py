"""The reading of a participant message: a calibrated score for each concern the roles act on, and
whom and when it is about.

On the crisis classifier's features (``chat.semantic.features``: all-MiniLM-L6-v2 over the whole
message, the mean and the maximum of its sentence windows) and the embedding of its last two
sentences (``chat.semantic.reading_features``), one head per concern (multi-label: a message can
seek validation and frame a conflict one-sidedly at once): a support-vector machine with an RBF
kernel for validation-seeking, reassurance-seeking and one-sided framing
(``chat.reading_train.KERNEL_CONCERNS``), where it separated independently written rounds better
than a linear head, a logistic regression for the others, each
Platt-scaled on cross-validated scores so that its number is a probability, and a multinomial
logistic regression for ``about``. Each concern's threshold is chosen on those cross-validated
scores for a stated recall (``chat/reading_train.py``; the figures are in the head's metadata and
the model card, ``chat/crisis_data/READING.md``). ``chat.semantic.classify`` computes the reading
with the crisis verdict, from one encoding of the message.

The danger concerns (risk to self, danger from others, harm to others) are scored here too, for the
record and the analyses; whether a message gets a check-in or an escalation is still decided by
the crisis classifier fused with the lexicon (``chat.semantic.fuse``), whose thresholds were set
for that decision. The other concerns are what pushback follows (``chat.steps.assess_message``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

READING_PATH = Path(__file__).parent / "crisis_data" / "reading.npz"
CONCERNS = ("risk_to_self", "risk_from_others", "harm_to_others", "distress", "validation_seeking",
            "reassurance_seeking", "dependence", "one_sided")
DANGER = ("risk_to_self", "risk_from_others", "harm_to_others")
ABOUT = ("self_now", "self_past", "someone_else", "general")
# Concerns whose reason quotes the participant's sentence that carries it most.
EMBEDDING = 384  # all-MiniLM-L6-v2's embedding size: the width of each part of a feature row
QUOTED = ("validation_seeking", "one_sided", "reassurance_seeking", "dependence")


@dataclass(frozen=True)
class Reading:
    """One message's reading: ``scores`` (a probability per concern), ``flagged`` (the concerns at
    their threshold), ``about`` (most likely of ``ABOUT``) and, for flagged ``QUOTED`` concerns,
    the sentence that carries each (``quotes``)."""

    scores: dict[str, float]
    flagged: frozenset[str]
    about: str
    about_scores: dict[str, float] = field(default_factory=dict)
    quotes: dict[str, str] = field(default_factory=dict)

    def features(self) -> dict[str, object]:
        """What is stored with the turn (``turns.features``) and exported."""
        return {"reading": {c: round(p, 4) for c, p in self.scores.items()},
                "reading_flagged": sorted(self.flagged), "about": self.about}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


class Kernel:
    """The RBF kernel between feature rows and fixed support vectors (m, features), as
    scikit-learn's SVC computes it: ``kernel(x)`` is (n, m).

    A feature row is made of ``block``-wide parts (``chat.semantic.features``: the whole message,
    the mean and the maximum of its windows; the reading adds its last sentences), and for a message
    of one window those parts are the same embedding. Where parts of a row are equal, the row's
    product with every support vector is the part's product with the sum of those parts of the
    support vectors: the sums are kept per pattern of equal parts (``_folded``), so a short
    message's kernel reads a third (the crisis head) or a quarter (the reading) of the support
    vectors' numbers, which is what the kernel's time goes on."""

    def __init__(self, support: np.ndarray, gamma: float, block: int) -> None:
        self.support = support.astype(np.float32)
        self.support_sq = (self.support * self.support).sum(axis=1)
        self.gamma = gamma
        self.block = block if block and self.support.shape[1] % block == 0 else self.support.shape[1]
        self.parts = self.support.shape[1] // self.block
        self._folds: dict[tuple[int, ...], np.ndarray] = {}
        self._folded((0,) * self.parts)  # a message of one window, whose parts are all equal

    def __len__(self) -> int:
        return len(self.support)

    def _pattern(self, row: np.ndarray) -> tuple[int, ...]:
        """For each part of ``row``, the first part equal to it."""
        parts = row.reshape(self.parts, self.block)
        found: list[int] = []
        for i in range(self.parts):
            found.append(next((j for j in found if j < i and np.array_equal(parts[j], parts[i])), i))
        return tuple(found)

    def _folded(self, pattern: tuple[int, ...]) -> np.ndarray:
        """The support vectors with the parts that ``pattern`` says are equal summed: (m, kept * block)."""
        folded = self._folds.get(pattern)
        if folded is None:
            parts = self.support.reshape(len(self.support), self.parts, self.block)
            kept = sorted(set(pattern))
            folded = np.concatenate([parts[:, [i for i, p in enumerate(pattern) if p == k]].sum(axis=1) for k in kept],
                                    axis=1).astype(np.float32)
            self._folds[pattern] = folded  # the same value whichever thread stores it
        return folded

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        products = np.empty((len(x), len(self.support)), dtype=np.float32)
        rows_by_pattern: dict[tuple[int, ...], list[int]] = {}
        for i, row in enumerate(x):
            rows_by_pattern.setdefault(self._pattern(row), []).append(i)
        for pattern, rows in rows_by_pattern.items():
            kept = sorted(set(pattern))
            reduced = x[rows].reshape(len(rows), self.parts, self.block)[:, kept].reshape(len(rows), -1)
            products[rows] = reduced @ self._folded(pattern).T
        distances = (x * x).sum(axis=1)[:, None] + self.support_sq[None, :] - 2.0 * products
        return np.asarray(np.exp(-self.gamma * np.maximum(distances, 0.0)))


class ReadingHead:
    """The fitted heads (``chat/reading_train.py``), numpy only at run time."""

    def __init__(self, path: Path = READING_PATH) -> None:
        with np.load(path) as data:
            self.concerns: tuple[str, ...] = tuple(str(c) for c in data["concerns"])
            self.coef = data["coef"].astype(np.float32)  # (concerns, features)
            self.intercept = data["intercept"].astype(np.float32)
            self.platt_a = data["platt_a"].astype(np.float64)  # probability = sigmoid(a * decision + b)
            self.platt_b = data["platt_b"].astype(np.float64)
            self.threshold = data["threshold"].astype(np.float64)  # on the probability
            self.about_coef = data["about_coef"].astype(np.float32)
            self.about_intercept = data["about_intercept"].astype(np.float32)
            # The kernel heads' support vectors (the union of every kernel head's), their RBF
            # kernel's gamma and each concern's weights on them (zero for a linear head).
            self.kernel = Kernel(data["support"], float(data["gamma"]), EMBEDDING)
            self.dual = data["dual"].astype(np.float32)  # (concerns, support vectors)
            self.metadata: dict[str, Any] = json.loads(str(data["metadata"]))

    def decision(self, x: np.ndarray) -> np.ndarray:
        """Each head's decision value (n, concerns): a linear head's ``x @ coef + intercept``, a
        kernel head's support-vector sum ``K(x, support) @ dual + intercept``."""
        decision = x @ self.coef.T + self.intercept
        if len(self.kernel):
            decision = decision + self.kernel(x) @ self.dual.T
        return decision.astype(np.float64)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probabilities (n, concerns) for feature rows ``x`` (n, features)."""
        return np.asarray(_sigmoid(self.platt_a * self.decision(x) + self.platt_b))

    def about(self, x: np.ndarray) -> np.ndarray:
        logits = (x @ self.about_coef.T + self.about_intercept).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        weights = np.exp(logits)
        return np.asarray(weights / weights.sum(axis=1, keepdims=True))

    def reading(self, x: np.ndarray) -> Reading:
        """The reading of one message's features ``x`` (features,), without quotes (``quotes``)."""
        probabilities = self.probabilities(x[None, :])[0]
        scores = {c: float(p) for c, p in zip(self.concerns, probabilities, strict=True)}
        flagged = frozenset(c for c, p, t in zip(self.concerns, probabilities, self.threshold, strict=True)
                            if p >= t)
        about = self.about(x[None, :])[0]
        return Reading(scores=scores, flagged=flagged, about=ABOUT[int(np.argmax(about))],
                       about_scores={a: float(p) for a, p in zip(ABOUT, about, strict=True)})
