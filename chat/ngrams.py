"""The crisis classifier's second view of a message: its words and characters, not its meaning.

The encoder places a message by what it is about; a logistic regression over hashed character
n-grams (2 to 5, within words) and word n-grams (1 and 2) reads how it is typed (misspellings, slang,
emoji, pasted code), and its errors differ enough from the encoder's that the two together find
more than either: fused with the support-vector machine's score (``chat.semantic.Head``), out of
fold on the crisis calibration rounds it found 0.975 of their risk messages where the machine alone
found 0.965, at the same 5% of their benign messages (on the fit before corpus L; the n-grams alone
0.907). ``chat.crisis_train`` fits it.

Features (``features``): counts hashed into fixed buckets by scikit-learn's ``HashingVectorizer``
(no vocabulary to ship: the same text gives the same row on every machine), sublinear (1 + log
count), weighted by the inverse document frequency of the training messages, each row scaled to
unit length: tf-idf as ``TfidfTransformer(sublinear_tf=True)`` computes it.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from scipy import sparse

CHAR_BUCKETS = 2**19
WORD_BUCKETS = 2**18
BUCKETS = CHAR_BUCKETS + WORD_BUCKETS


@cache
def _vectorizers() -> tuple[Any, Any]:
    """The two ``HashingVectorizer``s (scikit-learn is imported here, on the first message or at
    start-up by ``chat.semantic.load``, not by every import of ``chat.semantic``)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    common = {"alternate_sign": False, "norm": None, "lowercase": True, "dtype": np.float32}
    return (HashingVectorizer(analyzer="char_wb", ngram_range=(2, 5), n_features=CHAR_BUCKETS, **common),
            HashingVectorizer(analyzer="word", ngram_range=(1, 2), n_features=WORD_BUCKETS, **common))


def counts(texts: list[str]) -> sparse.csr_matrix:
    """Each text's n-gram counts, hashed (len(texts), ``BUCKETS``)."""
    from scipy import sparse

    chars, words = _vectorizers()
    return sparse.hstack([chars.transform(texts), words.transform(texts)], format="csr")


def idf(rows: sparse.csr_matrix) -> np.ndarray:
    """The smoothed inverse document frequency of each bucket over ``counts`` rows (as scikit-learn's
    ``TfidfTransformer``: ln((1 + n) / (1 + df)) + 1)."""
    documents = np.bincount(rows.indices, minlength=rows.shape[1])
    return (np.log((1 + rows.shape[0]) / (1 + documents)) + 1).astype(np.float32)


def features(rows: sparse.csr_matrix, weights: np.ndarray) -> sparse.csr_matrix:
    """tf-idf rows from ``counts`` rows and ``idf`` ``weights``: sublinear counts, weighted, unit length."""
    from sklearn.preprocessing import normalize

    out = rows.copy()
    out.data = (1 + np.log(out.data)) * weights[out.indices]
    return normalize(out, copy=False)
