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


def rbf(x: np.ndarray, support: np.ndarray, support_sq: np.ndarray, gamma: float) -> np.ndarray:
    """The RBF kernel between feature rows ``x`` (n, features) and support vectors (m, features)
    whose squared norms are ``support_sq``: (n, m), as scikit-learn's SVC computes it."""
    distances = (x * x).sum(axis=1)[:, None] + support_sq[None, :] - 2.0 * (x @ support.T)
    return np.asarray(np.exp(-gamma * np.maximum(distances, 0.0)))


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
            self.support = data["support"].astype(np.float32)
            self.support_sq = (self.support * self.support).sum(axis=1)
            self.gamma = float(data["gamma"])
            self.dual = data["dual"].astype(np.float32)  # (concerns, support vectors)
            self.metadata: dict[str, Any] = json.loads(str(data["metadata"]))

    def decision(self, x: np.ndarray) -> np.ndarray:
        """Each head's decision value (n, concerns): a linear head's ``x @ coef + intercept``, a
        kernel head's support-vector sum ``K(x, support) @ dual + intercept``."""
        decision = x @ self.coef.T + self.intercept
        if len(self.support):
            decision = decision + rbf(x, self.support, self.support_sq, self.gamma) @ self.dual.T
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
